"""The whole InstructGPT pipeline (and the demo) as one command, with its config."""
