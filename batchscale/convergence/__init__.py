"""Convergence runs: steps, examples and time to a target per (batch size, LR rule, seed)."""
