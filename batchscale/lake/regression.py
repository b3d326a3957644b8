"""Throughput regression check: this run's samples/s against the trailing history in the lake.

A cell is (workload, device, precision, input mode, batch size) of the throughput sweep. Its
series is the samples/s of the complete runs published before this one that measured the cell
well and are comparable with it (comparable.py: rows flagged unstable and runs disturbed as a
whole are left out; a run on another device, thread count, precision, ... is another series; a
run on another torch, CUDA, driver or image is the same series), then this run's. A run's
figure is the median of its stable timed rows of the cell.

The verdict, in this order: a run disturbed as a whole is "not_judged" ("measurement
disturbed"), as is a cell whose timed rows are all unstable (the row's `quality_reason`); a
cell not comparable with the last earlier run measured well is "environment_changed", naming
the fields that differ, with the step against that environment's baseline in `change`.
Otherwise the change-point test (changepoints.py) decides: fewer than MIN_HISTORY_RUNS earlier
runs is "insufficient_history"; one run below the baseline (a blip, or the start of a step) is
"suspected"; two or more in a row are "confirmed", and a confirmed cell names its last good and
first bad run, their commits and figures, and what changed between them (commit, version,
torch, CUDA, driver, Python, image). A software change since the previous run is named in the
reason of a cell that is not confirmed. A cell that timed fine in history but now ran out of
memory or failed lies below any baseline. Improvements are never flagged. Only "confirmed"
fails a run (`publish.fail_on_regression`); the rest are reported.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from batchscale.errors import BatchscaleError
from batchscale.lake.changepoints import (
    CONFIRMED,
    INSUFFICIENT_HISTORY,
    MIN_HISTORY_RUNS,
    NOISE_MADS,
    OK,
    SUSPECTED,
    TOO_NOISY,
    Baseline,
    Detection,
    detect,
)
from batchscale.lake.comparable import (
    ATTRIBUTION_FIELDS,
    CELL_KEYS,
    DEFAULT_MAX_CPU_WAIT_SHARE,
    DEFAULT_MAX_UNSTABLE_SHARE,
    FINGERPRINT_FIELDS,
    MEASUREMENT_COLUMNS,
    RUN_FIELDS,
    SOFTWARE_FIELDS,
    differences,
    disturbance,
    fingerprint_text,
    per_run_cells,
    same_fingerprint,
    series_cells,
    with_measurement_columns,
)
from batchscale.lake.lake import read_lake_table
from batchscale.lake.next_run import next_run_interval
from batchscale.lake.verdicts import (
    ENVIRONMENT_CHANGED,
    JUDGED,
    LEGACY_REGRESSION,
    NOT_JUDGED,
    attribution_text,
    disturbed_reason,
    environment_changes,
    regressed_cells,
    regressions_markdown,
    suspected_cells,
    unstable_cells,
    verdict_lines,
)
from batchscale.schemas import REGRESSIONS, TrialStatus
from batchscale.storage import ObjectStore

__all__ = ["CONFIRMED", "ENVIRONMENT_CHANGED", "INSUFFICIENT_HISTORY", "JUDGED",
           "LEGACY_REGRESSION", "MIN_HISTORY_RUNS", "NOISE_MADS", "NOT_JUDGED", "NO_REGRESSION",
           "SUSPECTED", "TOO_NOISY", "RegressionFound", "check_regressions", "disturbed_reason",
           "environment_changes", "read_history", "regressed_cells", "regressions_markdown",
           "regressions_table", "suspected_cells", "unstable_cells", "verdict_lines"]

NO_REGRESSION = OK
CELL_FIELDS = tuple(dict.fromkeys((*CELL_KEYS, *FINGERPRINT_FIELDS, *ATTRIBUTION_FIELDS)))
HISTORY_COLUMNS = list(dict.fromkeys(["run_id", "status", "samples_per_s", *CELL_FIELDS,
                                      *MEASUREMENT_COLUMNS, *RUN_FIELDS]))
"""The sweep columns the check reads from the lake (`date` is the partition)."""


class RegressionFound(BatchscaleError):
    """A scheduled benchmark got slower (publish.fail_on_regression)."""

    exit_code = 4


def _rate(cell: dict) -> float:
    """The cell's samples/s, NaN when it did not time."""
    return float(cell["samples_per_s"]) if cell["status"] == TrialStatus.OK else math.nan


