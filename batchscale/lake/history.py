"""`batchscale history`: one workload's throughput and B_crit over time, read from the lake.

Reads the Hive-partitioned `sweep` and `analysis` tables of every complete run with
pyarrow.dataset through the store's pyarrow filesystem, in publication order. Prints one table
per (device, precision, input mode) and one for B_crit, and draws both into one PNG.

The regression check's verdicts, as publish recorded them run by run (the `regressions` table),
go with the throughput: the table marks suspected (`?`) and confirmed (`!`) runs, and the plot
draws each cell's baseline band (the median of its baseline ± the drop the noise allows, as
judged at each run) and a dashed vertical line at each confirmed change point (the first bad
run), so a step and a blip look different at once (the plot: history_chart.py).
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow.dataset as ds

from batchscale.errors import BadInput, BatchscaleError
from batchscale.lake.next_run import ROUNDS_ALONE
from batchscale.schemas import Quality, TrialStatus
from batchscale.storage import ObjectStore

SWEEP_COLUMNS = ["run_id", "date", "device_name", "precision", "input_mode", "batch_size",
                 "samples_per_s", "quality", "samples_per_s_low", "samples_per_s_high"]
ANALYSIS_COLUMNS = ["run_id", "date", "lr_rule", "b_crit", "b_crit_low", "b_crit_high",
                    "b_crit_bound", "b_crit_bound_batch", "target_metric", "target_value",
                    "b_crit_reason"]
"""The analysis columns history shows; the bound and target columns are absent from partitions
published before B_crit could be a bound or targets were named, and read as none there."""
VERDICT_COLUMNS = ["run_id", "device_name", "precision", "input_mode", "batch_size", "verdict",
                   "history_median", "allowed_drop", "first_bad_run_id", "next_run_low",
                   "next_run_high", "next_run_basis", "reason"]
"""The regressions columns history shows (first_bad_run_id and the next-run range are null in
older tables)."""
VERDICT_MARKS = {"suspected": "?", "confirmed": "!", "regression": "!"}
"""How the text table marks a run's figure; "regression" is the verdict of older tables."""
UNSTABLE_MARK = "~"
"""A figure measured unstably (its rounds disagreed, or its trials waited for a CPU)."""
BOUND_SIGNS = {"above": ">", "below": "<"}
SERIES_KEYS = ["device_name", "precision", "input_mode"]
RUN_KEYS = ["published_at", "date", "run_id"]
TIME_FORMAT = "%Y-%m-%d %H:%M"


@dataclass(frozen=True)
class History:
    """Per run: samples/s per batch (`throughput`) and B_crit per LR rule (`critical`)."""

    workload: str
    throughput: pd.DataFrame
    """RUN_KEYS, SERIES_KEYS, batch_size, samples_per_s (median of the run's ok rows), unstable
    (any of those rows flagged unstable)."""
    critical: pd.DataFrame
    """RUN_KEYS, lr_rule, b_crit, b_crit_low, b_crit_high, b_crit_bound, b_crit_bound_batch."""
    verdicts: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=VERDICT_COLUMNS))
    """VERDICT_COLUMNS: the regression check's verdict per run and cell, as published."""


def load_history(store: ObjectStore, workload: str, device: str | None = None,
                 precision: str | None = None, last: int | None = None) -> History:
    """The workload's history; `device` matches device names case-insensitively as a
    substring ("h200", "xeon"); `last` keeps the most recent runs."""
    from batchscale.lake.lake import read_lake_table

    timed = (ds.field("workload") == workload) & (ds.field("status") == TrialStatus.OK)
    sweep = read_lake_table(store, "sweep", filter=timed, columns=SWEEP_COLUMNS)
    if sweep is None:
        return _history_without_throughput(store, workload, device, precision, last)
    if device:
        sweep = sweep[sweep["device_name"].str.contains(device, case=False, regex=False)]
    if precision:
        sweep = sweep[sweep["precision"] == precision]
    runs = sweep["run_id"].drop_duplicates()
    if last:
        runs = runs.tail(last)
    sweep = sweep[sweep["run_id"].isin(runs)]
    if sweep.empty:
        raise BatchscaleError(f"no run of {workload!r} matches --device {device!r} "
                              f"--precision {precision!r}")
    # Every column, not ANALYSIS_COLUMNS: the lake scans under today's schema (old partitions
    # read as nulls there), and `_critical` fills what a table from elsewhere lacks.
    analysis = read_lake_table(store, "analysis", filter=ds.field("run_id").isin(runs.tolist()))
    verdicts = read_lake_table(store, "regressions", columns=VERDICT_COLUMNS,
                               filter=(ds.field("workload") == workload)
                               & ds.field("run_id").isin(runs.tolist()))
    return History(workload, _throughput(sweep), _critical(analysis), _verdicts(verdicts))


