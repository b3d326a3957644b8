"""Bringing outside tables: `batchscale analyze` on steps-to-target (and step-time) tables a
user brings from elsewhere (`stage`), checked and named by analysis/usertables.py."""
