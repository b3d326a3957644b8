"""The statistics behind B_crit: the weighted fit of S on 1/B with its standard errors (which
decide whether the data support a number), Fieller's interval for the ratio B_crit =
E_min/S_min, and the seed bootstrap, vectorized over resamples.

Why two intervals, combined (see docs/architecture.md, "Critical batch"): the seed bootstrap
alone is too narrow with few seeds (two seeds resample to only three distinct medians per
batch) and with whole-epoch steps (seeds that tie give the same median in every resample), so
its 90 % interval covered the truth in about 70 % of simulated two-seed data sets. Fieller's
interval reads the scatter from the fit's residuals instead, which sees every source of noise
(seeds, rounding to epochs, the curve not being exactly S_min + E_min/B), with Student-t
quantiles for the few degrees of freedom. The reported interval is their union:
`tests/test_calibration.py` measures that it covers (≥ 85 % with two seeds, ≥ 87 % with five).

Pure numpy on arrays; the runs-table side is in `critical`.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np

from batchscale.tdist import t_quantile

ROUND_OFF_SCATTER = 1e-6
"""Floor on the relative scatter of S about the fit. Steps to target are counted, never known
to a part per million; without the floor, data exactly on a curve (S ∝ 1/B) have zero residuals
and an intercept of 1e-14 from round-off would look infinitely significant."""


@dataclass(frozen=True)
class LineFits:
    """Weighted least squares S ≈ S_min + E_min·(1/B), per row of a stack of data sets.

    Arrays share the stack's shape (a scalar shape for one data set). Variances are the
    weighted least-squares ones, σ²·(XᵀWX)⁻¹, with σ² the relative residual variance over
    `dof` = points − 2 degrees of freedom, floored at the steps' own resolution
    (`resolution_scatter`) and at ROUND_OFF_SCATTER²."""

    s_min: np.ndarray
    e_min: np.ndarray
    var_s: np.ndarray
    var_e: np.ndarray
    cov_se: np.ndarray
    points: np.ndarray
    r2: np.ndarray
    scatter: np.ndarray
    """σ: the residuals' relative standard deviation (0.03: steps scatter ±3 % about the fit)."""

    @property
    def dof(self) -> np.ndarray:
        return self.points - 2

    @property
    def t_s_min(self) -> np.ndarray:
        """S_min in units of its standard error."""
        return self.s_min / np.sqrt(self.var_s)

    @property
    def t_e_min(self) -> np.ndarray:
        """E_min in units of its standard error."""
        return self.e_min / np.sqrt(self.var_e)


