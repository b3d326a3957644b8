"""Measurement quality: which sweep rows were left out as unstable and why, the conditions the
trials ran under (load average against usable CPUs, CPU time per wall second, oversubscribed
threads), the timing flags of time to target, and what to do about them — in the words the
report's quality box, the Markdown narrative and `batchscale run`'s summary share.

The sweep records the columns (quality, quality_reason, load_avg_1m, usable_cpus,
process_cpu_per_wall, threads_oversubscribed); tables from before it did are null there and
read as "not recorded", never as stable or unstable.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from batchscale import schemas
from batchscale.analysis.summary import ExcludedRow, MeasurementQuality, TimingFlag
from batchscale.conditions import (
    CPU_WAIT_SHARE,
    cpu_threads_of,
    gc_note,
    gc_rows_of,
    threads_note,
)
from batchscale.fits import NO_SWEEP_GIVEN, ensure_columns, matches, numeric_column, unstable_rows
from batchscale.schemas import TrialStatus

BUSY_LOAD_EXCESS = 0.5
"""A timed row counts as busy when its 1-minute load average exceeds the usable CPUs by more
than this. The trial's own threads make the load about equal to the CPUs it uses; half a
runnable thread more, sustained over the minute, means something else was running."""
MAX_LISTED = 6
"""Excluded rows and timing flags named one by one; the rest are counted."""
WHAT_TO_DO = (
    "rerun on a quiet node (nothing else running); pin the stage to its CPUs (taskset, or torch"
    " threads no more than the usable CPUs); on Kubernetes request Guaranteed QoS (CPU"
    " requests equal to limits, in whole CPUs, with the static CPU manager) so no neighbour"
    " shares the cores"
)
USES = "t(B), the saturation batch, B* and time to target"
MARKDOWN_SPECIALS = ("\\", "*", "_", "`", "[", "]")
"""Escaped in Markdown text (the backslash first, so the escapes are not escaped again)."""


def measurement_quality(sweep: pd.DataFrame | None, cells: pd.DataFrame) -> MeasurementQuality:
    """The quality of one run's timings from its sweep rows and the analysis cells (batch_size,
    timing_flag: one flag per batch is listed, however many LR rules share it)."""
    sweep = ensure_columns(sweep, schemas.SWEEP)
    timed = sweep[matches(sweep, "status", TrialStatus.OK)]
    load = numeric_column(timed, "load_avg_1m")
    cpus = numeric_column(timed, "usable_cpus")
    cpu_per_wall = numeric_column(timed, "process_cpu_per_wall")
    cpu_per_wall = cpu_per_wall[np.isfinite(cpu_per_wall)]
    wait = numeric_column(timed, "cpu_wait_share")
    high_load = load > cpus + BUSY_LOAD_EXCESS
    # The sweep judged these rows by their threads' own CPU wait (sweep.max_cpu_wait_share, in
    # most of their trials): its verdict stands; where no wait was recorded the load decides.
    judged_by_wait = np.isfinite(wait) & timed["quality"].notna().to_numpy()
    oversubscribed = timed["threads_oversubscribed"].eq(True).to_numpy(dtype=bool, na_value=False)
    rows = timed.to_dict("records")
    return MeasurementQuality(
        timed_rows=len(timed),
        sweep_given=not sweep.empty,
        recorded_rows=int(timed["quality"].notna().sum()),
        excluded=_excluded(timed),
        max_load_avg_1m=float(np.nanmax(load)) if np.isfinite(load).any() else math.nan,
        usable_cpus=int(np.nanmin(cpus)) if np.isfinite(cpus).any() else None,
        busy_rows=int(np.sum(high_load & ~judged_by_wait)),
        cpu_per_wall_range=(
            (float(cpu_per_wall.min()), float(cpu_per_wall.max()))
            if cpu_per_wall.size
            else (math.nan, math.nan)
        ),
        max_cpu_wait_share=float(np.nanmax(wait)) if np.isfinite(wait).any() else math.nan,
        oversubscribed_rows=int(oversubscribed.sum()),
        gpu_shared_rows=int(np.sum(numeric_column(timed, "gpu_other_processes") > 0)),
        gpu_clock_temperature=(
            _extreme(np.nanmin, numeric_column(timed, "gpu_sm_clock_mhz")),
            _extreme(np.nanmax, numeric_column(timed, "gpu_temperature_c")),
        ),
        timing_flags=_timing_flags(cells),
        gc_rows=tuple(gc_rows_of(rows)),
        cpu_threads=cpu_threads_of(rows),
        loaded_rows_judged_by_wait=int(np.sum(high_load & judged_by_wait)),
    )


def _extreme(reduce, values: np.ndarray) -> float:
    return float(reduce(values)) if np.isfinite(values).any() else math.nan


def _excluded(timed: pd.DataFrame) -> tuple[ExcludedRow, ...]:
    rows = timed[unstable_rows(timed)].sort_values(["input_mode", "batch_size"])
    return tuple(
        ExcludedRow(
            str(row.input_mode),
            int(row.batch_size),
            row.quality_reason if isinstance(row.quality_reason, str) else "no reason recorded",
        )
        for row in rows.itertuples(index=False)
    )


def _timing_flags(cells: pd.DataFrame) -> tuple[TimingFlag, ...]:
    if cells.empty or "timing_flag" not in cells:
        return ()
    flagged = cells[cells["timing_flag"].map(lambda text: isinstance(text, str))]
    flagged = flagged.drop_duplicates("batch_size").sort_values("batch_size")
    return tuple(
        TimingFlag(int(batch), text)
        for batch, text in zip(flagged["batch_size"], flagged["timing_flag"], strict=True)
    )


# --------------------------------------------------------------------------- words


def headline(quality: MeasurementQuality) -> str:
    """One short sentence: what was flagged, or that the measurements look stable."""
    if not quality.flagged:
        return stable_sentence(quality)
    parts = []
    if quality.excluded:
        parts.append(
            f"{len(quality.excluded)} of {quality.timed_rows} timed sweep rows unstable (left out)"
        )
    if quality.busy_rows:
        parts.append("the machine was busy (load above the usable CPUs)")
    if quality.oversubscribed_rows:
        parts.append("more torch threads than usable CPUs")
    if quality.gpu_shared_rows:
        parts.append("other processes on the GPU")
    if quality.timing_flags:
        count = len(quality.timing_flags)
        parts.append(
            f"{count} batch size{'s' if count > 1 else ''} whose convergence step times are"
            " flagged"
        )
    return "Some timings cannot be trusted: " + "; ".join(parts) + "."


def stable_sentence(quality: MeasurementQuality) -> str:
    """The one line shown when nothing is flagged (no alarm, but no silence about old tables)."""
    if quality.timed_rows == 0:
        return ("No sweep row was timed: nothing to judge." if quality.sweep_given else
                f"{NO_SWEEP_GIVEN[0].upper()}{NO_SWEEP_GIVEN[1:]}: time to target uses the "
                "trials' own step times.")
    if quality.recorded_rows == 0:
        return (
            f"Measurement quality was not recorded for these {quality.timed_rows} sweep rows (a"
            " table from before quality flags): they are used as measured."
        )
    text = f"Measurements look stable: none of the {quality.timed_rows} timed sweep rows flagged"
    if math.isfinite(quality.max_load_avg_1m) and quality.usable_cpus is not None:
        text += (
            f"; load average up to {quality.max_load_avg_1m:.2g} on {quality.usable_cpus}"
            f" usable CPU{'s' if quality.usable_cpus != 1 else ''}"
        ) + _loaded_but_judged(quality)
    return text + "."


def _loaded_but_judged(quality: MeasurementQuality) -> str:
    """Why rows under a load above the CPUs are not counted busy ("" when there are none)."""
    if not quality.loaded_rows_judged_by_wait:
        return ""
    return (f"; above them in {quality.loaded_rows_judged_by_wait} of {quality.timed_rows} rows"
            " that the sweep's own check of their threads' CPU wait passed (unstable only where"
            f" most of a row's trials waited {CPU_WAIT_SHARE:.0%} of their runnable time or"
            " more), so those rows count as measured well: the load average lags and counts"
            " other processes' threads")


def excluded_text(quality: MeasurementQuality) -> str:
    """The excluded rows, each with its reason."""
    listed = [
        f"{row.input_mode} batch {row.batch_size} — {row.reason}"
        for row in quality.excluded[:MAX_LISTED]
    ]
    more = len(quality.excluded) - MAX_LISTED
    if more > 0:
        listed.append(f"and {more} more")
    return (
        f"{len(quality.excluded)} of {quality.timed_rows} timed sweep rows were flagged unstable"
        f" and are not used for {USES}. {_capital('; '.join(listed))}."
    )


def conditions_text(quality: MeasurementQuality) -> str:
    """Load, CPU time and threads, in plain words ("" when nothing was recorded)."""
    parts = []
    if math.isfinite(quality.max_load_avg_1m) and quality.usable_cpus is not None:
        text = (
            f"load average (1 min) up to {quality.max_load_avg_1m:.2g} on"
            f" {quality.usable_cpus} usable CPU{'s' if quality.usable_cpus != 1 else ''}"
        )
        if quality.busy_rows:
            text += (
                f", above the CPUs in {quality.busy_rows} of {quality.timed_rows} rows: more"
                " threads wanted to run than there were CPUs, so something else was running"
            )
        text += _loaded_but_judged(quality)
        parts.append(text)
    low, high = quality.cpu_per_wall_range
    if math.isfinite(low):
        spread = f"{low:.2g}" if high - low < 0.05 else f"{low:.2g}–{high:.2g}"
        parts.append(f"the trial processes used {spread} CPU-seconds per wall second")
    if math.isfinite(quality.max_cpu_wait_share):
        parts.append(f"their threads waited for a CPU up to {quality.max_cpu_wait_share:.1%}"
                     " of their runnable time")
    if quality.oversubscribed_rows:
        parts.append(
            f"torch threads outnumbered the usable CPUs in {quality.oversubscribed_rows} rows"
            " (threads then wait for each other)"
        )
    if quality.gpu_shared_rows:
        parts.append(
            f"another process was on the GPU in {quality.gpu_shared_rows} of"
            f" {quality.timed_rows} rows (it shares the device's time and memory)"
        )
    clock, temperature = quality.gpu_clock_temperature
    if math.isfinite(clock) or math.isfinite(temperature):
        parts.append(
            "the GPU ran at"
            + (f" {clock:,.0f} MHz SM clock at the lowest" if math.isfinite(clock) else "")
            + (" and" if math.isfinite(clock) and math.isfinite(temperature) else "")
            + (f" up to {temperature:.0f} °C" if math.isfinite(temperature) else "")
        )
    return _capital("; ".join(parts)) + "." if parts else ""


def timing_text(quality: MeasurementQuality) -> str:
    """The timing flags, one per batch size."""
    listed = [f"at batch {flag.batch_size}, {flag.text}" for flag in quality.timing_flags]
    if len(listed) > MAX_LISTED:
        listed = [*listed[:MAX_LISTED], f"and {len(listed) - MAX_LISTED} more batch sizes"]
    return _capital("; ".join(listed)) + "."


def what_to_do_text() -> str:
    return _capital(WHAT_TO_DO) + "."


def quality_items(quality: MeasurementQuality) -> list[tuple[str, str]]:
    """(label, sentence) pairs of everything flagged; empty when nothing is."""
    if not quality.flagged:
        return []
    items = []
    if quality.excluded:
        items.append(("Left out", excluded_text(quality)))
    conditions = conditions_text(quality)
    if conditions:
        items.append(("Conditions", conditions))
    if quality.timing_flags:
        items.append(("Timing", timing_text(quality)))
    items.append(("What to do", what_to_do_text()))
    return items


def note_items(quality: MeasurementQuality) -> list[tuple[str, str]]:
    """(label, sentence) pairs of what bounds the figures without flagging them: the threads
    a CPU sweep ran on (its rerun intervals cannot see whole-sweep speed shifts) and the rows
    Python's garbage collector took a visible share of."""
    items = []
    if threads := threads_note(quality.cpu_threads):
        items.append(("Threads", threads))
    if quality.gc_rows:
        items.append(("Garbage collection", gc_note(quality.gc_rows)))
    return items


