"""What the recommendation promises, with its spread: the steps and time to target expected at
the recommended (LR rule, batch), and the saving against the batch size and learning rate the
user trains with today (`analysis.current_batch_size`, `analysis.current_lr`).

The cell is (LR rule, batch, workers), at the recommended learning rate where one is given: runs
with another worker count are another cell, not more seeds of this one. The band is the range
over the seeds that reached the target at that cell (with one seed there is no spread, and the
text says so instead of inventing one). Time is the figure the results table gives the cell
(its steps × the batch's step time, the basis the batch is chosen on), with the band of the
runs' own measured times to target around it: their lowest and highest as shares of their
median, which counts a run that did not reach as never reaching, as the table's steps do
(steps × one step time alone would give seeds that tie on steps a zero-width band that no
measurement showed). Where the table has no time for the cell, or the cell ran with more
workers than the table's step time was measured with, the measured times stand as they are;
where the runs record no time to target, the time is steps × the cell's step time and is said
to have no known spread. A ratio against today's batch takes its band from the extremes of both
ranges (the slowest recommended seed against the fastest current one, and the other way
round), so it holds whatever pairing of seeds is the fair one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from batchscale.fits import ensure_columns, matches, numeric_column
from batchscale.schemas import RUNS, RunStatus


@dataclass(frozen=True)
class Spread:
    """Median over the seeds that reached the target, with their lowest and highest."""

    median: float
    low: float
    high: float
    seeds: int
    counted: str = "seed"
    """What `seeds` counts: "seed", or "run" where the runs are not one per seed (no seed
    recorded, or several learning rates pooled), so that the count never claims more seeds."""
    evaluation_gap: int = 0
    """Steps to target only: the widest gap, in steps, between the evaluation that met the
    target and the one before it (runs.steps_before_target), which `low` reaches back over;
    0 where the runs do not record it."""
    gaps_differ: bool = False
    """Whether the runs' gaps differ (then `evaluation_gap` is said as "up to")."""
    on_table: bool = False
    """Times only: placed on the results table's basis (`cell_time`), not the runs' own clocks."""
    unreached: int = 0
    """Runs of the cell that did not reach the target (`seeds` counts those that did)."""
    median_counts_unreached: bool = False
    """Whether the median counts them as never reaching, as the results table does: where it
    stays finite (fewer than half did not reach); otherwise it is of those that did."""

    def scaled(self, factor: float) -> Spread:
        return replace(self, median=self.median * factor, low=self.low * factor,
                       high=self.high * factor)

    @property
    def ranged(self) -> bool:
        """Whether [low, high] says something: several seeds, or an evaluation gap."""
        return self.seeds >= 2 or self.evaluation_gap > 1

    def overlaps(self, other: Spread | None) -> bool:
        """Whether the two ranges share a value (each of them ranged): the seeds cannot tell
        the two apart."""
        return (other is not None and self.ranged and other.ranged
                and self.low <= other.high and other.low <= self.high)

    def text(self, unit: str = "", digits: int = 3, *, gap_said: bool = True) -> str:
        """"110 [100, 120] steps over 3 seeds", or "110 steps (one seed: no spread)"; with an
        evaluation gap, what the range includes (unless `gap_said` is False: a line beside
        one that said it)."""
        value = short_number(self.median, digits)
        band = f"[{short_number(self.low, digits)}, {short_number(self.high, digits)}]"
        apart = f"{'up to ' if self.gaps_differ else ''}{self.evaluation_gap} steps apart"
        if self.seeds < 2:
            if self.evaluation_gap <= 1:
                return f"{value}{unit} (one {self.counted}: no spread){self._missed()}"
            return (f"{value}{unit} {band} (one {self.counted}: the range is the gap between "
                    f"evaluations, {apart}){self._missed()}")
        gap = (f" (read at evaluations {apart}: the range includes the gap)"
               if self.evaluation_gap > 1 and gap_said else "")
        return f"{value}{unit} {band} over {self.seeds} {self.counted}s{gap}{self._missed()}"

    def _missed(self) -> str:
        if not self.unreached:
            return ""
        how = ("which the median counts as never reaching" if self.median_counts_unreached
               else "and the figure is of those that did")
        return f"; {self.unreached} more did not reach the target, {how}"


