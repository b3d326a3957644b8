"""The planner's entry in a pipeline run: the analysis's rows and the run's tables in, the
`plan` table out (no rows when the run lacks a measurement it needs; the reason comes back for
the report)."""

from __future__ import annotations

import pandas as pd

from batchscale.config import ExperimentConfig
from batchscale.planner.table import Plan, default_plan, table_rows
from batchscale.schemas import make_table
from batchscale.storage import write_table_atomic


def plan_run(cfg: ExperimentConfig, sweep: pd.DataFrame, runs: pd.DataFrame,
             analysis_rows: list[dict], env: dict,
             plan_path: str | None) -> tuple[Plan | None, str]:
    """The run's what-if plan over the configured worker counts, written to `plan_path` when
    given; (plan, why there is none)."""
    plan, missing = default_plan(
        sweep, runs, pd.DataFrame(analysis_rows), workload=cfg.workload,
        configured_workers=[cfg.convergence.workers, *cfg.convergence.scaling_workers],
        image_size=cfg.sweep.image_size_px)
    if plan_path is not None:
        write_table_atomic(plan_path, make_table("plan", table_rows(plan) if plan else [], env))
    return plan, missing
