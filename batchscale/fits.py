"""Fits on the sweep table that both the sweep stage and the analysis use: the throughput curve,
the saturation batch, the step-time line t(B) ≈ α + βB and the memory line peak ≈ fixed +
per_sample·B.

A core module because two stages need it and stages do not import each other (see
docs/architecture.md): the sweep prints the saturation batch and memory model, the analysis
builds on them. Pure functions of pandas DataFrames shaped like `batchscale.schemas.SWEEP`
(numpy and pandas only). Missing pieces (an empty table, OOM rows only) give NaN or None with a
reason, never an exception.

Rows the sweep flagged `quality = "unstable"` (rounds that disagree, steps that scatter: the
machine was disturbed while they were timed) are left out of every timing figure here: the
throughput curve, the saturation batch, the timing mode and so t(B). A null quality (a table
from before the sweep recorded it) counts as ok.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import pyarrow as pa

from batchscale import schemas
from batchscale.config import AnalysisConfig
from batchscale.errors import SITE_PREFIX
from batchscale.schemas import Quality, TrialStatus
from batchscale.tdist import t_quantile

DEFAULT_SATURATION_TOLERANCE: float = AnalysisConfig.model_fields["saturation_tolerance"].default
"""The config's default (read from the model, not a second copy), for callers without a config."""
TIMING_MODES = ("synthetic", "real")
"""Input modes whose sweep step times are used, in order of preference: synthetic input is the
device's own speed, without the input pipeline."""
MIN_BYTES_PER_SAMPLE = 1.0
"""A memory slope under a byte per sample is rounding, not growth."""
MEMORY_EXTRAPOLATION_FACTOR = 8.0
"""The memory line predicts the largest batch under a budget up to this factor past the largest
batch measured; further out its slope's error and whatever else grows with the batch (a
kernel's workspace, the allocator's rounding) make the number a guess."""
MEMORY_INTERVAL_Z = 1.645
"""Standard errors each way for the predicted largest batch's range (two-sided 90 %)."""
CURVE_COLUMNS = (
    "step_time_median_s",
    "step_time_p10_s",
    "step_time_p90_s",
    "samples_per_s",
    "samples_per_s_low",
    "samples_per_s_high",
    "peak_memory_bytes",
    "mfu",
    "rounds",
    "retries",
)


@dataclass(frozen=True)
class StepTimeFit:
    """t(B) ≈ alpha + beta·B: alpha is the per-step overhead, beta the time per sample."""

    alpha_s: float
    beta_s: float
    r2: float
    reason: str = ""
    log_ratio_se: float = math.nan
    """Standard error of log(α/β) from the fit's covariance (the residual scatter over `dof`
    degrees of freedom): how well the points pin the ratio B* depends on. NaN without a
    positive α and β or without degrees of freedom (two batch sizes fit any line exactly)."""
    dof: int = 0
    """Points fitted minus the line's two parameters (none for two points)."""
    covariance: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    """(var α, var β, cov(α, β)) of the weighted fit, σ²(XᵀWX)⁻¹ with σ² the weighted residual
    variance over `dof`; NaN without degrees of freedom."""

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
    per_sample_clear: bool = True
    """False when the slope is not measurably above zero: `per_sample_bytes` is then no figure
    to print, and `reason` says why."""
    fixed_se_bytes: float = math.nan
    per_sample_se_bytes: float = math.nan
    """Standard errors of the two terms; NaN with two batch sizes (a line through them fits
    exactly and says nothing of its scatter)."""


# --------------------------------------------------------------------------- table helpers


def as_floats(values: Iterable) -> np.ndarray:
    """`values` as a float array, anything non-numeric (None, text) as NaN."""
    return pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce").to_numpy(
        dtype=float, na_value=np.nan
    )


