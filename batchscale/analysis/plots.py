"""The report's plots: matplotlib figures drawn off-screen (Agg) and returned as base64 PNG
`data:` URIs, so the page carries them inside and fetches nothing.

matplotlib is imported inside the drawing functions: only a report render pays for it.
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from batchscale.analysis.parallel import data_parallel_efficiency
from batchscale.analysis.summary import AnalysisSummary
from batchscale.fits import TIMING_MODES, matches, throughput_curve
from batchscale.schemas import TrialStatus

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

FIGURE_SIZE_IN = (6.4, 3.8)
FIGURE_DPI = 100
CURVE_POINTS = 200
"""Points on each fitted line."""
BYTES_PER_MIB = 2**20
MINOR_LOG_LABELS = (2, 5)
"""Minor ticks of a decade that carry a label on log axes."""
PNG_DATA_URI_PREFIX = "data:image/png;base64,"
NOT_MEASURED = "not measured in this run"
NO_SWEEP = "the throughput sweep timed no batch size"
NO_RUNS = "no batch size reached the target"


@dataclass(frozen=True)
class Plot:
    """One plot of the report: its caption and image, or why it could not be drawn."""

    caption: str
    image_uri: str | None
    """A `data:image/png;base64,…` URI; None when there was nothing to draw."""
    missing: str
    """Why there is no plot (shown instead of it)."""


def throughput_plots(sweep: pd.DataFrame, summary: AnalysisSummary) -> list[Plot]:
    """Throughput, step time and peak memory against batch size, from the sweep."""
    return [
        _plot(
            lambda: _draw_throughput(sweep, summary),
            "Throughput vs batch size (saturation batch marked)",
            NO_SWEEP,
        ),
        _plot(
            lambda: _draw_step_time(sweep, summary),
            "Step time vs batch size, with the linear model t(B) = α + βB",
            NO_SWEEP,
        ),
        _plot(
            lambda: _draw_memory(sweep, summary),
            "Peak memory vs batch size",
            "peak memory was not recorded",
        ),
    ]


def convergence_plots(
    table: pd.DataFrame, curves: pd.DataFrame, summary: AnalysisSummary
) -> list[Plot]:
    """Steps, time and examples to target per (rule, batch) of the analysis table, and B_simple
    during training, from the curves."""
    return [
        _plot(
            lambda: _draw_steps(table, summary),
            "Steps to target vs batch size: measured, perfect scaling and S_min + E_min/B",
            NO_RUNS,
        ),
        _plot(
            lambda: _draw_time_to_target(table, summary),
            "Time to target vs batch size (steps × step time)",
            NO_RUNS,
        ),
        _plot(
            lambda: _draw_tradeoff(table, summary),
            "Steps vs examples trade-off (batch sizes labelled)",
            NO_RUNS,
        ),
        _plot(
            lambda: _draw_b_simple(curves, summary),
            "Gradient noise scale B_simple during training",
            "B_simple was not recorded",
        ),
    ]


def parallel_plot(runs: pd.DataFrame) -> Plot:
    """Data-parallel efficiency over worker counts, from the convergence trials."""
    return _plot(
        lambda: _draw_dp_efficiency(runs),
        "Data-parallel efficiency: throughput(N) / (N · throughput(1))",
        f"{NOT_MEASURED} (one worker count)",
    )


# --------------------------------------------------------------------------- figure plumbing


def _plot(draw: Callable[[], Figure | None], caption: str, missing: str) -> Plot:
    fig = draw()
    return Plot(caption, None if fig is None else png_data_uri(fig), missing)


def png_data_uri(fig: Figure) -> str:
    """`fig` as a PNG `data:` URI (no timestamp or software metadata)."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return PNG_DATA_URI_PREFIX + base64.b64encode(buffer.getvalue()).decode("ascii")


def _plain_number(value: float, _pos: int | None = None) -> str:
    return f"{value:g}"