def resolution_scatter(steps: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """The relative scatter that reading steps on a grid alone gives, per data set: when every
    usable count is a whole multiple of q > 1 (the evaluation interval: a target is seen only at
    evaluations, so a count is known to within q), the root mean of (q / S)² / 12 (a uniform
    error over one interval), else 0. Points that fall exactly on the curve then still get an
    interval as wide as the grid they were read on. A common factor larger than half the
    smallest count is taken for a coincidence of the numbers (2,500, 1,250, 625 share 625), not
    a grid: no evaluation interval is that coarse against the counts it reads."""
    rounded = np.round(np.where(usable, steps, 0.0))
    integral = np.all(~usable | (np.abs(steps - rounded) < 1e-9), axis=-1)
    q = np.gcd.reduce(rounded.astype(np.int64), axis=-1).astype(float)
    smallest = np.where(usable, steps, np.inf).min(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(usable, (q[..., None] / steps) ** 2 / 12.0, 0.0).sum(-1) / np.maximum(
            usable.sum(-1), 1)
    grid = integral & (q > 1) & (q <= smallest / 2)
    return np.where(grid, np.sqrt(share), 0.0)


def fit_lines(batch: np.ndarray, steps: np.ndarray) -> LineFits:
    """Fit S = S_min + E_min/B along the last axis of `steps` (batches `batch`, same last axis).

    Weights 1/S² make the residuals relative: noise in steps to target is multiplicative (a few
    % per seed at every batch), so absolute residuals would let the small batches, with the
    most steps, set the fit. Non-finite or non-positive S (a batch that did not reach the
    target in that resample) get weight 0 and do not count as points.
    """
    x = 1.0 / np.asarray(batch, dtype=float)
    s = np.asarray(steps, dtype=float)
    usable = np.isfinite(s) & (s > 0)
    s = np.where(usable, s, 1.0)
    w = np.where(usable, 1.0 / s**2, 0.0)
    sw, swx, swxx = w.sum(-1), (w * x).sum(-1), (w * x * x).sum(-1)
    swy, swxy = (w * s).sum(-1), (w * x * s).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        det = sw * swxx - swx**2
        e_min = (sw * swxy - swx * swy) / det
        s_min = (swy - e_min * swx) / sw
        residual = s - s_min[..., None] - e_min[..., None] * x
        points = usable.sum(-1)
        rss = (w * residual**2).sum(-1)
        sigma2 = np.maximum(rss / (points - 2),
                            np.maximum(resolution_scatter(s, usable) ** 2, ROUND_OFF_SCATTER**2))
        total = (w * (s - (swy / sw)[..., None]) ** 2).sum(-1)
        r2 = np.where(total > 0, 1.0 - rss / total, np.nan)
    return LineFits(
        s_min=s_min,
        e_min=e_min,
        var_s=sigma2 * swxx / det,
        var_e=sigma2 * sw / det,
        cov_se=-sigma2 * swx / det,
        points=points,
        r2=r2,
        scatter=np.sqrt(sigma2),
    )


def b_crit_or_limit(fits: LineFits) -> np.ndarray:
    """E_min/S_min; 0 where E_min ≤ 0 (below any batch), +inf where S_min ≤ 0 (above any), NaN
    where fewer than three batch sizes count. Keeping 0 and +inf in a bootstrap distribution
    instead of dropping them keeps its tails honest."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = fits.e_min / fits.s_min
    ratio = np.where(fits.s_min > 0, ratio, np.inf)
    ratio = np.where(fits.e_min <= 0, 0.0, ratio)
    return np.where(fits.points >= 3, ratio, np.nan)


def fieller_interval(fits: LineFits, confidence: float) -> tuple[float, float]:
    """Fieller's `confidence` interval for B_crit = E_min/S_min of one fit.

    The B with |E_min − B·S_min| ≤ t·se(E_min − B·S_min): exact for a ratio of normally
    distributed estimates, where the delta method is not (its interval is symmetric on a
    scale the ratio's distribution is not). Bounded only when S_min is clearly positive
    (S_min² > t²·var(S_min)); otherwise (low, +inf), or (0, +inf) when no positive B above
    some low is excluded.
    """
    low, high = fieller_bounds(fits, t_quantile(0.5 + confidence / 2, int(fits.dof)))
    return float(low), float(high)


def fieller_bounds(fits: LineFits, t: float) -> tuple[np.ndarray, np.ndarray]:
    """`fieller_interval`'s (low, high) for every fit of a stack, at the Student-t quantile `t`
    (one for all: the fits of a stack share their degrees of freedom)."""
    a = fits.s_min**2 - t * t * fits.var_s
    b = -2.0 * (fits.s_min * fits.e_min - t * t * fits.cov_se)
    c = fits.e_min**2 - t * t * fits.var_e
    disc = b * b - 4 * a * c
    with np.errstate(invalid="ignore", divide="ignore"):
        root = np.sqrt(np.maximum(disc, 0.0))
        first, second = (-b - root) / (2 * a), (-b + root) / (2 * a)
    low, high = np.minimum(first, second), np.maximum(first, second)
    open_ended = (disc < 0) | (a == 0) | ~np.isfinite(disc)
    between = a > 0  # the B between the roots; else outside them, so unbounded above
    outside_low = np.where(low > 0, 0.0, np.maximum(high, 0.0))
    return (np.where(open_ended, 0.0, np.where(between, np.maximum(low, 0.0), outside_low)),
            np.where(open_ended | ~between, math.inf, high))


def seed_cells(
    batches: np.ndarray, steps: np.ndarray, lr_codes: np.ndarray, seed_codes: np.ndarray
) -> tuple[np.ndarray, list[np.ndarray]]:
    """The trials regrouped for `seed_bootstrap`: the measured batch sizes, and per batch its
    steps as an (LR, seed) matrix (+inf: did not reach the target; NaN: that LR not run with
    that seed; repeated trials of one (LR, seed): their median). One entry per trial in each
    argument; LRs and seeds as integer codes."""
    measured = np.unique(batches[np.isfinite(batches) & (batches > 0)])
    cells = []
    for batch in measured:
        rows = batches == batch
        _, lr = np.unique(lr_codes[rows], return_inverse=True)
        _, seed = np.unique(seed_codes[rows], return_inverse=True)
        cell = np.full((lr.max() + 1, seed.max() + 1), np.nan)
        key, values = lr * cell.shape[1] + seed, steps[rows]
        if np.unique(key).size == key.size:
            cell.flat[key] = values
        else:
            for k in np.unique(key):
                cell.flat[k] = np.median(values[key == k])
        cells.append(cell)
    return measured, cells


def seed_bootstrap(
    batch: np.ndarray, cells: list[np.ndarray], n: int, rng: np.random.Generator, reduce: str
) -> np.ndarray:
    """B_crit of `n` refits, each on S(B) recomputed from seeds drawn with replacement.

    `cells[i]` holds batch i's steps as an (LR, seed) matrix (+inf: that trial did not reach
    the target; NaN: not run). A resample draws as many seeds as were run, per batch, and
    takes per LR the median over the drawn seeds ('min': the minimum) and then the minimum
    over LRs, as `critical.steps_to_result` does.
    """
    steps = np.empty((n, len(cells)))
    for i, cell in enumerate(cells):
        drawn = cell[:, rng.integers(cell.shape[1], size=(n, cell.shape[1]))]
        steps[:, i] = np.min(_reduce_seeds(drawn, reduce), 0)
    return b_crit_or_limit(fit_lines(batch, steps))


def _reduce_seeds(drawn: np.ndarray, reduce: str) -> np.ndarray:
    """Median (or minimum) over the last axis, ignoring NaN (an LR not run with that seed);
    +inf where an LR has no drawn seed at all. The NaN-aware numpy reductions are ten times
    slower, so they run only for cells that have holes."""
    if not np.isnan(drawn).any():
        return np.median(drawn, -1) if reduce == "median" else np.min(drawn, -1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN slices: handled below
        per_lr = np.nanmedian(drawn, -1) if reduce == "median" else np.nanmin(drawn, -1)
    return np.where(np.isnan(per_lr), np.inf, per_lr)


def percentile_interval(estimates: np.ndarray, confidence: float) -> tuple[float, float]:
    """Equal-tailed percentiles of a bootstrap distribution, without interpolation (0 and +inf
    are valid values: refits below / above every batch)."""
    low, high = percentile_bounds(estimates, confidence)
    return float(low), float(high)


def percentile_bounds(estimates: np.ndarray, confidence: float,
                      axis: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """`percentile_interval`'s (low, high) along `axis` of a stack of bootstrap distributions."""
    tail = 100.0 * (1.0 - confidence) / 2.0
    low, high = np.percentile(estimates, [tail, 100.0 - tail], axis=axis, method="inverted_cdf")
    return low, high
