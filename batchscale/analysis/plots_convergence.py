"""The report's convergence plots: steps, time and examples to target per LR rule (each trial
and the median over seeds), with the fitted S = S_min + E_min/B and B_crit's 90 % interval as a
band where B_crit is a number, an arrow where it is only a bound, and the gradient noise scale
during training."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from batchscale.analysis.expected import at_fewest_workers
from batchscale.analysis.figures import geometric_grid, new_axes
from batchscale.analysis.summary import AnalysisSummary

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

BOUND_ARROW_SPAN = 8.0
"""A bound's arrow starts this factor inside the measured range (three doublings)."""
BOUND_LABEL_TOP, BOUND_LABEL_STEP = 0.9, 0.08
"""Height of the first rule's bound label (axes fraction), and the step between rules."""


def _rule_cells(table: pd.DataFrame) -> Iterator[tuple[int, str, pd.DataFrame]]:
    """(index, rule, cells with finite steps) per LR rule, for the convergence plots."""
    for i, (rule, cells) in enumerate(table.groupby("lr_rule", sort=True)):
        cells = cells[np.isfinite(cells["steps_to_target"].astype(float))]
        if not cells.empty:
            yield i, rule, cells.sort_values("batch_size")


def _seed_points(runs: pd.DataFrame | None, rule: str, column: str) -> pd.DataFrame:
    """(batch_size, value) of each reached trial of `rule` with the fewest workers run at its
    batch: the evidence behind each median."""
    if runs is None or runs.empty or column not in runs.columns:
        return pd.DataFrame({"batch_size": [], column: []})
    runs = at_fewest_workers(runs)
    value = pd.to_numeric(runs[column], errors="coerce")
    status = runs["status"] if "status" in runs.columns else "reached"
    keep = (runs["lr_rule"] == rule) & (status == "reached")
    keep &= np.isfinite(value.to_numpy(dtype=float))
    return pd.DataFrame({"batch_size": runs.loc[keep, "batch_size"].astype(float),
                         column: value[keep].astype(float)})


def draw_steps(table: pd.DataFrame, summary: AnalysisSummary,
               runs: pd.DataFrame | None = None) -> Figure | None:
    drawn = list(_rule_cells(table))
    if not drawn:
        return None
    fig, ax = new_axes("batch size", "steps to target", log_y=True)
    for i, rule, cells in drawn:
        color = f"C{i}"
        b, s = cells["batch_size"].astype(float), cells["steps_to_target"].astype(float)
        seeds = _seed_points(runs, rule, "steps_to_target")
        if not seeds.empty:
            ax.plot(seeds["batch_size"], seeds["steps_to_target"], ".", color=color, alpha=0.35,
                    label=f"{rule}: each trial")
        ax.plot(b, s, "o", color=color, label=f"{rule}: median over seeds S(B)")
        ax.plot(
            b, s.iloc[0] * b.iloc[0] / b, "--", color=color, alpha=0.5, linewidth=1,
            label=f"{rule}: perfect scaling",
        )
        fit = summary.critical_batch[rule]
        if math.isfinite(fit.b_crit):
            grid = geometric_grid(b.min(), b.max())
            ax.plot(
                grid, fit.s_min + fit.e_min / grid, "-", color=color,
                label=f"{rule}: S_min + E_min/B, B_crit ≈ {fit.b_crit:.3g}",
            )
            ax.axvline(fit.b_crit, color=color, linestyle=":", linewidth=1)
            if math.isfinite(fit.b_crit_low) and math.isfinite(fit.b_crit_high):
                ax.axvspan(fit.b_crit_low, fit.b_crit_high, color=color, alpha=0.12,
                           label=f"{rule}: B_crit 90 % interval [{fit.b_crit_low:.3g}, "
                                 f"{fit.b_crit_high:.3g}]")
        elif fit.bound:
            _draw_bound(ax, fit.bound, fit.bound_batch, i, color, rule)
    ax.legend(fontsize="small")
    return fig


def _draw_bound(ax: Axes, bound: str, batch: float, row: int, color: str, rule: str) -> None:
    """A bound on B_crit: no line at a number the data do not support, but a dotted line at the
    bound's batch and an arrow pointing at it from the measured side, towards where B_crit
    lies, with the bound in words (high in the axes, one line per LR rule `row`)."""
    if not math.isfinite(batch):
        return
    above = bound == "above"
    height = BOUND_LABEL_TOP - BOUND_LABEL_STEP * row  # axes fraction
    start = batch / BOUND_ARROW_SPAN if above else batch * BOUND_ARROW_SPAN
    ax.axvline(batch, color=color, linestyle=":", linewidth=1)
    ax.annotate(
        f"{rule}: B_crit {bound} {batch:g}", xy=(batch, height), xytext=(start, height),
        xycoords=("data", "axes fraction"), textcoords=("data", "axes fraction"),
        color=color, fontsize="small", ha="right" if above else "left", va="center",
        arrowprops={"arrowstyle": "->", "color": color},
    )


