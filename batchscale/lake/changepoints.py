"""Change points in one cell's throughput history: a sustained shift, not a single slow run.

A cell's series is its samples/s over the comparable runs (same speed fingerprint, measured
well: comparable.py), oldest first, the run being judged last; a run where the cell did not
time (out of memory, failed) is NaN. Beside each figure may stand its rerun margin: how far
above it the row's 90 % rerun interval reaches, as a share (samples_per_s_high / samples_per_s
− 1; sweep/rounds.py `rerun_interval`). The baseline of a run is the last `history_runs` timed
runs before it, m their median and MAD = median(|x − m|); a run lies *below* it when

    m − x > T = max(NOISE_MADS · 1.4826 · MAD, min(MIN_DROP_SHARE · m, x · M))   (or x is NaN)

M the median rerun margin of the baseline's runs and this one. The MAD term is the history's
own scatter. The second term keeps a history that happens to be quiet from flagging a wobble:
a fixed share of m, or less where the cell's rows show they are quieter than that — an
interval as wide as they carry, put on this run, ends below m, so a rerun would not reach the
baseline and the two sweeps differ by what their intervals say. The intervals narrow that
floor and never widen it: rows' intervals come from two trials (one degree of freedom) and
were measured 2–10× wider than the scatter between whole sweeps of the same rows, and judging
by them alone cut the detection of a 15 % step from 0.87 to 0.45 (resnet18 at batch 16) with
no fewer false alarms (bench_regressions; docs/lake.md). The median, not the run's own margin:
a row's width alone scatters widely, and a run whose two trials happened to agree would be
judged by a needle-thin interval. Runs without an interval (rows written before it, or trials
too far apart for one) count for nothing in M; with none at all the floor is the fixed share.

1.4826·MAD estimates the noise's standard deviation σ while ignoring an odd outlying run.

The test is a run rule on this robust control chart (the "k consecutive points beyond a limit"
rules of statistical process control, here k = CONFIRM_RUNS = 2): find the longest run of
latest points all below the baseline formed by the runs *before* them (L ≤ history_runs).
The streak's baseline does not include the streak: when the newest run is below its baseline's
median but within limits that hold the run before it, the last CONFIRM_RUNS runs are judged
against the runs before them (a first bad run in a short, noisy baseline widens its MAD enough
to hide the second; seen with a real 5x slowdown at a 20 % run-to-run CV).
L = 0: "ok". L = 1: "suspected" (a blip or the start of a step: reported, never fails).
L ≥ 2: "confirmed", a step whose first bad run is the first of those L and whose last good run
is the last timed run before it. An outlier is suspected, then cleared when the next run is
back within T. Once the slow runs are the majority of the last `history_runs`, the baseline's
median has moved to the new level and the cell is "ok" again: the change became the baseline.

False-alarm rate. With no change and independent runs of normal noise of known σ, a run is
below with p₁ = Φ(−T/σ) ≤ Φ(−NOISE_MADS) = Φ(−2.5) = 0.62 %, so a run is *suspected* at most
0.62 % of the time; a *confirmed* alarm needs two consecutive runs below (nearly) the same
baseline, p₁² ≤ 3.9e-5, i.e. 0.004 per 100 cell-runs. The interval only lowers the floor,
never the MAD term, so that bound holds with or without it. Where the floor binds (CV below
MIN_DROP_SHARE / NOISE_MADS = 3.2 %) it is smaller still: p₁ = Φ(−floor / CV), e.g. Φ(−4) =
3e-5 at a 2 % CV with the 8 % floor. Estimating m and σ from a handful of runs widens this
(a baseline that came out narrow by chance), and real noise has heavier tails than the normal;
the benchmark `bench_regressions` replays histories with measured noise and reports the rate that
results (false alarms per 100 cell-runs, goal ≤ 1), next to the single-run rule's (a run more
than max(3 · 1.4826 · MAD, 10 % of m) below m regressed).

Detection: a step of s (share of m) is confirmed at its second run when both runs fall below:
(Φ((s − T/m) / CV))², e.g. 0.95 for a 15 % step at a 3 % CV with the 8 % floor binding.
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
"""Drops smaller than this share of the median never count as below (nor, where the cell's rows
carry rerun intervals narrower than this, smaller than the drop those intervals allow)."""
MIN_HISTORY_RUNS = 3
"""Fewer timed runs than this before a run cannot tell noise from a change."""
CONFIRM_RUNS = 2
"""Consecutive runs below the baseline that confirm a shift."""

OK = "ok"
SUSPECTED = "suspected"
CONFIRMED = "confirmed"
INSUFFICIENT_HISTORY = "insufficient_history"


@dataclass(frozen=True)
class Baseline:
    """The timed runs a point is judged against, summarised."""

    runs: int
    median: float
    mad: float
    noise_drop: float
    """NOISE_MADS robust standard deviations of the runs' scatter (the MAD term of T)."""
    min_drop_share: float = MIN_DROP_SHARE
    margins: tuple[float, ...] = ()
    """The runs' rerun margins (NaN where a run has none)."""

    @classmethod
    def of(cls, rates: np.ndarray, margins: np.ndarray | None = None,
           noise_mads: float = NOISE_MADS, min_drop_share: float = MIN_DROP_SHARE) -> Baseline:
        kept = () if margins is None else tuple(float(m) for m in margins)
        if not rates.size:
            return cls(0, math.nan, math.nan, math.nan, min_drop_share, kept)
        median = float(np.median(rates))
        mad = float(np.median(np.abs(rates - median)))
        return cls(int(rates.size), median, mad, noise_mads * MAD_TO_SIGMA * mad, min_drop_share,
                   kept)

    @property
    def allowed_drop(self) -> float:
        """T for a run when no run has a rerun interval: the MAD term or the fixed floor."""
        return max(self.noise_drop, self.min_drop_share * self.median)

    def margin(self, own: float = math.nan) -> float:
        """M: the median rerun margin of the baseline's runs and a run's `own`; NaN when none
        has a usable one (a zero-width interval is none)."""
        usable = [m for m in (*self.margins, own) if math.isfinite(m) and m > 0]
        return float(np.median(usable)) if usable else math.nan

    def threshold(self, rate: float, margin: float = math.nan) -> float:
        """T for a run of `rate` samples/s whose rerun interval reaches `margin` (a share) above
        it: the MAD term, or the floor — the fixed share of the median, or the drop that puts an
        interval of width M on the run below the median where that is smaller."""
        floor = self.min_drop_share * self.median
        pooled = self.margin(margin)
        if math.isfinite(pooled) and math.isfinite(rate):
            floor = min(floor, rate * pooled)
        return max(self.noise_drop, floor)

    def below(self, rate: float, margin: float = math.nan) -> bool:
        """Not timed, or slower than the median by more than the threshold."""
        return not math.isfinite(rate) or self.median - rate > self.threshold(rate, margin)


