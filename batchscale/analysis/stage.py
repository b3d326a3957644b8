"""The critical-batch fits' entry: the run's tables in, the analysis table out (its rows, the
summary and the metrics come back for the plan and the report: batchscale/report/stage.py)."""

from __future__ import annotations

import pandas as pd

from batchscale.config import AnalysisConfig, ExperimentConfig
from batchscale.schemas import make_table
from batchscale.storage import write_table_atomic


def analyse(cfg: ExperimentConfig, sweep: pd.DataFrame, runs: pd.DataFrame,
            curves: pd.DataFrame, env: dict, analysis_path: str, adaptive: bool = False):
    """Fit and recommend on the run's tables and write the analysis table; the AnalysisResult.
    `adaptive`: an adaptive search chose the trials (their B_crit interval is read higher)."""
    from batchscale.analysis.analyze import analyze

    result = analyze(sweep, runs, curves, settings_for(cfg.analysis, adaptive),
                     primary_target=primary_target(cfg),
                     gap_epochs=cfg.convergence.gap_epochs,
                     warmup_steps=cfg.convergence.warmup_steps)
    write_table_atomic(analysis_path, make_table("analysis", result.rows, env))
    return result


def settings_for(settings: AnalysisConfig, adaptive: bool) -> AnalysisConfig:
    """The analysis settings with the level the B_crit interval is read at resolved
    (critical.read_level: higher for the trials of an adaptive search)."""
    from batchscale.analysis.critical import read_level

    return settings.model_copy(update={"b_crit_read_level": read_level(settings, adaptive)})


def primary_target(cfg) -> tuple[str, float] | None:
    """The config's target marked `primary: true`, as (metric, value); None when none is."""
    marked = [t for t in cfg.convergence.resolved_targets() if t.primary]
    return (marked[0].metric, marked[0].value) if marked else None