def box_items(quality: MeasurementQuality) -> list[tuple[str, str]]:
    """What was flagged, then the notes, then what to do (when anything was flagged)."""
    flagged, notes = quality_items(quality), note_items(quality)
    return [*flagged[:-1], *notes, *flagged[-1:]] if flagged else notes


def quality_box_markdown(quality: MeasurementQuality) -> str:
    """The report's quality box: the headline, then one item per flagged aspect, then the
    notes (`note_items`); "" when there is neither (the report then shows `stable_sentence`
    as a plain line)."""
    items = box_items(quality)
    if not items:
        return ""
    body = "\n".join(f"- **{label}.** {markdown_text(text)}" for label, text in items)
    return f"**{markdown_text(headline(quality))}**\n\n{body}\n"


def markdown_text(text: str) -> str:
    """`text` with Markdown's emphasis and link characters escaped, so "B*" or a reason the
    sweep wrote stays literal text (HTML in it is escaped by the renderer)."""
    for char in MARKDOWN_SPECIALS:
        text = text.replace(char, "\\" + char)
    return text


def quality_lines(quality: MeasurementQuality) -> list[str]:
    """Plain-text lines for a terminal (`batchscale run`, `batchscale report`)."""
    items = [f"  {label.lower()}: {text}" for label, text in box_items(quality)]
    return [f"measurement quality: {headline(quality)}", *items]


def _capital(text: str) -> str:
    return text[:1].upper() + text[1:]
