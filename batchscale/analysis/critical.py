"""Steps to result and the critical batch: S(B) per batch size from the convergence trials, the
fit S = S_min + E_min/B, B_crit = E_min/S_min where the data support a number (otherwise a
bound: above the largest or below the smallest batch), its interval, and the regimes along the
fitted curve. The statistics (standard errors, Fieller's interval, the vectorized seed
bootstrap) are in `interval`.

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
from batchscale.analysis.critical_reasons import (
    fitted_fall,
    neither_clear_reason,
    too_few_reason,
)
from batchscale.analysis.evaluations import coarse_evaluations
from batchscale.analysis.interval import (
    fieller_interval,
    fit_lines,
    percentile_interval,
    seed_bootstrap,
    seed_cells,
)
from batchscale.config import AnalysisConfig
from batchscale.fits import as_floats, ensure_columns, matches, numeric_column, positive_pairs
from batchscale.schemas import RunStatus
from batchscale.tdist import t_quantile

PERFECT_SCALING_SLOPE = -0.8
"""d log S / d log B at or below this: doubling the batch nearly halves the steps."""
MAXIMAL_PARALLELISM_SLOPE = -0.2
"""d log S / d log B at or above this: a bigger batch barely reduces the steps."""
PERFECT_SCALING = "perfect_scaling"
DIMINISHING_RETURNS = "diminishing_returns"
MAXIMAL_DATA_PARALLELISM = "maximal_data_parallelism"
SUPPORT_CONFIDENCE = 0.95
"""B_crit is a number only if S_min and E_min are each above zero with this one-sided
confidence (Student t on the fit's standard errors): the same as the two-sided 90 % interval
being bounded."""
DEFAULT_RANGE_FACTOR: float = AnalysisConfig.model_fields["b_crit_range_factor"].default
"""A B_crit further than this factor outside the measured batches is reported as a bound."""
BOOTSTRAP_CONFIDENCE = 0.90
"""The coverage every B_crit interval claims."""
ADAPTIVE_READ_LEVEL = 0.98
"""The nominal level at which the trials of an adaptive search are read so that the interval
holds the truth BOOTSTRAP_CONFIDENCE of the time: a search that stops once its interval is
narrow selects lucky draws (bench_adaptive_calibration measures the coverage it gives)."""


def read_level_reason(level: float) -> str:
    """Why the interval is read at `level` rather than its claimed 90 %; "" at 90 %."""
    if level == BOOTSTRAP_CONFIDENCE:
        return ""
    if level == ADAPTIVE_READ_LEVEL:
        return ("an adaptive search chose these trials from the results so far (where to "
                "train next, when to stop), which a "
                f"{BOOTSTRAP_CONFIDENCE:.0%} reading over-claims")
    return "analysis.b_crit_read_level"


def read_level(settings: AnalysisConfig, adaptive: bool) -> float:
    """The nominal level the B_crit interval is read at (AnalysisConfig.b_crit_read_level)."""
    if settings.b_crit_read_level is not None:
        return settings.b_crit_read_level
    return ADAPTIVE_READ_LEVEL if adaptive else BOOTSTRAP_CONFIDENCE
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
    s_min_se: float = math.nan
    e_min_se: float = math.nan
    """S_min's and E_min's standard errors from the fit (interval.LineFits; NaN without B_crit)."""


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
    the learning rates tried. Shallue et al. 2018 take the minimum over all trials; with two or
    three seeds that rewards a lucky seed, and the median keeps S(B) a property of the learning
    rate.
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


def fit_critical_batch(
    batch: Iterable, steps: Iterable, *, range_factor: float = DEFAULT_RANGE_FACTOR
) -> CriticalBatchFit:
    """S_min, E_min and B_crit = E_min/S_min from S(B) = S_min + E_min/B (McCandlish 2018), or
    the bound the data support instead of a number.

    Below B_crit doubling the batch almost halves the steps; above it, the steps approach
    S_min and a bigger batch only spends more examples. B_crit is a number only when
    - S_min and E_min are each clearly positive: at least t(SUPPORT_CONFIDENCE, n − 2) of
      their own standard errors (one-sided 95 %: 6.3 with 3 batch sizes, 2.0 with 7, 1.9 with
      9), the scatter floored at round-off (`interval.ROUND_OFF_SCATTER`), and
    - it lies within the measured batches widened by `range_factor` each way
      (`analysis.b_crit_range_factor`).
    Otherwise: E_min not clearly positive → bound "below" the smallest batch (no batch size
    saved steps) when even E_min's upper bound puts B_crit there, else no number and no bound
    (the steps fell, but not clearly); S_min not clearly positive → bound "above" the largest
    (steps still fall like 1/B); a number past the widened range → the bound on that side;
    neither clearly positive → no number and no bound (the steps scatter too much to tell).
    Batches whose steps are missing (the target was not reached) do not count; with fewer
    than MIN_CRITICAL_FIT_BATCHES left there is no fit, and the reason says which reached.
    """
    b, s = positive_pairs(batch, steps)
    short = too_few_reason(as_floats(batch), b)
    if short:
        return CriticalBatchFit(math.nan, math.nan, math.nan, math.nan, short)
    fits = fit_lines(b, s)
    r2, s_min, e_min = float(fits.r2), float(fits.s_min), float(fits.e_min)
    needed = t_quantile(SUPPORT_CONFIDENCE, int(fits.dof))
    smallest, largest = float(b.min()), float(b.max())
    e_clear, s_clear = float(fits.t_e_min) >= needed, float(fits.t_s_min) >= needed
    if not (e_clear or s_clear):
        return CriticalBatchFit(math.nan, math.nan, math.nan, r2,
                                neither_clear_reason(fits, needed, smallest, largest))
    if not e_clear:
        return _e_min_unclear(fits, needed, smallest, largest, r2)
    if not s_clear:
        return _s_min_unclear(fits, needed, smallest, largest, r2)
    b_crit = e_min / s_min
    if b_crit > range_factor * largest:
        reason = (
            f"steps still fall nearly like 1/B up to {largest:,.0f}: the fit puts B_crit near"
            f" {b_crit:,.0f}, more than {range_factor:g}× the largest batch measured, so the"
            f" data only show that B_crit is above {largest:,.0f}"
        )
        return _above(largest, r2, reason)
    if b_crit < smallest / range_factor:
        reason = (
            f"no batch size saved steps: the fit puts B_crit near {b_crit:.3g}, less than"
            f" 1/{range_factor:g} of the smallest batch measured, so the data only show that"
            f" B_crit is below {smallest:,.0f}"
        )
        return _below(smallest, r2, reason)
    return CriticalBatchFit(s_min, e_min, b_crit, r2, s_min_se=float(np.sqrt(fits.var_s)),
                            e_min_se=float(np.sqrt(fits.var_e)))


def _e_min_unclear(fits, needed: float, smallest: float, largest: float,
                   r2: float) -> CriticalBatchFit:
    """E_min is not clearly positive. "Below the smallest batch" is a claim only when even
    E_min's upper bound puts B_crit there; steps that fell, but by less than the scatter can
    vouch for, give no number and no bound (a bound the falling steps contradict would be
    worse than none)."""
    s_min, e_min = float(fits.s_min), float(fits.e_min)
    e_high = e_min + needed * math.sqrt(max(float(fits.var_e), 0.0))
    if s_min > 0 and e_high / s_min < smallest:
        return _below(smallest, r2, f"no batch size saved steps: B_crit is below {smallest:,.0f}")
    reason = (f"{fitted_fall(fits, smallest, largest)} that fall is not clear (E_min "
              f"{float(fits.t_e_min):.1f} standard errors from zero, {needed:.1f} needed); "
              "more seeds or batch sizes would tell")
    return CriticalBatchFit(math.nan, math.nan, math.nan, r2, reason)


def _s_min_unclear(fits, needed: float, smallest: float, largest: float,
                   r2: float) -> CriticalBatchFit:
    """S_min is not clearly positive. "Above the largest batch" is a claim only when even
    S_min's upper bound puts B_crit there (as `_e_min_unclear` for "below"): steps that fell
    clearly slower than 1/B with too few batch sizes to pin the floor give no bound, which
    would tell the user to keep growing the batch against the table."""
    e_min = float(fits.e_min)
    s_high = float(fits.s_min) + needed * math.sqrt(max(float(fits.var_s), 0.0))
    if s_high <= 0 or e_min / s_high > largest:
        return _above(largest, r2, f"steps still fall like 1/B up to {largest:,.0f}: B_crit is "
                                   f"above {largest:,.0f}")
    reason = (f"{fitted_fall(fits, smallest, largest)} the floor they fall towards is not clear "
              f"(S_min {float(fits.t_s_min):.1f} standard errors from zero, {needed:.1f} "
              f"needed), and even at its upper bound B_crit would be near {e_min / s_high:,.0f}, "
              f"inside the batches measured; more batch sizes or seeds would tell")
    return CriticalBatchFit(math.nan, math.nan, math.nan, r2, reason)


def _above(largest: float, r2: float, reason: str) -> CriticalBatchFit:
    return CriticalBatchFit(math.nan, math.nan, math.nan, r2, reason, "above", largest)


def _below(smallest: float, r2: float, reason: str) -> CriticalBatchFit:
    return CriticalBatchFit(math.nan, math.nan, math.nan, r2, reason, "below", smallest)


# --------------------------------------------------------------------------- its interval


def bootstrap_critical_batch(
    runs: pd.DataFrame,
    rule: str,
    n: int,
    seed: int = 0,
    reduce: Reduction = "median",
    confidence: float = BOOTSTRAP_CONFIDENCE,
    *,
    range_factor: float = DEFAULT_RANGE_FACTOR,
    seeds_needed: bool = False,
) -> tuple[float, float]:
    """(low, high) `confidence` interval of B_crit for one LR rule, when B_crit is a number.

    The union of two intervals (why: `batchscale.analysis.interval`): percentiles of `n` seed
    bootstrap refits (`analysis.bootstrap_samples`; per batch, seeds drawn with replacement,
    all LRs of a drawn seed along), and Fieller's interval from the fit's own residuals, which
    sees the scatter that resampled seeds miss (two seeds, whole-epoch steps that tie).
    Calibrated by tests/test_calibration.py. The ends are cut at the measured batches widened
    by `range_factor` (`interval_note` says so).

    With one run per batch size (the usual published table: the best run over learning rates
    per batch) there are no seeds to resample, and the interval is Fieller's alone: the fit's
    residuals across the batch sizes carry the scatter (coverage measured on simulated one-run
    tables by tests/test_calibration.py; `interval_note` says which kind it is), unless
    `seeds_needed` (the adaptive search: NaN, NaN until some batch size has two seeds).

    NaN, NaN when `fit_critical_batch` gives no number for these trials (a bound or too few
    batch sizes: the bound is then the whole statement, with no interval), or when fewer than
    MIN_BOOTSTRAP_SUCCESS of the refits have three batch sizes that reached the target.
    """
    runs = ensure_columns(runs, schemas.RUNS)
    rule_runs = runs[matches(runs, "lr_rule", rule)]
    table = steps_to_result(rule_runs, by=(), reduce=reduce)
    batch, steps = positive_pairs(table["batch_size"], table["steps_to_target"])
    if not math.isfinite(fit_critical_batch(batch, steps, range_factor=range_factor).b_crit):
        return math.nan, math.nan
    batches, cells = seed_cells(
        numeric_column(rule_runs, "batch_size"),
        trial_steps(rule_runs),
        pd.factorize(rule_runs["lr"], use_na_sentinel=False)[0],
        pd.factorize(rule_runs["seed"], use_na_sentinel=False)[0],
    )
    if seeds_needed and all(cell.shape[1] < 2 for cell in cells):
        return math.nan, math.nan
    low, high = fieller_interval(fit_lines(batch, steps), confidence)
    if any(cell.shape[1] >= 2 for cell in cells):
        rng = np.random.default_rng(seed)
        estimates = seed_bootstrap(batches, cells, n, rng, reduce)
        estimates = estimates[~np.isnan(estimates)]
        if estimates.size < MIN_BOOTSTRAP_SUCCESS * n:
            return math.nan, math.nan
        boot_low, boot_high = percentile_interval(estimates, confidence)
        low, high = min(boot_low, low), max(boot_high, high)
    floor, ceiling = batch.min() / range_factor, batch.max() * range_factor
    return float(np.clip(low, floor, ceiling)), float(np.clip(high, floor, ceiling))


def _rule_batches(runs: pd.DataFrame, rule: str) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """(the rule's runs, the batch sizes that reached the target, their steps)."""
    rule_runs = ensure_columns(runs, schemas.RUNS)
    rule_runs = rule_runs[matches(rule_runs, "lr_rule", rule)]
    table = steps_to_result(rule_runs, by=())
    batch, steps = positive_pairs(table["batch_size"], table["steps_to_target"])
    return rule_runs, batch, steps


BOTTOM_CUT, TOP_CUT = "its bottom is cut at", "its top is cut at"
"""How `interval_note` begins the note of an interval end cut at the range the fit allows."""


def cut_sides(runs: pd.DataFrame, rule: str, interval: tuple[float, float], *,
              range_factor: float = DEFAULT_RANGE_FACTOR) -> tuple[bool, bool]:
    """(bottom cut, top cut): whether the interval reaches the limit the fit allows below the
    smallest or above the largest batch that reached the target (`range_factor` each way). On
    a cut side the interval is a bound, however narrow its high/low reads."""
    low, high = interval
    _, batch, _ = _rule_batches(runs, rule)
    if not (math.isfinite(low) and math.isfinite(high)) or len(batch) == 0:
        return False, False
    return low <= batch.min() / range_factor, high >= batch.max() * range_factor


def interval_note(
    runs: pd.DataFrame,
    rule: str,
    interval: tuple[float, float],
    *,
    range_factor: float = DEFAULT_RANGE_FACTOR,
) -> str:
    """Why the B_crit interval is missing, or where it leaves the measured batches, and where
    the steps it rests on are coarsely counted (`coarse_evaluations`); "" if none of these."""
    low, high = interval
    rule_runs, batch, steps = _rule_batches(runs, rule)
    if math.isnan(low):
        fit = fit_critical_batch(batch, steps, range_factor=range_factor)
        if not math.isfinite(fit.b_crit):
            return f"no interval without a number: {fit.reason}"
        return "most bootstrap refits had fewer than three batch sizes reaching the target"
    smallest, largest = float(batch.min()), float(batch.max())
    floor, ceiling = smallest / range_factor, largest * range_factor
    bottom_cut, top_cut = cut_sides(runs, rule, interval, range_factor=range_factor)
    notes = []
    seeds = rule_runs.groupby("batch_size")["seed"].nunique()
    if seeds.empty or seeds.max() < 2:
        notes.append("one run per batch size: the interval is read from the fit's residuals "
                     "across batch sizes alone, with no seeds to resample")
    if bottom_cut:
        notes.append(
            f"{BOTTOM_CUT} {floor:,.3g}, 1/{range_factor:g} of the smallest batch"
            " measured: B_crit may lie lower"
        )
    elif low < smallest:
        notes.append(
            f"its bottom ({low:,.3g}) is below the smallest batch measured ({smallest:,.0f}):"
            " an extrapolation"
        )
    if top_cut:
        notes.append(
            f"{TOP_CUT} {ceiling:,.0f}, {range_factor:g}× the largest batch measured:"
            " B_crit may lie higher"
        )
    elif high > largest:
        notes.append(
            f"its top ({high:,.0f}) is past the largest batch measured ({largest:,.0f}):"
            " an extrapolation"
        )
    notes.append(coarse_evaluations(runs, rule))
    return "; ".join(note for note in notes if note)


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


def fitted_slope(batch: np.ndarray, fit: CriticalBatchFit | None) -> np.ndarray:
    """d log S / d log B of the fitted curve at `batch`: −B_crit/(B + B_crit) for a number;
    −1 everywhere for a bound "above" (the data fall like 1/B), 0 for "below" (flat); NaN
    without a fit."""
    batch = np.asarray(batch, dtype=float)
    if fit is None:
        return np.full(batch.shape, np.nan)
    if math.isfinite(fit.b_crit) and not fit.bound:
        return -fit.b_crit / (batch + fit.b_crit)
    limit = {"above": -1.0, "below": 0.0}.get(fit.bound, math.nan)
    return np.full(batch.shape, limit)


def measured_slopes(batch: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """d log S / d log B from finite differences with the neighbouring batches (central inside,
    one-sided at the ends) on log–log axes; NaN where S is not finite."""
    slope = np.full(batch.size, np.nan)
    usable = np.isfinite(steps) & (steps > 0) & np.isfinite(batch) & (batch > 0)
    if usable.sum() >= 2:
        slope[usable] = np.gradient(np.log(steps[usable]), np.log(batch[usable]))
    return slope


def regimes(batch: Iterable, steps: Iterable, fit: CriticalBatchFit | None = None) -> pd.DataFrame:
    """Per measured batch, sorted: batch_size, fit_slope, measured_slope, regime.

    fit_slope is the local slope d log S / d log B of the fitted curve (`fitted_slope`), so the
    labels agree with B_crit: perfect scaling (≤ −0.8) up to B_crit/4, maximal data
    parallelism (≥ −0.2) from 4·B_crit. measured_slope is the finite difference of the
    measured S(B), kept beside it. The regime comes from fit_slope when `fit` has a number or
    a bound; without one (no fit given, or too few batch sizes) from measured_slope, whose
    noise can flip labels between neighbours. Batches without a finite S get NaN slopes and
    no regime. Batch sizes must be distinct.
    """
    b, s = as_floats(batch), as_floats(steps)
    order = np.argsort(b, kind="stable")
    b, s = b[order], s[order]
    reached = np.isfinite(s) & (s > 0)
    fit_slope = np.where(reached, fitted_slope(b, fit), np.nan)
    measured = measured_slopes(b, s)
    use_fit = fit is not None and (fit.bound != "" or math.isfinite(fit.b_crit))
    chosen = fit_slope if use_fit else measured
    labels = pd.Series([classify_slope(value) for value in chosen], dtype=object)
    return pd.DataFrame(
        {"batch_size": b, "fit_slope": fit_slope, "measured_slope": measured, "regime": labels}
    )