def short_number(value: float, digits: int) -> str:
    """`digits` significant digits, whole numbers from 10 ** (digits − 1) up, never in
    exponent form: "0.0487", "72.5", "165", "1,234"."""
    return f"{value:,.0f}" if abs(value) >= 10 ** (digits - 1) else f"{value:.{digits}g}"


def cell_runs(runs: pd.DataFrame, rule: str, batch: int,
              workers: int | None = None) -> pd.DataFrame:
    """The runs (every status) of `rule` at `batch` with one worker count: `workers` where the
    cell reached the target with it, else the fewest workers that did (the fewest run where
    none did). A seed run again with more workers is another cell's run, not another seed.
    Runs that record no worker count read as 1 worker."""
    runs = ensure_columns(runs, RUNS)
    cell = runs[matches(runs, "lr_rule", rule) & (numeric_column(runs, "batch_size") == batch)]
    counts = _worker_counts(cell)
    reached = counts[matches(cell, "status", RunStatus.REACHED)]
    pool = reached if reached.size else counts
    if not pool.size:
        return cell
    chosen = workers if workers in set(pool) else pool.min()
    return cell[counts == chosen]


def at_fewest_workers(runs: pd.DataFrame) -> pd.DataFrame:
    """The trials with the fewest workers run at their batch size: those the results table's
    steps to target, the critical-batch fit and the step times are of. Trials at a batch run
    again with more workers (the scaling runs) answer the worker-count question only; pooled
    as more seeds they would make a table row that no one cell of the card matches."""
    runs = ensure_columns(runs, RUNS)
    if runs.empty:
        return runs
    counts = pd.Series(_worker_counts(runs), index=runs.index)
    batches = pd.Series(numeric_column(runs, "batch_size"), index=runs.index)
    fewest = counts.groupby(batches).transform("min")
    return runs[((counts == fewest) | fewest.isna()).to_numpy(dtype=bool)]


def _worker_counts(frame: pd.DataFrame) -> np.ndarray:
    counts = numeric_column(frame, "workers")
    return np.where(np.isfinite(counts), counts, 1.0)


@dataclass(frozen=True)
class CellRows:
    """A cell's runs that reached the target, and how many of its runs did not."""

    reached: pd.DataFrame
    unreached: int = 0


def _reached(runs: pd.DataFrame, rule: str, batch: int, workers: int | None,
             lr: float | None) -> CellRows:
    """The cell's runs that reached the target (at learning rate `lr`, where given)."""
    cell = cell_runs(runs, rule, batch, workers)
    if lr is not None:
        cell = cell[numeric_column(cell, "lr") == lr]
    return _split_reached(cell)


def _split_reached(cell: pd.DataFrame) -> CellRows:
    keep = (matches(cell, "status", RunStatus.REACHED)
            & np.isfinite(numeric_column(cell, "steps_to_target")))
    return CellRows(cell[keep], int((~keep).sum()))


def _spread(cell: CellRows, column: str) -> Spread | None:
    """Median and range of `column` over the reached runs (its finite values), the median
    counting the runs that did not reach as never reaching where it stays finite, as the
    results table does; None where no value is."""
    rows = cell.reached
    values = numeric_column(rows, column)
    finite = np.isfinite(values)
    if not finite.any():
        return None
    values = values[finite]
    unreached = cell.unreached
    counted = float(np.median(np.concatenate([values, np.full(unreached, np.inf)])))
    median = counted if math.isfinite(counted) else float(np.median(values))
    # Count seeds only where each run is a seed of its own; otherwise say runs.
    one_per_seed = rows["seed"][finite].nunique() == values.size
    return Spread(median, float(values.min()), float(values.max()), int(values.size),
                  "seed" if one_per_seed else "run",
                  unreached=unreached, median_counts_unreached=math.isfinite(counted))


