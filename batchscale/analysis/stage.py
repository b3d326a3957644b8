"""The critical-batch fits' entry: the run's tables in, the analysis table out (its rows, the
summary and the metrics come back for the plan and the report: batchscale/report/stage.py)."""

from __future__ import annotations

import pandas as pd

from batchscale.config import ExperimentConfig
from batchscale.schemas import make_table
from batchscale.storage import write_table_atomic


def analyse(cfg: ExperimentConfig, sweep: pd.DataFrame, runs: pd.DataFrame,
            curves: pd.DataFrame, env: dict, analysis_path: str):
    """Fit and recommend on the run's tables and write the analysis table; the AnalysisResult."""
    from batchscale.analysis.analyze import analyze

    result = analyze(sweep, runs, curves, cfg.analysis, primary_target=primary_target(cfg),
                     gap_epochs=cfg.convergence.gap_epochs,
                     warmup_steps=cfg.convergence.warmup_steps)
    write_table_atomic(analysis_path, make_table("analysis", result.rows, env))
    return result


def primary_target(cfg) -> tuple[str, float] | None:
    """The config's target marked `primary: true`, as (metric, value); None when none is."""
    marked = [t for t in cfg.convergence.resolved_targets() if t.primary]
    return (marked[0].metric, marked[0].value) if marked else None
