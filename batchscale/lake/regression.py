"""Throughput regression check: this run's samples/s against the trailing history in the lake.

A cell is (workload, device, precision, input mode, batch size) of the throughput sweep. Its
baseline is the samples/s of the last `history_runs` complete runs published before this one
that timed the same cell successfully and were measured well, with the same speed fingerprint
(comparable.py: rows flagged unstable and runs disturbed as a whole are left out; a run on
another torch, thread count, ... is another baseline). A run's figure is the median of its
stable timed rows of the cell. With at least MIN_HISTORY_RUNS such runs, m their median and
MAD = median(|x − m|), the cell has regressed when

    m − current > max(NOISE_MADS · 1.4826 · MAD, MIN_DROP_SHARE · m)

1.4826·MAD estimates the standard deviation of normal noise while ignoring an odd outlier
run; three of them make a false alarm rare (≈0.1 % per cell for normal noise). The floor keeps
a history that happens to be quiet from flagging a few-percent wobble. A cell that timed fine in
history but now ran out of memory or failed has regressed too. Improvements are not flagged.

Before that rule, in this order: a run disturbed as a whole is not judged ("measurement
disturbed"), nor is a cell whose timed rows are all unstable (the reason is the row's
`quality_reason`); a cell whose fingerprint differs from that of the last earlier run judged
well is "environment_changed", naming the fields that differ, with the step against that
environment's baseline in `change`. Neither is a regression, so `--fail-on-regression` does not
fail on them.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from batchscale.errors import BatchscaleError
from batchscale.lake.comparable import (
    CELL_KEYS,
    DEFAULT_MAX_CPU_WAIT_SHARE,
    DEFAULT_MAX_UNSTABLE_SHARE,
    DISTURBED,
    FINGERPRINT_FIELDS,
    MEASUREMENT_COLUMNS,
    baseline_cells,
    differences,
    disturbance,
    fingerprint_text,
    per_run_cells,
    same_fingerprint,
    with_measurement_columns,
)
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
NOT_JUDGED = "not_judged"
"""Measured badly (an unstable row, or a disturbed run): no verdict either way."""
ENVIRONMENT_CHANGED = "environment_changed"
"""The speed fingerprint differs from the last run judged well: a new baseline starts."""
JUDGED = (REGRESSION, NO_REGRESSION)
CELL_FIELDS = tuple(dict.fromkeys((*CELL_KEYS, *FINGERPRINT_FIELDS)))
HISTORY_COLUMNS = list(dict.fromkeys(["run_id", "status", "samples_per_s", *CELL_FIELDS,
                                      *MEASUREMENT_COLUMNS]))
"""The sweep columns the check reads from the lake."""


class RegressionFound(BatchscaleError):
    """A scheduled benchmark got slower (publish.fail_on_regression)."""

    exit_code = 4


def judge(current: float, status: str, baseline: np.ndarray) -> dict:
    """The verdict for one cell given the baseline runs' samples/s (see the module rule)."""
    n = int(baseline.size)
    median = float(np.median(baseline)) if n else math.nan
    mad = float(np.median(np.abs(baseline - median))) if n else math.nan
    allowed = max(NOISE_MADS * MAD_TO_SIGMA * mad, MIN_DROP_SHARE * median) if n else math.nan
    change = current / median - 1.0 if n and status == TrialStatus.OK else math.nan
    if n < MIN_HISTORY_RUNS:
        verdict = INSUFFICIENT_HISTORY
        reason = (f"{n} earlier run{'s' if n != 1 else ''} judged well with this fingerprint; "
                  f"{MIN_HISTORY_RUNS} needed")
    elif status != TrialStatus.OK or median - current > allowed:
        verdict, reason = REGRESSION, None
    else:
        verdict, reason = NO_REGRESSION, None
    return {"history_runs": n, "history_median": median, "history_mad": mad,
            "allowed_drop": allowed, "change": change, "verdict": verdict, "reason": reason}