def draw_time_to_target(table: pd.DataFrame, summary: AnalysisSummary,
                        runs: pd.DataFrame | None = None) -> Figure | None:
    drawn = [
        (i, rule, cells[np.isfinite(cells["time_to_target_s"].astype(float))])
        for i, rule, cells in _rule_cells(table)
    ]
    drawn = [item for item in drawn if not item[2].empty]
    if not drawn:
        return None
    fig, ax = new_axes("batch size", "time to target (s)", log_y=True)
    for i, rule, cells in drawn:
        seeds = _seed_points(runs, rule, "time_to_target_s")
        if not seeds.empty:
            ax.plot(seeds["batch_size"], seeds["time_to_target_s"], ".", color=f"C{i}",
                    alpha=0.35, label=f"{rule}: each trial")
        ax.plot(cells["batch_size"], cells["time_to_target_s"], "o-", color=f"C{i}",
                label=f"{rule}: median over seeds")
    batch, rule = summary.recommendation.batch_size, summary.recommendation.lr_rule
    best = table[(table["batch_size"] == batch) & (table["lr_rule"] == rule)]
    if not best.empty:
        ax.plot(
            best["batch_size"], best["time_to_target_s"], "*", markersize=16, color="C3",
            label=f"recommended: {rule}, batch {batch}",
        )
    ax.legend()
    return fig


def draw_tradeoff(table: pd.DataFrame, summary: AnalysisSummary) -> Figure | None:
    drawn = list(_rule_cells(table))
    if not drawn:
        return None
    fig, ax = new_axes("steps to target", "examples to target", x_base=10, log_y=True)
    for i, rule, cells in drawn:
        color = f"C{i}"
        ax.plot(cells["steps_to_target"], cells["examples_to_target"], "o", color=color, label=rule)
        for batch, s, e in zip(
            cells["batch_size"], cells["steps_to_target"], cells["examples_to_target"], strict=True
        ):
            ax.annotate(
                f"{int(batch)}", (s, e), textcoords="offset points", xytext=(4, 4),
                fontsize="x-small", color=color,
            )
        fit = summary.critical_batch[rule]
        if math.isfinite(fit.b_crit):
            grid = geometric_grid(cells["batch_size"].min(), cells["batch_size"].max())
            ax.plot(
                fit.s_min + fit.e_min / grid, fit.s_min * grid + fit.e_min, "-", color=color,
                alpha=0.7, label=f"{rule}: (S/S_min − 1)(E/E_min − 1) = 1",
            )
    ax.legend(fontsize="small")
    return fig


def draw_b_simple(curves: pd.DataFrame, summary: AnalysisSummary) -> Figure | None:
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm

    b_simple = pd.to_numeric(curves["b_simple"], errors="coerce")
    examples = pd.to_numeric(curves["examples_seen"], errors="coerce")
    logged = curves[np.isfinite(b_simple) & (b_simple > 0) & (examples > 0)]
    if logged.empty:
        return None
    fig, ax = new_axes("examples seen", "B_simple", x_base=10, log_y=True)
    batches = sorted(logged["batch_size"].unique())
    norm = LogNorm(vmin=min(batches), vmax=max(batches) if len(batches) > 1 else min(batches) + 1)
    cmap = colormaps["viridis"]
    labelled: set = set()
    for _trial, points in logged.groupby(["batch_size", "trial_id"], sort=True):
        points = points.sort_values("step")
        batch = points["batch_size"].iloc[0]
        label = f"batch {batch}" if batch not in labelled else None
        labelled.add(batch)
        ax.plot(
            points["examples_seen"], points["b_simple"], "-", color=cmap(norm(batch)),
            linewidth=1, alpha=0.8, label=label,
        )
    for i, (rule, fit) in enumerate(summary.critical_batch.items()):
        if math.isfinite(fit.b_crit):
            ax.axhline(
                fit.b_crit, color=f"C{i + 3}", linestyle="--", linewidth=1,
                label=f"B_crit ({rule})",
            )
    ax.legend(fontsize="x-small", ncol=2)
    return fig
