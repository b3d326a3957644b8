"""Change points in one cell's throughput history: a sustained shift, not a single slow run.

A cell's series is its samples/s over the comparable runs (same speed fingerprint, measured
well: comparable.py), oldest first, the run being judged last; a run where the cell did not
time (out of memory, failed) is NaN. The baseline of a run is the last `history_runs` timed
runs before it, m their median and MAD = median(|x − m|); a run lies *below* it when

    m − x > T = max(NOISE_MADS · 1.4826 · MAD, MIN_DROP_SHARE · m)        (or x is NaN)

1.4826·MAD estimates the noise's standard deviation σ while ignoring an odd outlying run; the
floor keeps a history that happens to be quiet from flagging a few-percent wobble.

The test is a run rule on this robust control chart (the "k consecutive points beyond a limit"
rules of statistical process control, here k = CONFIRM_RUNS = 2): find the longest run of
latest points all below the baseline formed by the runs *before* them (L ≤ history_runs).
The streak's baseline does not include the streak: when the newest run is below its baseline's
median but within limits that hold the run before it, the last CONFIRM_RUNS runs are judged
against the runs before them (a first bad run in a short, noisy baseline widens its MAD enough
to hide the second; seen with a real 5x slowdown at a 20 % run-to-run CV).
L = 0: "ok", unless the baseline allows a drop of more than BLIND_DROP_SHARE of its median:
then the history scatters too much to see even a halving, and the verdict is "too_noisy" (a run
below such a baseline is still suspected or confirmed: it fell further than the noise).
L = 1: "suspected" (a blip or the start of a step: reported, never fails).
L ≥ 2: "confirmed", a step whose first bad run is the first of those L and whose last good run
is the last timed run before it. An outlier is suspected, then cleared when the next run is
back within T. Once the slow runs are the majority of the last `history_runs`, the baseline's
median has moved to the new level and the cell is "ok" again: the change became the baseline.

False-alarm rate. With no change and independent runs of normal noise of known σ, a run is
below with p₁ = Φ(−T/σ) ≤ Φ(−NOISE_MADS) = Φ(−2.5) = 0.62 %, so a run is *suspected* at most
0.62 % of the time; a *confirmed* alarm needs two consecutive runs below (nearly) the same
baseline, p₁² ≤ 3.9e-5, i.e. 0.004 per 100 cell-runs. Where the floor dominates (CV below
MIN_DROP_SHARE / NOISE_MADS = 3.2 %) it is smaller still: p₁ = Φ(−MIN_DROP_SHARE / CV), e.g.
Φ(−4) = 3e-5 at a 2 % CV. Estimating m and σ from a handful of runs widens this (a baseline
that came out narrow by chance), and real noise has heavier tails than the normal; the
benchmark `bench_regressions` replays histories with measured noise and reports the rate that
results (false alarms per 100 cell-runs, goal ≤ 1), next to the single-run rule's (a run more
than max(3 · 1.4826 · MAD, 10 % of m) below m regressed).

Detection: a step of s (share of m) is confirmed at its second run when both runs fall below:
(Φ((s − T/m) / CV))², e.g. 0.95 for a 15 % step at a 3 % CV with the floor binding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

NOISE_MADS = 2.5
"""How many robust standard deviations below the baseline's median a run must fall."""
MAD_TO_SIGMA = 1.4826
"""MAD × this = standard deviation, for normally distributed noise."""
MIN_DROP_SHARE = 0.08
"""Drops smaller than this share of the median never count as below."""
MIN_HISTORY_RUNS = 3
"""Fewer timed runs than this before a run cannot tell noise from a change."""
CONFIRM_RUNS = 2
"""Consecutive runs below the baseline that confirm a shift."""
BLIND_DROP_SHARE = 0.5
"""A baseline whose noise allows a drop of more than this share of its median could not see
the throughput halve: a run that is not below it is "too_noisy", not "ok"."""

OK = "ok"
TOO_NOISY = "too_noisy"
SUSPECTED = "suspected"
CONFIRMED = "confirmed"
INSUFFICIENT_HISTORY = "insufficient_history"