def judge_cell(cell: dict, past: pd.DataFrame | None, history_runs: int,
               disturbed: str | None) -> dict:
    """One REGRESSIONS row: `cell` of this run against the earlier cells `past`. When the
    environment changed, the figures compare with the previous environment's baseline (the
    step); otherwise with this one's."""
    same_cell = _same_cell(past, cell)
    last = same_cell.iloc[-1].to_dict() if len(same_cell) else None
    changed = differences(last, cell) if last else []
    baseline = same_cell[same_fingerprint(same_cell, last if changed else cell)]
    rates = baseline["samples_per_s"].tail(history_runs).to_numpy(dtype=float)
    row = {**{k: cell[k] for k in ("run_id", *CELL_KEYS, "status", "samples_per_s")},
           **judge(cell["samples_per_s"], cell["status"], rates),
           "fingerprint": fingerprint_text(cell)}
    if disturbed:
        row.update(verdict=NOT_JUDGED, reason=disturbed)
    elif cell["status"] == TrialStatus.OK and not cell["trusted"]:
        row.update(verdict=NOT_JUDGED,
                   reason=f"unstable: {_text_or(cell['quality_reason'], 'no reason recorded')}")
    elif changed:
        row.update(verdict=ENVIRONMENT_CHANGED, reason=f"{', '.join(changed)}: new baseline")
    return row


def _same_cell(past: pd.DataFrame | None, cell: dict) -> pd.DataFrame:
    """The earlier runs' figures of `cell`, oldest first."""
    if past is None or past.empty:
        return pd.DataFrame(columns=[*CELL_FIELDS, "samples_per_s"])
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
    past = baseline_cells(history, max_unstable_share, max_cpu_wait_share)
    rows = [judge_cell(cell, past, history_runs, disturbed)
            for cell in per_run_cells(current).to_dict("records")]
    return pd.DataFrame(rows, columns=REGRESSIONS.names)


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


def regressed_cells(frame: pd.DataFrame) -> list[str]:
    """A short description of every regressed cell, for messages and the report."""
    lines = []
    for row in frame[frame["verdict"].eq(REGRESSION)].to_dict("records"):
        cell = _cell_name(row)
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


def _cell_name(row: dict) -> str:
    return (f"{row['workload']} on {row['device_name']}, {row['precision']}, "
            f"{row['input_mode']} input, batch {row['batch_size']}")


def _with_verdict_columns(frame: pd.DataFrame) -> pd.DataFrame:
    """Tables published before `reason` and `fingerprint` existed read as null there."""
    missing = [c for c in ("reason", "fingerprint") if c not in frame]
    return frame.assign(**{c: None for c in missing})


def disturbed_reason(frame: pd.DataFrame) -> str | None:
    """The reason when the whole run was not judged because its measurement was disturbed."""
    frame = _with_verdict_columns(frame)
    reasons = frame["reason"][frame["verdict"].eq(NOT_JUDGED)].dropna()
    disturbed = reasons[reasons.str.startswith(DISTURBED)]
    return str(disturbed.iloc[0]) if len(disturbed) == len(frame) and len(frame) else None


def environment_changes(frame: pd.DataFrame) -> list[str]:
    """One line per cell whose environment changed, with the step it showed."""
    lines = []
    for row in _with_verdict_columns(frame)[frame["verdict"].eq(ENVIRONMENT_CHANGED)].to_dict(
            "records"):
        step = (f"{row['samples_per_s']:,.0f} samples/s vs median {row['history_median']:,.0f} "
                f"over {_count(row['history_runs'], 'run')} before ({_percent(row['change'])})"
                if math.isfinite(row["change"]) else f"{row['status']} now")
        lines.append(f"{_cell_name(row)}: {row['reason']}; {step}")
    return lines


