"""Throughput regression check: this run's samples/s against the trailing history in the lake.

A cell is (workload, device, precision, input mode, batch size) of the throughput sweep. Its
baseline is the samples/s of the last `history_runs` complete runs published before this one
that timed the same cell successfully (the median of a run's rows if it has several). With at
least MIN_HISTORY_RUNS of them, m their median and MAD = median(|x − m|), the cell has
regressed when

    m − current > max(NOISE_MADS · 1.4826 · MAD, MIN_DROP_SHARE · m)

1.4826·MAD estimates the standard deviation of normal noise while ignoring an odd outlier
run; three of them make a false alarm rare (≈0.1 % per cell for normal noise). The floor keeps
a history that happens to be quiet from flagging a few-percent wobble. A cell that timed fine in
history but now ran out of memory or failed has regressed too. Improvements are not flagged.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from batchscale.errors import BatchscaleError
from batchscale.lake.lake import read_lake_table
from batchscale.schemas import REGRESSIONS, TrialStatus
from batchscale.storage import ObjectStore

NOISE_MADS = 3.0
"""How many robust standard deviations below the median a drop must reach."""
MAD_TO_SIGMA = 1.4826
"""MAD × this = standard deviation, for normally distributed noise."""
MIN_DROP_SHARE = 0.10
"""Drops smaller than this share of the median are never flagged: with the few runs a history
holds, the MAD itself is noisy, and a 5 % floor still gave about one false alarm in 200 cells
of 2 %-noise benchmarks; timings on shared machines wander by several percent."""
MIN_HISTORY_RUNS = 3
"""Fewer earlier runs than this cannot tell noise from a change: the cell is not judged."""
REGRESSION = "regression"
NO_REGRESSION = "ok"
INSUFFICIENT_HISTORY = "insufficient_history"
CELL_KEYS = ("workload", "device_name", "precision", "input_mode", "batch_size")
HISTORY_COLUMNS = ["run_id", "status", "samples_per_s", *CELL_KEYS]

class RegressionFound(BatchscaleError):
    """A scheduled benchmark got slower (publish.fail_on_regression)."""

    exit_code = 4


def per_run_cells(sweep: pd.DataFrame) -> pd.DataFrame:
    """One row per (run, cell), in the order of `sweep`: ok if any row timed, samples/s the
    median of the timed rows."""
    keys = ["run_id", *CELL_KEYS]
    timed = sweep.assign(
        ok=sweep["status"].eq(TrialStatus.OK),
        rate=pd.to_numeric(sweep["samples_per_s"], errors="coerce").where(
            sweep["status"].eq(TrialStatus.OK)),
    )
    grouped = timed.groupby(keys, sort=False, dropna=False)
    cells = grouped.agg(ok=("ok", "any"), samples_per_s=("rate", "median"),
                        status=("status", "first")).reset_index()
    cells["status"] = cells["status"].where(~cells["ok"], TrialStatus.OK)
    return cells.drop(columns="ok")


def judge(current: float, status: str, baseline: np.ndarray) -> dict:
    """The verdict for one cell given the baseline runs' samples/s (see the module rule)."""
    n = int(baseline.size)
    median = float(np.median(baseline)) if n else math.nan
    mad = float(np.median(np.abs(baseline - median))) if n else math.nan
    allowed = max(NOISE_MADS * MAD_TO_SIGMA * mad, MIN_DROP_SHARE * median) if n else math.nan
    change = current / median - 1.0 if n and status == TrialStatus.OK else math.nan
    if n < MIN_HISTORY_RUNS:
        verdict = INSUFFICIENT_HISTORY
    elif status != TrialStatus.OK or median - current > allowed:
        verdict = REGRESSION
    else:
        verdict = NO_REGRESSION
    return {"history_runs": n, "history_median": median, "history_mad": mad,
            "allowed_drop": allowed, "change": change, "verdict": verdict}


def check_regressions(current: pd.DataFrame, history: pd.DataFrame | None,
                      history_runs: int) -> pd.DataFrame:
    """One row per cell of `current` (one run's sweep) with its verdict against `history`
    (sweep rows of earlier runs, oldest first), columns of REGRESSIONS."""
    now = per_run_cells(current)
    past = per_run_cells(history) if history is not None and len(history) else None
    if past is not None:
        past = past[past["status"].eq(TrialStatus.OK)]
    rows = []
    for cell in now.to_dict("records"):
        baseline = np.array([], dtype=float)
        if past is not None:
            same = np.logical_and.reduce([past[k].eq(cell[k]).to_numpy() for k in CELL_KEYS])
            baseline = past[same]["samples_per_s"].tail(history_runs).to_numpy(dtype=float)
        rows.append({**{k: cell[k] for k in ("run_id", *CELL_KEYS, "status", "samples_per_s")},
                     **judge(cell["samples_per_s"], cell["status"], baseline)})
    return pd.DataFrame(rows, columns=REGRESSIONS.names)


def read_history(store: ObjectStore, run_id: str, workloads: list[str]) -> pd.DataFrame | None:
    """Sweep rows of `workloads` from the complete runs other than `run_id`, oldest first.

    Publish judges a run before writing its manifest, so every complete run is an earlier one.
    """
    others = (ds.field("run_id") != run_id) & ds.field("workload").isin(workloads)
    return read_lake_table(store, "sweep", filter=others, columns=HISTORY_COLUMNS)


def regressions_table(frame: pd.DataFrame) -> pa.Table:
    return pa.Table.from_pandas(frame, schema=REGRESSIONS, preserve_index=False)


def regressed_cells(frame: pd.DataFrame) -> list[str]:
    """A short description of every regressed cell, for messages and the report."""
    lines = []
    for row in frame[frame["verdict"].eq(REGRESSION)].to_dict("records"):
        cell = (f"{row['workload']} on {row['device_name']}, {row['precision']}, "
                f"{row['input_mode']} input, batch {row['batch_size']}")
        if row["status"] != TrialStatus.OK:
            lines.append(f"{cell}: {row['status']} now, timed fine in "
                         f"{row['history_runs']} earlier runs")
        else:
            lines.append(f"{cell}: {row['samples_per_s']:,.0f} samples/s vs median "
                         f"{row['history_median']:,.0f} ({_percent(row['change'])}; noise "
                         f"allows a drop of {row['allowed_drop']:,.0f}) over "
                         f"{row['history_runs']} runs")
    return lines


def _percent(change: float) -> str:
    return f"{change:+.1%}".replace("-", "−")


def regressions_markdown(frame: pd.DataFrame) -> str:
    """The report's "Regressions" section, in the Markdown subset the report renders."""
    rule = (f"Rule: a drop below the median of the last runs by more than max({NOISE_MADS:g} × "
            f"1.4826 × MAD, {MIN_DROP_SHARE:.0%} of the median); at least {MIN_HISTORY_RUNS} "
            "earlier runs per cell.")
    flagged = regressed_cells(frame)
    judged = int((frame["verdict"] != INSUFFICIENT_HISTORY).sum())
    lines = ["## Regressions", ""]
    if flagged:
        lines.append(f"**{len(flagged)} of {judged} judged cells regressed** against history:")
        lines += ["", *(f"- {line}" for line in flagged)]
    elif judged:
        lines.append(f"No throughput regression in {judged} cells judged against history.")
    else:
        lines.append("Not judged: fewer than "
                     f"{MIN_HISTORY_RUNS} earlier runs of this workload in the lake.")
    unjudged = len(frame) - judged
    if judged and unjudged:
        lines += ["", f"{unjudged} cells have too little history to judge."]
    return "\n".join([*lines, "", rule]) + "\n"
