"""Can the full grid pin B_crit at all? The adaptive search asks this after every cell, so that
where the steps scatter too much for any allowed design it says so early, at a share of the
grid's cost, instead of spending most of the grid before "no cell left is expected to narrow
the interval". docs/architecture.md, "Adaptive search", states the rule and why.

The forecast is a posterior predictive one, optimistic where the trials leave room (a false
"cannot" stops a search that would have answered; a missed one costs only what the search spends
anyway):

- the scatter σ of log steps about the current fit is drawn from its own uncertainty
  (σ̂²·dof/χ²_dof: with few trials σ may well be smaller than it looks);
- B_crit is drawn log-uniformly over the search's current interval;
- each draw simulates the grid's trials (every allowed batch size × every seed) about the fit,
  takes the median over seeds per batch and forms the 90 % interval a grid would report:
  Fieller's ∪ the seed bootstrap's. Fieller's alone is narrower: on grids of 9 batch sizes × 3
  seeds at ±25 % scatter it pinned B_crit to ×2 in 54 % of draws where real grids, analysed
  as the analysis does, pinned it in 28 % (tests/test_adaptive_futility.py), so the forecast
  was slow to call futility where a grid only just fails.

The search stops as futile only when fewer than `convergence.adaptive_futile_chance` (0.10) of
the draws pin B_crit.
bench_adaptive_calibration measures how often it stops so where the grid would have pinned it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from batchscale.analysis.critical import BOOTSTRAP_CONFIDENCE, steps_to_result, trial_steps
from batchscale.analysis.interval import (
    b_crit_or_limit,
    fieller_bounds,
    fit_lines,
    percentile_bounds,
)
from batchscale.fits import positive_pairs
from batchscale.tdist import t_quantile

STOP_FUTILE = "even the full grid"
"""How the stop reason of a search that forecasts the grid cannot pin B_crit begins."""
FORECAST_DRAWS = 400
GRID_BOOTSTRAP = 40
"""Bootstrap refits per simulated grid: enough for the 5th and 95th percentiles to tell a ×2
interval from a ×3 one, at 400 × 40 refits a forecast."""
MORE_SEEDS_FACTOR = 4
"""How far past the config's seeds the forecast looks for a seed count that would pin B_crit."""
MIN_TRIALS = 5
"""Trials at the target before the scatter is trusted enough to forecast from (3 degrees of
freedom: fewer give a σ whose lower range reaches almost 0, and the forecast says nothing)."""


@dataclass(frozen=True)
class GridForecast:
    """How likely the full grid is to pin B_crit, and the scatter the forecast started from."""

    chance: float
    """Share of simulated grids whose 90 % interval is at most the target ratio wide; NaN when
    the trials cannot forecast it."""
    scatter: float = math.nan
    """σ̂: the trials' relative scatter about the current fit (0.3: ±30 %)."""
    scatter_interval: tuple[float, float] = (math.nan, math.nan)
    """σ's 90 % interval (the 5th and 95th percentiles of the σ drawn for the forecast)."""
    trials: int = 0
    """Trials σ̂ was read from."""
    cells: int = 0
    """Trials a grid runs: every allowed batch size × every seed."""
    seeds: int = 0
    """Seeds per batch size of that grid."""
    seeds_to_pin: int | None = None
    """The fewest seeds per batch size (up to MORE_SEEDS_FACTOR × `seeds`) with which half the
    simulated grids pin B_crit; None when even that many do not (or the grid already does)."""

    def futile(self, below: float | None) -> bool:
        """Fewer than `below` of the simulated grids pin B_crit (never with None or NaN)."""
        return below is not None and self.chance < below

    def words(self, target_ratio: float) -> str:
        more = (f"with {self.seeds_to_pin} seeds per batch size half of them would"
                if self.seeds_to_pin else f"even with {MORE_SEEDS_FACTOR * self.seeds} seeds "
                "per batch size fewer than half would")
        low, high = self.scatter_interval
        return (f"{STOP_FUTILE} ({self.cells} cells) is not expected to pin B_crit to "
                f"×{target_ratio:g}: {self.chance:.0%} of grids simulated from these trials "
                f"would (their steps scatter ±{self.scatter:.0%} about the fit, 90 % interval "
                f"±{low:.0%}–{high:.0%} from {self.trials} trials); {more}")


NO_FORECAST = GridForecast(math.nan)