def unstable_cells(frame: pd.DataFrame) -> list[str]:
    """One line per cell not judged because its own rows were unstable."""
    rows = _with_verdict_columns(frame)
    rows = rows[rows["verdict"].eq(NOT_JUDGED)].to_dict("records")
    return [f"{_cell_name(r)}: {r['samples_per_s']:,.0f} samples/s, {r['reason']}" for r in rows]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _nothing_judged(frame: pd.DataFrame) -> str:
    """"not judged: ..." with why, when no cell was judged against history."""
    counts = frame["verdict"].value_counts()
    few = f"fewer than {MIN_HISTORY_RUNS} comparable earlier runs"
    if counts.get(INSUFFICIENT_HISTORY, 0) == len(frame):
        return f"not judged: {few} of this workload in the lake"
    parts = [f"{_count(int(counts[verdict]), 'cell')} {why}" for verdict, why in (
        (ENVIRONMENT_CHANGED, "with a changed environment"), (NOT_JUDGED, "measured unstably"),
        (INSUFFICIENT_HISTORY, f"with {few}")) if counts.get(verdict, 0)]
    return f"not judged: {', '.join(parts)}"


def verdict_lines(frame: pd.DataFrame) -> list[str]:
    """The run summary's lines about the regression check (`batchscale run`, `report`)."""
    disturbed = disturbed_reason(frame)
    if disturbed:
        return [f"regressions: not judged: {disturbed} (nothing fails on it; rerun on a quiet "
                "node)"]
    judged = int(frame["verdict"].isin(JUDGED).sum())
    flagged = regressed_cells(frame)
    if flagged:
        lines = [f"regressions: {len(flagged)} of {judged} judged cells",
                 *(f"  {line}" for line in flagged)]
    elif judged:
        lines = [f"regressions: none in {judged} cells judged against history"]
    else:
        lines = [f"regressions: {_nothing_judged(frame)}"]
    lines += [f"  environment changed: {line}" for line in environment_changes(frame)]
    lines += [f"  not judged: {line}" for line in unstable_cells(frame)]
    return lines


def regressions_markdown(frame: pd.DataFrame) -> str:
    """The report's "Regressions" section, in the Markdown subset the report renders."""
    rule = (f"Rule: a drop below the median of the last runs by more than max({NOISE_MADS:g} × "
            f"1.4826 × MAD, {MIN_DROP_SHARE:.0%} of the median); at least {MIN_HISTORY_RUNS} "
            "earlier runs per cell, measured well (no unstable rows, no disturbed run) with the "
            f"same fingerprint ({', '.join(FINGERPRINT_FIELDS)}).")
    lines = ["## Regressions", ""]
    disturbed = disturbed_reason(frame)
    if disturbed:
        lines += [f"**Not judged: {disturbed}.** A regression check on these figures would "
                  "cry wolf; rerun on a quiet node (pin CPUs, request Guaranteed QoS). This "
                  "run is left out of later baselines.", "", rule]
        return "\n".join(lines) + "\n"
    flagged = regressed_cells(frame)
    judged = int(frame["verdict"].isin(JUDGED).sum())
    if flagged:
        lines.append(f"**{len(flagged)} of {judged} judged cells regressed** against history:")
        lines += ["", *(f"- {line}" for line in flagged)]
    elif judged:
        lines.append(f"No throughput regression in {judged} cells judged against history.")
    else:
        lines.append(f"{_nothing_judged(frame).capitalize()}.")  # "Not judged: ..."
    changed = environment_changes(frame)
    if changed:
        lines += ["", f"**Environment changed: new baseline** ({_count(len(changed), 'cell')}; "
                  "not regressions):", "", *(f"- {line}" for line in changed)]
    unstable = unstable_cells(frame)
    if unstable:
        lines += ["", f"Not judged, measured unstably ({_count(len(unstable), 'cell')}):", "",
                  *(f"- {line}" for line in unstable)]
    unjudged = int(frame["verdict"].eq(INSUFFICIENT_HISTORY).sum())
    if judged and unjudged:
        lines += ["", f"{_count(unjudged, 'cell')} had too little comparable history to judge."]
    return "\n".join([*lines, "", rule]) + "\n"