def _history_without_throughput(store: ObjectStore, workload: str, device: str | None,
                                precision: str | None, last: int | None) -> History:
    """A workload whose runs published no timed sweep row (a TrainingLoop has no sweep, or
    every row ran out of memory): its B_crit over time alone, from the analysis table."""
    from batchscale.lake.lake import read_lake_table

    analysis = read_lake_table(store, "analysis", filter=ds.field("workload") == workload)
    if analysis is None:
        there = lake_workloads(store)
        close = difflib.get_close_matches(workload, there, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise BadInput(f"no published run of workload {workload!r} in "
                       f"s3://{store.settings.bucket}/{store.key()}{hint}; "
                       f"workloads there: {', '.join(there) or 'none'}")
    if precision:
        raise BatchscaleError(f"--precision: the runs of {workload!r} published no timed "
                              "sweep row (a TrainingLoop's runs have none), so none records a "
                              "precision")
    if device:
        analysis = analysis[analysis["device_name"].str.contains(device, case=False,
                                                                 regex=False)]
    runs = analysis["run_id"].drop_duplicates()
    analysis = analysis[analysis["run_id"].isin(runs.tail(last) if last else runs)]
    if analysis.empty:
        raise BatchscaleError(f"no run of {workload!r} matches --device {device!r}")
    throughput = pd.DataFrame(columns=[*RUN_KEYS, *SERIES_KEYS, "batch_size", "samples_per_s",
                                       "unstable"])
    return History(workload, throughput, _critical(analysis), _verdicts(None))


def _verdicts(verdicts: pd.DataFrame | None) -> pd.DataFrame:
    # reindex: a frame given in memory may lack the newer columns, read as null there
    return (pd.DataFrame(columns=VERDICT_COLUMNS) if verdicts is None
            else verdicts.reindex(columns=VERDICT_COLUMNS).reset_index(drop=True))


def lake_workloads(store: ObjectStore) -> list[str]:
    from batchscale.lake.lake import read_lake_table

    found: set[str] = set()
    for kind in ("sweep", "analysis"):  # a TrainingLoop's runs publish no sweep rows
        table = read_lake_table(store, kind, columns=["run_id", "workload"])
        found |= set() if table is None else set(table["workload"])
    return sorted(found)


def _throughput(sweep: pd.DataFrame) -> pd.DataFrame:
    keys = [*RUN_KEYS, *SERIES_KEYS, "batch_size"]
    quality = sweep["quality"] if "quality" in sweep else pd.Series(None, index=sweep.index)
    sweep = sweep.assign(unstable=quality.eq(Quality.UNSTABLE))
    for end in ("samples_per_s_low", "samples_per_s_high"):  # absent before rerun intervals
        if end not in sweep:
            sweep = sweep.assign(**{end: math.nan})
    return sweep.groupby(keys, sort=False).agg(
        samples_per_s=("samples_per_s", "median"), unstable=("unstable", "any"),
        samples_per_s_low=("samples_per_s_low", "median"),
        samples_per_s_high=("samples_per_s_high", "median")).reset_index()


def _critical(analysis: pd.DataFrame | None) -> pd.DataFrame:
    columns = [*RUN_KEYS, *ANALYSIS_COLUMNS[2:]]
    if analysis is None:
        return pd.DataFrame(columns=columns)
    if "b_crit_bound" not in analysis:
        analysis = analysis.assign(b_crit_bound=None, b_crit_bound_batch=math.nan)
    if "target_metric" not in analysis:
        analysis = analysis.assign(target_metric=None, target_value=math.nan)
    if "b_crit_reason" not in analysis:
        analysis = analysis.assign(b_crit_reason=None)
    critical = analysis[columns].drop_duplicates([*RUN_KEYS, "lr_rule"])
    if "batch_size" not in analysis:
        return critical.assign(smallest_batch=math.nan, largest_batch=math.nan)
    # the batches each rule's fit was measured over: where its interval reaches past them
    span = (pd.to_numeric(analysis["batch_size"], errors="coerce")
            .groupby([analysis["run_id"], analysis["lr_rule"]]).agg(["min", "max"])
            .rename(columns={"min": "smallest_batch", "max": "largest_batch"}))
    return critical.join(span, on=["run_id", "lr_rule"])


def _number(value: float) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:,.0f}"


RUN_ID_WIDTH = 28
"""The run_id column's width: a generated run id's; a study variant's longer id widens it."""


