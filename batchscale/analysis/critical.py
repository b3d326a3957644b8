"""Steps to result and the critical batch: S(B) per batch size from the convergence trials, the
fit S = S_min + E_min/B, B_crit = E_min/S_min with a bootstrap interval over seeds, the regimes
along S(B), and time to target T(B) = S(B)·t(B) with its model optimum B*.

References: McCandlish et al. 2018, "An Empirical Model of Large-Batch Training" (critical
batch, S = S_min + E_min/B); Shallue et al. 2018, "Measuring the Effects of Data Parallelism on
Neural Network Training" (steps-to-result, regimes, infeasible trials).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd

from batchscale import schemas
from batchscale.fits import (
    as_floats,
    ensure_columns,
    matches,
    numeric_column,
    positive_pairs,
    weighted_line,
)
from batchscale.schemas import RunStatus

PERFECT_SCALING_SLOPE = -0.8
"""d log S / d log B at or below this: doubling the batch nearly halves the steps."""
MAXIMAL_PARALLELISM_SLOPE = -0.2
"""d log S / d log B at or above this: a bigger batch barely reduces the steps."""
PERFECT_SCALING = "perfect_scaling"
DIMINISHING_RETURNS = "diminishing_returns"
MAXIMAL_DATA_PARALLELISM = "maximal_data_parallelism"
MIN_CRITICAL_FIT_BATCHES = 3
"""Two parameters fit any two points exactly: a third batch size is the first check."""
BOOTSTRAP_CONFIDENCE = 0.90
MIN_BOOTSTRAP_SUCCESS = 0.5
"""Share of bootstrap refits that must give an estimate for the interval to be reported."""
Reduction = Literal["median", "min"]
REDUCTIONS: tuple[str, ...] = ("median", "min")


@dataclass(frozen=True)
class CriticalBatchFit:
    """S(B) = S_min + E_min/B (McCandlish et al. 2018) and B_crit = E_min / S_min."""

    s_min: float
    e_min: float
    b_crit: float
    r2: float
    reason: str = ""
    """Why there is no B_crit (empty when there is one)."""
    bound: Literal["", "above", "below"] = ""
    """When the data support no number but a bound: B_crit lies above / below `bound_batch`."""
    bound_batch: float = math.nan


# --------------------------------------------------------------------------- steps to result


def trial_steps(runs: pd.DataFrame) -> np.ndarray:
    """Steps to target per trial, +inf for trials that did not reach it.

    Diverged and not_reached trials are infeasible (Shallue et al. 2018), not errors: +inf
    makes them lose every minimum and, when they are half the seeds or more, every median.
    """
    steps = numeric_column(runs, "steps_to_target")
    ok = matches(runs, "status", RunStatus.REACHED) & np.isfinite(steps) & (steps > 0)
    return np.where(ok, steps, np.inf)


def _reduce_steps(steps: np.ndarray, lrs: np.ndarray, reduce: Reduction) -> tuple[float, float]:
    """S at one batch size and the learning rate that gives it.

    'median': per LR the median over seeds (a learning rate that fails on half the seeds does
    not count as reaching), then the minimum over LRs. 'min': the minimum over all trials, the
    steps-to-result of Shallue et al. 2018 (optimistic with few seeds).
    """
    if reduce == "min":
        i = int(np.argmin(steps))
        return float(steps[i]), float(lrs[i])
    best, best_lr = math.inf, math.nan
    for lr in np.unique(lrs):
        value = float(np.median(steps[lrs == lr]))
        if value < best:
            best, best_lr = value, float(lr)
    return best, best_lr


def steps_to_result(
    runs: pd.DataFrame,
    by: Sequence[str] = ("lr_rule",),
    reduce: Reduction = "median",
) -> pd.DataFrame:
    """S(B) and E(B) = B·S(B) per (`by`…, batch_size), from the trials of the runs table.

    Default reduction: for each (rule, batch, lr) the median over seeds, then the minimum over
    the LR grid. Shallue et al. 2018 take the minimum over all trials; with two or three seeds
    that rewards a lucky seed, and the median keeps S(B) a property of the learning rate.
    `reduce='min'` gives Shallue's definition. Groups where no LR reached the target have NaN
    steps (and `reached` = 0). Columns: by…, batch_size, steps_to_target, examples_to_target,
    best_lr, trials, reached.
    """
    if reduce not in REDUCTIONS:
        raise ValueError(f"reduce must be one of {REDUCTIONS}, got {reduce!r}")
    keys = [*by, "batch_size"]
    columns = [*keys, "steps_to_target", "examples_to_target", "best_lr", "trials", "reached"]
    runs = ensure_columns(runs, schemas.RUNS)
    if runs.empty:
        return pd.DataFrame({c: pd.Series(dtype=object) for c in columns})
    steps = trial_steps(runs)
    lrs = numeric_column(runs, "lr")
    records = []
    for group, index in runs.groupby(keys, sort=True).indices.items():
        key = group if isinstance(group, tuple) else (group,)
        s, lr = _reduce_steps(steps[index], lrs[index], reduce)
        s, lr = (s, lr) if math.isfinite(s) else (math.nan, math.nan)
        batch = int(key[-1])
        records.append(
            {
                **dict(zip(keys, key, strict=True)),
                "batch_size": batch,
                "steps_to_target": s,
                "examples_to_target": batch * s,
                "best_lr": lr,
                "trials": int(index.size),
                "reached": int(np.isfinite(steps[index]).sum()),
            }
        )
    return pd.DataFrame.from_records(records, columns=columns)


# --------------------------------------------------------------------------- critical batch


def _fit_s_on_inverse_b(b: np.ndarray, s: np.ndarray) -> tuple[float, float, float]:
    """Least squares S ≈ S_min + E_min·(1/B) with relative residuals (weights 1/S²).

    Noise in steps-to-target is roughly multiplicative (a few % per seed at every batch), so
    absolute residuals would let the small-batch points, with the most steps, set the fit.
    """
    return weighted_line(1.0 / b, s, 1.0 / s**2)


def fit_critical_batch(batch: Iterable, steps: Iterable) -> CriticalBatchFit:
    """S_min, E_min and B_crit = E_min/S_min from S(B) = S_min + E_min/B (McCandlish 2018).

    Below B_crit doubling the batch almost halves the steps; above it, the steps approach
    S_min and a bigger batch only spends more examples. A non-positive intercept means the
    steps still fall like 1/B at the largest batch measured (B_crit lies above the range); a
    non-positive slope means they do not fall at all (B_crit lies below it). Both give NaN with
    the reason instead of a meaningless ratio.
    """
    b, s = positive_pairs(batch, steps)
    if np.unique(b).size < MIN_CRITICAL_FIT_BATCHES:
        reason = f"fewer than {MIN_CRITICAL_FIT_BATCHES} batch sizes reached the target"
        return CriticalBatchFit(math.nan, math.nan, math.nan, math.nan, reason)
    s_min, e_min, r2 = _fit_s_on_inverse_b(b, s)
    if e_min <= 0:
        reason = f"steps do not fall with batch size: B_crit is below {int(b.min())}"
        return CriticalBatchFit(math.nan, math.nan, math.nan, r2, reason, "below", b.min())
    if s_min <= 0:
        reason = f"steps still fall like 1/B: B_crit is above {int(b.max())}"
        return CriticalBatchFit(math.nan, math.nan, math.nan, r2, reason, "above", b.max())
    return CriticalBatchFit(s_min, e_min, e_min / s_min, r2)


def _b_crit_or_limit(b: np.ndarray, s: np.ndarray) -> float:
    """B_crit for the bootstrap: 0 / +inf where the refit says it lies below / above the range.

    Dropping those refits instead would pull the interval towards the middle of the range.
    """
    b, s = positive_pairs(b, s)
    if np.unique(b).size < MIN_CRITICAL_FIT_BATCHES:
        return math.nan
    s_min, e_min, _ = _fit_s_on_inverse_b(b, s)
    if e_min <= 0:
        return 0.0
    return e_min / s_min if s_min > 0 else math.inf


def _bounded(low: float, high: float, batches: np.ndarray) -> tuple[float, float]:
    """Clip the interval to the measured batch range: a refit's B_crit outside it (0, +inf, or
    a near-zero S_min giving millions) is an extrapolation the data cannot support, so the
    interval ends at the smallest / largest batch and `interval_note` says it runs past."""
    smallest, largest = float(batches.min()), float(batches.max())
    return min(max(low, smallest), largest), min(max(high, smallest), largest)


def _seed_groups(runs: pd.DataFrame) -> list[tuple[float, np.ndarray, np.ndarray, list]]:
    """Per batch size: (batch, trial steps, trial LRs, row indices of each seed)."""
    groups = []
    for batch, trials in runs.groupby("batch_size", sort=True):
        seeds = trials["seed"].to_numpy()
        by_seed = [np.flatnonzero(seeds == seed) for seed in np.unique(seeds)]
        groups.append((float(batch), trial_steps(trials), numeric_column(trials, "lr"), by_seed))
    return groups


def bootstrap_critical_batch(
    runs: pd.DataFrame,
    rule: str,
    n: int,
    seed: int = 0,
    reduce: Reduction = "median",
    confidence: float = BOOTSTRAP_CONFIDENCE,
) -> tuple[float, float]:
    """(low, high) `confidence` interval of B_crit for one LR rule from `n` resamples of seeds
    (`analysis.bootstrap_samples` in the config).

    Each resample draws, per batch size, as many seeds as were run, with replacement (all LR
    values of a drawn seed come along), recomputes S(B) and refits. Percentiles of the
    empirical distribution, without interpolation, clipped to the measured batch range (see
    `_b_crit_or_limit`, `_bounded`). NaN when no batch has two seeds
    (nothing to resample) or when most refits fail.
    """
    runs = ensure_columns(runs, schemas.RUNS)
    groups = _seed_groups(runs[matches(runs, "lr_rule", rule)])
    if not any(len(by_seed) > 1 for *_, by_seed in groups):
        return math.nan, math.nan
    rng = np.random.default_rng(seed)
    batches = np.array([batch for batch, *_ in groups])
    estimates = []
    for _ in range(n):
        s = np.empty(batches.size)
        for i, (_batch, steps, lrs, by_seed) in enumerate(groups):
            drawn = rng.integers(len(by_seed), size=len(by_seed))
            index = np.concatenate([by_seed[j] for j in drawn])
            s[i] = _reduce_steps(steps[index], lrs[index], reduce)[0]
        estimate = _b_crit_or_limit(batches, s)
        if not math.isnan(estimate):
            estimates.append(estimate)
    if len(estimates) < MIN_BOOTSTRAP_SUCCESS * n:
        return math.nan, math.nan
    tail = 100.0 * (1.0 - confidence) / 2.0
    values = np.array(estimates)
    low, high = np.percentile(values, [tail, 100.0 - tail], method="inverted_cdf")
    return _bounded(float(low), float(high), batches)


def interval_note(runs: pd.DataFrame, rule: str, interval: tuple[float, float]) -> str:
    """Why the B_crit interval is missing, or that it reaches an end of the measured range."""
    low, high = interval
    rule_runs = runs[matches(runs, "lr_rule", rule)]
    if math.isnan(low):
        seeds = rule_runs.groupby("batch_size")["seed"].nunique()
        if seeds.empty or seeds.max() < 2:
            return "one seed per batch size: nothing to resample"
        return "most bootstrap refits failed"
    batches = numeric_column(rule_runs, "batch_size")
    if high >= np.nanmax(batches):
        return "the interval reaches past the largest batch measured: its top is uncertain"
    if low <= np.nanmin(batches):
        return "the interval reaches below the smallest batch measured: its bottom is uncertain"
    return ""


# --------------------------------------------------------------------------- regimes


def classify_slope(slope: float) -> str | None:
    """Regime of Shallue et al. 2018 from the local slope d log S / d log B (None if unknown)."""
    if not math.isfinite(slope):
        return None
    if slope <= PERFECT_SCALING_SLOPE:
        return PERFECT_SCALING
    if slope >= MAXIMAL_PARALLELISM_SLOPE:
        return MAXIMAL_DATA_PARALLELISM
    return DIMINISHING_RETURNS


def regimes(batch: Iterable, steps: Iterable) -> pd.DataFrame:
    """Per batch: local slope d log S / d log B and its regime label.

    The slope comes from finite differences with the neighbouring batches (central inside,
    one-sided at the ends) on log–log axes: −1 means doubling the batch halves the steps
    (perfect scaling), 0 means it saves none (maximal data parallelism). Batches without a
    finite S get NaN and None. Batch sizes must be distinct.
    """
    b, s = as_floats(batch), as_floats(steps)
    order = np.argsort(b, kind="stable")
    b, s = b[order], s[order]
    slope = np.full(b.size, np.nan)
    usable = np.isfinite(s) & (s > 0) & np.isfinite(b) & (b > 0)
    if usable.sum() >= 2:
        slope[usable] = np.gradient(np.log(s[usable]), np.log(b[usable]))
    labels = pd.Series([classify_slope(value) for value in slope], dtype=object)
    return pd.DataFrame({"batch_size": b, "slope": slope, "regime": labels})
