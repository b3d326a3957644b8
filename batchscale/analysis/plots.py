"""The report's plots: matplotlib figures drawn off-screen (Agg) and returned as base64 PNG
`data:` URIs, so the page carries them inside and fetches nothing. The sweep and
data-parallel plots are here, the convergence plots in `plots_convergence`, the plumbing in
`figures`.

matplotlib is imported inside the drawing functions: only a report render pays for it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from batchscale.analysis.figures import (
    PNG_DATA_URI_PREFIX,
    Plot,
    geometric_grid,
    make_plot,
    new_axes,
    png_data_uri,
)
from batchscale.analysis.parallel import data_parallel_efficiency
from batchscale.analysis.plots_convergence import (
    draw_b_simple,
    draw_steps,
    draw_time_to_target,
    draw_tradeoff,
)
from batchscale.analysis.summary import AnalysisSummary
from batchscale.fits import (
    NO_SWEEP_GIVEN,
    TIMING_MODES,
    matches,
    numeric_column,
    throughput_curve,
)
from batchscale.schemas import Quality, TrialStatus

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["PNG_DATA_URI_PREFIX", "Plot", "png_data_uri"]  # the plumbing, re-exported

BYTES_PER_MIB = 2**20
NOT_MEASURED = "not measured in this run"
NO_SWEEP = "the throughput sweep timed no batch size"
NO_RUNS = "no batch size reached the target"


def throughput_plots(
    sweep: pd.DataFrame, summary: AnalysisSummary, table: pd.DataFrame | None = None
) -> list[Plot]:
    """Throughput, step time and peak memory against batch size, from the sweep (rows flagged
    unstable drawn hollow: they are left out of every fit), with the convergence runs' step
    times from the analysis `table` beside the sweep's."""
    untimed = NO_SWEEP if not sweep.empty else NO_SWEEP_GIVEN
    return [
        make_plot(
            lambda: _draw_throughput(sweep, summary),
            "Throughput vs batch size (saturation batch marked; hollow: unstable, left out)",
            untimed,
        ),
        make_plot(
            lambda: _draw_step_time(sweep, summary, table),
            _step_time_caption(summary),
            untimed,
        ),
        make_plot(
            lambda: _draw_memory(sweep, summary),
            "Peak memory vs batch size",
            "peak memory was not recorded" if not sweep.empty else NO_SWEEP_GIVEN,
        ),
    ]


def convergence_plots(
    table: pd.DataFrame, curves: pd.DataFrame, summary: AnalysisSummary,
    runs: pd.DataFrame | None = None,
) -> list[Plot]:
    """Steps, time and examples to target per (rule, batch) of the analysis table (with each
    trial of `runs`, the recommendation's target's rows), and B_simple during training, from
    the curves."""
    return [
        make_plot(
            lambda: draw_steps(table, summary, runs),
            "Steps to target vs batch size: each trial, the median over seeds, perfect scaling,"
            " S_min + E_min/B and B_crit's 90 % interval",
            NO_RUNS,
        ),
        make_plot(
            lambda: draw_time_to_target(table, summary, runs),
            "Time to target vs batch size (steps × step time): each trial and the median",
            NO_RUNS,
        ),
        make_plot(
            lambda: draw_tradeoff(table, summary),
            "Steps vs examples trade-off (batch sizes labelled)",
            NO_RUNS,
        ),
        make_plot(
            lambda: draw_b_simple(curves, summary),
            "Gradient noise scale B_simple during training" + _failed_estimates(curves),
            ("B_simple during training needs the curves table; the trials' final values are"
             " summarized in the text" if math.isfinite(summary.noise_scale.b_simple_median)
             else "B_simple was not recorded"),
        ),
    ]


def _failed_estimates(curves: pd.DataFrame) -> str:
    """Says how many logged estimates the log axis leaves out (≤ 0: failed where the noise
    swamped the squared gradient), "" where none."""
    values = pd.to_numeric(curves["b_simple"], errors="coerce") if "b_simple" in curves else []
    failed = int((values <= 0).sum()) if len(values) else 0
    return (f" ({failed} of {int(np.isfinite(values).sum())} estimates ≤ 0, failed where the "
            "noise swamped |G|², are not shown)" if failed else "")


