"""The adaptive search: which batch sizes and seeds to train, chosen cell by cell from the
trials so far, until the B_crit interval is narrow enough; above the convergence stage, which
trains its cells, and the analysis's B_crit fit (docs/architecture.md, "Adaptive search")."""
