"""The batch-schedule measurement's plot: B_crit at each checkpoint with its interval, B_simple
along the reference run and the scheduled batch, against examples seen (the report's and the
command's `critical_over_training.png`)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from batchscale.analysis.figures import Plot, make_plot
from batchscale.batch_schedule.check import LEVEL

if TYPE_CHECKING:
    from batchscale.batch_schedule.findings import Findings


def plot(f: Findings, curve: list[dict] | None = None) -> Plot:
    """B_crit at each checkpoint with its interval (a triangle for a bound), B_simple (along the
    reference run when its curve is given, else at the checkpoints) and the scheduled batch,
    against examples seen, log y."""
    return make_plot(lambda: _draw(f, curve), "B_crit over training, B_simple and the schedule",
                     "no checkpoint was measured")


def _draw(f: Findings, curve: list[dict] | None):
    from batchscale.analysis.figures import new_axes

    if f.crit.empty:
        return None
    fig, ax = new_axes("examples seen by the reference run", "batch size (examples)",
                       x_base=None, log_y=True)
    # an evaluation without a positive estimate is a gap in the line, not a straight stroke
    # across it: the table shows "–" there
    points = ([(r["examples"], _positive(r.get("b_simple"))) for r in curve or []]
              or [(r["examples"], _positive(r["b_simple"])) for r in f.crit.to_dict("records")])
    if any(math.isfinite(y) for _, y in points):
        ax.plot(*zip(*points, strict=True), color="tab:gray", marker="" if curve else ".",
                label="B_simple (reference run)")
    for r in f.crit.to_dict("records"):
        if math.isfinite(r["b_crit"]):
            low = r["b_crit"] - r["b_crit_low"] if math.isfinite(r["b_crit_low"]) else 0
            high = r["b_crit_high"] - r["b_crit"] if math.isfinite(r["b_crit_high"]) else 0
            ax.errorbar(r["examples"], r["b_crit"], yerr=[[low], [high]], fmt="o",
                        color="tab:blue", capsize=4)
        elif isinstance(r["b_crit_bound"], str) and r["b_crit_bound"]:
            ax.plot(r["examples"], r["b_crit_bound_batch"], linestyle="none", color="tab:blue",
                    marker="^" if r["b_crit_bound"] == "above" else "v")
    ax.plot([], [], "o", color="tab:blue", label=f"B_crit ({LEVEL:.0%}); triangles: bounds")
    xs = [0, *f.crit["examples"], max(f.crit["examples"].max(), points[-1][0] if points else 0)]
    ys = [f.base_batch, *f.crit["scheduled_batch_size"]]
    ax.step(xs, [*ys, ys[-1]], where="post", color="tab:orange",
            label="scheduled batch (from the checkpoint's loss on)")
    ax.legend()
    return fig


def _positive(value) -> float:
    """A B_simple estimate that can be drawn on a log axis, else NaN (a gap)."""
    return float(value) if value is not None and math.isfinite(value) and value > 0 else math.nan