def parallel_plot(runs: pd.DataFrame) -> Plot:
    """Data-parallel efficiency over worker counts, from the convergence trials."""
    return make_plot(
        lambda: _draw_dp_efficiency(runs),
        "Data-parallel efficiency: throughput(N) / (N · throughput(1))",
        f"{NOT_MEASURED} (one worker count)",
    )


# --------------------------------------------------------------------------- sweep plots


def _oom_batches(sweep: pd.DataFrame) -> list[float]:
    rows = sweep[matches(sweep, "status", TrialStatus.OOM)]
    return sorted(pd.to_numeric(rows["batch_size"], errors="coerce").dropna().unique())


def _unstable_points(sweep: pd.DataFrame, mode: str, column: str) -> pd.DataFrame:
    """The rows of one input mode flagged unstable: batch_size and `column`."""
    flagged = sweep[
        matches(sweep, "status", TrialStatus.OK)
        & matches(sweep, "input_mode", mode)
        & matches(sweep, "quality", Quality.UNSTABLE)
    ]
    batches = numeric_column(flagged, "batch_size")
    return pd.DataFrame({"batch_size": batches, column: numeric_column(flagged, column)}).dropna()


def _draw_unstable(ax: Axes, sweep: pd.DataFrame, mode: str, column: str, scale: float,
                   color: str) -> None:
    points = _unstable_points(sweep, mode, column)
    if not points.empty:
        ax.plot(
            points["batch_size"], scale * points[column], "o", markerfacecolor="none",
            color=color, label=f"{mode}: unstable (left out)",
        )


def _draw_rerun_band(ax, curve: pd.DataFrame, color: str, mode: str) -> None:
    """The rows' 90 % rerun intervals (sweep/rounds.py) as a band, where the rows have them."""
    band = curve.dropna(subset=["samples_per_s_low", "samples_per_s_high"])
    if band.empty:
        return
    ax.fill_between(band["batch_size"], band["samples_per_s_low"], band["samples_per_s_high"],
                    color=color, alpha=0.15, linewidth=0,
                    label=f"{mode}: 90 % rerun interval")


def _draw_throughput(sweep: pd.DataFrame, summary: AnalysisSummary) -> Figure | None:
    curves = {mode: throughput_curve(sweep, mode) for mode in TIMING_MODES}
    curves = {mode: curve for mode, curve in curves.items() if not curve.empty}
    if not curves:
        return None
    fig, ax = new_axes("batch size", "samples / s")
    for i, (mode, curve) in enumerate(curves.items()):
        ax.plot(curve["batch_size"], curve["samples_per_s"], "o-", color=f"C{i}",
                label=f"{mode} input")
        _draw_rerun_band(ax, curve, f"C{i}", mode)
        _draw_unstable(ax, sweep, mode, "samples_per_s", 1.0, f"C{i}")
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


def _draw_step_time(
    sweep: pd.DataFrame, summary: AnalysisSummary, table: pd.DataFrame | None
) -> Figure | None:
    mode = summary.throughput.timing_input_mode
    converged = _convergence_step_times(table)
    if mode is None and converged.empty:
        return None
    fig, ax = new_axes("batch size", "step time (ms)", log_y=True)
    batches = list(converged["batch_size"])
    if mode is not None:
        batches += _draw_sweep_step_times(ax, sweep, mode)
    if not converged.empty:
        ax.plot(
            converged["batch_size"], 1e3 * converged["step_time_s"], "s", color="C2",
            label="convergence runs (train time per step)",
        )
    grid = geometric_grid(min(batches), max(batches))
    _draw_line(ax, grid, (summary.step_time.alpha_s, summary.step_time.beta_s), "C1", "")
    if summary.optimal_batch_line:
        real = throughput_curve(sweep, "real")
        ax.plot(real["batch_size"], 1e3 * real["step_time_median_s"], "^", color="C4",
                label="real input (median)")
        _draw_line(ax, grid, summary.optimal_batch_step_time, "C4", "real input, B*'s line: ")
    ax.legend()
    return fig