def baseline_before(rates: np.ndarray, end: int, history_runs: int,
                    margins: np.ndarray | None = None, **rule) -> Baseline:
    """The baseline of the point at index `end`: the last `history_runs` timed points before it
    (with their rerun margins, when given)."""
    timed = np.flatnonzero(np.isfinite(rates[:end]))[-history_runs:]
    return Baseline.of(rates[timed], None if margins is None else margins[timed], **rule)


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


def _margins(margins: Sequence[float] | None, size: int) -> np.ndarray:
    if margins is None:
        return np.full(size, math.nan)
    values = np.asarray(margins, dtype=float)
    if values.shape != (size,):
        raise ValueError(f"{values.size} rerun margins for {size} figures")
    return values


def detect(rates: Sequence[float], history_runs: int,
           margins: Sequence[float] | None = None, **rule) -> Detection:
    """Judge the last of `rates` (oldest first, NaN = not timed) against the points before it;
    `margins` the rerun margin of each (NaN: none; None: no point has one). `rule` may override
    noise_mads / min_drop_share (the benchmark's fixed-share comparison)."""
    series = np.asarray(rates, dtype=float)
    margin = _margins(margins, series.size)
    end = series.size - 1
    first = baseline_before(series, end, history_runs, margin, **rule)
    if first.runs < MIN_HISTORY_RUNS:
        return Detection(INSUFFICIENT_HISTORY, 0, first)
    if first.below(series[end], margin[end]):
        below, baseline = 1, first
    elif series[end] < first.median:
        # Low, but within limits that the run before may have widened (a first bad run in the
        # baseline inflates its MAD): judge the last CONFIRM_RUNS against the runs before them.
        # Once the median itself has moved to the new level, the change is the baseline.
        start = end - CONFIRM_RUNS + 1
        before = baseline_before(series, start, history_runs, margin, **rule)
        if before.runs < MIN_HISTORY_RUNS or not _all_below(before, series, margin, start):
            return Detection(OK, 0, first)
        below, baseline = CONFIRM_RUNS, before
    else:
        return Detection(OK, 0, first)
    while below < history_runs:
        start = end - below  # would the point before the run below join it?
        wider = baseline_before(series, start, history_runs, margin, **rule)
        if wider.runs < MIN_HISTORY_RUNS or not _all_below(wider, series, margin, start):
            break
        below, baseline = below + 1, wider
    first_bad = end - below + 1
    verdict = CONFIRMED if below >= CONFIRM_RUNS else SUSPECTED
    return Detection(verdict, below, baseline, first_bad, _last_timed(series, first_bad))


def _all_below(baseline: Baseline, series: np.ndarray, margin: np.ndarray, start: int) -> bool:
    return all(baseline.below(r, m) for r, m in zip(series[start:], margin[start:], strict=True))


def _last_timed(series: np.ndarray, before: int) -> int | None:
    timed = np.flatnonzero(np.isfinite(series[:before]))
    return int(timed[-1]) if timed.size else None


def replay(rates: Sequence[float], history_runs: int, margins: Sequence[float] | None = None,
           **rule) -> list[Detection]:
    """The verdict each point got when it was the newest (as publish judged it, run by run)."""
    series = np.asarray(rates, dtype=float)
    margin = _margins(margins, series.size)
    return [detect(series[:i + 1], history_runs, margin[:i + 1], **rule)
            for i in range(series.size)]


def change_points(detections: Sequence[Detection]) -> list[int]:
    """Indices of the first bad point of every confirmed shift, in order, each once."""
    return sorted({d.first_bad for d in detections
                   if d.verdict == CONFIRMED and d.first_bad is not None})
