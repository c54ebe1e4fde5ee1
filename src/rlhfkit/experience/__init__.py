"""Making experience: generate responses, score them, shape per-token rewards, and the rollout."""