def steps_spread(runs: pd.DataFrame, rule: str, batch: int, workers: int | None = None,
                 lr: float | None = None) -> Spread | None:
    """Steps to target over the reached seeds of the (rule, batch, workers) cell (`cell_runs`),
    at `lr` where given; None when none reached."""
    return _steps(_reached(runs, rule, batch, workers, lr))


def _steps(cell: CellRows) -> Spread | None:
    """The steps to target over the cell's reached runs: a run's count is its first
    evaluation that met the target, so where the runs record the evaluation before it
    (steps_before_target) the range's low end reaches back to the step after that one."""
    return _reaching_back(cell, "steps_to_target", lambda value, steps, before: before + 1)


def _reaching_back(cell: CellRows, column: str, earliest) -> Spread | None:
    """`column`'s spread over the cell's reached runs, its low end reaching back over the
    evaluation gap: `earliest(value, steps, before)` is the least a run's value could have been
    had it met the target right after the evaluation before (steps_before_target)."""
    spread = _spread(cell, column)
    rows = cell.reached
    if spread is None or "steps_before_target" not in rows:
        return spread
    values = numeric_column(rows, column)
    steps = numeric_column(rows, "steps_to_target")
    before = numeric_column(rows, "steps_before_target")
    known = np.isfinite(values) & np.isfinite(steps) & np.isfinite(before) & (steps > 0)
    if not known.any():
        return spread
    gaps = steps[known] - before[known]
    low = float(np.min(earliest(values[known], steps[known], before[known])))
    return replace(spread, low=min(spread.low, low), evaluation_gap=int(gaps.max()),
                   gaps_differ=bool(gaps.min() != gaps.max()))


def time_spread(runs: pd.DataFrame, rule: str, batch: int, workers: int | None = None,
                lr: float | None = None) -> Spread | None:
    """The measured time to target (s) over the same runs as `steps_spread`; None where none
    of them records one."""
    return _times(_reached(runs, rule, batch, workers, lr))


def _times(cell: CellRows) -> Spread | None:
    """The measured times to target over the cell's reached runs, the low end reaching back
    over the evaluation gap as the steps' does: a run that met the target at step S, with the
    evaluation before it at step b, could have taken as little as its time × (b + 1) / S."""
    return _reaching_back(cell, "time_to_target_s",
                          lambda value, steps, before: value * (before + 1) / steps)


def cell_time(runs: pd.DataFrame, table: pd.DataFrame, rule: str, batch: int,
              workers: int | None = None, lr: float | None = None) -> Spread | None:
    """The cell's time to target as the results table gives it, with its seeds' measured
    spread around it (module docstring); the measured times as they are where the table has no
    time for the cell or its step time is of another worker count."""
    measured = time_spread(runs, rule, batch, workers, lr)
    centre = _table_time(runs, table, rule, batch, workers, lr)
    if (measured is None or not math.isfinite(centre) or measured.median <= 0
            or not _at_table_workers(runs, rule, batch, workers, lr)):
        return measured
    return replace(measured.scaled(centre / measured.median), on_table=True)


def _table_time(runs: pd.DataFrame, table: pd.DataFrame, rule: str, batch: int,
                workers: int | None, lr: float | None) -> float:
    """The table's time to target for the cell; at learning rate `lr` where the table's steps
    are another learning rate's (the tuned rule's best median): those steps × its step time."""
    row = _cell(table, rule, batch)
    times = numeric_column(row, "time_to_target_s") if "time_to_target_s" in row else []
    centre = float(times[0]) if len(times) else math.nan
    steps = steps_spread(runs, rule, batch, workers, lr) if lr is not None else None
    table_steps = numeric_column(row, "steps_to_target") if "steps_to_target" in row else []
    if steps is None or not len(table_steps) or math.isclose(steps.median, table_steps[0]):
        return centre
    return steps.median * step_time_at(table, rule, batch)


