"""Using a policy: best-of-n sampling, the Gymnasium-style text environment and the terminal chat."""