def numeric_column(frame: pd.DataFrame, name: str) -> np.ndarray:
    """Column `name` of `frame` as a float array, missing or non-numeric values as NaN."""
    return pd.to_numeric(frame[name], errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def matches(frame: pd.DataFrame, column: str, value: str) -> np.ndarray:
    """Boolean mask of the rows whose `column` equals `value` (missing values never match)."""
    return frame[column].eq(value).to_numpy(dtype=bool, na_value=False)


def positive_pairs(x: Iterable, y: Iterable) -> tuple[np.ndarray, np.ndarray]:
    """The (x, y) pairs where both are finite and positive (the only ones the fits can use)."""
    xs, ys = as_floats(x), as_floats(y)
    keep = np.isfinite(xs) & np.isfinite(ys) & (xs > 0) & (ys > 0)
    return xs[keep], ys[keep]


def weighted_line(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float, float]:
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


def trained_trials(runs: pd.DataFrame) -> pd.DataFrame:
    """One row per trial that was trained: a trial has a runs row per target, and a row
    recorded from another trial's training (`trained_as`: the LR rules' shared reference
    batch) spent nothing of its own."""
    runs = runs.drop_duplicates("trial_id")
    if "trained_as" not in runs:
        return runs
    return runs[runs["trained_as"].isna().to_numpy()]


# --------------------------------------------------------------------------- throughput


def unstable_rows(sweep: pd.DataFrame) -> np.ndarray:
    """Boolean mask of the rows the sweep flagged unstable (null quality: not flagged)."""
    return matches(ensure_columns(sweep, schemas.SWEEP), "quality", Quality.UNSTABLE)


def throughput_curve(
    sweep: pd.DataFrame, input_mode: str = "synthetic", *, include_unstable: bool = False
) -> pd.DataFrame:
    """Per batch size of one input mode: step time (median, p10, p90), samples/s, memory, MFU,
    trials.

    Only ok rows count (oom and error rows carry no timing), and of those only the ones not
    flagged unstable unless `include_unstable` (the memory model and the plots, which mark
    them, ask for them); repeated rows give their median.
    """
    sweep = ensure_columns(sweep, schemas.SWEEP)
    timed = matches(sweep, "status", TrialStatus.OK) & matches(sweep, "input_mode", input_mode)
    if not include_unstable:
        timed &= ~unstable_rows(sweep)
    rows = sweep[timed]
    numeric = pd.DataFrame({c: numeric_column(rows, c) for c in CURVE_COLUMNS})
    numeric["batch_size"] = numeric_column(rows, "batch_size")
    curve = numeric.groupby("batch_size", sort=True).median().reset_index()
    derived = curve["batch_size"] / curve["step_time_median_s"]
    curve["samples_per_s"] = curve["samples_per_s"].fillna(derived)
    curve["trials"] = curve["rounds"] + curve["retries"].fillna(0.0)  # NaN: not recorded
    return curve[np.isfinite(curve["samples_per_s"]) & (curve["samples_per_s"] > 0)]


def saturation_batch(
    sweep: pd.DataFrame,
    tolerance: float = DEFAULT_SATURATION_TOLERANCE,
    input_mode: str = "synthetic",
) -> int | None:
    """Smallest batch whose samples/s is within `tolerance` of the best measured (ok rows not
    flagged unstable: a disturbed row's samples/s would move the best or the threshold).

    Past this batch the device is busy: a bigger batch makes each step longer by about as much
    as it adds samples, so it buys throughput only at the margin. None when fewer than two
    batches were timed or none past it (`find_saturation` says why).
    """
    return find_saturation(sweep, tolerance, input_mode)[0]


def failed_batches(sweep: pd.DataFrame) -> list[int]:
    """The batch sizes whose sweep row raised an error in the workload's own code (status
    error, the error naming a line of it: `errors.error_site`; any input mode), in order: a
    bigger batch there cannot be measured as the workload is. A trial process that died
    without a result is the machine's failure, not the workload's, and is not counted."""
    sweep = ensure_columns(sweep, schemas.SWEEP)
    failed = numeric_column(sweep, "batch_size")[own_code_errors(sweep)]
    return sorted({int(b) for b in failed if math.isfinite(b)})


def own_code_errors(sweep: pd.DataFrame) -> np.ndarray:
    """Per row: the trial raised (status error) and its error names a line of the workload's
    own code (`errors.error_site`), not of a library or of a process that died."""
    # an error column with no text reads back as float NaN: only strings name a line
    named = sweep["error"].map(lambda e: isinstance(e, str) and SITE_PREFIX in e)
    return matches(sweep, "status", TrialStatus.ERROR) & named.to_numpy(dtype=bool)


def _listed(batches: list[int]) -> str:
    return ", ".join(f"{b:,}" for b in batches)


def find_saturation(sweep: pd.DataFrame, tolerance: float = DEFAULT_SATURATION_TOLERANCE,
               input_mode: str = "synthetic") -> tuple[int | None, str]:
    """(`saturation_batch`, what it is or why there is none). A batch within `tolerance` of
    the best is a saturation batch only when a larger batch was measured too: the largest
    batch measured being the first within tolerance says samples/s was still growing there,
    and calling it the saturation batch would claim a plateau nobody saw."""
    curve = throughput_curve(sweep, input_mode)
    if curve.empty:
        return None, f"no stable timed row ({input_mode} input)"
    batches = curve["batch_size"].astype(int)
    if len(curve) < 2:
        return None, (f"only batch {int(batches.iloc[0])} was measured stable ({input_mode} "
                      "input): a saturation batch needs at least two")
    best = curve["samples_per_s"].max()
    first = int(batches[curve["samples_per_s"] >= (1.0 - tolerance) * best].min())
    if first == int(batches.max()):
        larger = [b for b in failed_batches(sweep) if b > first]
        unstable = [int(b) for b in throughput_curve(sweep, input_mode, include_unstable=True)
                    ["batch_size"] if b > first]
        if unstable:
            return None, (f"samples/s still grows at {first:,}, the largest batch measured "
                          f"stably ({input_mode} input); batch {_listed(unstable)} were timed "
                          "but flagged unstable and left out, so whether it goes on growing is "
                          "not known: rerun the sweep on a quieter machine")
        advice = (f"batch {_listed(larger)} failed in the sweep (status error), so no larger "
                  "batch can be measured as the workload is" if larger
                  else "measure larger batches")
        return None, (f"samples/s still grows at {first:,}, the largest batch measured "
                      f"({input_mode} input): no saturation seen; {advice}")
    return first, f"smallest batch within {tolerance:.0%} of the best samples/s"


def saturation_range(sweep: pd.DataFrame, tolerance: float = DEFAULT_SATURATION_TOLERANCE,
                     input_mode: str = "synthetic") -> str:
    """Where the rows' uncertainty puts the saturation batch when it does not pin it ("the
    sweep's trials put it anywhere from 512 to 2,048": the earliest batch that may reach
    (1 − tolerance) × best, the first surely above it), or "": each row against the best by
    `pair_half_width`, or in older tables by their rerun intervals."""
    curve = throughput_curve(sweep, input_mode)
    saturation, _ = find_saturation(sweep, tolerance, input_mode)
    if saturation is None or curve.empty:
        return ""
    best = curve["samples_per_s"].max()
    ratio = curve["samples_per_s"] / best
    half = pair_half_width(trial_pool(sweep), curve["trials"],
                           float(curve["trials"][curve["samples_per_s"].idxmax()]))
    if np.isfinite(half).all():
        low, high, basis = ratio * np.exp(-half), ratio * np.exp(half), "the sweep's trials"
    else:
        low, high = curve["samples_per_s_low"] / best, curve["samples_per_s_high"] / best
        basis = "the rows' rerun ranges"
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        return ""
    batches = curve["batch_size"].astype(int)
    earliest = int(batches[high >= 1.0 - tolerance].min())
    surely = batches[low >= 1.0 - tolerance]
    latest = int(surely.min()) if len(surely) else None
    if earliest == saturation and latest == saturation:
        return ""
    upper = (f"{latest:,}" if latest is not None
             else f"past {int(batches.max()):,}, the largest measured")
    return f"{basis} put it anywhere from {earliest:,} to {upper}"


def pair_half_width(pool: tuple[float, int], trials_a, trials_b):
    """90 % half-width (log units) of the ratio of two rows of one sweep averaging k_a, k_b
    trials: t(df)·s·sqrt(1/k_a + 1/k_b), `pool` = (s, df) from `trial_pool`; NaN without one."""
    t = t_quantile(0.95, pool[1]) if pool[1] >= 1 else math.nan
    return t * pool[0] * np.sqrt(1.0 / trials_a + 1.0 / trials_b)


def trial_pool(sweep: pd.DataFrame) -> tuple[float, int]:
    """(pooled log-sd, df) of the trials about their rows, over the stable timed rows with a
    `trial_log_sd`: sqrt(Σ (k−1)·s² / Σ (k−1)), k = rounds + retries. (NaN, 0): none."""
    sweep = ensure_columns(sweep, schemas.SWEEP)
    rows = sweep[matches(sweep, "status", TrialStatus.OK) & ~unstable_rows(sweep)]
    sd = numeric_column(rows, "trial_log_sd")
    freedom = numeric_column(rows, "rounds") + np.nan_to_num(numeric_column(rows, "retries")) - 1
    usable = np.isfinite(sd) & np.isfinite(freedom) & (freedom >= 1)
    df = int(freedom[usable].sum())
    return (math.sqrt(float(np.sum(freedom[usable] * sd[usable] ** 2)) / df) if df
            else math.nan), df


def timing_mode(sweep: pd.DataFrame) -> str | None:
    """The input mode whose step times describe the device (synthetic when it was timed with at
    least one stable row); None when no stable row was timed."""
    for mode in TIMING_MODES:
        if not throughput_curve(sweep, mode).empty:
            return mode
    return None


# --------------------------------------------------------------------------- step time, memory


def fit_step_time(batch: Iterable, step_time: Iterable) -> StepTimeFit:
    """Least squares t(B) ≈ α + βB, minimizing relative residuals.

    Sweeps space batches geometrically (1 … 1024), so an unweighted fit would be set by the
    largest batch alone and could predict negative times at small B; weighting by 1/t² treats
    every measured batch alike. α is the fixed cost per step (launches, optimizer, sync),
    β the cost per sample; with the critical batch they give the batch that reaches the
    target soonest, B* = sqrt(α·B_crit/β) (see `batchscale.analysis.timetotarget.optimal_batch`).
    """
    b, t = positive_pairs(batch, step_time)
    if np.unique(b).size < 2:
        return StepTimeFit(math.nan, math.nan, math.nan, "fewer than two timed batch sizes")
    alpha, beta, r2 = weighted_line(b, t, 1.0 / t**2)
    dof = b.size - 2
    covariance = _line_covariance(b, t, alpha, beta, dof)
    return StepTimeFit(alpha, beta, r2, log_ratio_se=_log_ratio_se(covariance, alpha, beta),
                       dof=dof, covariance=covariance)


def _line_covariance(b: np.ndarray, t: np.ndarray, alpha: float, beta: float,
                     dof: int) -> tuple[float, float, float]:
    """(var α, var β, cov(α, β)) of the 1/t²-weighted fit: σ²(XᵀWX)⁻¹, σ² the weighted residual
    variance over `dof` = points − 2 degrees of freedom; NaN without degrees of freedom."""
    if dof < 1:
        return math.nan, math.nan, math.nan
    w = 1.0 / t**2
    design = np.column_stack([np.ones_like(b), b])
    sigma2 = float(np.sum(w * (t - alpha - beta * b) ** 2)) / dof
    cov = sigma2 * np.linalg.inv(design.T @ (w[:, None] * design))
    return float(cov[0, 0]), float(cov[1, 1]), float(cov[0, 1])


def _log_ratio_se(covariance: tuple[float, float, float], alpha: float, beta: float) -> float:
    """se of log(α/β) by the delta method on the fit's covariance."""
    var_alpha, var_beta, cov = covariance
    if not (math.isfinite(var_alpha) and alpha > 0 and beta > 0):
        return math.nan
    var = var_alpha / alpha**2 + var_beta / beta**2 - 2 * cov / (alpha * beta)
    return math.sqrt(max(var, 0.0))


def fit_memory(
    batch: Iterable, peak_bytes: Iterable, budget_bytes: float | None = None
) -> MemoryFit:
    """Least squares peak ≈ fixed + per_sample·B, and the largest batch under `budget_bytes`.

    Unweighted: the large batches, closest to the budget, should dominate the prediction.
    """
    b, m = positive_pairs(batch, peak_bytes)
    if np.unique(b).size < 2:
        return MemoryFit(math.nan, math.nan, math.nan, math.nan, "fewer than two measured batches")
    fixed, per_sample, r2 = weighted_line(b, m, np.ones_like(m))
    errors = dict(zip(("fixed_se_bytes", "per_sample_se_bytes"),
                      _line_errors(b, m, fixed, per_sample), strict=True))
    if per_sample < MIN_BYTES_PER_SAMPLE:
        return MemoryFit(fixed, per_sample, r2, math.nan, "peak memory does not grow with batch",
                         per_sample_clear=False, **errors)
    unclear = _unclear_growth(b, m, fixed, per_sample)
    if unclear:
        return MemoryFit(fixed, per_sample, r2, math.nan, unclear, per_sample_clear=False, **errors)
    if budget_bytes is None or not math.isfinite(budget_bytes):
        return MemoryFit(fixed, per_sample, r2, math.nan, "no memory budget given", **errors)
    if budget_bytes <= fixed:
        return MemoryFit(fixed, per_sample, r2, 0.0, "the fixed memory alone exceeds the budget",
                         **errors)
    b_max = float(math.floor((budget_bytes - fixed) / per_sample))
    largest = float(b.max())
    if b_max > MEMORY_EXTRAPOLATION_FACTOR * largest:
        return MemoryFit(fixed, per_sample, r2, math.nan,
                         f"the budget would be reached near batch {b_max:,.0f}, more than "
                         f"{MEMORY_EXTRAPOLATION_FACTOR:g}× the largest batch measured "
                         f"({largest:,.0f}): too far out to predict; measure larger batches",
                         **errors)
    return MemoryFit(fixed, per_sample, r2, b_max, **errors)


def b_max_interval(fit: MemoryFit, budget_bytes: float,
                   z: float = MEMORY_INTERVAL_Z) -> tuple[float, float]:
    """The range of the largest batch under `budget_bytes` that the line's terms allow, each
    at `z` of its own standard errors (both ends together: wider than the joint interval, as
    the terms' covariance is not kept); NaN, NaN without standard errors or a prediction."""
    if not (math.isfinite(fit.b_max) and math.isfinite(fit.fixed_se_bytes)
            and math.isfinite(fit.per_sample_se_bytes)):
        return math.nan, math.nan
    steepest = fit.per_sample_bytes + z * fit.per_sample_se_bytes
    flattest = fit.per_sample_bytes - z * fit.per_sample_se_bytes
    low = max(0.0, math.floor((budget_bytes - fit.fixed_bytes - z * fit.fixed_se_bytes)
                              / steepest))
    high = (math.floor((budget_bytes - fit.fixed_bytes + z * fit.fixed_se_bytes) / flattest)
            if flattest > 0 else math.inf)
    return float(low), float(high)


def _line_errors(b: np.ndarray, m: np.ndarray, fixed: float,
                 per_sample: float) -> tuple[float, float]:
    """Standard errors of an unweighted line's intercept and slope; NaN, NaN with fewer than
    three batch sizes."""
    n = b.size
    spread = float(np.sum((b - b.mean()) ** 2))
    if np.unique(b).size < 3 or spread <= 0:
        return math.nan, math.nan
    variance = float(np.sum((m - fixed - per_sample * b) ** 2)) / (n - 2)
    return (math.sqrt(variance * (1 / n + b.mean() ** 2 / spread)),
            math.sqrt(variance / spread))


def _unclear_growth(b: np.ndarray, m: np.ndarray, fixed: float, per_sample: float) -> str:
    """Why the per-sample memory is not measurably above zero ("" when it is): its slope
    within t(0.95, n − 2) standard errors of zero, with three or more batches (two fix a line
    exactly and say nothing about its scatter)."""
    n = b.size
    if np.unique(b).size < 3:
        return ""
    se = _line_errors(b, m, fixed, per_sample)[1]
    needed = t_quantile(0.95, n - 2)
    if per_sample >= needed * se:
        return ""
    return (f"peak memory does not grow measurably with the batch: {per_sample:,.0f} ± "
            f"{se:,.0f} bytes per sample over {n} batches, within the run-to-run scatter")


NO_SWEEP_GIVEN = ("no throughput sweep was given (batchscale analyze takes one with --sweep "
                  "FILE; a pipeline run of a TrainingLoop has none)")
"""Why a figure only the sweep measures is missing when the analysis got no sweep table."""


def largest_fitting_batch(sweep: pd.DataFrame) -> tuple[float, str]:
    """Largest ok batch below the smallest OOM batch; +inf when nothing ran out of memory.

    Unstable rows count: whether a batch fits in memory does not depend on how busy the CPU
    was while it was timed (only its timing does).
    """
    sweep = ensure_columns(sweep, schemas.SWEEP)
    batches = numeric_column(sweep, "batch_size")
    oom = batches[matches(sweep, "status", TrialStatus.OOM)]
    ok = batches[matches(sweep, "status", TrialStatus.OK)]
    if sweep.empty:
        return math.nan, f"memory not measured: {NO_SWEEP_GIVEN}"
    if oom.size == 0 and ok.size == 0:
        return math.nan, "memory not measured: no batch size ran"
    if oom.size == 0 and not np.isfinite(numeric_column(sweep, "peak_memory_bytes")).any():
        # A table from elsewhere with neither an out-of-memory row nor a peak: its rows say
        # nothing about memory, so "nothing ran out" would be a claim it never made.
        return math.nan, ("memory not measured: the sweep table records no peak memory and no "
                          "out-of-memory row")
    if oom.size == 0:
        return math.inf, f"no batch ran out of memory up to batch {int(np.nanmax(ok))}"
    smallest_oom = int(np.nanmin(oom))
    fits = ok[ok < smallest_oom]
    larger_ok = sorted({int(b) for b in ok[ok > smallest_oom]})
    if fits.size == 0:
        return math.nan, f"batch {smallest_oom} ran out of memory and no smaller batch ran"
    reason = f"batch {smallest_oom} ran out of memory"
    if larger_ok:  # the conservative answer stays, and the table it contradicts is named
        reason += (f", although {', '.join(map(str, larger_ok))} fit: peak memory is not "
                   "monotone in the batch size here (a kernel's workspace can peak at one "
                   "size), so a batch above this one fits only some of the time")
    return float(np.max(fits)), reason


def mfu_text(mfu: float | None, samples_range: tuple[float, float] | None = None) -> str:
    """MFU as printed everywhere: above 100 % it cannot be true (the peak was measured low —
    a matmul timed at the sweep's start, e.g. while the machine was busy — or the FLOP count
    is off), so it is named as untrusted instead of printed as a figure. `samples_range`: the
    row's rerun range of samples/s as shares of its figure (low/value, high/value), which MFU
    moves with; the peak's own error is not in it."""
    if mfu is None or not math.isfinite(mfu):
        return "MFU not known"
    if mfu > 1:
        return (f"MFU not trusted: {mfu:.0%} is above 100 %, so the measured peak FLOP/s or "
                "the FLOP count is off")
    if samples_range is None or not all(map(math.isfinite, samples_range)):
        return f"MFU {mfu:.1%}"
    low, high = samples_range
    return f"MFU {mfu:.1%} [{mfu * low:.1%}, {min(1.0, mfu * high):.1%}]"