@dataclass(frozen=True)
class RowBands:
    """The results table's bands for one (rule, batch) row: the trials at the row's learning
    rate (at the fewest workers run at the batch, as the row's median is), how many reached
    the target, their steps to target, and the card's time to target for the cell (`cell_time`: the
    measured times of the seeds at the worker count the table's step time is of, placed
    around the row's time)."""

    trials: int
    reached: int
    steps: Spread | None
    time: Spread | None


def row_bands(runs: pd.DataFrame, table: pd.DataFrame, rule: str, batch: int,
              lr: float) -> RowBands:
    """`RowBands` for the row of `rule` at `batch` whose steps are learning rate `lr`'s: the
    steps over every trial its median is over; the time as the card gives it (`cell_time`),
    where that is on the table's basis."""
    runs = ensure_columns(runs, RUNS)
    at_lr = runs[matches(runs, "lr_rule", rule) & (numeric_column(runs, "batch_size") == batch)
                 & (numeric_column(runs, "lr") == lr)]
    reached = _split_reached(at_lr)
    time = cell_time(runs, table, rule, batch, lr=lr)
    return RowBands(len(at_lr), len(reached.reached), _steps(reached),
                    time if time is not None and time.on_table else None)


def on_one_basis(first: Spread | None, second: Spread | None,
                 measured: tuple[Spread | None, Spread | None]) -> tuple:
    """`first` and `second`, or both as measured where only one is on the table's basis: two
    times are compared on one basis or not at all."""
    if first is not None and second is not None and first.on_table != second.on_table:
        return measured
    return first, second


def _at_table_workers(runs: pd.DataFrame, rule: str, batch: int, workers: int | None,
                      lr: float | None) -> bool:
    """Whether the cell's runs used the fewest workers run at `batch`, those the table's step
    time is measured with (timetotarget.convergence_step_times)."""
    every = ensure_columns(runs, RUNS)
    counts = _worker_counts(every[numeric_column(every, "batch_size") == batch])
    mine = _worker_counts(_reached(runs, rule, batch, workers, lr).reached)
    return bool(mine.size) and bool(counts.size) and mine[0] == counts.min()


def step_time_at(table: pd.DataFrame, rule: str, batch: int) -> float:
    """The cell's step time from the analysis's cell table; NaN where it has none."""
    times = numeric_column(_cell(table, rule, batch), "step_time_s")
    return float(times[0]) if times.size and np.isfinite(times[0]) else math.nan


def untrusted_time(table: pd.DataFrame, rule: str, batch: int) -> str:
    """" (step time NOT TRUSTED: …)" where the cell's step time carries a timing flag, else ""."""
    row = _cell(table, rule, batch)
    flag = row["timing_flag"].iloc[0] if "timing_flag" in row and len(row) else None
    return f" (step time NOT TRUSTED: {flag})" if isinstance(flag, str) else ""


def _cell(table: pd.DataFrame, rule: str, batch: int) -> pd.DataFrame:
    return table[matches(table, "lr_rule", rule) & (numeric_column(table, "batch_size") == batch)]


NO_TIME_SPREAD = ("steps × one step time: the runs record no time to target, so its spread is "
                  "unknown")


def expected_text(runs: pd.DataFrame, table: pd.DataFrame, rule: str, batch: int,
                  workers: int | None = None, lr: float | None = None) -> str:
    """"110 [100, 120] steps over 3 seeds; 2.3 [2.1, 2.5] s of training over 3 seeds" at the
    (rule, batch, workers) cell, at `lr` where given."""
    rows = _reached(runs, rule, batch, workers, lr)
    steps = _steps(rows)
    if steps is None:
        return f"no run of the {rule} rule at batch {batch} reached the target"
    text = f"{steps.text(' steps')}{_workers_said(runs, rule, batch, rows.reached)}"
    flag = untrusted_time(table, rule, batch)
    measured = cell_time(runs, table, rule, batch, workers, lr)
    if measured is not None:
        return f"{text}; {measured.text(' s of training', gap_said=False)}{flag}"
    step_s = step_time_at(table, rule, batch)
    if math.isfinite(step_s):
        text += f"; {short_number(steps.median * step_s, 3)} s of training ({NO_TIME_SPREAD}){flag}"
    return text