def _id_width(run_ids) -> int:
    return max([RUN_ID_WIDTH, *(len(str(r)) for r in run_ids)])


def _run_label(row, width: int = RUN_ID_WIDTH) -> str:
    return f"{row.published_at.strftime(TIME_FORMAT)}  {row.run_id:{width}s}"


def _marks(history: History) -> dict[tuple, str]:
    """(run_id, device, precision, mode, batch) -> the mark of its verdict, where it has one,
    else UNSTABLE_MARK where it was measured unstably."""
    frame = history.throughput
    unstable = frame[frame["unstable"].astype(bool)] if "unstable" in frame else frame.iloc[:0]
    marks = {(r.run_id, r.device_name, r.precision, r.input_mode, r.batch_size): UNSTABLE_MARK
             for r in unstable.itertuples(index=False)}
    rows = history.verdicts[history.verdicts["verdict"].isin(VERDICT_MARKS)]
    marks.update({(r.run_id, r.device_name, r.precision, r.input_mode, r.batch_size):
                  VERDICT_MARKS[r.verdict] for r in rows.itertuples(index=False)})
    return marks


def throughput_lines(history: History) -> list[str]:
    if history.throughput.empty:
        return [f"samples/s: no timed sweep row published for {history.workload} (a "
                "TrainingLoop's runs have none)"]
    lines, marks = [], _marks(history)
    for series, rows in history.throughput.groupby(SERIES_KEYS, sort=True):
        device, precision, mode = series
        table = rows.pivot_table(index=RUN_KEYS, columns="batch_size", values="samples_per_s",
                                 sort=False)
        table = table.reset_index().sort_values(["published_at", "run_id"])
        batches = [c for c in table.columns if c not in RUN_KEYS]
        width = _id_width(table["run_id"])
        lines += [f"samples/s — {device}, {precision}, {mode} input",
                  f"  {'published (UTC)':16s}  {'run_id':{width}s}"
                  + "".join(f"{f'B={b}':>12s}" for b in batches)]
        for row in table.itertuples(index=False):
            values = dict(zip(table.columns, row, strict=True))
            lines.append(f"  {_run_label(row, width)}" + "".join(
                f"{_number(values[b]) + marks.get((row.run_id, *series, b), ' '):>12s}"
                for b in batches))
        latest = table["run_id"].iloc[-1]
        lines.append(next_run_line(history, series, latest) or no_next_run_line(history, latest))
    if set(marks.values()) & set(VERDICT_MARKS.values()):
        lines.append("  ? suspected (one run below its baseline), ! confirmed regression "
                     "(two or more in a row), as the regression check judged each run")
    if UNSTABLE_MARK in marks.values():
        lines.append(f"  {UNSTABLE_MARK} measured unstably (rounds disagreed, or its trials "
                     "waited for a CPU): not judged, not part of any baseline")
    return lines


def no_next_run_line(history: History, run_id: str) -> str:
    """Why the latest run gives no next-run range: its regression check did not judge it (with
    the check's reason), or it has no check recorded."""
    rows = history.verdicts[history.verdicts["run_id"].eq(run_id)]
    if rows.empty:
        return (f"  next run: no range: run {run_id} has no regression check recorded (a study "
                "variant, or a run published before the check gave ranges)")
    badly = rows[rows["verdict"].eq("not_judged")]
    if badly.empty:
        return (f"  next run: no range: the regression check of run {run_id} gave none (a "
                "table published before it did)")
    reasons = badly["reason"].dropna() if "reason" in badly else pd.Series(dtype=object)
    why = f" ({reasons.iloc[0]})" if len(reasons) else ""
    return (f"  next run: no range: the latest run, {run_id}, was measured too badly to give "
            f"one{why}; a range needs a run the check could judge")


def next_run_line(history: History, series: tuple, run_id: str) -> str | None:
    """"  next run should land in (90 %, …): B=16 9,100–12,400; ..." from the regression
    check of the series' latest run (lake/next_run.py); None where it gave no range (older
    tables, nothing timed well, a History built without those columns)."""
    frame = history.verdicts
    if not {"next_run_low", "next_run_high"} <= set(frame.columns):
        return None
    mine = frame[frame["run_id"].eq(run_id) & np.logical_and.reduce(
        [frame[k].eq(v).to_numpy() for k, v in zip(SERIES_KEYS, series, strict=True)])]
    mine = mine.dropna(subset=["next_run_low", "next_run_high"]).sort_values("batch_size")
    if mine.empty:
        return None
    alone = (mine["next_run_basis"].eq(ROUNDS_ALONE) if "next_run_basis" in mine
             else pd.Series(False, index=mine.index))
    ranges = "; ".join(f"B={r.batch_size}{'*' if one else ''} {_number(r.next_run_low)}–"
                       f"{_number(r.next_run_high)}"
                       for r, one in zip(mine.itertuples(index=False), alone, strict=True))
    line = f"  next run should land in (90 %, docs/lake.md): {ranges}"
    if alone.any():
        line += (f"\n  * {ROUNDS_ALONE}: the range of this run's rounds, which sees no drift "
                 "between runs; the next run may land outside it")
    return line