def _draw_sweep_step_times(ax: Axes, sweep: pd.DataFrame, mode: str) -> list[float]:
    """The sweep's median step times with their p10–p90 (unstable rows hollow); the batch
    sizes drawn."""
    curve = throughput_curve(sweep, mode)
    median = 1e3 * curve["step_time_median_s"]
    spread = [
        (median - 1e3 * curve["step_time_p10_s"]).clip(lower=0).fillna(0),
        (1e3 * curve["step_time_p90_s"] - median).clip(lower=0).fillna(0),
    ]
    ax.errorbar(
        curve["batch_size"], median, yerr=spread, fmt="o", capsize=3,
        label=f"measured ({mode}, p10–p90)",
    )
    _draw_unstable(ax, sweep, mode, "step_time_median_s", 1e3, "C0")
    return list(curve["batch_size"])


def _step_time_caption(summary: AnalysisSummary) -> str:
    if summary.throughput.timing_input_mode is None:
        return ("Step time vs batch size: the convergence runs' own (train time per step), with"
                " the linear model t(B) = α + βB fitted to them (no stable sweep step time)")
    return ("Step time vs batch size, with the linear model t(B) = α + βB fitted to the stable"
            " sweep rows, and the convergence runs' step times"
            + (", and real input's line, which B* uses (the input pipeline is a bottleneck)"
               if summary.optimal_batch_line else ""))


def _draw_line(ax: Axes, grid, line: tuple[float, float], color: str, prefix: str) -> None:
    """The line t(B) = α + βB over `grid`, where both are finite and t > 0, its label
    starting with `prefix`."""
    alpha, beta = line
    if not (math.isfinite(alpha) and math.isfinite(beta)):
        return
    model = 1e3 * (alpha + beta * grid)
    ax.plot(grid[model > 0], model[model > 0], "-", color=color,
            label=f"{prefix}t(B) = {1e3 * alpha:.3g} ms + {1e6 * beta:.3g} µs·B")


def _convergence_step_times(table: pd.DataFrame | None) -> pd.DataFrame:
    """Per batch, the step time the analysis took from the convergence runs."""
    if table is None or table.empty:
        return pd.DataFrame(columns=["batch_size", "step_time_s"])
    rows = table[table["step_time_source"].eq("convergence")]
    return rows.drop_duplicates("batch_size")[["batch_size", "step_time_s"]]


def _draw_memory(sweep: pd.DataFrame, summary: AnalysisSummary) -> Figure | None:
    # The timing input mode's rows first; any mode that recorded memory otherwise, as the
    # memory model itself does (a peak is a peak whichever input fed it).
    modes = dict.fromkeys((summary.throughput.timing_input_mode or TIMING_MODES[0],
                           *TIMING_MODES))
    curves = [throughput_curve(sweep, mode) for mode in modes]
    curves = [c[np.isfinite(c["peak_memory_bytes"])] for c in curves]
    curve = next((c for c in curves if not c.empty), None)
    if curve is None:
        return None
    fig, ax = new_axes("batch size", "peak memory (MiB)")
    ax.plot(curve["batch_size"], curve["peak_memory_bytes"] / BYTES_PER_MIB, "o", label="measured")
    memory = summary.memory
    if math.isfinite(memory.fixed_bytes) and math.isfinite(memory.per_sample_bytes):
        grid = geometric_grid(curve["batch_size"].min(), curve["batch_size"].max())
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


def _draw_dp_efficiency(runs: pd.DataFrame) -> Figure | None:
    table = data_parallel_efficiency(runs)
    if table["workers"].nunique() < 2:
        return None
    fig, ax = new_axes("workers", "data-parallel efficiency")
    for batch, rows in table.groupby("batch_size", sort=True):
        if rows["workers"].nunique() < 2:  # ran with one worker count only: no line to draw
            continue
        ax.plot(rows["workers"], rows["efficiency"], "o-", label=f"batch {int(batch)}")
    beyond = table[table["efficiency"] > 1]
    if not beyond.empty:  # no group is more than ideal: such a point is timing noise (or cache)
        ax.plot(beyond["workers"], beyond["efficiency"], "x", color="red", markersize=10,
                label="above the ideal 1: NOT TRUSTED")
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1, label="ideal")
    ax.legend(fontsize="small")
    return fig
