"""The analysis stage's core: the fits of DESIGN §4, regimes, and the recommendation.

Everything here is a pure function of pandas DataFrames shaped like the `sweep`, `runs` and
`curves` tables of `batchscale.schemas`. Missing pieces (no reached trial for a rule, OOM rows,
a single seed, an empty table) give NaN or None with a reason, never an exception: a report
that says "not measured" is more useful than a failed pipeline step.

References: McCandlish et al. 2018, "An Empirical Model of Large-Batch Training" (critical
batch, S = S_min + E_min/B, gradient noise scale); Shallue et al. 2018, "Measuring the Effects
of Data Parallelism on Neural Network Training" (steps-to-result, regimes, infeasible trials).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import pyarrow as pa

from batchscale import schemas

SATURATION_TOLERANCE = 0.10
"""A batch is saturated when its samples/s is within this share of the best measured."""
PERFECT_SCALING_SLOPE = -0.8
"""d log S / d log B at or below this: doubling the batch nearly halves the steps."""
MAXIMAL_PARALLELISM_SLOPE = -0.2
"""d log S / d log B at or above this: a bigger batch barely reduces the steps."""
PERFECT_SCALING = "perfect_scaling"
DIMINISHING_RETURNS = "diminishing_returns"
MAXIMAL_DATA_PARALLELISM = "maximal_data_parallelism"
MIN_BYTES_PER_SAMPLE = 1.0
"""A memory slope under a byte per sample is rounding, not growth."""
MIN_CRITICAL_FIT_BATCHES = 3
"""Two parameters fit any two points exactly: a third batch size is the first check."""
BOOTSTRAP_SAMPLES = 200
BOOTSTRAP_CONFIDENCE = 0.90
MIN_BOOTSTRAP_SUCCESS = 0.5
"""Share of bootstrap refits that must give an estimate for the interval to be reported."""
REACHED = "reached"
STATUS_OK = "ok"
STATUS_OOM = "oom"
TIMING_MODES = ("synthetic", "real")
"""Input modes whose sweep step times are used, in order of preference: synthetic input is the
device's own speed, without the input pipeline."""
Reduction = Literal["median", "min"]
REDUCTIONS: tuple[str, ...] = ("median", "min")
ANALYSIS_COLUMNS: list[str] = list(schemas.ANALYSIS.names)
INPUT_BOTTLENECK_SHARE = 0.2
"""Real input losing more than this share of synthetic throughput: the input pipeline limits."""
NOT_AVAILABLE = "n/a"


# --------------------------------------------------------------------------- fit results


@dataclass(frozen=True)
class StepTimeFit:
    """t(B) ≈ alpha + beta·B: alpha is the per-step overhead, beta the time per sample."""

    alpha_s: float
    beta_s: float
    r2: float
    reason: str = ""

    def predict(self, batch: float) -> float:
        """Step time at `batch` from the line; NaN where the line is unusable or non-positive."""
        value = self.alpha_s + self.beta_s * batch
        return float(value) if math.isfinite(value) and value > 0 else math.nan


@dataclass(frozen=True)
class MemoryFit:
    """peak ≈ fixed + per_sample·B; `b_max` is the largest batch under the budget."""

    fixed_bytes: float
    per_sample_bytes: float
    r2: float
    b_max: float
    reason: str = ""


@dataclass(frozen=True)
class CriticalBatchFit:
    """S(B) = S_min + E_min/B (McCandlish et al. 2018) and B_crit = E_min / S_min."""

    s_min: float
    e_min: float
    b_crit: float
    r2: float
    reason: str = ""


@dataclass(frozen=True)
class Recommendation:
    batch_size: int | None
    lr_rule: str | None
    workers: int | None
    batch_reason: str
    lr_rule_reason: str
    workers_reason: str


@dataclass(frozen=True)
class AnalysisResult:
    """What the analysis component writes: the analysis table, headline numbers and text."""

    rows: list[dict]
    """One dict per (lr_rule, batch_size), with exactly the columns of schemas.ANALYSIS."""
    summary: dict
    """Headline numbers with the reasons behind them (JSON-serializable)."""
    metrics: dict[str, float]
    """Flat name → finite float, for KFP Metrics (non-finite values are left out)."""
    markdown: str
    """Short answer to "why doesn't my training get faster?" with the numbers."""


# --------------------------------------------------------------------------- helpers


def _floats(values: Iterable) -> np.ndarray:
    return pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").to_numpy(
        dtype=float, na_value=np.nan
    )


def _column(frame: pd.DataFrame, name: str) -> np.ndarray:
    return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _positive_pairs(x: Iterable, y: Iterable) -> tuple[np.ndarray, np.ndarray]:
    """The (x, y) pairs where both are finite and positive (the only ones the fits can use)."""
    xs, ys = _floats(x), _floats(y)
    keep = np.isfinite(xs) & np.isfinite(ys) & (xs > 0) & (ys > 0)
    return xs[keep], ys[keep]


