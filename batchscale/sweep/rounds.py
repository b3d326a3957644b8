"""Interleaved rounds, and how a row's trials combine into its figures and its quality.

Pure functions (no torch, no processes), so they are tested on their own.

Each (input mode, batch size) cell is timed once per round; round r visits the cells in
ascending order when r is even and descending when odd, so drift (caches and clocks settling,
thermal throttling) and bursts of load from other processes land on every batch size alike
instead of on whichever came last. A row's figures combine its trials (its rounds, then any
retries):

- `step_time_median_s` is the median of the trials' medians. Each trial gets one vote whatever
  its number of steps: a trial stops early once its CV target is met and runs to its budget when
  its steps scatter, so pooled steps would let a disturbed trial (the one with the most steps)
  outvote the quiet ones.
- `step_time_p10_s`, `step_time_p90_s`, `step_time_cv` are the median over trials of each
  trial's own figure, for the same reason; and because the median is monotone, p10 <= median <=
  p90 holds for the combined figures as it does within each trial (pooled quantiles could leave
  the median of medians outside them). The trials' disagreement is `round_spread`, kept out of
  the CV so each column measures one thing: scatter within a trial, disagreement between trials.
- `round_spread` is (max - min) / median of the trials' medians over their closest majority:
  with two trials (the default) that is both of them; after retries, the closest 2 of 3, 3 of 4,
  and so on, so one disturbed trial can be outvoted by re-measurements (the combined median always
  lies inside that majority's range). It is at most 2 by construction.
- `rerun_low_s`, `rerun_high_s` bound the median a rerun of the row (as many trials, at another
  moment) would report, at RERUN_LEVEL: a Student-t prediction interval on the log of the
  trials' medians (`rerun_interval`). Trials are the units because they are the independent
  repeats a row has: each runs in its own process at its own moment, while the steps within a
  trial are correlated (one trial's steps share its allocator state, caches and the load of that
  moment) and would give a falsely narrow interval. With two trials the t quantile has one degree
  of freedom, so the interval is about ±4.5× the trials' relative difference: wide, because two
  repeats say little about a third. Two trials can also agree by luck, and one degree of
  freedom cannot tell luck from a quiet row: so a row's disagreement is floored at that of the
  sweep's rows of its input mode, pooled (`pooled_log_sd`; they ran on the same host, minutes
  apart at most). Trials seconds apart still miss the drift between sweeps
  minutes or hours apart, so a known between-sweep CV (sweep.between_sweep_cv) is added. How
  often the next sweep lands inside it is measured in `make bench` (bench_sweep, "rerun
  interval coverage"; docs/sweep.md).

`judge` then calls a row unstable when its trials disagree, its steps scatter (judged without
the steps a full garbage collection ran in: `_scatter_reason`), or most of its
trials ran while other processes kept every usable CPU busy (conditions.OTHERS_LOAD_SHARE) or
starved its threads of CPU (conditions.CPU_WAIT_SHARE): the case where steps are steadily slow
in every round, which neither figure can see.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from batchscale.config import SweepConfig
from batchscale.schemas import Quality
from batchscale.tdist import t_quantile
from batchscale.timing import MIN_TIMED_S, StepTimes

T = TypeVar("T")

RERUN_LEVEL = 0.9
"""Coverage the rerun interval of a row's step time (and so of its samples/s) aims at."""
MAX_RERUN_FACTOR = 10.0
"""No rerun interval is given when it would reach beyond this factor either side of the
median: trials that far apart (a neighbour came and went) say only that a rerun could land
anywhere, and [x/500, 500x] printed as an interval would read as a measurement."""


def visit_order(cells: Sequence[T], round_index: int) -> list[T]:
    """`cells` (given ascending) in round `round_index`'s order: ascending on even rounds
    (0, 2, ...), descending on odd ones."""
    return list(cells) if round_index % 2 == 0 else list(reversed(cells))