@dataclass(frozen=True)
class Baseline:
    """The timed runs a point is judged against, summarised."""

    runs: int
    median: float
    mad: float
    allowed_drop: float

    @classmethod
    def of(cls, rates: np.ndarray, noise_mads: float = NOISE_MADS,
           min_drop_share: float = MIN_DROP_SHARE) -> Baseline:
        if not rates.size:
            return cls(0, math.nan, math.nan, math.nan)
        median = float(np.median(rates))
        mad = float(np.median(np.abs(rates - median)))
        return cls(int(rates.size), median, mad,
                   max(noise_mads * MAD_TO_SIGMA * mad, min_drop_share * median))

    def below(self, rate: float) -> bool:
        """Not timed, or slower than the median by more than the allowed drop."""
        return not math.isfinite(rate) or self.median - rate > self.allowed_drop


def baseline_before(rates: np.ndarray, end: int, history_runs: int, **rule) -> Baseline:
    """The baseline of the point at index `end`: the last `history_runs` timed points before it."""
    timed = rates[:end][np.isfinite(rates[:end])]
    return Baseline.of(timed[-history_runs:], **rule)


@dataclass(frozen=True)
class Detection:
    """The verdict for the last point of a series."""

    verdict: str
    runs_below: int
    """The latest points, this one included, that lie below `baseline` (0 when ok)."""
    baseline: Baseline
    first_bad: int | None = None
    """Index of the first of the `runs_below` points (None when none is below)."""
    last_good: int | None = None
    """Index of the last timed point before `first_bad` (the baseline's newest run)."""


def blind(baseline: Baseline) -> bool:
    """Whether `baseline`'s allowed drop is so wide that a halved throughput would pass."""
    return baseline.allowed_drop > BLIND_DROP_SHARE * baseline.median


def _not_below(baseline: Baseline) -> Detection:
    return Detection(TOO_NOISY if blind(baseline) else OK, 0, baseline)


def detect(rates: Sequence[float], history_runs: int, **rule) -> Detection:
    """Judge the last of `rates` (oldest first, NaN = not timed) against the points before it.
    `rule` may override noise_mads / min_drop_share (the benchmark's single-run comparison)."""
    series = np.asarray(rates, dtype=float)
    end = series.size - 1
    first = baseline_before(series, end, history_runs, **rule)
    if first.runs < MIN_HISTORY_RUNS:
        return Detection(INSUFFICIENT_HISTORY, 0, first)
    if first.below(series[end]):
        below, baseline = 1, first
    elif series[end] < first.median:
        # Low, but within limits that the run before may have widened (a first bad run in the
        # baseline inflates its MAD): judge the last CONFIRM_RUNS against the runs before them.
        # Once the median itself has moved to the new level, the change is the baseline.
        start = end - CONFIRM_RUNS + 1
        before = baseline_before(series, start, history_runs, **rule)
        if before.runs < MIN_HISTORY_RUNS or not all(before.below(r) for r in series[start:]):
            return _not_below(first)
        below, baseline = CONFIRM_RUNS, before
    else:
        return _not_below(first)
    while below < history_runs:
        start = end - below  # would the point before the run below join it?
        wider = baseline_before(series, start, history_runs, **rule)
        if wider.runs < MIN_HISTORY_RUNS or not all(wider.below(r) for r in series[start:]):
            break
        below, baseline = below + 1, wider
    first_bad = end - below + 1
    verdict = CONFIRMED if below >= CONFIRM_RUNS else SUSPECTED
    return Detection(verdict, below, baseline, first_bad, _last_timed(series, first_bad))


def _last_timed(series: np.ndarray, before: int) -> int | None:
    timed = np.flatnonzero(np.isfinite(series[:before]))
    return int(timed[-1]) if timed.size else None


def replay(rates: Sequence[float], history_runs: int, **rule) -> list[Detection]:
    """The verdict each point got when it was the newest (as publish judged it, run by run)."""
    series = np.asarray(rates, dtype=float)
    return [detect(series[:i + 1], history_runs, **rule) for i in range(series.size)]


def change_points(detections: Sequence[Detection]) -> list[int]:
    """Indices of the first bad point of every confirmed shift, in order, each once."""
    return sorted({d.first_bad for d in detections
                   if d.verdict == CONFIRMED and d.first_bad is not None})