def critical_lines(history: History) -> list[str]:
    if history.critical.empty:
        return ["B_crit: no analysis published for these runs"]
    width = _id_width(history.critical["run_id"])
    targets = [_target_text(row) for row in history.critical.itertuples(index=False)]
    aim = max(len("target"), *map(len, targets))
    lines = ["B_crit (90 % interval), for the target each run was analysed for",
             f"  {'published (UTC)':16s}  {'run_id':{width}s}  {'target':{aim}s}  "
             f"{'LR rule':10s} {'B_crit':>10s}  interval"]
    for row, target in zip(history.critical.itertuples(index=False), targets, strict=True):
        value, interval = _b_crit_cells(row)
        lines.append(f"  {_run_label(row, width)}  {target:{aim}s}  {row.lr_rule:10s} "
                     f"{value:>10s}  {interval}")
    if len(set(targets)) > 1:
        lines.append("  the runs were analysed for different targets: B_crit grows as a target "
                     "gets harder, so compare B_crit only between runs of one target")
    return lines


def _target_text(row) -> str:
    """"val_accuracy >= 0.85", or "-" for runs published before targets were recorded."""
    from batchscale.metrics import target_label

    metric, value = getattr(row, "target_metric", None), getattr(row, "target_value", math.nan)
    if not isinstance(metric, str) or value is None or not math.isfinite(value):
        return "-"
    try:
        return target_label(metric, float(value))
    except KeyError:  # a metric this version does not know: as recorded
        return f"{metric} {float(value):g}"


def _b_crit_cells(row) -> tuple[str, str]:
    """(B_crit, interval) as printed: a bound shows as "> 1,024" with its meaning in words
    where the interval would be, as the report says it."""
    from batchscale.analysis.narrative import b_crit_text

    if isinstance(row.b_crit_bound, str) and row.b_crit_bound in BOUND_SIGNS:
        sign = BOUND_SIGNS[row.b_crit_bound]
        return (f"{sign} {_number(row.b_crit_bound_batch)}",
                b_crit_text(math.nan, row.b_crit_bound, row.b_crit_bound_batch))
    if not math.isfinite(row.b_crit):
        reason = getattr(row, "b_crit_reason", None)
        return "-", (f"not estimated: {reason}" if isinstance(reason, str) and reason
                     else "not estimated")
    if not math.isfinite(row.b_crit_low):
        return _number(row.b_crit), "no interval"
    interval = f"[{_number(row.b_crit_low)}, {_number(row.b_crit_high)}]"
    smallest, largest = (getattr(row, name, math.nan) for name in ("smallest_batch",
                                                                   "largest_batch"))
    past = []
    if math.isfinite(smallest) and row.b_crit_low < smallest:
        past.append(f"below {_number(smallest)}, the smallest batch measured")
    if math.isfinite(largest) and row.b_crit_high > largest:
        past.append(f"above {_number(largest)}, the largest batch measured")
    return _number(row.b_crit), interval + (f" (reaches {' and '.join(past)})" if past else "")


def with_run(history: History, run_id: str, date: str, sweep: pd.DataFrame,
             verdicts: pd.DataFrame, analysis: pd.DataFrame | None = None) -> History:
    """`history` (earlier runs) with the run being published appended as the latest one, so
    the run's own report can draw its cells' series before the run is in the lake."""
    now = pd.Timestamp.now(tz="UTC")
    ok = sweep[sweep["status"].eq(TrialStatus.OK)]
    current = ok.assign(run_id=run_id, date=date, published_at=now)
    latest = _critical(None if analysis is None else
                       analysis.assign(run_id=run_id, date=date, published_at=now))
    return History(
        history.workload,
        _concat(history.throughput, _throughput(current)),
        _concat(history.critical, latest),
        _concat(history.verdicts, _verdicts(verdicts.assign(run_id=run_id))),
    )


def _concat(earlier: pd.DataFrame, latest: pd.DataFrame) -> pd.DataFrame:
    frames = [f for f in (earlier, latest) if not f.empty]
    return pd.concat(frames, ignore_index=True) if frames else earlier


