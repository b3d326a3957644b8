"""The report's "What if" section: time to target against device-hours of every plan
row, with the B_crit interval's band as error bars, the Pareto front joined, rows where adding
workers stops helping marked by their reason, extrapolated worker counts hollow, rows that
accumulate micro-batches (per-worker batch above the memory limit) framed in a diamond; and the
section's Markdown (what was measured, what assumed, the recommendation)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from batchscale.analysis.figures import Plot, make_plot, new_axes
from batchscale.planner.model import (
    LIMIT_COMMUNICATION,
    LIMIT_MEMORY,
    LIMIT_PAST_B_CRIT,
    PlanRow,
    describe,
)
from batchscale.planner.table import Plan, past_reach, plan_lines, reach_note

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

LIMIT_MARKERS = {"": "o", LIMIT_PAST_B_CRIT: "^", LIMIT_COMMUNICATION: "s", LIMIT_MEMORY: "x"}
NO_PLAN = "no plan: the run lacks a measurement the planner needs"


def plan_plot(plan: Plan | None) -> Plot:
    return make_plot(
        lambda: None if plan is None else _draw(plan),
        "What if: time to target vs device-hours per (workers, per-worker batch); bars: the "
        "B_crit interval's band; line: Pareto front; hollow: extrapolated worker count; "
        "diamond: gradient accumulation",
        NO_PLAN,
    )


def _draw(plan: Plan) -> Figure:
    fig, ax = new_axes("device-hours", "time to target (s)", x_base=10, log_y=True)
    workers = sorted({r.workers for r in plan.rows})
    colors = dict(zip(workers, _palette(len(workers)), strict=True))
    for limit, marker in LIMIT_MARKERS.items():
        for n in workers:
            rows = [r for r in plan.rows if r.workers == n and r.limit == limit]
            if rows:
                _draw_rows(ax, rows, marker, colors[n], n not in plan.measured_workers,
                           f"N = {n}" if limit == "" or not _has_plain(plan, n) else None)
    front = plan.front
    ax.plot([r.device_hours.value for r in front], [r.time_to_target_s.value for r in front],
            "-o", color="black", linewidth=1, markersize=11, markerfacecolor="none",
            label="Pareto front (ringed)")
    _frame_accumulated(ax, [r for r in plan.rows if r.accumulation_steps > 1])
    for limit, marker in LIMIT_MARKERS.items():
        if limit:
            ax.plot([], [], marker, color="gray", linestyle="none", label=f"stops helping: {limit}")
    ax.legend(fontsize="x-small", ncol=2)
    return fig


def _frame_accumulated(ax: Axes, rows: list[PlanRow]) -> None:
    """A diamond around each row whose per-worker batch runs as k micro-batches per step."""
    if rows:
        ax.plot([r.device_hours.value for r in rows], [r.time_to_target_s.value for r in rows],
                "D", color="crimson", markersize=13, markerfacecolor="none", linestyle="none",
                label="accumulated: k micro-batches per step (b above the memory limit)")


def _has_plain(plan: Plan, n: int) -> bool:
    return any(r.workers == n and r.limit == "" for r in plan.rows)


def _draw_rows(ax: Axes, rows: list[PlanRow], marker: str, color, hollow: bool,
               label: str | None) -> None:
    x = np.array([r.device_hours.value for r in rows])
    y = np.array([r.time_to_target_s.value for r in rows])
    # An open band end (inf) is drawn to the top of the axes' data range, not to infinity.
    high = np.array([r.time_to_target_s.high for r in rows])
    high = np.where(np.isfinite(high), high, 10 * y.max())
    low = np.array([r.time_to_target_s.low for r in rows])
    ax.errorbar(x, y, yerr=[y - low, high - y], fmt=marker, color=color, label=label,
                markerfacecolor="none" if hollow else color, capsize=2, linewidth=0.8)


def _palette(count: int) -> list:
    from matplotlib import colormaps

    return [colormaps["viridis"](v) for v in np.linspace(0, 0.9, max(count, 1))][:count]


def what_if_markdown(plan: Plan | None, missing: str = "") -> str:
    """The section's prose: the recommendation, the inputs and their sources, the front."""
    if plan is None:
        return f"No plan for this run: {missing or NO_PLAN}."
    lines = plan_lines(plan)
    inputs = [line.strip() for line in lines[:5]]
    front = "\n".join(f"- {describe(r)}" for r in plan.front[:6])
    extrapolated = sorted({r.workers for r in plan.rows} - set(plan.measured_workers))
    return "\n".join([
        f"**{plan.recommendation}**", "",
        *[f"- {line}" for line in inputs], "",
        f"Worker counts {', '.join(map(str, extrapolated)) or 'none'} were not run: their "
        "step time is the model's extrapolation (one device's measured step plus the fitted "
        "or stated all-reduce), and is only as good as that model; a cluster run at those "
        "counts would check it.", "",
        "The plan's times are the model's (S(B) through B_crit's interval, times the modelled "
        "step), the recommendation card's are the trials' own measured times: at one worker "
        "the two can name different batches where their ranges overlap. For the batch to "
        "train at on the devices this run used, act on the card; the plan answers how the "
        "time and the device-hours move with more workers.", "",
        *_reach_words(plan), *_accumulation_words(plan),
        "Pareto front (fastest first):", "", front or "- (no feasible row)",
    ])


def _reach_words(plan: Plan) -> list[str]:
    """The rows past the rule's reach, where its plan has any."""
    past = sorted({r.global_batch for r in plan.rows if past_reach(r, plan.inputs)})
    if not past:
        return []
    return [f"Global batches {', '.join(f'{b:,}' for b in past)} lie {reach_note(plan.inputs)}.",
            ""]


def _accumulation_words(plan: Plan) -> list[str]:
    accumulated = sorted({(r.per_worker_batch, r.accumulation_steps, r.micro_batch)
                          for r in plan.rows if r.accumulation_steps > 1})
    if not accumulated:
        return []
    cases = ", ".join(f"b {b} = {k}×{micro}" for b, k, micro in accumulated)
    return [f"Per-worker batches above the largest that fits "
            f"({plan.inputs.max_per_worker_batch}) accumulate gradients ({cases}): k forward and "
            "backward passes of the micro-batch, one all-reduce and one optimizer step; the "
            "step time is k × one device's step at the micro-batch (a diamond in the plot).", ""]
