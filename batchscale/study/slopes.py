"""Does B_crit move with an axis? One additive fit of log B_crit over every axis of a study,
with each slope's interval drawn from the variants' own B_crit intervals.

The model: log B_crit = c + Σ_axis slope_axis · g(x_axis), g = log x when every value of the
axis is a positive number (the slope is then the exponent: B_crit ∝ x^slope), else x itself. A
full product and a one-axis-at-a-time design are both identified by this fit; each slope is what
its axis does with the others held. Uncertainty: each variant's log B_crit is drawn from a
normal whose 90 % interval is the variant's B_crit interval, the fit is repeated, and the
slopes' 5th and 95th percentiles are their interval. This carries the measurement noise of each
variant; it does not carry model misfit (an axis whose effect depends on another's value), and
the report says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

CONFIDENCE = 0.90
"""Of the slopes' intervals, and the level the variants' B_crit intervals are read at."""
DRAWS = 4000
SEED = 0
"""The draws are seeded: the same variants give the same intervals (and the same lake bytes)."""
LOG_FACTOR_LIMIT = math.log(1e15)
"""Range factors are clipped to [1e-15, 1e15] (the study_axes suite's bounds)."""


@dataclass(frozen=True)
class AxisPoint:
    """One variant's B_crit for the fit: the axis values (numbers) and the 90 % interval."""

    x: dict[str, float]
    b_crit: float
    low: float
    high: float
    interval_inside: bool = True
    """False where the interval is cut at (or extrapolates past) the measured batch range: not
    a 90 % interval on that side, so not fitted."""


@dataclass(frozen=True)
class AxisSlope:
    axis: str
    x_scale: str
    """"log" (B_crit ∝ x^slope) or "linear" (log B_crit changes by slope per unit of x)."""
    variants_fitted: int
    slope: float
    slope_low: float
    slope_high: float
    range_factor: float
    """B_crit at the axis's largest studied value over that at its smallest (the fit's)."""
    range_factor_low: float
    range_factor_high: float
    verdict: str
    """"grows", "shrinks", "no detectable change", or "not fitted: <why>"."""


def _log_sigma(point: AxisPoint) -> float:
    z = NormalDist().inv_cdf(0.5 + CONFIDENCE / 2)
    return (math.log(point.high) - math.log(point.low)) / (2 * z)


def usable(point: AxisPoint) -> bool:
    """A B_crit number inside a finite, positive interval of non-zero width that lies within
    the measured batches (a bound alone, or a cut interval, is not fitted)."""
    values = (point.b_crit, point.low, point.high)
    return (all(math.isfinite(v) and v > 0 for v in values)
            and point.low <= point.b_crit <= point.high and point.high > point.low
            and point.interval_inside)


def _scale(values: list[float]) -> str:
    return "log" if all(v > 0 for v in values) else "linear"


def _design(points: list[AxisPoint], axes: list[str], scales: dict[str, str]) -> np.ndarray:
    columns = [np.ones(len(points))]
    for axis in axes:
        xs = np.array([p.x[axis] for p in points], dtype=float)
        columns.append(np.log(xs) if scales[axis] == "log" else xs)
    return np.column_stack(columns)


def _factor(log_change: float) -> float:
    """exp, clipped so an absurd slope reads as a huge (or tiny) factor, not an overflow."""
    return math.exp(min(max(log_change, -LOG_FACTOR_LIMIT), LOG_FACTOR_LIMIT))


def _unfitted(axis: str, scale: str, count: int, why: str) -> AxisSlope:
    nan = math.nan
    return AxisSlope(axis, scale, count, nan, nan, nan, nan, nan, nan, f"not fitted: {why}")


def fit_slopes(points: list[AxisPoint], axes: list[str]) -> list[AxisSlope]:
    """Each axis's slope from the variants with a B_crit interval; an axis that takes one value
    among them, or a design the fit cannot separate, is "not fitted" with the reason."""
    fitted = [p for p in points if usable(p)]
    dropped = len(points) - len(fitted)
    scales = {a: _scale([p.x[a] for p in fitted] or [1.0]) for a in axes}
    varying = [a for a in axes if len({p.x[a] for p in fitted}) >= 2]
    note = (f" ({dropped} variant(s) without a B_crit interval inside the measured batches "
            "left out)" if dropped else "")
    why = (f"no variant has a B_crit interval inside the measured batches{note}" if not fitted
           else f"the variants with a B_crit interval take one value of it{note}")
    results = {a: _unfitted(a, scales[a], len(fitted), why) for a in axes if a not in varying}
    if varying:
        design = _design(fitted, varying, scales)
        if np.linalg.matrix_rank(design) < design.shape[1]:
            why = ("the variants with a B_crit interval do not separate the axes (too few, or "
                   f"the axes change together){note}")
            results |= {a: _unfitted(a, scales[a], len(fitted), why) for a in varying}
        else:
            results |= _fit(fitted, varying, scales, design)
    return [results[a] for a in axes]


def _fit(points: list[AxisPoint], axes: list[str], scales: dict[str, str],
         design: np.ndarray) -> dict[str, AxisSlope]:
    centre = np.log([p.b_crit for p in points])
    sigma = np.array([max(_log_sigma(p), 1e-9) for p in points])
    weights = 1.0 / sigma
    rng = np.random.default_rng(SEED)
    draws = centre + rng.standard_normal((DRAWS, len(points))) * sigma
    solve = np.linalg.pinv(design * weights[:, None])
    best = solve @ (centre * weights)
    slopes = (solve @ (draws * weights).T).T  # (DRAWS, 1 + axes)
    tail = 100 * (1 - CONFIDENCE) / 2
    out = {}
    for index, axis in enumerate(axes, start=1):
        low, high = np.percentile(slopes[:, index], [tail, 100 - tail])
        column = design[:, index]
        span = float(column.max() - column.min())
        factor = [_factor(s * span) for s in (best[index], low, high)]
        verdict = ("no detectable change" if low <= 0 <= high
                   else "grows" if low > 0 else "shrinks")
        out[axis] = AxisSlope(axis, scales[axis], len(points), float(best[index]), float(low),
                              float(high), *factor, verdict)
    return out
