"""Human preference labelling: tasks in SQLite, a web app to vote on them, votes to JSONL."""
