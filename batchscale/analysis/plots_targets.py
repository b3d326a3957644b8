"""The report's plots for several targets and for the generalization gap: B_crit against the
target value (intervals as bars, bounds as arrows), and each validation metric at the gap
budget against batch size. Plumbing in `figures`; matplotlib imported inside the functions."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from batchscale.analysis.figures import Plot, make_plot, new_axes
from batchscale.analysis.gap import NOT_MEASURED, VALIDATION_METRICS
from batchscale.analysis.summary import AnalysisSummary, TargetCriticalBatch

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

BOUND_ARROW_FACTOR = 1.6
"""How far (as a factor on the log axis) a bound's arrow points."""


def target_plot(summary: AnalysisSummary) -> Plot:
    fitted = any(math.isfinite(f.b_crit) or f.bound for f in summary.targets)
    return make_plot(
        lambda: draw_b_crit_vs_target(summary.targets),
        "B_crit vs target value, one series per metric and LR rule (bars: the 90 % interval;"
        " open markers with arrows: bounds, B_crit lies beyond them)",
        "one target value per metric: B_crit against the target needs two or more values of"
        " one metric (convergence.targets); the table above has each target's B_crit"
        if fitted else "no target has a B_crit or a bound",
    )


def gap_plots(table: pd.DataFrame) -> list[Plot]:
    """One plot per validation metric at the gap budget."""
    metrics = [m for m in VALIDATION_METRICS if m in table.columns]
    return [
        make_plot(
            lambda metric=metric: draw_gap(table, metric),
            f"{metric} after the same data seen vs batch size, one line per LR rule"
            " (median over seeds)",
            NOT_MEASURED,
        )
        for metric in metrics
    ]


def draw_b_crit_vs_target(fits: tuple[TargetCriticalBatch, ...]) -> Figure | None:
    series: dict[tuple[str, str], list[TargetCriticalBatch]] = {}
    for fit in fits:
        if math.isfinite(fit.value) and (math.isfinite(fit.b_crit) or fit.bound):
            series.setdefault((fit.metric, fit.rule), []).append(fit)
    # A line against the target needs two target values: a lone point is not a trend.
    series = {key: points for key, points in series.items()
              if len({p.value for p in points}) >= 2}
    if not series:
        return None
    fig, ax = new_axes("target value", "B_crit (batch size)", x_base=None, log_y=True)
    for i, ((metric, rule), points) in enumerate(series.items()):
        _draw_series(ax, f"C{i}", f"{metric}, {rule} rule", points)
    ax.legend(fontsize="small")
    return fig


def _draw_series(ax: Axes, color: str, label: str, points: list[TargetCriticalBatch]) -> None:
    numbers = [p for p in points if not p.bound]
    if numbers:
        x = np.array([p.value for p in numbers])
        y = np.array([p.b_crit for p in numbers])
        low = np.array([p.b_crit_low for p in numbers])
        high = np.array([p.b_crit_high for p in numbers])
        has = np.isfinite(low) & np.isfinite(high)
        yerr = np.vstack([np.where(has, y - low, 0.0), np.where(has, high - y, 0.0)])
        ax.errorbar(x, y, yerr=np.clip(yerr, 0.0, None), fmt="o-", color=color, capsize=3,
                    label=label)
    for p in points:
        if not p.bound:
            continue
        up = p.bound == "above"
        tip = p.bound_batch * (BOUND_ARROW_FACTOR if up else 1 / BOUND_ARROW_FACTOR)
        ax.annotate("", (p.value, tip), (p.value, p.bound_batch),
                    arrowprops={"arrowstyle": "->", "color": color})
        ax.plot([p.value], [p.bound_batch], "o", mfc="none", color=color,
                label=f"{label}: bound ({p.bound} {p.bound_batch:g})")


def draw_gap(table: pd.DataFrame, metric: str) -> Figure | None:
    values = pd.to_numeric(table[metric], errors="coerce")
    drawn = table[np.isfinite(values)]
    if drawn.empty:
        return None
    fig, ax = new_axes("batch size", f"{metric} at the gap budget")
    for i, (rule, cells) in enumerate(drawn.groupby("lr_rule", sort=True)):
        cells = cells.sort_values("batch_size")
        ax.plot(cells["batch_size"], cells[metric], "o-", color=f"C{i}", label=str(rule))
    ax.legend()
    return fig