def as_fast(runs: pd.DataFrame, cells: pd.DataFrame, rule: str, batch: int,
            workers: int | None = None) -> list[tuple[int, str, Spread]]:
    """The other (batch, rule) cells of `cells` (the results table) whose times to target
    (`cell_time`: the table's figure with its seeds' spread) overlap the (rule, batch) cell's:
    the seeds cannot tell them apart, so a rerun may well pick one of them. Only cells with two
    or more seeds on each side (one seed has no spread to compare)."""
    best = cell_time(runs, cells, rule, batch, workers)
    if best is None or best.seeds < 2:
        return []
    found = []
    for other_rule, other_batch in zip(cells["lr_rule"], cells["batch_size"], strict=True):
        if (other_rule, int(other_batch)) == (rule, batch):
            continue
        spread = cell_time(runs, cells, other_rule, int(other_batch))
        mine, spread = on_one_basis(best, spread, (
            time_spread(runs, rule, batch, workers), time_spread(runs, other_rule,
                                                                  int(other_batch))))
        if spread is not None and spread.seeds >= 2 and mine.overlaps(spread):
            found.append((int(other_batch), str(other_rule), spread))
    return sorted(found, key=lambda cell: cell[2].median)


def as_fast_text(cells: list[tuple[int, str, Spread]], rules: int, limit: int = 3) -> str:
    """"; as fast within the seeds' spread: batch 32 (0.177 [0.156, 0.199] s over 2 seeds)",
    or "" where no cell is; the rule is named where the table has several."""
    if not cells:
        return ""
    shown = [f"batch {b}{f' {r}' if rules > 1 else ''} ({s.text(' s', gap_said=False)})"
             for b, r, s in cells[:limit]]
    more = f" and {len(cells) - limit} more" if len(cells) > limit else ""
    return f"; as fast within the seeds' spread: {', '.join(shown)}{more}"


def _workers_said(runs: pd.DataFrame, rule: str, batch: int, rows: pd.DataFrame) -> str:
    """" with 2 workers" where the cell's rule and batch ran with more than one worker count
    (the figures are of one of them), else ""."""
    cell = ensure_columns(runs, RUNS)
    cell = cell[matches(cell, "lr_rule", rule) & (numeric_column(cell, "batch_size") == batch)]
    if len(set(_worker_counts(cell))) < 2 or rows.empty:
        return ""
    n = int(_worker_counts(rows)[0])
    return f" with {n} worker{'s' if n != 1 else ''}"


