"""What the regression check may compare: rows measured well, runs not disturbed as a whole,
and earlier runs whose speed fingerprint matches this one's.

Measured well: a timed sweep row with `quality == "unstable"` (its rounds disagreed or its
trials waited for a CPU; docs/architecture.md, "Measurement rules") is neither judged nor part
of a baseline. Rows published before the quality columns existed carry nulls there and count as
stable: nothing then said they were disturbed, and dropping them would erase old baselines.

Disturbed as a whole: a run whose share of unstable timed rows exceeds the sweep's
`max_unstable_share` (the limit its validation fails on), or whose timed rows' median
`cpu_wait_share` reaches the sweep's `max_cpu_wait_share` (most of the run waited for a CPU),
says "not judged: measurement disturbed" for every cell and is left out of later baselines.

Fingerprint: the environment fields that change speed without any change of batchscale's code
(FINGERPRINT_FIELDS), of two kinds. SERIES_FIELDS make runs *not comparable* (another device,
thread or process count, precision, input size or layout): a change of one starts a new series,
"environment_changed". SOFTWARE_FIELDS (torch, and so its CUDA build; the CUDA runtime; the
NVIDIA driver; Python by major.minor; the image reference) leave runs comparable: the series
goes on across a change of one, so a slowdown that comes with a new torch or driver is
suspected, then confirmed and attributed to it like a code change. `git_commit` and
`batchscale_version` are in neither: a code change is what the check exists to catch. A field
null on either side (not recorded then, or a CPU's driver) is not a difference.

Attribution: the commit, version and software fields (ATTRIBUTION_FIELDS) travel with each cell
so a confirmed regression can name what changed between its last good and its first bad run.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from batchscale.config import SweepConfig
from batchscale.schemas import Quality, TrialStatus

SERIES_FIELDS = ("device_name", "threads", "world_size", "precision", "image_size_px",
                 "channels_last", "compiled")
"""What makes two runs not comparable: the device model, torch threads and processes, precision,
and the sweep's input size and layout/compile switches."""
SOFTWARE_FIELDS = ("torch_version", "cuda_version", "gpu_driver", "python_version", "image")
"""Software under batchscale's code: a change keeps the series and is named when it slows it."""
FINGERPRINT_FIELDS = (*SERIES_FIELDS, *SOFTWARE_FIELDS)
MEASUREMENT_COLUMNS = ("quality", "quality_reason", "cpu_wait_share")
DEFAULT_MAX_UNSTABLE_SHARE = SweepConfig.model_fields["max_unstable_share"].default
DEFAULT_MAX_CPU_WAIT_SHARE = SweepConfig.model_fields["max_cpu_wait_share"].default
ATTRIBUTION_FIELDS = ("git_commit", "batchscale_version", *SOFTWARE_FIELDS)
"""What a confirmed regression names as changed between its last good and first bad run."""
RUN_FIELDS = ("date",)
"""The run's date partition, where the rows came from the lake."""
ROW_INTERVAL_COLUMNS = ("samples_per_s_low", "samples_per_s_high")
"""A sweep row's own rerun interval (sweep/rounds.py), carried to its cell's next-run interval."""
DISTURBED = "measurement disturbed"
CELL_KEYS = ("workload", "device_name", "precision", "input_mode", "batch_size")
"""A cell of the throughput sweep; its runs' figures form its series."""


def with_measurement_columns(sweep: pd.DataFrame) -> pd.DataFrame:
    """`sweep` with the quality and fingerprint columns, all-null where an older row lacks them."""
    missing = [c for c in (*MEASUREMENT_COLUMNS, *FINGERPRINT_FIELDS, *ATTRIBUTION_FIELDS,
                           *RUN_FIELDS) if c not in sweep]
    return sweep.assign(**{c: pd.Series(None, index=sweep.index, dtype=object)
                           for c in missing})


def timed_rows(sweep: pd.DataFrame) -> pd.Series:
    return sweep["status"].eq(TrialStatus.OK)


def unstable_rows(sweep: pd.DataFrame) -> pd.Series:
    """Timed rows flagged unstable (null quality counts as stable: see the module)."""
    return timed_rows(sweep) & sweep["quality"].eq(Quality.UNSTABLE)


def disturbance(sweep: pd.DataFrame, max_unstable_share: float | None,
                max_cpu_wait_share: float | None) -> str | None:
    """Why one run's measurement was disturbed as a whole, or None if it was not."""
    sweep = with_measurement_columns(sweep)
    timed = int(timed_rows(sweep).sum())
    if not timed:
        return None
    unstable = int(unstable_rows(sweep).sum())
    if max_unstable_share is not None and unstable / timed > max_unstable_share:
        return (f"{DISTURBED}: {unstable} of {timed} timed rows unstable (more than "
                f"{max_unstable_share:.0%})")
    waits = pd.to_numeric(sweep["cpu_wait_share"][timed_rows(sweep)], errors="coerce").dropna()
    if max_cpu_wait_share is not None and len(waits) and waits.median() >= max_cpu_wait_share:
        return (f"{DISTURBED}: the trials' threads waited for a CPU {waits.median():.0%} of "
                f"their runnable time (median of the timed rows; the sweep's limit is "
                f"{max_cpu_wait_share:.0%})")
    return None