def _figures(baseline: Baseline, cell: dict) -> dict:
    change = (cell["samples_per_s"] / baseline.median - 1.0
              if baseline.runs and cell["status"] == TrialStatus.OK else math.nan)
    return {"history_runs": baseline.runs, "history_median": baseline.median,
            "history_mad": baseline.mad, "allowed_drop": baseline.allowed_drop,
            "change": change}


def judge_series(series: pd.DataFrame, cell: dict, history_runs: int) -> dict:
    """The change-point verdict of `cell` after the comparable earlier cells `series`."""
    rows = [*series.to_dict("records"), cell]
    found = detect([_rate(r) for r in rows], history_runs)
    verdict = {**_figures(found.baseline, cell), "verdict": found.verdict, "reason": None,
               "runs_below": found.runs_below}
    if found.verdict == INSUFFICIENT_HISTORY:
        n = found.baseline.runs
        verdict["reason"] = (f"{n} earlier run{'s' if n != 1 else ''} judged well with this "
                             f"fingerprint; {MIN_HISTORY_RUNS} needed")
    elif found.verdict == TOO_NOISY:
        verdict["reason"] = too_noisy_reason(found.baseline)
    elif found.verdict == CONFIRMED:
        verdict.update(_attribution(rows, found))
    return verdict


def too_noisy_reason(baseline: Baseline) -> str:
    """Why a history cannot judge: the drop its noise lets pass, against its median."""
    return (f"its history scatters too much to see a drop: the noise allows a drop of "
            f"{baseline.allowed_drop:,.0f} samples/s, {baseline.allowed_drop / baseline.median:.0%}"
            f" of the median {baseline.median:,.0f} over {baseline.runs} runs, so even a halved "
            "throughput would pass (measure the history on a quiet node: pin CPUs, no "
            "neighbours)")


def _attribution(rows: list[dict], found: Detection) -> dict:
    """The last good and first bad run of a confirmed shift, and what changed between them."""
    good, bad = rows[found.last_good], rows[found.first_bad]
    return {"last_good_run_id": good["run_id"], "last_good_commit": good["git_commit"],
            "first_bad_run_id": bad["run_id"], "first_bad_commit": bad["git_commit"],
            "attribution": attribution_text(good, bad, ATTRIBUTION_FIELDS)}


def judge_cell(cell: dict, past: pd.DataFrame | None, history_runs: int,
               disturbed: str | None) -> dict:
    """One REGRESSIONS row: `cell` of this run against the earlier cells `past`. When the
    environment changed, the figures compare with the previous environment's baseline (the
    step); otherwise with this one's."""
    same_cell = _same_cell(past, cell)
    last = same_cell.iloc[-1].to_dict() if len(same_cell) else None
    changed = differences(last, cell) if last else []
    series = same_cell[same_fingerprint(same_cell, last if changed else cell)]
    row = {**{k: cell[k] for k in ("run_id", *CELL_KEYS, "status", "samples_per_s")},
           **judge_series(series, cell, history_runs), "fingerprint": fingerprint_text(cell)}
    if disturbed:
        row.update(verdict=NOT_JUDGED, reason=disturbed)
    elif cell["status"] == TrialStatus.OK and not cell["trusted"]:
        row.update(verdict=NOT_JUDGED,
                   reason=f"unstable: {_text_or(cell['quality_reason'], 'no reason recorded')}")
    elif changed:
        timed = np.array([_rate(r) for r in series.to_dict("records")], dtype=float)
        before = Baseline.of(timed[np.isfinite(timed)][-history_runs:])
        row.update(_figures(before, cell), verdict=ENVIRONMENT_CHANGED,
                   reason=f"{', '.join(changed)}: new baseline")
    elif last and row["verdict"] != CONFIRMED and (
            software := differences(last, cell, SOFTWARE_FIELDS)):
        row["reason"] = (f"{', '.join(software)} since run {last['run_id']}: compared across "
                         "the change" + (f"; {row['reason']}" if row["reason"] else ""))
    earlier = [] if changed else [_rate(r) for r in series.to_dict("records")]
    row.update(_next_run(earlier, cell, row["verdict"] != NOT_JUDGED))
    if row["verdict"] != CONFIRMED:
        row.update(runs_below=row["runs_below"] if row["verdict"] in JUDGED else None,
                   **dict.fromkeys(("last_good_run_id", "last_good_commit", "first_bad_run_id",
                                    "first_bad_commit", "attribution")))
    return row