def versus_current(runs: pd.DataFrame, table: pd.DataFrame, rule: str, batch: int,
                   current_batch: int | None, workers: int | None = None,
                   lr: float | None = None, current_lr: float | None = None) -> str:
    """The expected saving against `current_batch` (same LR rule and worker count), or why it
    cannot be given; `lr`: the recommended learning rate, where given. The runs at your batch
    trained at the rule's learning rate there: where that is not `current_lr`, said."""
    if current_batch is None:
        return ("give the batch size you train with today (analysis.current_batch_size, "
                "--current-batch-size) to see the saving against it")
    if current_batch == batch:
        return f"you already train at batch {batch}: keep it"
    rec = steps_spread(runs, rule, batch, workers, lr)
    cur = steps_spread(runs, rule, current_batch, workers)
    if rec is None:
        return f"no run of the {rule} rule at batch {batch} reached the target"
    if cur is None:
        measured = sorted({int(b) for b in numeric_column(ensure_columns(runs, RUNS),
                                                          "batch_size") if np.isfinite(b)})
        listed = ", ".join(map(str, measured))
        if current_batch not in measured:
            return (f"your batch {current_batch} was not trained (the trials ran at batch "
                    f"{listed}): to quote a saving, train it beside them (in "
                    "convergence.batch_sizes with strategy grid; an adaptive search trains "
                    "only the batches it chooses among them)")
        return (f"your batch {current_batch} did not reach the target with the {rule} rule "
                f"(the trials ran at batch {listed}), so there is no saving to quote against "
                "it")
    parts = [f"{_ratio(rec, cur)} the steps"]
    flags = untrusted_time(table, rule, batch) or untrusted_time(table, rule, current_batch)
    rec_t, cur_t = on_one_basis(
        cell_time(runs, table, rule, batch, workers, lr),
        cell_time(runs, table, rule, current_batch, workers),
        (time_spread(runs, rule, batch, workers, lr),
         time_spread(runs, rule, current_batch, workers)))
    rec_s, cur_s = step_time_at(table, rule, batch), step_time_at(table, rule, current_batch)
    if rec_t is not None and cur_t is not None:
        parts.append(f"{_ratio(rec_t, cur_t)} the training time{flags}")
    elif math.isfinite(rec_s) and math.isfinite(cur_s):
        value = rec.median * rec_s / (cur.median * cur_s)
        parts.append(f"{value:.2f}× the training time ({NO_TIME_SPREAD}){flags}")
    same = rec_t is not None and rec_t.overlaps(cur_t)
    return (f"at your batch {current_batch} ({cur.text(' steps', gap_said=False)}"
            f"{_their_lr(runs, rule, current_batch, workers, current_lr)}), the "
            "recommendation needs "
            + " and ".join(parts)
            + (f"; the seeds do not tell the two times apart, so staying at batch "
               f"{current_batch} is as good as far as they show" if same else ""))


def _their_lr(runs: pd.DataFrame, rule: str, batch: int, workers: int | None,
              current_lr: float | None) -> str:
    """", trained at learning rate 0.025 by the sqrt rule, not your 0.05": what the runs at
    your batch were compared at, where it is not your learning rate; "" where it is, or where
    no learning rate of yours was given."""
    if current_lr is None:
        return ""
    rates = sorted({float(v) for v in numeric_column(_reached(runs, rule, batch, workers,
                                                               None).reached, "lr")
                    if np.isfinite(v)})
    if not rates or all(math.isclose(r, current_lr, rel_tol=1e-6) for r in rates):
        return ""
    shown = " and ".join(f"{r:.4g}" for r in rates)
    return (f", trained at learning rate {shown} by the {rule} rule, not your "
            f"{current_lr:.4g}: the saving is against the rule's rate at your batch")


def _ratio(new: Spread, old: Spread) -> str:
    """"0.55× [0.45, 0.66]" (extremes of both ranges), or without a band for single seeds."""
    value = new.median / old.median
    if not (new.ranged or old.ranged):
        return f"{value:.2f}× (one {new.counted} each: no spread)"
    return f"{value:.2f}× [{new.low / old.high:.2f}, {new.high / old.low:.2f}]"


def lr_versus_current(learning_rate: float | None, current_lr: float | None) -> str:
    """How the recommended learning rate compares with today's; "" when either is unknown."""
    if learning_rate is None or current_lr is None:
        return ""
    return f"; {learning_rate / current_lr:.3g}× your current {current_lr:.4g}"


def accumulation_text(batch: int, largest_fitting: float, workers: int | None) -> str:
    """How to run `batch` where one device holds less: "" when it fits (or the wall is
    unknown), else the accumulation steps that bring each device's micro-batch under the
    largest batch the sweep measured to fit."""
    per_device = batch / max(workers or 1, 1)
    known = math.isfinite(largest_fitting) and largest_fitting > 0
    if not known or per_device <= largest_fitting:
        return ""
    steps = math.ceil(per_device / largest_fitting)
    return (f"; each device holds at most batch {largest_fitting:.0f} (the sweep's memory wall): "
            f"run it as {steps} accumulation steps of {math.ceil(per_device / steps)} "
            "(convergence.accumulation_steps)")