def disturbed_runs(sweep: pd.DataFrame, max_unstable_share: float | None,
                   max_cpu_wait_share: float | None) -> set[str]:
    """Run ids of `sweep` (many runs) whose measurement was disturbed as a whole."""
    return {run_id for run_id, rows in sweep.groupby("run_id", sort=False)
            if disturbance(rows, max_unstable_share, max_cpu_wait_share)}


def _recorded(value: object) -> bool:
    if value is None or value is pd.NA:
        return False
    return not (isinstance(value, float) and math.isnan(value))


def _text(value: object) -> str:
    if isinstance(value, bool | np.bool_):
        return str(bool(value)).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))  # an integer column read back with nulls becomes float
    return str(value)


def value_text(field: str, cell: dict) -> str:
    """A fingerprint field as compared: Python by major.minor (a patch release does not move
    training speed, and an image rebuild picks one up), everything else as recorded."""
    text = _text(cell[field])
    return ".".join(text.split(".")[:2]) if field == "python_version" else text


def fingerprint_text(cell: dict) -> str:
    """The recorded fingerprint fields of one cell, as "field=value; ..."."""
    return "; ".join(f"{f}={value_text(f, cell)}" for f in FINGERPRINT_FIELDS
                     if _recorded(cell[f]))


def differences(before: dict, now: dict, fields: tuple[str, ...] = SERIES_FIELDS) -> list[str]:
    """The `fields` recorded in both that differ, as "field old -> new"."""
    return [f"{f} {value_text(f, before)} -> {value_text(f, now)}" for f in fields
            if _recorded(before[f]) and _recorded(now[f])
            and value_text(f, before) != value_text(f, now)]


def same_fingerprint(cells: pd.DataFrame, cell: dict) -> np.ndarray:
    """Mask of the rows of `cells` comparable with `cell` (no SERIES_FIELDS differ)."""
    return np.array([not differences(row, cell) for row in cells.to_dict("records")],
                    dtype=bool)


def per_run_cells(sweep: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, cell), in the order of `sweep`: status ok if any row timed;
    samples_per_s the median of the stable timed rows, or of all timed rows when every one is
    unstable (`trusted` false, `quality_reason` the first reason); the fingerprint and
    attribution fields, the date, and the rows' own rerun interval where recorded: the span of
    the intervals of the rows the median was taken over (one row: its own)."""
    sweep = with_measurement_columns(sweep)
    timed, unstable = timed_rows(sweep), unstable_rows(sweep)
    keys = ["run_id", *CELL_KEYS]
    stable = pd.Series(timed & ~unstable, index=sweep.index)
    trusted = stable.groupby([sweep[k] for k in keys], sort=False, dropna=False).transform("any")
    used = stable | (~trusted & timed)  # the rows the cell's figures are taken over
    own = {c: pd.to_numeric(sweep[c], errors="coerce").where(used)
           for c in ROW_INTERVAL_COLUMNS if c in sweep}  # absent in rows written before them
    frame = sweep.assign(ok=timed, trusted=trusted, **own,
                         rate=pd.to_numeric(sweep["samples_per_s"], errors="coerce").where(used),
                         unstable_reason=sweep["quality_reason"].where(unstable))
    cells = frame.groupby(keys, sort=False, dropna=False).agg(
        **{c: (c, "min" if c.endswith("_low") else "max") for c in own},
        ok=("ok", "any"), trusted=("trusted", "any"), samples_per_s=("rate", "median"),
        status=("status", "first"), quality_reason=("unstable_reason", "first"),
        **{f: (f, "first") for f in dict.fromkeys((*FINGERPRINT_FIELDS, *ATTRIBUTION_FIELDS,
                                                   *RUN_FIELDS)) if f not in CELL_KEYS},
    ).reset_index()
    cells["status"] = cells["status"].where(~cells["ok"], TrialStatus.OK)
    return cells.drop(columns=["ok"])


def baseline_cells(history: pd.DataFrame | None, max_unstable_share: float | None,
                   max_cpu_wait_share: float | None) -> pd.DataFrame | None:
    """The cells of earlier runs that may form baselines: timed, measured well, in runs not
    disturbed as a whole; oldest first."""
    cells = series_cells(history, max_unstable_share, max_cpu_wait_share)
    return None if cells is None else cells[cells["status"].eq(TrialStatus.OK)]


def series_cells(history: pd.DataFrame | None, max_unstable_share: float | None,
                 max_cpu_wait_share: float | None) -> pd.DataFrame | None:
    """The cells of earlier runs that form a cell's series: those of `baseline_cells`, and the
    cells that did not time (out of memory, failed) in runs not disturbed as a whole (a slow
    run's step may be a failure); oldest first."""
    if history is None or not len(history):
        return None
    history = with_measurement_columns(history)
    disturbed = disturbed_runs(history, max_unstable_share, max_cpu_wait_share)
    cells = per_run_cells(history[~history["run_id"].isin(disturbed)])
    return cells[cells["trusted"] | cells["status"].ne(TrialStatus.OK)]