def _next_run(earlier: list[float], cell: dict, judged: bool) -> dict:
    """The cell's next-run interval (next_run.py) from the comparable earlier runs' samples/s
    (those that did not time are skipped) and this run's, with the row's own rerun interval;
    null for a cell measured badly or not timed."""
    columns = ("next_run_low", "next_run_high", "next_run_basis")
    if not judged or cell["status"] != TrialStatus.OK:
        return dict.fromkeys(columns)
    found = next_run_interval([*(r for r in earlier if math.isfinite(r)), _rate(cell)],
                              (cell.get("samples_per_s_low"), cell.get("samples_per_s_high")))
    return dict(zip(columns, found, strict=True)) if found else dict.fromkeys(columns)


def _same_cell(past: pd.DataFrame | None, cell: dict) -> pd.DataFrame:
    """The earlier runs' figures of `cell`, oldest first."""
    if past is None or past.empty:
        return pd.DataFrame(columns=[*CELL_FIELDS, "run_id", "status", "samples_per_s"])
    return past[np.logical_and.reduce([past[k].eq(cell[k]).to_numpy() for k in CELL_KEYS])]


def _text_or(value: object, fallback: str) -> str:
    return fallback if value is None or pd.isna(value) else str(value)


def check_regressions(current: pd.DataFrame, history: pd.DataFrame | None, history_runs: int,
                      max_unstable_share: float | None = DEFAULT_MAX_UNSTABLE_SHARE,
                      max_cpu_wait_share: float | None = DEFAULT_MAX_CPU_WAIT_SHARE,
                      ) -> pd.DataFrame:
    """One row per cell of `current` (one run's sweep) with its verdict against `history`
    (sweep rows of earlier runs, oldest first), columns of REGRESSIONS. The two shares are the
    sweep's own limits (`sweep.max_unstable_share`, `sweep.max_cpu_wait_share`)."""
    disturbed = disturbance(current, max_unstable_share, max_cpu_wait_share)
    past = series_cells(history, max_unstable_share, max_cpu_wait_share)
    rows = [judge_cell(cell, past, history_runs, disturbed)
            for cell in per_run_cells(current).to_dict("records")]
    frame = pd.DataFrame(rows, columns=REGRESSIONS.names)
    return frame.astype({"runs_below": "Int64"})  # null where not judged, not NaN


def read_history(store: ObjectStore, run_id: str, workloads: list[str]) -> pd.DataFrame | None:
    """Sweep rows of `workloads` from the complete runs other than `run_id`, oldest first.

    Publish judges a run before writing its manifest, so every complete run is an earlier one.
    The lake reads older partitions under today's schema, so their quality and fingerprint
    columns come back null (stable, not recorded: see comparable.py).
    """
    others = (ds.field("run_id") != run_id) & ds.field("workload").isin(workloads)
    history = read_lake_table(store, "sweep", filter=others, columns=HISTORY_COLUMNS)
    return None if history is None else with_measurement_columns(history)


def regressions_table(frame: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(frame, schema=REGRESSIONS, preserve_index=False)
