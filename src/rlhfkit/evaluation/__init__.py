"""Measuring policies and reward models, the `eval` command, and the run report."""
