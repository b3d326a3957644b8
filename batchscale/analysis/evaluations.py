"""How finely steps to target are resolved. A run counts the target at its first evaluation
that met it (runs.steps_before_target is the evaluation before that one), so each count is at
or above the step the target was crossed at. At a large batch, where the target takes few
steps, the gap between evaluations can be a large share of the count. The fit's interval takes
the grid's width as scatter (`interval.resolution_scatter`), but not its direction: every count
errs upwards, most where the counts are smallest. This module says where that matters, so the
B_crit interval carries the caveat instead of hiding it."""

from __future__ import annotations

import numpy as np
import pandas as pd

from batchscale import schemas
from batchscale.fits import ensure_columns, matches, numeric_column
from batchscale.schemas import RunStatus

COARSE_GAP_SHARE = 0.2
"""An evaluation gap above this share of a batch size's steps to target is worth saying: the
count may then be a fifth or more above the step the target was crossed at."""


def coarse_evaluations(runs: pd.DataFrame, rule: str) -> str:
    """Where `rule`'s counts of steps to target are coarse, in words ("" where no batch size's
    widest evaluation gap exceeds COARSE_GAP_SHARE of its median count, or the runs do not
    record the evaluation before the target)."""
    runs = ensure_columns(runs, schemas.RUNS)
    reached = runs[matches(runs, "lr_rule", rule) & matches(runs, "status", RunStatus.REACHED)]
    steps = numeric_column(reached, "steps_to_target")
    gaps = steps - numeric_column(reached, "steps_before_target")
    known = np.isfinite(steps) & np.isfinite(gaps)
    if not known.any():
        return ""
    frame = pd.DataFrame({"batch": numeric_column(reached, "batch_size")[known],
                          "steps": steps[known], "gap": gaps[known]})
    per_batch = frame.groupby("batch").agg(steps=("steps", "median"), gap=("gap", "max"))
    per_batch["share"] = per_batch["gap"] / per_batch["steps"]
    coarse = per_batch[per_batch["share"] > COARSE_GAP_SHARE]
    if coarse.empty:
        return ""
    batch = coarse["share"].idxmax()
    worst = coarse.loc[batch]
    others = len(coarse) - 1
    more = f" (and at {others} more batch size{'s' if others > 1 else ''})" if others else ""
    return (f"steps to target are counted at evaluations: at batch {batch:,.0f} the runs met "
            f"the target by step {worst['steps']:,.0f} with evaluations {worst['gap']:,.0f} "
            f"steps apart{more}, so up to {min(worst['share'], 1.0):.0%} fewer steps may have "
            "sufficed; a count errs only upwards, which the interval does not correct (a "
            "smaller convergence.eval_every_steps resolves it)")
