"""The history as a PNG: throughput per batch size run after run, with each cell's baseline
band, its suspected and confirmed runs and change points, and B_crit per LR rule
(`batchscale history --plot`; the run's own report embeds the throughput panel). The figures
come from history.py's `History`."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from batchscale.errors import BatchscaleError
from batchscale.lake.history import (
    BOUND_SIGNS,
    SERIES_KEYS,
    TIME_FORMAT,
    History,
    load_history,
    throughput_lines,
    with_run,
)
from batchscale.storage import ObjectStore

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from batchscale.analysis.figures import Plot

BAND_ALPHA = 0.15
FIGURE_SIZE_IN = (8.0, 7.0)
FIGURE_DPI = 100
MAX_TICK_LABELS = 12
"""Label at most this many runs on the x axis (every k-th run beyond that)."""
RUN_ID_TAIL = 8
"""Characters of the run id shown under each tick."""
HISTORY_CAPTION = ("Throughput of this run's cells against the earlier runs on the same device "
                   "and precision (this run last)")
UNSAFE_FILE_CHARS = re.compile(r"[^A-Za-z0-9_.-]+")


def default_plot_path(workload: str) -> Path:
    return Path(f"history-{UNSAFE_FILE_CHARS.sub('_', workload)}.png")


def _run_axis(axis, history: History) -> dict[str, int]:
    """Runs evenly spaced in publication order (runs minutes or months apart stay readable),
    labelled with their publication time and the end of their id; returns run id -> x."""
    timed = history.throughput if not history.throughput.empty else history.critical
    runs = timed.drop_duplicates("run_id")
    step = max(1, math.ceil(len(runs) / MAX_TICK_LABELS))
    shown = runs.iloc[::step]
    axis.set_xticks(range(0, len(runs), step), [
        f"{row.published_at.strftime(TIME_FORMAT)}\n{row.run_id[-RUN_ID_TAIL:]}"
        for row in shown.itertuples(index=False)], rotation=30, ha="right", fontsize="small")
    return {run_id: i for i, run_id in enumerate(runs["run_id"])}


def _plot_bounds(axis, rows: pd.DataFrame, x: dict[str, int], color: str) -> None:
    """Runs whose B_crit is only a bound: a hollow triangle at the bound pointing to the side
    where B_crit lies (no point at a number the data did not support)."""
    for bound, marker in (("above", "^"), ("below", "v")):
        bounded = rows[rows["b_crit_bound"].eq(bound)]
        if not bounded.empty:
            axis.plot(bounded["run_id"].map(x), bounded["b_crit_bound_batch"], marker,
                      markerfacecolor="none", color=color, linestyle="none",
                      label=f"B_crit {bound} (bound)")


def _cell_mask(frame: pd.DataFrame, cell: tuple) -> np.ndarray:
    """Rows of `frame` of one cell (device, precision, input mode, batch size)."""
    return np.logical_and.reduce([frame[k].eq(v).to_numpy() for k, v in
                                  zip([*SERIES_KEYS, "batch_size"], cell, strict=True)])


def _plot_verdicts(axis, history: History, cell: tuple, x: dict[str, int], color: str) -> None:
    """The cell's baseline band as judged at each run, its suspected (hollow) and confirmed
    (filled) runs, and a dashed line at each confirmed change point (first bad run)."""
    rows = history.verdicts[_cell_mask(history.verdicts, cell)]
    judged = rows[rows["history_median"].notna() & rows["allowed_drop"].notna()]
    judged = judged.assign(x=judged["run_id"].map(x)).dropna(subset=["x"]).sort_values("x")
    if len(judged):
        axis.fill_between(judged["x"], judged["history_median"] - judged["allowed_drop"],
                          judged["history_median"] + judged["allowed_drop"], color=color,
                          alpha=BAND_ALPHA, linewidth=0)
    figures = history.throughput[_cell_mask(history.throughput, cell)]
    cell_rates = figures.set_index("run_id")["samples_per_s"]
    for verdict, face in (("suspected", "none"), ("confirmed", color), ("regression", color)):
        marked = rows[rows["verdict"].eq(verdict) & rows["run_id"].isin(cell_rates.index)]
        if len(marked):
            axis.plot(marked["run_id"].map(x), cell_rates.loc[marked["run_id"]], "s",
                      markersize=9, markerfacecolor=face, markeredgecolor="red",
                      linestyle="none")
    for run_id in rows["first_bad_run_id"].dropna().unique():
        if run_id in x:
            axis.axvline(x[run_id] - 0.5, color=color, linestyle="--", linewidth=1)


def history_plot(store: ObjectStore, workload: str, run_id: str, date: str,
                 sweep: pd.DataFrame, verdicts: pd.DataFrame, analysis: pd.DataFrame | None,
                 last_runs: int) -> Plot:
    """The plot of the run's own report: its cells' series over the last `last_runs` earlier
    runs on the same device and precision, with the baseline band, the suspected and confirmed
    runs and the change points (what `batchscale history --plot` draws), this run last."""
    from batchscale.analysis.figures import Plot, png_data_uri

    try:
        past = load_history(store, workload, last=last_runs)
    except BatchscaleError:
        return Plot(HISTORY_CAPTION, None, "no earlier run of this workload is in the lake")
    pairs = sweep[["device_name", "precision"]].drop_duplicates()
    same = past.throughput.merge(pairs, on=["device_name", "precision"])
    if same.empty:
        return Plot(HISTORY_CAPTION, None, "no earlier run on this device and precision is in "
                                           "the lake")
    past = History(workload, same, past.critical, past.verdicts)
    figure = history_figure(with_run(past, run_id, date, sweep, verdicts, analysis),
                            critical=False)
    return Plot(HISTORY_CAPTION, png_data_uri(figure), "")


def plot_history(history: History, path: Path) -> Path:
    """Throughput per batch and B_crit per LR rule, run after run, as one PNG."""
    path.parent.mkdir(parents=True, exist_ok=True)
    history_figure(history).savefig(path, format="png", metadata={"Software": None})
    return path


def history_figure(history: History, critical: bool = True) -> Figure:
    """Throughput per batch and, with `critical`, B_crit per LR rule, run after run (the
    figure plot_history saves; the run's own report embeds the throughput panel alone: its
    B_crit is in the report already, and each panel costs a publish about half a second)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    size = FIGURE_SIZE_IN if critical else (FIGURE_SIZE_IN[0], FIGURE_SIZE_IN[1] / 2)
    fig = Figure(figsize=size, dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    top, bottom = fig.subplots(2, 1, sharex=True) if critical else (fig.subplots(), None)
    x = _run_axis(bottom or top, history)
    _draw_throughput(top, history, x)
    if bottom is not None:
        _draw_critical(bottom, history, x)
    else:
        top.set_xlabel("run (published, UTC)")
    return fig


def _draw_throughput(top, history: History, x: dict[str, int]) -> None:
    if history.throughput.empty:
        top.text(0.5, 0.5, throughput_lines(history)[0], ha="center", va="center",
                 transform=top.transAxes, fontsize="small")
        top.set_yticks([])
        top.set_title(f"{history.workload}: throughput per batch size", fontsize="small")
        return
    for series, rows in history.throughput.groupby([*SERIES_KEYS, "batch_size"], sort=True):
        device, precision, mode, batch = series
        [line] = top.plot(rows["run_id"].map(x), rows["samples_per_s"], "o-",
                          label=f"B={batch}, {mode}, {precision}, {device[:24]}")
        _rerun_bars(top, rows, x, line.get_color())
        unstable = rows[rows["unstable"].astype(bool)] if "unstable" in rows else rows.iloc[:0]
        if len(unstable):  # drawn hollow, as the report's sweep plot draws them
            top.plot(unstable["run_id"].map(x), unstable["samples_per_s"], "o",
                     markerfacecolor="white", markeredgecolor=line.get_color(),
                     linestyle="none")
        _plot_verdicts(top, history, series, x, line.get_color())
    top.set_yscale("log")
    top.set_ylabel("samples / s")
    # Two title lines and the legend beside the axes: one line was cut at the figure's edge,
    # and a legend inside covered the points of a workload with many batch sizes.
    top.set_title(f"{history.workload}: throughput per batch size (bars: 90 % rerun "
                  "interval)\n(band: baseline ± allowed drop; hollow circles: measured "
                  "unstably, not judged; squares: suspected, filled: confirmed; dashed: change "
                  "point)", fontsize="small", wrap=True)
    top.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _rerun_bars(axis, rows: pd.DataFrame, x: dict[str, int], color: str) -> None:
    """Each run's 90 % rerun interval of samples/s as a bar (runs published before rows
    carried one have none)."""
    if "samples_per_s_low" not in rows or "samples_per_s_high" not in rows:
        return
    low = pd.to_numeric(rows["samples_per_s_low"], errors="coerce")
    high = pd.to_numeric(rows["samples_per_s_high"], errors="coerce")
    has = low.notna() & high.notna()
    if not has.any():
        return
    rate = rows.loc[has, "samples_per_s"]
    axis.errorbar(rows.loc[has, "run_id"].map(x), rate,
                  yerr=[(rate - low[has]).clip(lower=0), (high[has] - rate).clip(lower=0)],
                  fmt="none", ecolor=color, capsize=2, alpha=0.6)


def _draw_critical(bottom, history: History, x: dict[str, int]) -> None:
    for rule, rows in history.critical.groupby("lr_rule", sort=True):
        low = (rows["b_crit"] - rows["b_crit_low"]).clip(lower=0).fillna(0)
        high = (rows["b_crit_high"] - rows["b_crit"]).clip(lower=0).fillna(0)
        line = bottom.errorbar(rows["run_id"].map(x), rows["b_crit"], yerr=[low, high],
                               fmt="o-", capsize=3, label=f"{rule} LR rule")
        _plot_bounds(bottom, rows, x, line.lines[0].get_color())
    bottom.set_ylabel("B_crit")
    bottom.set_xlabel("run (published, UTC)")
    bottom.set_title("critical batch size (90 % interval)")
    shown = history.critical[history.critical["b_crit"].notna()
                             | history.critical["b_crit_bound"].isin(list(BOUND_SIGNS))]
    if shown.empty:
        bottom.text(0.5, 0.5, "no run here has a B_crit or a bound on it (each run's "
                    "b_crit_reason in the analysis table says why)" if len(history.critical)
                    else "no analysis published for these runs", ha="center", va="center",
                    transform=bottom.transAxes, fontsize="small")
        bottom.set_yticks([])
    elif not history.critical.empty:
        bottom.legend(fontsize="small")