def _weighted_line(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
    """Weighted least squares y ≈ a + b·x; R² in the same weighted metric the fit minimizes."""
    root = np.sqrt(w)
    design = np.column_stack([np.ones_like(x), x]) * root[:, None]
    (intercept, slope), *_ = np.linalg.lstsq(design, y * root, rcond=None)
    mean = np.sum(w * y) / np.sum(w)
    total = np.sum(w * (y - mean) ** 2)
    residual = np.sum(w * (y - intercept - slope * x) ** 2)
    r2 = 1.0 - residual / total if total > 0 else math.nan
    return float(intercept), float(slope), float(r2)


def ensure_columns(frame: pd.DataFrame | None, schema: pa.Schema) -> pd.DataFrame:
    """`frame` with every column of `schema` (missing ones all-null); an empty frame for None."""
    if frame is None:
        return pd.DataFrame({name: pd.Series(dtype=object) for name in schema.names})
    missing = [name for name in schema.names if name not in frame.columns]
    if not missing:
        return frame
    return frame.assign(**{name: pd.Series(np.nan, index=frame.index) for name in missing})


def _is(frame: pd.DataFrame, column: str, value: str) -> np.ndarray:
    return frame[column].eq(value).to_numpy(dtype=bool, na_value=False)


# --------------------------------------------------------------------------- throughput


def throughput_curve(sweep: pd.DataFrame, input_mode: str = "synthetic") -> pd.DataFrame:
    """Per batch size of one input mode: step time (median, p10, p90), samples/s, memory, MFU.

    Only ok rows count (oom and error rows carry no timing); repeated rows give their median.
    """
    sweep = ensure_columns(sweep, schemas.SWEEP)
    rows = sweep[_is(sweep, "status", STATUS_OK) & _is(sweep, "input_mode", input_mode)]
    columns = [
        "step_time_median_s",
        "step_time_p10_s",
        "step_time_p90_s",
        "samples_per_s",
        "peak_memory_bytes",
        "mfu",
    ]
    numeric = pd.DataFrame({c: _column(rows, c) for c in columns})
    numeric["batch_size"] = _column(rows, "batch_size")
    curve = numeric.groupby("batch_size", sort=True).median().reset_index()
    derived = curve["batch_size"] / curve["step_time_median_s"]
    curve["samples_per_s"] = curve["samples_per_s"].fillna(derived)
    return curve[np.isfinite(curve["samples_per_s"]) & (curve["samples_per_s"] > 0)]


def saturation_batch(
    sweep: pd.DataFrame,
    tolerance: float = SATURATION_TOLERANCE,
    input_mode: str = "synthetic",
) -> int | None:
    """Smallest batch whose samples/s is within `tolerance` of the best measured (ok rows).

    Past this batch the device is busy: a bigger batch makes each step longer by about as much
    as it adds samples, so it buys throughput only at the margin. None when nothing was timed.
    """
    curve = throughput_curve(sweep, input_mode)
    if curve.empty:
        return None
    best = curve["samples_per_s"].max()
    saturated = curve[curve["samples_per_s"] >= (1.0 - tolerance) * best]
    return int(saturated["batch_size"].min())


def timing_mode(sweep: pd.DataFrame) -> str | None:
    """The input mode whose step times describe the device (synthetic when it was timed)."""
    for mode in TIMING_MODES:
        if not throughput_curve(sweep, mode).empty:
            return mode
    return None


def fit_step_time(batch: Iterable, step_time: Iterable) -> StepTimeFit:
    """Least squares t(B) ≈ α + βB, minimizing relative residuals.

    Sweeps space batches geometrically (1 … 1024), so an unweighted fit would be set by the
    largest batch alone and could predict negative times at small B; weighting by 1/t² treats
    every measured batch alike. α is the fixed cost per step (launches, optimizer, sync),
    β the cost per sample; together they give B* = sqrt(α·B_crit/β) (DESIGN §4).
    """
    b, t = _positive_pairs(batch, step_time)
    if np.unique(b).size < 2:
        return StepTimeFit(math.nan, math.nan, math.nan, "fewer than two timed batch sizes")
    alpha, beta, r2 = _weighted_line(b, t, 1.0 / t**2)
    return StepTimeFit(alpha, beta, r2)


def fit_memory(
    batch: Iterable, peak_bytes: Iterable, budget_bytes: float | None = None
) -> MemoryFit:
    """Least squares peak ≈ fixed + per_sample·B, and the largest batch under `budget_bytes`.

    Unweighted: the large batches, closest to the budget, should dominate the prediction.
    """
    b, m = _positive_pairs(batch, peak_bytes)
    if np.unique(b).size < 2:
        return MemoryFit(math.nan, math.nan, math.nan, math.nan, "fewer than two measured batches")
    fixed, per_sample, r2 = _weighted_line(b, m, np.ones_like(m))
    if per_sample < MIN_BYTES_PER_SAMPLE:
        return MemoryFit(fixed, per_sample, r2, math.nan, "peak memory does not grow with batch")
    if budget_bytes is None or not math.isfinite(budget_bytes):
        return MemoryFit(fixed, per_sample, r2, math.nan, "no memory budget given")
    if budget_bytes <= fixed:
        return MemoryFit(fixed, per_sample, r2, 0.0, "the fixed memory alone exceeds the budget")
    return MemoryFit(fixed, per_sample, r2, float(math.floor((budget_bytes - fixed) / per_sample)))


def largest_fitting_batch(sweep: pd.DataFrame) -> tuple[float, str]:
    """Largest ok batch below the smallest OOM batch; +inf when nothing ran out of memory."""
    sweep = ensure_columns(sweep, schemas.SWEEP)
    batches = _column(sweep, "batch_size")
    oom = batches[_is(sweep, "status", STATUS_OOM)]
    ok = batches[_is(sweep, "status", STATUS_OK)]
    if oom.size == 0 and ok.size == 0:
        return math.nan, "memory not measured: no batch size ran"
    if oom.size == 0:
        return math.inf, f"no batch ran out of memory up to batch {int(np.nanmax(ok))}"
    fits = ok[ok < np.nanmin(oom)]
    if fits.size == 0:
        return math.nan, f"batch {int(np.nanmin(oom))} ran out of memory and no smaller batch ran"
    return float(np.max(fits)), f"batch {int(np.nanmin(oom))} ran out of memory"


def input_pipeline_share(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per batch: share of synthetic-input throughput lost with real input (1 − real/synthetic).

    Near 0 the input pipeline keeps up; a large share means the device waits for data.
    """
    synthetic = throughput_curve(sweep, "synthetic").set_index("batch_size")["samples_per_s"]
    real = throughput_curve(sweep, "real").set_index("batch_size")["samples_per_s"]
    both = pd.DataFrame({"synthetic": synthetic, "real": real}).dropna()
    both["share"] = 1.0 - both["real"] / both["synthetic"]
    return both.reset_index(names="batch_size")


# --------------------------------------------------------------------------- steps to result


def _trial_steps(runs: pd.DataFrame) -> np.ndarray:
    """Steps to target per trial, +inf for trials that did not reach it.

    Diverged and not_reached trials are infeasible (Shallue et al. 2018), not errors: +inf
    makes them lose every minimum and, when they are half the seeds or more, every median.
    """
    steps = _column(runs, "steps_to_target")
    ok = _is(runs, "status", REACHED) & np.isfinite(steps) & (steps > 0)
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
    steps = _trial_steps(runs)
    lrs = _column(runs, "lr")
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
    return _weighted_line(1.0 / b, s, 1.0 / s**2)


def fit_critical_batch(batch: Iterable, steps: Iterable) -> CriticalBatchFit:
    """S_min, E_min and B_crit = E_min/S_min from S(B) = S_min + E_min/B (McCandlish 2018).

    Below B_crit doubling the batch almost halves the steps; above it, the steps approach
    S_min and a bigger batch only spends more examples. A non-positive intercept means the
    steps still fall like 1/B at the largest batch measured (B_crit lies above the range); a
    non-positive slope means they do not fall at all (B_crit lies below it). Both give NaN with
    the reason instead of a meaningless ratio.
    """
    b, s = _positive_pairs(batch, steps)
    if np.unique(b).size < MIN_CRITICAL_FIT_BATCHES:
        reason = f"fewer than {MIN_CRITICAL_FIT_BATCHES} batch sizes reached the target"
        return CriticalBatchFit(math.nan, math.nan, math.nan, math.nan, reason)
    s_min, e_min, r2 = _fit_s_on_inverse_b(b, s)
    if e_min <= 0:
        reason = f"steps do not fall with batch size: B_crit is below {int(b.min())}"
        return CriticalBatchFit(math.nan, math.nan, math.nan, r2, reason)
    if s_min <= 0:
        reason = f"steps still fall like 1/B: B_crit is above {int(b.max())}"
        return CriticalBatchFit(math.nan, math.nan, math.nan, r2, reason)
    return CriticalBatchFit(s_min, e_min, e_min / s_min, r2)


def _b_crit_or_limit(b: np.ndarray, s: np.ndarray) -> float:
    """B_crit for the bootstrap: 0 / +inf where the refit says it lies below / above the range.

    Dropping those refits instead would pull the interval towards the middle of the range.
    """
    b, s = _positive_pairs(b, s)
    if np.unique(b).size < MIN_CRITICAL_FIT_BATCHES:
        return math.nan
    s_min, e_min, _ = _fit_s_on_inverse_b(b, s)
    if e_min <= 0:
        return 0.0
    return e_min / s_min if s_min > 0 else math.inf


def _bounded(low: float, high: float, batches: np.ndarray) -> tuple[float, float]:
    """Clip the interval to the measured batch range: a refit's B_crit outside it (0, +inf, or
    a near-zero S_min giving millions) is an extrapolation the data cannot support, so the
    interval ends at the smallest / largest batch and `_interval_note` says it runs past."""
    smallest, largest = float(batches.min()), float(batches.max())
    return min(max(low, smallest), largest), min(max(high, smallest), largest)


def _seed_groups(runs: pd.DataFrame) -> list[tuple[float, np.ndarray, np.ndarray, list]]:
    """Per batch size: (batch, trial steps, trial LRs, row indices of each seed)."""
    groups = []
    for batch, trials in runs.groupby("batch_size", sort=True):
        seeds = trials["seed"].to_numpy()
        by_seed = [np.flatnonzero(seeds == seed) for seed in np.unique(seeds)]
        groups.append((float(batch), _trial_steps(trials), _column(trials, "lr"), by_seed))
    return groups


def bootstrap_critical_batch(
    runs: pd.DataFrame,
    rule: str,
    n: int = BOOTSTRAP_SAMPLES,
    seed: int = 0,
    reduce: Reduction = "median",
    confidence: float = BOOTSTRAP_CONFIDENCE,
) -> tuple[float, float]:
    """(low, high) `confidence` interval of B_crit for one LR rule, resampling seeds.

    Each resample draws, per batch size, as many seeds as were run, with replacement (all LR
    values of a drawn seed come along), recomputes S(B) and refits. Percentiles of the
    empirical distribution, without interpolation, clipped to the measured batch range (see
    `_b_crit_or_limit`, `_bounded`). NaN when no batch has two seeds
    (nothing to resample) or when most refits fail.
    """
    runs = ensure_columns(runs, schemas.RUNS)
    groups = _seed_groups(runs[_is(runs, "lr_rule", rule)])
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


# --------------------------------------------------------------------------- regimes, time


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
    b, s = _floats(batch), _floats(steps)
    order = np.argsort(b, kind="stable")
    b, s = b[order], s[order]
    slope = np.full(b.size, np.nan)
    usable = np.isfinite(s) & (s > 0) & np.isfinite(b) & (b > 0)
    if usable.sum() >= 2:
        slope[usable] = np.gradient(np.log(s[usable]), np.log(b[usable]))
    labels = pd.Series([classify_slope(value) for value in slope], dtype=object)
    return pd.DataFrame({"batch_size": b, "slope": slope, "regime": labels})


def time_to_target(steps: float | np.ndarray, step_time: float | np.ndarray) -> np.ndarray:
    """T(B) = S(B)·t(B): steps to the target times seconds per step (evaluation excluded)."""
    return np.asarray(steps, dtype=float) * np.asarray(step_time, dtype=float)


def optimal_batch(alpha: float, beta: float, b_crit: float, b_max: float = math.inf) -> float:
    """B* = sqrt(α·B_crit/β), capped at `b_max`: the minimum of T(B) under both models.

    With t = α + βB and S = S_min + E_min/B, dT/dB = S_min·β − E_min·α/B², zero at
    B² = α·B_crit/β. NaN unless α, β and B_crit are positive and finite.
    """
    values = (alpha, beta, b_crit)
    if not all(math.isfinite(v) and v > 0 for v in values):
        return math.nan
    best = math.sqrt(alpha * b_crit / beta)
    return best if math.isnan(b_max) else min(best, b_max)


def step_times(
    sweep: pd.DataFrame, runs: pd.DataFrame, batches: Iterable
) -> tuple[np.ndarray, StepTimeFit, str]:
    """Seconds per step at each of `batches`, the α + βB fit, and where the times came from.

    The sweep's synthetic-input timing is the clean measurement (warm-up excluded, device
    synchronized); the batch sizes it timed use their median, the others the fitted line.
    Without a sweep, the convergence runs' wall time per step stands in.
    """
    mode = timing_mode(sweep)
    if mode is not None:
        curve = throughput_curve(sweep, mode)
        measured = dict(zip(curve["batch_size"], curve["step_time_median_s"], strict=True))
        source = f"throughput sweep ({mode} input)"
    else:
        runs = ensure_columns(runs, schemas.RUNS)
        per_step = _column(runs, "train_time_s") / _column(runs, "steps_run")
        frame = pd.DataFrame({"batch_size": _column(runs, "batch_size"), "t": per_step})
        frame = frame[np.isfinite(frame["t"]) & (frame["t"] > 0)]
        measured = frame.groupby("batch_size")["t"].median().to_dict()
        source = "convergence runs (train time per step)"
    fit = fit_step_time(list(measured), list(measured.values()))
    times = []
    for batch in _floats(batches):
        value = measured.get(batch, math.nan)
        times.append(value if math.isfinite(value) and value > 0 else fit.predict(batch))
    if not measured:
        source = "none: no timed batch"
    return np.array(times, dtype=float), fit, source


# --------------------------------------------------------------------------- noise scale, DP


def final_b_simple(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """The last B_simple of each trial (runs table first, else the curve's last finite value).

    The training code estimates B_simple = tr Σ / |G|² (McCandlish et al. 2018, App. A) as a
    ratio of moving averages; it grows during training, so the final value is the one to
    compare with B_crit at the target. Columns: trial_id, batch_size, b_simple.
    """
    runs = ensure_columns(runs, schemas.RUNS)
    curves = ensure_columns(curves, schemas.CURVES)
    final = pd.DataFrame(
        {
            "trial_id": runs["trial_id"].to_numpy(),
            "batch_size": _column(runs, "batch_size"),
            "b_simple": _column(runs, "b_simple"),
        }
    )
    logged = pd.DataFrame(
        {
            "trial_id": curves["trial_id"].to_numpy(),
            "batch_size": _column(curves, "batch_size"),
            "step": _column(curves, "step"),
            "b_simple": _column(curves, "b_simple"),
        }
    )
    logged = logged[np.isfinite(logged["b_simple"])].sort_values("step")
    last = logged.groupby("trial_id").last().reset_index()[["trial_id", "batch_size", "b_simple"]]
    merged = pd.concat([final[np.isfinite(final["b_simple"])], last], ignore_index=True)
    return merged.drop_duplicates("trial_id", keep="first").reset_index(drop=True)


def data_parallel_efficiency(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, workers): training samples/s and efficiency thr(N) / (N·thr(1)) (DESIGN §4).

    Throughput is steps_run·B / train_time_s of each trial (evaluation excluded), median over
    trials. Efficiency is NaN where one worker was not run at that batch.
    """
    runs = ensure_columns(runs, schemas.RUNS)
    batch = _column(runs, "batch_size")
    frame = pd.DataFrame(
        {
            "batch_size": batch,
            "workers": _column(runs, "workers"),
            "samples_per_s": _column(runs, "steps_run") * batch / _column(runs, "train_time_s"),
        }
    )
    frame = frame[np.isfinite(frame["samples_per_s"]) & (frame["samples_per_s"] > 0)]
    table = frame.groupby(["batch_size", "workers"], sort=True)["samples_per_s"].median()
    table = table.reset_index()
    single = table[table["workers"] == 1].set_index("batch_size")["samples_per_s"]
    baseline = table["batch_size"].map(single)
    table["efficiency"] = table["samples_per_s"] / (table["workers"] * baseline)
    return table


# --------------------------------------------------------------------------- recommendation


def _worker_choice(runs: pd.DataFrame) -> tuple[int | None, str]:
    """Workers = 1 unless trials with more workers reached the target faster (median time)."""
    runs = ensure_columns(runs, schemas.RUNS)
    workers = _column(runs, "workers")
    counts = sorted({int(w) for w in workers[np.isfinite(workers)]})
    if len(counts) <= 1:
        only = counts[0] if counts else 1
        return only, f"only {only} worker{'s' if only != 1 else ''} measured"
    time = _column(runs, "time_to_target_s")
    reached = _is(runs, "status", REACHED) & np.isfinite(time)
    frame = pd.DataFrame(
        {
            "lr_rule": runs["lr_rule"].to_numpy(),
            "batch_size": _column(runs, "batch_size"),
            "workers": workers,
            "time": time,
        }
    )[reached]
    medians = frame.groupby(["lr_rule", "batch_size", "workers"])["time"].median()
    fastest = medians.groupby(level="workers").min()
    if fastest.empty:
        return 1, "no trial reached the target"
    if 1 not in fastest.index:
        best = int(fastest.idxmin())
        return best, f"{best} workers fastest to target ({fastest[best]:.3g} s); 1 worker not run"
    best = int(fastest.idxmin())
    if best == 1 or fastest[best] >= fastest[1]:
        return 1, f"more workers did not reach the target faster than 1 ({fastest[1]:.3g} s)"
    return best, f"{best} workers reached the target in {fastest[best]:.3g} s vs {fastest[1]:.3g} s"


def recommend(
    table: pd.DataFrame, runs: pd.DataFrame, b_star: dict[str, float] | None = None
) -> Recommendation:
    """Batch size, LR rule and worker count, each with a one-line reason.

    Batch: the minimum measured time to target (S·t) over reached (rule, batch) cells; the
    model optimum B* of the chosen rule (`b_star`, per rule) is quoted to explain it, not to
    override the measurement. LR rule: the smallest S at that batch. Workers: `_worker_choice`.
    `table` has lr_rule, batch_size, steps_to_target, step_time_s, time_to_target_s.
    """
    workers, workers_reason = _worker_choice(runs)
    timed = table[np.isfinite(_column(table, "time_to_target_s"))] if not table.empty else table
    if timed.empty:
        reason = "no trial reached the target with a known step time"
        return Recommendation(None, None, workers, reason, reason, workers_reason)
    best = timed.sort_values(["time_to_target_s", "batch_size"]).iloc[0]
    batch = int(best["batch_size"])
    batch_reason = (
        f"fastest time to target: {best['time_to_target_s']:.3g} s "
        f"({best['steps_to_target']:.0f} steps × {1e3 * best['step_time_s']:.3g} ms per step)"
    )
    at_batch = timed[timed["batch_size"] == batch].sort_values(["steps_to_target", "lr_rule"])
    rule = str(at_batch.iloc[0]["lr_rule"])
    model = (b_star or {}).get(rule, math.nan)
    if math.isfinite(model):
        batch_reason += f"; the model optimum sqrt(α·B_crit/β) is ≈ {model:.0f}"
    listing = ", ".join(
        f"{r} {s:.0f}"
        for r, s in zip(at_batch["lr_rule"], at_batch["steps_to_target"], strict=True)
    )
    rule_reason = f"fewest steps to target at batch {batch} ({listing})"
    return Recommendation(batch, rule, workers, batch_reason, rule_reason, workers_reason)


# --------------------------------------------------------------------------- analyze


def _throughput_summary(sweep: pd.DataFrame, tolerance: float) -> dict:
    mode = timing_mode(sweep)
    if mode is None:
        return {
            "timing_input_mode": None,
            "saturation_batch": None,
            "saturation_reason": "no batch size was timed successfully",
            "saturated_at_smallest_batch": False,
            "best_samples_per_s": math.nan,
            "best_samples_per_s_batch": None,
            "mfu_at_best": math.nan,
            "smallest_timed_batch": None,
        }
    curve = throughput_curve(sweep, mode)
    best = curve.loc[curve["samples_per_s"].idxmax()]
    saturation = saturation_batch(sweep, tolerance, mode)
    smallest = int(curve["batch_size"].min())
    return {
        "timing_input_mode": mode,
        "saturation_batch": saturation,
        "saturation_reason": f"smallest batch within {tolerance:.0%} of the best samples/s",
        "saturated_at_smallest_batch": saturation == smallest and len(curve) > 1,
        "best_samples_per_s": float(best["samples_per_s"]),
        "best_samples_per_s_batch": int(best["batch_size"]),
        "mfu_at_best": float(best["mfu"]),
        "smallest_timed_batch": smallest,
    }


def _memory_summary(sweep: pd.DataFrame) -> dict:
    mode = timing_mode(sweep) or "synthetic"
    curve = throughput_curve(sweep, mode)
    fit = fit_memory(curve["batch_size"], curve["peak_memory_bytes"])
    b_max, b_max_reason = largest_fitting_batch(sweep)
    return {
        "memory_fixed_bytes": fit.fixed_bytes,
        "memory_per_sample_bytes": fit.per_sample_bytes,
        "memory_r2": fit.r2,
        "memory_reason": fit.reason if math.isnan(fit.fixed_bytes) else "",
        "largest_fitting_batch": b_max,
        "largest_fitting_batch_reason": b_max_reason,
    }


def _optimal_batch_cap(sweep: pd.DataFrame, table: pd.DataFrame, fitting: float) -> float:
    """The largest batch B* may take: the largest that fits, else the largest one measured.

    Without an OOM the models are extrapolations past the largest batch run; a B* beyond it
    (for example when step time barely grows with B) is not a measured answer.
    """
    if math.isfinite(fitting):
        return fitting
    measured = np.concatenate([_column(sweep, "batch_size"), _column(table, "batch_size")])
    measured = measured[np.isfinite(measured)]
    return float(measured.max()) if measured.size else math.nan


def _interval_note(runs: pd.DataFrame, rule: str, interval: tuple[float, float]) -> str:
    """Why the B_crit interval is missing, or that it reaches an end of the measured range."""
    low, high = interval
    rule_runs = runs[_is(runs, "lr_rule", rule)]
    if math.isnan(low):
        seeds = rule_runs.groupby("batch_size")["seed"].nunique()
        if seeds.empty or seeds.max() < 2:
            return "one seed per batch size: nothing to resample"
        return "most bootstrap refits failed"
    batches = _column(rule_runs, "batch_size")
    if high >= np.nanmax(batches):
        return "the interval reaches past the largest batch measured: its top is uncertain"
    if low <= np.nanmin(batches):
        return "the interval reaches below the smallest batch measured: its bottom is uncertain"
    return ""


def _critical_summary(
    runs: pd.DataFrame,
    rule: str,
    cells: pd.DataFrame,
    samples: int,
    step_fit: StepTimeFit,
    b_cap: float,
) -> dict:
    fit = fit_critical_batch(cells["batch_size"], cells["steps_to_target"])
    low, high = math.nan, math.nan
    interval_note = fit.reason
    batches = _column(runs[_is(runs, "lr_rule", rule)], "batch_size")
    if not fit.reason:
        low, high = bootstrap_critical_batch(runs, rule, n=samples)
        interval_note = _interval_note(runs, rule, (low, high))
    return {
        "s_min": fit.s_min,
        "e_min": fit.e_min,
        "b_crit": fit.b_crit,
        "b_crit_low": low,
        "b_crit_high": high,
        "r2": fit.r2,
        "reason": fit.reason,
        "interval_note": interval_note,
        "batch_range": [float(np.nanmin(batches)), float(np.nanmax(batches))],
        "optimal_batch": optimal_batch(step_fit.alpha_s, step_fit.beta_s, fit.b_crit, b_cap),
    }


def _regime_ranges(table: pd.DataFrame) -> list[dict]:
    """Consecutive batches with the same regime: [{regime, from, to}, …] (unknown skipped)."""
    ranges: list[dict] = []
    for batch, regime in zip(table["batch_size"], table["regime"], strict=True):
        if not isinstance(regime, str):
            continue
        if ranges and ranges[-1]["regime"] == regime:
            ranges[-1]["to"] = int(batch)
        else:
            ranges.append({"regime": regime, "from": int(batch), "to": int(batch)})
    return ranges


def _b_simple_summary(runs: pd.DataFrame, curves: pd.DataFrame) -> tuple[pd.Series, dict]:
    final = final_b_simple(runs, curves)
    by_batch = final.groupby("batch_size")["b_simple"].median()
    if final.empty:
        return by_batch, {
            "b_simple_median": math.nan,
            "b_simple_trials": 0,
            "b_simple_reason": "no B_simple recorded",
        }
    return by_batch, {
        "b_simple_median": float(final["b_simple"].median()),
        "b_simple_trials": int(len(final)),
        "b_simple_reason": "",
    }


def _input_share_at_best(sweep: pd.DataFrame, batch: int | None) -> float:
    share = input_pipeline_share(sweep).set_index("batch_size")["share"]
    return float(share.get(float(batch), math.nan)) if batch is not None else math.nan


def _cell_table(sweep: pd.DataFrame, runs: pd.DataFrame) -> tuple[pd.DataFrame, StepTimeFit, str]:
    """Per (lr_rule, batch): S, E, step time, time to target and samples/s."""
    table = steps_to_result(runs)
    times, fit, source = step_times(sweep, runs, table["batch_size"])
    batch = _column(table, "batch_size")
    table = table.assign(
        step_time_s=times,
        time_to_target_s=time_to_target(_column(table, "steps_to_target"), times),
        samples_per_s=batch / times,
    )
    return table, fit, source


def _rows(
    table: pd.DataFrame,
    critical: dict[str, dict],
    regime_of: dict[tuple[str, float], str | None],
    b_simple: pd.Series,
    saturation: int | None,
) -> list[dict]:
    """The analysis table: one row per (lr_rule, batch), columns of schemas.ANALYSIS."""
    rows = []
    for cell in table.itertuples(index=False):
        fit = critical[cell.lr_rule]
        row = {
            "lr_rule": str(cell.lr_rule),
            "batch_size": int(cell.batch_size),
            "steps_to_target": float(cell.steps_to_target),
            "examples_to_target": float(cell.examples_to_target),
            "step_time_s": float(cell.step_time_s),
            "time_to_target_s": float(cell.time_to_target_s),
            "samples_per_s": float(cell.samples_per_s),
            "regime": regime_of.get((cell.lr_rule, float(cell.batch_size))),
            "b_simple": float(b_simple.get(float(cell.batch_size), math.nan)),
            "saturation_batch": saturation,
            **{key: float(fit[key]) for key in ("s_min", "e_min", "b_crit")},
            **{key: float(fit[key]) for key in ("b_crit_low", "b_crit_high")},
        }
        rows.append({name: row[name] for name in ANALYSIS_COLUMNS})
    return rows


METRIC_NAMES = (
    "saturation_batch",
    "best_samples_per_s",
    "mfu_at_best",
    "input_pipeline_share",
    "step_time_alpha_s",
    "step_time_beta_s",
    "step_time_r2",
    "memory_fixed_bytes",
    "memory_per_sample_bytes",
    "largest_fitting_batch",
    "b_simple_median",
    "recommended_batch_size",
    "recommended_workers",
    "min_time_to_target_s",
)
RULE_METRIC_NAMES = ("s_min", "e_min", "b_crit", "b_crit_low", "b_crit_high", "optimal_batch")


def _metrics(summary: dict) -> dict[str, float]:
    """Finite headline numbers, flat, for KFP Metrics (which cannot store NaN or inf)."""
    values = {name: summary.get(name) for name in METRIC_NAMES}
    for rule, fit in summary["critical_batch"].items():
        values.update({f"{key}_{rule}": fit[key] for key in RULE_METRIC_NAMES})
    return {
        name: float(value)
        for name, value in values.items()
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    }


def analyze(
    sweep: pd.DataFrame | None,
    runs: pd.DataFrame | None,
    curves: pd.DataFrame | None,
    *,
    saturation_tolerance: float = SATURATION_TOLERANCE,
    bootstrap_samples: int = BOOTSTRAP_SAMPLES,
) -> AnalysisResult:
    """All of DESIGN §4 on one run's tables: the analysis rows, summary, metrics and Markdown."""
    sweep = ensure_columns(sweep, schemas.SWEEP)
    runs = ensure_columns(runs, schemas.RUNS)
    curves = ensure_columns(curves, schemas.CURVES)
    summary = _throughput_summary(sweep, saturation_tolerance)
    summary.update(_memory_summary(sweep))
    summary["saturation_tolerance"] = saturation_tolerance
    summary["input_pipeline_share"] = _input_share_at_best(
        sweep, summary["best_samples_per_s_batch"]
    )
    table, step_fit, source = _cell_table(sweep, runs)
    summary.update(
        step_time_source=source,
        step_time_alpha_s=step_fit.alpha_s,
        step_time_beta_s=step_fit.beta_s,
        step_time_r2=step_fit.r2,
        step_time_reason=step_fit.reason,
    )
    cap = _optimal_batch_cap(sweep, table, summary["largest_fitting_batch"])
    summary["optimal_batch_cap"] = cap
    critical, regime_of, ranges = {}, {}, {}
    for rule, cells in table.groupby("lr_rule", sort=True):
        critical[rule] = _critical_summary(runs, rule, cells, bootstrap_samples, step_fit, cap)
        labels = regimes(cells["batch_size"], cells["steps_to_target"])
        regime_of.update(
            {(rule, b): r for b, r in zip(labels["batch_size"], labels["regime"], strict=True)}
        )
        ranges[rule] = _regime_ranges(labels)
    summary["critical_batch"] = critical
    summary["regimes"] = ranges
    b_simple, b_simple_summary = _b_simple_summary(runs, curves)
    summary.update(b_simple_summary)
    b_star = {rule: fit["optimal_batch"] for rule, fit in critical.items()}
    recommendation = recommend(table, runs, b_star)
    times = _column(table, "time_to_target_s")
    summary.update(
        recommended_batch_size=recommendation.batch_size,
        recommended_batch_size_reason=recommendation.batch_reason,
        recommended_lr_rule=recommendation.lr_rule,
        recommended_lr_rule_reason=recommendation.lr_rule_reason,
        recommended_workers=recommendation.workers,
        recommended_workers_reason=recommendation.workers_reason,
        min_time_to_target_s=float(np.nanmin(times)) if np.isfinite(times).any() else math.nan,
        worker_counts=sorted({int(w) for w in _column(runs, "workers") if math.isfinite(w)}),
    )
    rows = _rows(table, critical, regime_of, b_simple, summary["saturation_batch"])
    return AnalysisResult(rows, summary, _metrics(summary), render_markdown(summary))


# --------------------------------------------------------------------------- markdown


def _num(value: float | int | None) -> str:
    """A number for prose: n/a for missing, ∞ for unbounded, thousands separated."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NOT_AVAILABLE
    if value == math.inf:
        return "∞"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def _bytes(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.3g} B"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _throughput_text(summary: dict) -> str:
    if summary["timing_input_mode"] is None:
        return f"Not measured: {summary['saturation_reason']}."
    best, saturation = summary["best_samples_per_s_batch"], summary["saturation_batch"]
    text = (
        f"Samples/s peaks at {_num(summary['best_samples_per_s'])} at batch {best} "
        f"({summary['timing_input_mode']} input"
    )
    mfu = summary["mfu_at_best"]
    text += f", {mfu:.1%} MFU)." if math.isfinite(mfu) else ")."
    if summary["saturated_at_smallest_batch"]:
        text += (
            f" The device is already saturated at batch {saturation}, the smallest measured: a"
            " bigger batch does not raise samples/s, each step just takes longer."
        )
    else:
        text += (
            f" From batch {saturation} on, throughput is within "
            f"{summary['saturation_tolerance']:.0%} of the best: a bigger batch mostly makes"
            " each step longer."
        )
    if math.isfinite(summary["step_time_alpha_s"]):
        text += (
            f" Step time t(B) ≈ {1e3 * summary['step_time_alpha_s']:.3g} ms + "
            f"{1e6 * summary['step_time_beta_s']:.3g} µs × B (R² {summary['step_time_r2']:.2f})."
        )
    share = summary["input_pipeline_share"]
    if math.isfinite(share):
        text += f" Real input reaches {1 - share:.0%} of synthetic throughput at batch {best}"
        text += ": the input pipeline is a bottleneck." if share > INPUT_BOTTLENECK_SHARE else "."
    return text


def _memory_text(summary: dict) -> str:
    text = _sentence(summary["largest_fitting_batch_reason"])
    b_max = summary["largest_fitting_batch"]
    if math.isfinite(b_max):
        text += f" The largest batch that fits is {int(b_max)}."
    if math.isfinite(summary["memory_fixed_bytes"]):
        text += (
            f" Peak memory ≈ {_bytes(summary['memory_fixed_bytes'])} + "
            f"{_bytes(summary['memory_per_sample_bytes'])} per sample."
        )
    return text


def _critical_text(fit: dict, ranges: list[dict], cap: float) -> str:
    if fit["reason"]:
        return f"B_crit not estimated: {fit['reason']}."
    text = (
        f"S_min ≈ {_num(fit['s_min'])} steps and E_min ≈ {_num(fit['e_min'])} examples, so"
        f" B_crit = E_min/S_min ≈ {_num(fit['b_crit'])}"
    )
    if math.isnan(fit["b_crit_low"]):
        text += f" (no interval: {fit['interval_note']})."
    else:
        text += f" ({BOOTSTRAP_CONFIDENCE:.0%} interval {_interval_text(fit)})."
    text += " Past B_crit each doubling of the batch saves less than a quarter of the steps."
    if ranges:
        parts = [
            f"{r['regime'].replace('_', ' ')} {r['from']}"
            + (f"–{r['to']}" if r["to"] != r["from"] else "")
            for r in ranges
        ]
        text += f" Regimes: {', '.join(parts)}."
    b_star = fit["optimal_batch"]
    if math.isfinite(b_star) and b_star >= cap:
        text += f" With t(B), time to target keeps falling up to batch {_num(cap)} (B* capped)."
    elif math.isfinite(b_star):
        text += f" With t(B), time to target is lowest near B* ≈ {_num(b_star)}."
    return text


def _interval_text(fit: dict) -> str:
    """The bootstrap interval in words; an end clipped to the measured range reads as open."""
    low, high = fit["b_crit_low"], fit["b_crit_high"]
    smallest, largest = fit["batch_range"]
    if low >= largest:
        return f"entirely above {_num(largest)}, the largest batch measured"
    if low <= smallest and high >= largest:
        return f"spanning the whole measured range {_num(smallest)}–{_num(largest)}"
    if high >= largest:
        return f"{_num(low)} to above {_num(largest)}, the largest batch measured"
    if low <= smallest:
        return f"below {_num(smallest)}, the smallest batch measured, to {_num(high)}"
    return f"{_num(low)}–{_num(high)}"


def _b_simple_text(summary: dict) -> str:
    if not math.isfinite(summary["b_simple_median"]):
        return f"Not available: {summary['b_simple_reason']}."
    return (
        "The gradient noise scale (McCandlish et al. 2018), a cheap predictor of B_crit, has"
        f" median {_num(summary['b_simple_median'])} over {summary['b_simple_trials']} trials."
    )


def _recommendation_lines(summary: dict) -> list[str]:
    items = (
        ("Batch size", "recommended_batch_size"),
        ("LR rule", "recommended_lr_rule"),
        ("Workers", "recommended_workers"),
    )
    lines = []
    for label, key in items:
        value = summary[key]
        shown = NOT_AVAILABLE if value is None else value
        lines.append(f"- **{label}: {shown}** — {summary[key + '_reason']}.")
    return lines


def render_markdown(summary: dict) -> str:
    """The short answer to "why doesn't my training get faster?" and the recommendation."""
    return narrative_markdown(summary) + recommendation_markdown(summary)


def recommendation_markdown(summary: dict) -> str:
    """The recommendation block alone (the HTML report shows it in its own styled box)."""
    return "\n".join(["", "## Recommendation", "", *_recommendation_lines(summary)]) + "\n"


def narrative_markdown(summary: dict) -> str:
    """The answer to "why doesn't my training get faster?", without the recommendation."""
    lines = [
        "## Why doesn't training get faster with a bigger batch?",
        "",
        f"- **Throughput.** {_throughput_text(summary)}",
        f"- **Memory.** {_memory_text(summary)}",
    ]
    for rule, fit in summary["critical_batch"].items():
        text = _critical_text(fit, summary["regimes"].get(rule, []), summary["optimal_batch_cap"])
        lines.append(f"- **Steps to target ({rule} LR rule).** {text}")
    if not summary["critical_batch"]:
        lines.append("- **Steps to target.** Not measured: no convergence trials.")
    lines.append(f"- **Gradient noise scale.** {_b_simple_text(summary)}")
    if summary["recommended_batch_size"] is not None:
        lines.append(
            f"- **Fastest to target:** {_num(summary['min_time_to_target_s'])} s of training."
        )
    return "\n".join(lines) + "\n"