def trial_share(cfg: SweepConfig) -> SweepConfig:
    """The settings of one trial: a row's `time_budget_s` and `max_timed_steps` split evenly
    over its rounds, so a sweep takes about as long as with one round (warm-up and
    `min_timed_steps` stay per trial: each trial needs its own median)."""
    return cfg.model_copy(update={
        "time_budget_s": cfg.time_budget_s / cfg.rounds,
        "max_timed_steps": max(cfg.min_timed_steps, cfg.max_timed_steps // cfg.rounds),
    })


def trial_min_time_s(cfg: SweepConfig) -> float:
    """timing.MIN_TIMED_S split over the rounds too: its purpose (not trusting a few steps
    that fell in a quiet moment) is served better by rounds at different moments."""
    return MIN_TIMED_S / cfg.rounds


def majority_spread(medians: Sequence[float]) -> float | None:
    """(max - min) / median over the closest strict majority of `medians`; None for fewer than
    two (one trial cannot disagree with itself)."""
    if len(medians) < 2:
        return None
    ordered = sorted(medians)
    k = len(ordered) // 2 + 1
    width = min(ordered[i + k - 1] - ordered[i] for i in range(len(ordered) - k + 1))
    center = statistics.median(ordered)
    return width / center if center > 0 else None


def _median_of_finite(values: Sequence[float]) -> float:
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median(finite) if finite else math.nan


@dataclass(frozen=True)
class Combined:
    """A row's timing figures, combined over its trials as the module docstring says."""

    median_s: float
    p10_s: float
    p90_s: float
    cv: float
    """NaN when no trial timed two steps."""
    timed_steps: int
    trials: int
    round_spread: float | None
    cpu_per_wall: float | None
    """The lowest over the trials: the one that got the least CPU."""
    cpu_wait_share: float | None = None
    """The highest over the trials: the one whose threads waited longest for a CPU."""
    gc_share: float | None = None
    """The share of the trials' timed spans Python's garbage collector ran, pooled: a trial
    stops once its steps settle, so its own span may hold one full collection or none."""
    cv_outside_gc: float = math.nan
    """Like `cv`, over the steps no full garbage collection ran in (StepTimes.cv_outside_gc)."""
    rerun_low_s: float | None = None
    rerun_high_s: float | None = None
    """`rerun_interval`'s bounds on the median step time; None when it cannot be computed."""
    trial_log_sd: float | None = None
    """The standard deviation of the log of the trials' medians (all of them); None with fewer
    than two trials."""


def combine(trials: Sequence[StepTimes], between_sweep_cv: float = 0.0,
            floor_log_sd: float = 0.0) -> Combined:
    """The row's figures from its trials (at least one, each with at least one timed step);
    `between_sweep_cv` and `floor_log_sd` widen the rerun interval (`rerun_interval`)."""
    if not trials:
        raise ValueError("combine needs at least one timed trial")
    medians = [t.median_s for t in trials]
    cpu = [t.cpu_per_wall for t in trials if t.cpu_per_wall is not None]
    waits = [t.cpu_wait_share for t in trials if t.cpu_wait_share is not None]
    collected = [(t.gc_s, t.wall_s) for t in trials if t.gc_s is not None and t.wall_s]
    median_s = statistics.median(medians)
    rerun = rerun_interval(trials, median_s, between_sweep_cv=between_sweep_cv,
                           floor_log_sd=floor_log_sd)
    return Combined(
        median_s=median_s,
        p10_s=statistics.median(t.quantile_s(0.1) for t in trials),
        p90_s=statistics.median(t.quantile_s(0.9) for t in trials),
        cv=_median_of_finite([t.cv for t in trials]),
        timed_steps=sum(len(t.seconds) for t in trials),
        trials=len(trials),
        round_spread=majority_spread(medians),
        cpu_per_wall=min(cpu) if cpu else None,
        cpu_wait_share=max(waits) if waits else None,
        gc_share=(min(1.0, sum(g for g, _ in collected) / sum(w for _, w in collected))
                  if collected else None),
        cv_outside_gc=_median_of_finite([t.cv_outside_gc for t in trials]),
        rerun_low_s=rerun[0] if rerun else None,
        rerun_high_s=rerun[1] if rerun else None,
        trial_log_sd=pooled_log_sd([trials]) if len(trials) >= 2 else None,
    )


def rerun_interval(trials: Sequence[StepTimes], median_s: float,
                   level: float = RERUN_LEVEL,
                   between_sweep_cv: float = 0.0,
                   floor_log_sd: float = 0.0) -> tuple[float, float] | None:
    """(low, high) around `median_s` for the median step time a rerun of these trials would
    report: exp(log median ± h), h = sqrt((t·s·sqrt(2/k))² + (z·sqrt(2)·c)²). s is the standard
    deviation of the log medians of the k units, at least `floor_log_sd` (the sweep's pooled
    figure, `pooled_log_sd`), t Student's quantile with k - 1 degrees of
    freedom; sqrt(2/k) because the row's figure and the rerun's each average k units. c is
    `between_sweep_cv`, the drift between sweeps that the units of one sweep cannot show (the
    row and the rerun each carry their own, hence sqrt(2)), z the normal quantile: it is known
    from elsewhere (sweep.between_sweep_cv), not estimated here. Adding the two half-widths in
    quadrature rather than their variances before one t quantile is the wider, safer choice.
    The units are the trials; a lone trial is split into its earlier and later half (two units
    adjacent in time: they share more than two trials do, so that interval is the narrower
    guess). None with fewer than two units of two steps, or when the interval would be wider
    than MAX_RERUN_FACTOR either side."""
    units = [t.median_s for t in trials] if len(trials) >= 2 else _half_medians(trials[0])
    if len(units) < 2 or min(units) <= 0 or median_s <= 0:
        return None
    logs = [math.log(u) for u in units]
    log_sd = max(statistics.stdev(logs), floor_log_sd)
    rounds = t_quantile(0.5 + level / 2, len(units) - 1) * log_sd * math.sqrt(2 / len(units))
    drift = statistics.NormalDist().inv_cdf(0.5 + level / 2) * math.sqrt(2) * between_sweep_cv
    half = math.hypot(rounds, drift)
    if half > math.log(MAX_RERUN_FACTOR):
        return None
    return median_s * math.exp(-half), median_s * math.exp(half)


def pooled_log_sd(rows: Iterable[Sequence[StepTimes]]) -> float:
    """The standard deviation of a trial's log median about its row's mean, pooled over
    `rows` (each a row's trials; rows of fewer than two trials say nothing and are skipped):
    sqrt(sum of squared deviations / sum of (k - 1)). 0.0 when no row has two trials."""
    squares, freedom = 0.0, 0
    for trials in rows:
        logs = [math.log(t.median_s) for t in trials if t.median_s > 0]
        if len(logs) >= 2:
            mean = statistics.fmean(logs)
            squares += sum((x - mean) ** 2 for x in logs)
            freedom += len(logs) - 1
    return math.sqrt(squares / freedom) if freedom else 0.0


def _half_medians(trial: StepTimes) -> list[float]:
    """Medians of the trial's earlier and later half of steps (none under two steps each)."""
    middle = len(trial.seconds) // 2
    if middle < 2:
        return []
    return [statistics.median(trial.seconds[:middle]), statistics.median(trial.seconds[middle:])]


@dataclass(frozen=True)
class Overload:
    """How many of a row's trials ran while other processes kept every usable CPU busy
    (conditions.overloaded), with the highest such load for the reason; and how many were
    starved of CPU by their own account (conditions.starved), with the longest wait."""

    trials: int = 0
    others_load: float = 0.0
    usable_cpus: int = 0
    starved_trials: int = 0
    cpu_wait_share: float = 0.0


def _scatter_reason(combined: Combined, max_cv: float) -> str | None:
    """Steps scatter beyond `max_cv`, judged without the steps a full garbage collection ran
    in: those pauses come from the loop's own garbage, in every round alike, and would flag a
    steady row (their time is the row's `gc_share`)."""
    cv, outside = combined.cv, combined.cv_outside_gc
    if math.isfinite(outside) and math.isfinite(cv) and outside < cv:
        return (f"step times scatter: CV {outside:.2f} outside the steps Python's garbage "
                f"collector ran in (> {max_cv:.2f})" if outside > max_cv else None)
    if math.isfinite(cv) and cv > max_cv:
        return f"step times scatter: CV {cv:.2f} (> {max_cv:.2f})"
    return None


def judge(combined: Combined, *, max_round_spread: float, max_cv: float,
          overload: Overload = Overload()) -> tuple[str, str | None]:
    """(quality, reason): "unstable" with the figures in plain words when the trials disagree by
    more than `max_round_spread`, the steps scatter with a CV above `max_cv`
    (`_scatter_reason`), or most trials ran on an overloaded machine or starved of CPU (steady
    but slow steps that agree across rounds: see conditions.OTHERS_LOAD_SHARE,
    conditions.CPU_WAIT_SHARE); else "ok". A figure that
    cannot be computed (one trial; fewer than two steps) does not flag a row."""
    reasons = []
    spread = combined.round_spread
    if spread is not None and spread > max_round_spread:
        reasons.append(f"rounds disagree by {spread:.0%} (> {max_round_spread:.0%})")
    if (scatter := _scatter_reason(combined, max_cv)) is not None:
        reasons.append(scatter)
    if 2 * overload.trials > combined.trials:
        reasons.append(f"other processes kept all {overload.usable_cpus} usable CPUs busy in "
                       f"{overload.trials} of {combined.trials} trials (load beyond this "
                       f"trial's own up to {overload.others_load:.1f})")
    if 2 * overload.starved_trials > combined.trials:
        reasons.append(f"its threads waited for a CPU up to {overload.cpu_wait_share:.0%} of "
                       f"the time they were runnable, in {overload.starved_trials} of "
                       f"{combined.trials} trials (other processes held the CPUs)")
    if reasons:
        return Quality.UNSTABLE, "; ".join(reasons)
    return Quality.OK, None
