"""The statistics every benchmark figure goes through: paired, interleaved measurement, an
interval for each figure and a verdict against its goal.

- `interleaved` measures two things in the same rounds, alternating which goes first
  (A B, B A, A B, ...: the sequence reads A B B A A B ...), so drift and bursts of load from
  other processes hit both sides alike; a round's ratio compares measurements taken seconds
  apart.
- `median_figure` / `ratio_figure`: the median over rounds with a percentile-bootstrap 90 %
  interval (rounds resampled with replacement, fixed seed: the same data give the same interval).
- `share_figure`: k of n with the exact (Clopper-Pearson) 90 % interval.
- `cv_figure`: a coefficient of variation with the normal-theory (chi-square) 90 % interval.
- `verdict`: "met" when the whole interval is on the good side of the goal, "missed" when it is
  wholly on the bad side, "not established" when it straddles the goal. A figure without a goal
  is reported as "report".

Pure functions of their inputs (no clocks, no global random state), so tests can pin them.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

LEVEL = 0.90
BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 20_12
# The range of n values covers their population median with probability 1 - 2 * 0.5**n: 75 %
# at n = 3, 94 % at n = 5. A bootstrap interval of fewer values cannot be read as 90 %.
MIN_ROUNDS_FOR_VERDICT = 5
MET, MISSED, NOT_ESTABLISHED, REPORT = "met", "missed", "not established", "report"
# Bisection steps for quantiles in [0, 1] or [0, upper]: 2**-60 of the range, far below print.
BISECTION_STEPS = 60
GAMMA_SERIES_TERMS = 500
T = TypeVar("T")


@dataclass(frozen=True)
class Goal:
    """`figure >= threshold` (at_least) or `figure <= threshold` is good."""

    threshold: float
    at_least: bool = True

    def __str__(self) -> str:
        return f"{'≥' if self.at_least else '≤'} {self.threshold:g}"

    def is_good(self, value: float) -> bool:
        return value >= self.threshold if self.at_least else value <= self.threshold


@dataclass(frozen=True)
class Figure:
    """A measured figure with its 90 % interval, sample size and verdict."""

    value: float
    low: float
    high: float
    n: int
    how: str
    goal: Goal | None = None
    verdict: str = REPORT

    def text(self, digits: int = 3) -> str:
        """'0.995 [0.981, 1.010] (median of 8 rounds) ≥ 0.97: met'."""
        head = (f"{self.value:.{digits}f} [{self.low:.{digits}f}, {self.high:.{digits}f}] "
                f"({self.how})")
        return head + (f" goal {self.goal}: {self.verdict}" if self.goal else "")

    def as_dict(self) -> dict:
        return {"value": self.value, "interval_90": [self.low, self.high], "n": self.n,
                "how": self.how, "goal": str(self.goal) if self.goal else None,
                "verdict": self.verdict}


def floor_verdict(figure: Figure, goal: Goal, floor: float) -> str:
    """A goal stated as "the figure at least `goal` with its interval above `floor`" (an
    at-least goal): met when both hold, missed when the whole interval lies below the goal,
    not established otherwise."""
    if figure.value >= goal.threshold and figure.low > floor:
        return MET
    if figure.high < goal.threshold:
        return MISSED
    return NOT_ESTABLISHED


def verdict(low: float, high: float, goal: Goal | None) -> str:
    """met / missed / not established: where the interval [low, high] lies against the goal."""
    if goal is None:
        return REPORT
    if goal.is_good(low) and goal.is_good(high):
        return MET
    if not goal.is_good(low) and not goal.is_good(high):
        return MISSED
    return NOT_ESTABLISHED


def combined_verdict(verdicts: Sequence[str]) -> str:
    """One verdict for a set of figures that must all meet their goal (e.g. every batch size):
    missed if any is missed, met only if all are met."""
    if any(v == MISSED for v in verdicts):
        return MISSED
    if verdicts and all(v == MET for v in verdicts):
        return MET
    return NOT_ESTABLISHED


# ----------------------------------------------------------------------------- measuring
def interleaved(measure_a: Callable[[], T], measure_b: Callable[[], T],
                rounds: int) -> tuple[list[T], list[T]]:
    """Measure A and B once per round, A first in even rounds and B first in odd ones, so
    neither side always runs in the other's wake. Returns (a values, b values), paired."""
    pairs = [paired_round(i, measure_a, measure_b) for i in range(rounds)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def paired_round(index: int, measure_a: Callable[[], T], measure_b: Callable[[], T]
                 ) -> tuple[T, T]:
    """Round `index` of an interleaved comparison: (A, B), measured A first in even rounds."""
    if index % 2 == 0:
        a = measure_a()
        return a, measure_b()
    b = measure_b()
    return measure_a(), b


# ----------------------------------------------------------------------------- intervals
def bootstrap_interval(values: Sequence[float],
                       statistic: Callable[[Sequence[float]], float] = statistics.median,
                       level: float = LEVEL, resamples: int = BOOTSTRAP_RESAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap: resample the values with replacement, take the statistic, and
    return the (1-level)/2 and (1+level)/2 quantiles. With one value the interval is that
    value (nothing to resample: the caller states n)."""
    if not values:
        raise ValueError("no values to bootstrap")
    rng = random.Random(seed)
    n = len(values)
    stats = sorted(statistic([values[rng.randrange(n)] for _ in range(n)])
                   for _ in range(resamples))
    return _quantile(stats, (1 - level) / 2), _quantile(stats, (1 + level) / 2)


def _quantile(ordered: Sequence[float], q: float) -> float:
    """Linear-interpolated quantile of sorted values."""
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def clopper_pearson(k: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Exact binomial interval for k successes in n trials."""
    if not 0 <= k <= n or n == 0:
        raise ValueError(f"need 0 <= k <= n and n > 0, got k={k}, n={n}")
    tail = (1 - level) / 2
    # Lower end: the p at which k or more successes have probability `tail`.
    low = 0.0 if k == 0 else _bisect(lambda p: 1 - _binom_cdf(k - 1, n, p) - tail, 0.0, 1.0)
    # Upper end: the p at which k or fewer successes have probability `tail`.
    high = 1.0 if k == n else _bisect(lambda p: tail - _binom_cdf(k, n, p), 0.0, 1.0)
    return low, high


def _binom_cdf(k: int, n: int, p: float) -> float:
    # In log space: math.comb(n, i) overflows a float for n in the thousands.
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    log_p, log_q = math.log(p), math.log1p(-p)
    return min(1.0, sum(math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                                 + i * log_p + (n - i) * log_q) for i in range(k + 1)))


def _bisect(increasing: Callable[[float], float], lo: float, hi: float) -> float:
    """The root of an increasing function on [lo, hi]."""
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        if increasing(mid) < 0:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def chi2_quantile(q: float, df: int) -> float:
    """Quantile of the chi-square distribution (bisection on its CDF, the regularized lower
    incomplete gamma function)."""
    upper = df + 50 * math.sqrt(2 * df) + 50
    return _bisect(lambda x: _lower_gamma_regularized(df / 2, x / 2) - q, 0.0, upper)


def _lower_gamma_regularized(a: float, x: float) -> float:
    """P(a, x) by its power series (converges for every x; df here is small)."""
    if x <= 0:
        return 0.0
    term = total = 1.0 / a
    for i in range(1, GAMMA_SERIES_TERMS):
        term *= x / (a + i)
        total += term
        if term < total * 1e-15:
            break
    return min(1.0, total * math.exp(-x + a * math.log(x) - math.lgamma(a)))


def cv_interval(cv: float, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Interval of a coefficient of variation from n values, treating them as normal:
    (n-1)s²/σ² follows chi-square with n-1 degrees of freedom (the mean's own uncertainty is
    ignored: fine for CVs of a few per cent)."""
    if n < 2:
        raise ValueError("a CV needs at least two values")
    df = n - 1
    tail = (1 - level) / 2
    return (cv * math.sqrt(df / chi2_quantile(1 - tail, df)),
            cv * math.sqrt(df / chi2_quantile(tail, df)))


# ----------------------------------------------------------------------------- figures
def median_figure(values: Sequence[float], goal: Goal | None = None, what: str = "rounds"
                  ) -> Figure:
    """Median over rounds with its bootstrap 90 % interval. Under MIN_ROUNDS_FOR_VERDICT
    values the bootstrap interval is about the range of the values, which covers the median
    far less often than 90 %: such a figure gets no verdict beyond "not established"."""
    low, high = bootstrap_interval(values)
    how = f"median of {len(values)} {what}, bootstrap {LEVEL:.0%}"
    result = verdict(low, high, goal)
    if goal is not None and len(values) < MIN_ROUNDS_FOR_VERDICT:
        how += f"; under {MIN_ROUNDS_FOR_VERDICT}: no verdict"
        result = NOT_ESTABLISHED
    return Figure(statistics.median(values), low, high, len(values), how, goal, result)


def ratio_figure(numerators: Sequence[float], denominators: Sequence[float],
                 goal: Goal | None = None) -> Figure:
    """Median of paired per-round ratios with its bootstrap 90 % interval."""
    if len(numerators) != len(denominators):
        raise ValueError("paired ratios need as many numerators as denominators")
    ratios = [a / b for a, b in zip(numerators, denominators, strict=True)]
    return median_figure(ratios, goal, "paired rounds")


def share_figure(k: int, n: int, goal: Goal | None = None) -> Figure:
    """k of n with its exact 90 % interval. A goal of 100 % (or 0 %) is a statement about every
    observed case, which no interval from finitely many can reach: it is met when every case
    passed (and missed by any failure); the interval then says what rate n cases rule out."""
    low, high = clopper_pearson(k, n)
    share = k / n
    if goal is not None and goal.threshold in (0.0, 1.0):
        result = MET if goal.is_good(share) else MISSED
    else:
        result = verdict(low, high, goal)
    return Figure(share, low, high, n, f"{k} of {n}, exact {LEVEL:.0%}", goal, result)


def cv_figure(values: Sequence[float], goal: Goal | None = None) -> Figure:
    """CV (sample standard deviation over mean) of values, with its chi-square 90 % interval."""
    mean = statistics.fmean(values)
    cv = statistics.stdev(values) / mean
    low, high = cv_interval(cv, len(values))
    return Figure(cv, low, high, len(values), f"CV of {len(values)} sweeps, chi-square "
                  f"{LEVEL:.0%}", goal, verdict(low, high, goal))


def worst_figure(figures: Sequence[Figure]) -> Figure:
    """The figure furthest on the bad side of its goal (the lowest value for an at-least goal),
    carrying the combined verdict of all of them."""
    goal = figures[0].goal
    pick = min if goal is None or goal.at_least else max
    worst = pick(figures, key=lambda f: f.value)
    return Figure(worst.value, worst.low, worst.high, worst.n, worst.how, goal,
                  combined_verdict([f.verdict for f in figures]) if goal else REPORT)


def history_coverage(runs: list[dict[int, float]], min_history: int = 3,
                     level: float = LEVEL) -> tuple[int, int, list[float]]:
    """(covered, checked, relative half-widths) of a prediction interval built from history
    alone: for each sweep with at least `min_history` earlier sweeps vouching for a batch, the
    Student-t prediction interval of the log samples/s of all those earlier sweeps,
    exp(mean ± t(n-1)·sd·sqrt(1 + 1/n)), checked against that sweep's value. It sees the drift
    between sweeps, which a row's own rounds (seconds apart) cannot."""
    from batchscale.tdist import t_quantile

    covered = checked = 0
    widths = []
    for i, run in enumerate(runs):
        for batch, value in run.items():
            logs = [math.log(r[batch]) for r in runs[:i] if batch in r]
            if len(logs) < min_history:
                continue
            n = len(logs)
            centre = statistics.fmean(logs)
            half = t_quantile(0.5 + level / 2, n - 1) * statistics.stdev(logs) * math.sqrt(
                1 + 1 / n)
            checked += 1
            covered += centre - half <= math.log(value) <= centre + half
            widths.append(math.sinh(half))  # (high - low) / 2 over the centre, in ratio
    return covered, checked, widths


def rerun_coverage(runs: list[dict[int, float]],
                   intervals: list[dict[int, tuple[float, float]]]
                   ) -> tuple[int, int, list[float]]:
    """(covered, checked, relative half-widths): how often sweep i+1's samples/s fell inside
    sweep i's rerun interval, over consecutive sweeps and the batches both vouch for, and the
    half-width of each interval checked, over its own samples/s."""
    covered = checked = 0
    widths = []
    for before, after, interval in zip(runs, runs[1:], intervals, strict=False):
        for batch, (low, high) in interval.items():
            if batch in after:
                checked += 1
                covered += low <= after[batch] <= high
                widths.append((high - low) / 2 / before[batch])
    return covered, checked, widths


def next_run_coverage(runs: list[dict[int, float]],
                      intervals: list[dict[int, tuple[float, float]]] | None = None
                      ) -> tuple[int, int, list[float]]:
    """(covered, checked, relative half-widths) of the lake's next-run interval
    (batchscale.lake.next_run.next_run_interval): for each sweep i and batch, the interval from
    the sweeps up to i that vouch for the batch (with sweep i's own rerun interval when
    `intervals` is given; history alone otherwise), checked against sweep i+1's value. Only
    intervals the history widens or gives are checked, from next_run.MIN_STEPS steps on."""
    from batchscale.lake.next_run import next_run_interval, successive_half_width

    covered = checked = 0
    widths = []
    for i, (now, after) in enumerate(zip(runs, runs[1:], strict=False)):
        for batch, value in now.items():
            series = [r[batch] for r in runs[:i + 1] if batch in r]
            if batch not in after or successive_half_width(series) is None:
                continue
            own = intervals[i].get(batch) if intervals is not None else None
            low, high, _ = next_run_interval(series, own)
            checked += 1
            covered += low <= after[batch] <= high
            widths.append((high - low) / 2 / value)
    return covered, checked, widths
