"""Studies that decide what to train: the adaptive study above the convergence
stage and the analysis's B_crit fit (docs/architecture.md, "Adaptive study")."""