def grid_pin_chance(runs: pd.DataFrame, rule: str, allowed: Sequence[int], seeds: int,
                    interval: tuple[float, float], target_ratio: float,
                    rng: np.random.Generator) -> GridForecast:
    """How likely a grid of every `allowed` batch size × `seeds` seeds is to give a 90 % B_crit
    interval at most `target_ratio` wide, forecast from the trials of `rule` so far and their
    current B_crit `interval`; NO_FORECAST when they cannot tell (too few trials, no fit, no
    bounded interval)."""
    rule_runs = runs[runs["lr_rule"] == rule]
    table = steps_to_result(rule_runs, by=(), reduce="median")
    # the scatter is the seeds' about the fit, at the learning rate each batch's point is read
    # at: trials at a worse learning rate are slower by design, not by noise
    best = dict(zip(table["batch_size"], table["best_lr"], strict=True))
    best_lr = rule_runs["batch_size"].map(best)
    rule_runs = rule_runs[np.isclose(pd.to_numeric(rule_runs["lr"], errors="coerce"),
                                     pd.to_numeric(best_lr, errors="coerce"))]
    steps = trial_steps(rule_runs)
    batch = pd.to_numeric(rule_runs["batch_size"], errors="coerce").to_numpy(float)
    reached = np.isfinite(steps) & np.isfinite(batch) & (batch > 0)
    low, high = interval
    if reached.sum() < MIN_TRIALS or not (0 < low <= high < math.inf):
        return NO_FORECAST
    fits = fit_lines(*positive_pairs(table["batch_size"], table["steps_to_target"]))
    s_min, e_min = float(fits.s_min), float(fits.e_min)
    if not (s_min > 0 and e_min > 0):
        return NO_FORECAST
    fitted = s_min + e_min / batch[reached]
    residual = np.log(steps[reached]) - np.log(fitted)
    dof = int(reached.sum()) - 2
    scatter = math.sqrt(float(np.sum(residual**2)) / dof)
    sigma = scatter * np.sqrt(dof / rng.chisquare(dof, FORECAST_DRAWS))
    b_crit = np.exp(rng.uniform(math.log(low), math.log(high), FORECAST_DRAWS))
    batches = np.asarray(sorted(set(allowed)), float)

    def pinned(n: int) -> float:
        return float(np.mean(_grid_ratios(batches, n, b_crit, sigma, rng) <= target_ratio))

    chance = pinned(seeds)
    more = None if chance >= 0.5 else next(
        (n for n in range(seeds + 1, MORE_SEEDS_FACTOR * seeds + 1) if pinned(n) >= 0.5), None)
    spread = tuple(float(v) for v in np.percentile(sigma, [5, 95]))
    return GridForecast(chance, scatter=scatter, scatter_interval=spread,
                        trials=int(reached.sum()), cells=batches.size * seeds, seeds=seeds,
                        seeds_to_pin=more)


def _grid_ratios(batches: np.ndarray, seeds: int, b_crit: np.ndarray, sigma: np.ndarray,
                 rng: np.random.Generator) -> np.ndarray:
    """The 90 % interval ratio (high/low, inf when unbounded) a grid would report, one simulated
    grid per draw: steps (1 + B_crit/B)·e^(σ·ε) per batch and seed, the median over seeds per
    batch; the union of Fieller's interval and the seed bootstrap's, as
    `critical.bootstrap_critical_batch` forms it (the bootstrap with GRID_BOOTSTRAP refits)."""
    noise = rng.standard_normal((b_crit.size, batches.size, seeds)) * sigma[:, None, None]
    trials = (1 + b_crit[:, None, None] / batches[None, :, None]) * np.exp(noise)
    steps = np.median(trials, -1)
    fits = fit_lines(np.broadcast_to(batches, steps.shape), steps)
    low, high = fieller_bounds(fits, t_quantile(0.5 + BOOTSTRAP_CONFIDENCE / 2,
                                                batches.size - 2))
    if seeds >= 2:
        boot_low, boot_high = _bootstrap_bounds(batches, trials, rng)
        low, high = np.minimum(low, boot_low), np.maximum(high, boot_high)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(low > 0, high / low, math.inf)


def _bootstrap_bounds(batches: np.ndarray, trials: np.ndarray,
                      rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Per simulated grid (trials: draw × batch × seed), the seed bootstrap's 90 % interval of
    B_crit: per batch, seeds drawn with replacement and their median, refitted GRID_BOOTSTRAP
    times (`interval.seed_bootstrap`, vectorized over the draws)."""
    draws, _, seeds = trials.shape
    pick = rng.integers(seeds, size=(draws, GRID_BOOTSTRAP, batches.size, seeds))
    resampled = np.median(np.take_along_axis(trials[:, None], pick, -1), -1)
    return percentile_bounds(b_crit_or_limit(fit_lines(batches, resampled)),
                             BOOTSTRAP_CONFIDENCE, axis=1)