def _minor_log_label(value: float, _pos: int | None = None) -> str:
    """Label the 2× and 5× minor ticks of a log axis, so short ranges still read as numbers."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if mantissa in MINOR_LOG_LABELS else ""


def _log_axis(axis: Axis, base: float = 10) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(_plain_number))
    axis.set_minor_formatter(FuncFormatter(_minor_log_label if base == 10 else lambda *_: ""))


def _new_axes(
    xlabel: str, ylabel: str, *, x_base: float | None = 2, log_y: bool = False
) -> tuple[Figure, Axes]:
    """A fresh Agg figure and axes.

    `x_base` is the log base of the x axis (None: linear). Log axes get plain number labels.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if x_base is not None:
        ax.set_xscale("log", base=x_base)
        _log_axis(ax.xaxis, x_base)
    if log_y:
        ax.set_yscale("log")
        _log_axis(ax.yaxis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    return fig, ax


def _geometric_grid(low: float, high: float) -> np.ndarray:
    return np.geomspace(low, high, CURVE_POINTS)


# --------------------------------------------------------------------------- sweep plots


def _oom_batches(sweep: pd.DataFrame) -> list[float]:
    rows = sweep[matches(sweep, "status", TrialStatus.OOM)]
    return sorted(pd.to_numeric(rows["batch_size"], errors="coerce").dropna().unique())


def _draw_throughput(sweep: pd.DataFrame, summary: AnalysisSummary) -> Figure | None:
    curves = {mode: throughput_curve(sweep, mode) for mode in TIMING_MODES}
    curves = {mode: curve for mode, curve in curves.items() if not curve.empty}
    if not curves:
        return None
    fig, ax = _new_axes("batch size", "samples / s")
    for mode, curve in curves.items():
        ax.plot(curve["batch_size"], curve["samples_per_s"], "o-", label=f"{mode} input")
    saturation = summary.throughput.saturation_batch
    timing = curves.get(summary.throughput.timing_input_mode)
    if saturation is not None and timing is not None:
        point = timing[timing["batch_size"] == saturation]["samples_per_s"]
        ax.plot([saturation], point, "*", markersize=16, color="C3", label="saturation batch")
        ax.axvline(saturation, color="C3", linestyle=":", linewidth=1)
    oom = _oom_batches(sweep)
    if oom:
        ax.axvline(oom[0], color="black", linestyle="--", linewidth=1, label="out of memory")
    ax.legend()
    return fig


def _draw_step_time(sweep: pd.DataFrame, summary: AnalysisSummary) -> Figure | None:
    mode = summary.throughput.timing_input_mode
    if mode is None:
        return None
    curve = throughput_curve(sweep, mode)
    fig, ax = _new_axes("batch size", "step time (ms)", log_y=True)
    median = 1e3 * curve["step_time_median_s"]
    spread = [
        (median - 1e3 * curve["step_time_p10_s"]).clip(lower=0).fillna(0),
        (1e3 * curve["step_time_p90_s"] - median).clip(lower=0).fillna(0),
    ]
    ax.errorbar(
        curve["batch_size"], median, yerr=spread, fmt="o", capsize=3,
        label=f"measured ({mode}, p10–p90)",
    )
    alpha, beta = summary.step_time.alpha_s, summary.step_time.beta_s
    if math.isfinite(alpha) and math.isfinite(beta):
        grid = _geometric_grid(curve["batch_size"].min(), curve["batch_size"].max())
        model = 1e3 * (alpha + beta * grid)
        ax.plot(
            grid[model > 0], model[model > 0], "-", color="C1",
            label=f"t(B) = {1e3 * alpha:.3g} ms + {1e6 * beta:.3g} µs·B",
        )
    ax.legend()
    return fig


def _draw_memory(sweep: pd.DataFrame, summary: AnalysisSummary) -> Figure | None:
    curve = throughput_curve(sweep, summary.throughput.timing_input_mode or TIMING_MODES[0])
    curve = curve[np.isfinite(curve["peak_memory_bytes"])]
    if curve.empty:
        return None
    fig, ax = _new_axes("batch size", "peak memory (MiB)")
    ax.plot(curve["batch_size"], curve["peak_memory_bytes"] / BYTES_PER_MIB, "o", label="measured")
    memory = summary.memory
    if math.isfinite(memory.fixed_bytes):
        grid = _geometric_grid(curve["batch_size"].min(), curve["batch_size"].max())
        ax.plot(
            grid, (memory.fixed_bytes + memory.per_sample_bytes * grid) / BYTES_PER_MIB, "-",
            label="fixed + per sample·B",
        )
    if math.isfinite(memory.largest_fitting_batch):
        ax.axvline(
            memory.largest_fitting_batch, color="black", linestyle="--", linewidth=1,
            label="largest batch that fits",
        )
    ax.legend()
    return fig


# --------------------------------------------------------------------------- convergence plots


def _rule_cells(table: pd.DataFrame) -> Iterator[tuple[int, str, pd.DataFrame]]:
    """(index, rule, cells with finite steps) per LR rule, for the convergence plots."""
    for i, (rule, cells) in enumerate(table.groupby("lr_rule", sort=True)):
        cells = cells[np.isfinite(cells["steps_to_target"].astype(float))]
        if not cells.empty:
            yield i, rule, cells.sort_values("batch_size")


def _draw_steps(table: pd.DataFrame, summary: AnalysisSummary) -> Figure | None:
    drawn = list(_rule_cells(table))
    if not drawn:
        return None
    fig, ax = _new_axes("batch size", "steps to target", log_y=True)
    for i, rule, cells in drawn:
        color = f"C{i}"
        b, s = cells["batch_size"].astype(float), cells["steps_to_target"].astype(float)
        ax.plot(b, s, "o", color=color, label=f"{rule}: measured S(B)")
        ax.plot(
            b, s.iloc[0] * b.iloc[0] / b, "--", color=color, alpha=0.5, linewidth=1,
            label=f"{rule}: perfect scaling",
        )
        fit = summary.critical_batch[rule]
        if math.isfinite(fit.b_crit):
            grid = _geometric_grid(b.min(), b.max())
            ax.plot(
                grid, fit.s_min + fit.e_min / grid, "-", color=color,
                label=f"{rule}: S_min + E_min/B, B_crit ≈ {fit.b_crit:.3g}",
            )
            ax.axvline(fit.b_crit, color=color, linestyle=":", linewidth=1)
    ax.legend(fontsize="small")
    return fig


def _draw_time_to_target(table: pd.DataFrame, summary: AnalysisSummary) -> Figure | None:
    drawn = [
        (i, rule, cells[np.isfinite(cells["time_to_target_s"].astype(float))])
        for i, rule, cells in _rule_cells(table)
    ]
    drawn = [item for item in drawn if not item[2].empty]
    if not drawn:
        return None
    fig, ax = _new_axes("batch size", "time to target (s)", log_y=True)
    for i, rule, cells in drawn:
        ax.plot(cells["batch_size"], cells["time_to_target_s"], "o-", color=f"C{i}", label=rule)
    batch, rule = summary.recommendation.batch_size, summary.recommendation.lr_rule
    best = table[(table["batch_size"] == batch) & (table["lr_rule"] == rule)]
    if not best.empty:
        ax.plot(
            best["batch_size"], best["time_to_target_s"], "*", markersize=16, color="C3",
            label=f"recommended: {rule}, batch {batch}",
        )
    ax.legend()
    return fig


def _draw_tradeoff(table: pd.DataFrame, summary: AnalysisSummary) -> Figure | None:
    drawn = list(_rule_cells(table))
    if not drawn:
        return None
    fig, ax = _new_axes("steps to target", "examples to target", x_base=10, log_y=True)
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
            grid = _geometric_grid(cells["batch_size"].min(), cells["batch_size"].max())
            ax.plot(
                fit.s_min + fit.e_min / grid, fit.s_min * grid + fit.e_min, "-", color=color,
                alpha=0.7, label=f"{rule}: (S/S_min − 1)(E/E_min − 1) = 1",
            )
    ax.legend(fontsize="small")
    return fig


def _draw_b_simple(curves: pd.DataFrame, summary: AnalysisSummary) -> Figure | None:
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm

    b_simple = pd.to_numeric(curves["b_simple"], errors="coerce")
    examples = pd.to_numeric(curves["examples_seen"], errors="coerce")
    logged = curves[np.isfinite(b_simple) & (b_simple > 0) & (examples > 0)]
    if logged.empty:
        return None
    fig, ax = _new_axes("examples seen", "B_simple", x_base=10, log_y=True)
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


def _draw_dp_efficiency(runs: pd.DataFrame) -> Figure | None:
    table = data_parallel_efficiency(runs)
    if table["workers"].nunique() < 2:
        return None
    fig, ax = _new_axes("workers", "data-parallel efficiency")
    for batch, rows in table.groupby("batch_size", sort=True):
        ax.plot(rows["workers"], rows["efficiency"], "o-", label=f"batch {int(batch)}")
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
    ax.legend(fontsize="small")
    return fig
