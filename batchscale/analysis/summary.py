"""The analysis summary as typed objects: the headline numbers of one run with the reasons behind
them. `analyze` builds them; the Markdown narrative, the HTML report and the KFP metrics read
them as attributes.

Every value is a plain Python value (float, int, str, None, tuples and dicts of them), so
`dataclasses.asdict` of a summary is JSON-serializable. Missing numbers are NaN (or None for a
batch size that does not exist), each with a reason string.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

INPUT_BOTTLENECK_SHARE = 0.2
"""Share of synthetic throughput lost with real input past which the input pipeline is called
a bottleneck."""


@dataclass(frozen=True)
class ThroughputSummary:
    """Samples/s over the sweep's batch sizes, and where the device saturates."""

    timing_input_mode: str | None
    """The input mode whose step times describe the device; None when nothing was timed."""
    saturation_batch: int | None
    """Smallest batch within `saturation_tolerance` of the best samples/s."""
    saturation_reason: str
    saturation_tolerance: float
    saturated_at_smallest_batch: bool
    best_samples_per_s: float
    best_batch: int | None
    """The batch with the best samples/s."""
    mfu_at_best: float
    smallest_timed_batch: int | None
    input_pipeline_share: float
    """Share of synthetic-input samples/s lost with real input at `best_batch` (NaN: unknown;
    below 0: real input was timed faster, which reading data cannot make it)."""
    input_pipeline_share_range: tuple[float, float] = (math.nan, math.nan)
    """That share's 90 % range (analysis.input_share.input_pipeline_share); NaN: none."""
    input_pipeline_share_basis: str = ""
    """What the range was computed from: the sweep's trials, or (older tables) the two rows'
    rerun intervals."""
    best_rerun_interval: tuple[float, float] = (math.nan, math.nan)
    """The best row's 90 % rerun interval of samples/s (sweep/rounds.py); NaN: none recorded."""
    failed_batches: tuple[int, ...] = ()
    """Batch sizes whose sweep row raised an error (fits.failed_batches)."""
    saturation_range: str = ""
    """Where the rows' rerun intervals would put the saturation batch when they do not pin it
    (fits.saturation_range); "" where they agree with it."""

    @property
    def input_share_bounds(self) -> tuple[float, float]:
        """The share's range cut to what a share can be, [0, 1] (real input cannot be faster
        than synthetic: a range reaching below 0 says only that no loss is ruled out); (NaN,
        NaN) where the whole range lies below 0 (the rows were timed at different speeds) or
        there is none."""
        low, high = self.input_pipeline_share_range
        if not (math.isfinite(low) and math.isfinite(high)) or high < 0:
            return math.nan, math.nan
        return max(0.0, low), min(1.0, high)

    @property
    def input_bottleneck(self) -> bool:
        """Real input loses more than INPUT_BOTTLENECK_SHARE of synthetic throughput at the
        best batch, over the whole of its range (or, without one, at its point)."""
        low = self.input_pipeline_share_range[0]
        return (self.input_pipeline_share > INPUT_BOTTLENECK_SHARE
                and not low <= INPUT_BOTTLENECK_SHARE)


@dataclass(frozen=True)
class MemorySummary:
    """Peak memory ≈ fixed + per_sample·B, and the largest batch that ran without an OOM."""

    fixed_bytes: float
    per_sample_bytes: float
    r2: float
    reason: str
    """Why there is no fit ("" when there is one)."""
    largest_fitting_batch: float
    """+inf when no batch ran out of memory, NaN when no batch ran."""
    largest_fitting_reason: str
    fixed_se_bytes: float = math.nan
    per_sample_se_bytes: float = math.nan
    """Standard errors of the two terms (NaN: two batch sizes, no scatter to judge by)."""


@dataclass(frozen=True)
class StepTimeSummary:
    """The step-time line t(B) ≈ alpha + beta·B, and which measurements it came from."""

    source: str
    alpha_s: float
    beta_s: float
    r2: float
    reason: str
    alpha_se_s: float = math.nan
    beta_se_s: float = math.nan
    """Standard errors of α and β from the fit's covariance; NaN without degrees of freedom
    (two batch sizes fit any line exactly)."""


@dataclass(frozen=True)
class RegimeRange:
    """Consecutive measured batch sizes in the same regime of Shallue et al. 2018."""

    regime: str
    first_batch: int
    last_batch: int


@dataclass(frozen=True)
class CriticalBatchSummary:
    """One LR rule: S(B) = S_min + E_min/B, B_crit with its bootstrap interval, regimes, B*."""

    s_min: float
    e_min: float
    b_crit: float
    b_crit_low: float
    b_crit_high: float
    r2: float
    reason: str
    """Why B_crit was not estimated ("" when it was): a bound, or an edge case (one batch size,
    fewer than three reached the target, every trial diverged)."""
    bound: str
    """"above" / "below" when the data support only a bound on B_crit ("" otherwise)."""
    bound_batch: float
    """The batch size of the bound: B_crit lies above / below it (NaN without a bound)."""
    interval_note: str
    """Why the interval is missing, or that it reaches an end of the measured range."""
    batch_range: tuple[float, float]
    """Smallest and largest batch size run with this rule."""
    optimal_batch: float
    """B* = sqrt(alpha·B_crit/beta), capped at the largest batch that fits."""
    regimes: tuple[RegimeRange, ...]
    optimal_batch_interval: tuple[float, float] = (math.nan, math.nan)
    """B*'s 90 % interval (timetotarget.optimal_batch_interval); NaN without B*."""
    s_min_se: float = math.nan
    e_min_se: float = math.nan
    """S_min's and E_min's standard errors from the fit (NaN without B_crit)."""
    interval_level: float = 0.90
    """The nominal level the B_crit interval was read at (above 0.90 for an adaptive search's
    trials, so that it holds the truth 90 % of the time: critical.read_level)."""


@dataclass(frozen=True)
class NoiseScaleSummary:
    """The gradient noise scale B_simple at the end of the trials."""

    b_simple_median: float
    trials: int
    reason: str
    quartile_low: float = math.nan
    quartile_high: float = math.nan
    """The interquartile range over the trials: their spread, not an interval of the median."""
    dropped: int = 0
    """Trials whose final estimate was ≤ 0 (left out: the estimate failed there)."""
    unrecorded: int = 0
    """Trials (not diverged) whose runs row records no final estimate while others do: the
    estimate failed there too (the training records none when |G|² ≤ 0)."""


@dataclass(frozen=True)
class Recommendation:
    """Batch size, LR rule and worker count, each None when there is no answer, with a reason."""

    batch_size: int | None
    lr_rule: str | None
    workers: int | None
    batch_reason: str
    lr_rule_reason: str
    workers_reason: str
    learning_rate: float | None = None
    """The learning rate the runs of the chosen rule used at the chosen batch (the rule applied
    to the config's base LR, or the grid's best), None where the runs do not record one."""
    learning_rate_reason: str = ""
    expected: str = ""
    """Steps and training time to target at the recommended cell, with their spread over seeds
    (analysis/expected.py); "" when there is no recommended batch."""
    versus_current: str = ""
    """The saving against the batch size trained with today, or what to give to see it."""
    lr_rule_shown: str | None = None
    """What the answer says for the rule when `lr_rule` is only a label (a table brought
    without an lr_rule column: "not given"); None: `lr_rule` itself."""


@dataclass(frozen=True)
class ExcludedRow:
    """A sweep row flagged unstable and left out of every timing figure."""

    input_mode: str
    batch_size: int
    reason: str
    """The sweep's `quality_reason` (why its rounds or steps could not be trusted)."""


@dataclass(frozen=True)
class TimingFlag:
    """A batch size whose convergence step time and sweep step time disagree."""

    batch_size: int
    text: str


@dataclass(frozen=True)
class MeasurementQuality:
    """How far the run's timings can be trusted: what was left out, under which conditions."""

    timed_rows: int
    """Sweep rows that ran (status ok), stable or not."""
    sweep_given: bool
    """Whether the analysis got a sweep table with any row (ok or not)."""
    recorded_rows: int
    """Of those, rows with a recorded quality (0: a table from before quality flags)."""
    excluded: tuple[ExcludedRow, ...]
    max_load_avg_1m: float
    """Highest 1-minute load average over the timed rows (NaN: not recorded)."""
    usable_cpus: int | None
    """CPUs the sweep could use (its affinity mask / cgroup quota); None: not recorded."""
    busy_rows: int
    """Timed rows whose load average exceeded the usable CPUs (`quality.BUSY_LOAD_EXCESS`)
    and which the sweep could not judge by their threads' CPU wait (not recorded)."""
    cpu_per_wall_range: tuple[float, float]
    """Lowest and highest process CPU seconds per wall second over the timed rows."""
    max_cpu_wait_share: float
    """Longest share of runnable time the trials' threads waited for a CPU (NaN: not
    recorded: not Linux, or a table from before it was)."""
    oversubscribed_rows: int
    """Timed rows whose torch threads outnumbered the usable CPUs."""
    gpu_shared_rows: int
    """Timed rows with another process on the GPU (CUDA with NVML only)."""
    gpu_clock_temperature: tuple[float, float]
    """Lowest SM clock (MHz) and highest temperature (°C) over the timed rows (NaN: unknown)."""
    timing_flags: tuple[TimingFlag, ...]
    gc_rows: tuple[tuple[float, str, int], ...] = ()
    """(gc_share, input mode, batch size) of the timed rows whose trials spent at least
    conditions.GC_NOTE_SHARE of their timed spans in Python's garbage collector."""
    cpu_threads: int | None = None
    """The most torch threads a CPU sweep's trials ran on; None on a GPU or not recorded."""
    loaded_rows_judged_by_wait: int = 0
    """Timed rows whose load average exceeded the usable CPUs but which the sweep judged by
    their own threads' CPU wait and passed: the load average lags and counts other threads,
    the wait is the trials' own experience, so these rows are not counted busy."""

    @property
    def flagged(self) -> bool:
        """Anything a user must know before trusting the figures."""
        return bool(
            self.excluded
            or self.busy_rows
            or self.oversubscribed_rows
            or self.gpu_shared_rows
            or self.timing_flags
        )


@dataclass(frozen=True)
class TargetCriticalBatch:
    """B_crit of one LR rule for one target (the "B_crit vs target" table): a number with its
    interval only where the data support it, else the bound, as `CriticalBatchSummary`."""

    metric: str
    value: float
    label: str
    """The target as people write it: "val_accuracy >= 0.95"."""
    rule: str
    b_crit: float
    b_crit_low: float
    b_crit_high: float
    bound: str
    """"above" / "below" when the data support only a bound ("" otherwise)."""
    bound_batch: float
    s_min: float
    e_min: float
    reached_batches: tuple[int, ...]
    """Batch sizes whose median over seeds reached the target (best LR of the grid)."""
    reason: str
    """Why B_crit was not estimated ("" when it was)."""
    optimal_batch: float = math.nan
    """B* from this B_crit (CriticalBatchSummary.optimal_batch)."""
    optimal_batch_interval: tuple[float, float] = (math.nan, math.nan)
    """B*'s 90 % interval, B_crit's and the step-time line's uncertainty both in it
    (timetotarget.optimal_batch_interval)."""
    s_min_se: float = math.nan
    e_min_se: float = math.nan
    """S_min's and E_min's standard errors from the fit (NaN where not fitted)."""


@dataclass(frozen=True)
class GapTrend:
    """How one validation metric at the gap budget moves with the batch, for one LR rule: the
    least-squares slope of the metric against log2(batch) (the change per doubling)."""

    rule: str
    metric: str
    slope_per_doubling: float
    slope_low: float
    slope_high: float
    """The slope's interval (`gap.GAP_CONFIDENCE`); NaN when the data give none."""
    interval_source: str
    """"seed bootstrap", "least squares" or "" (no interval)."""
    verdict: str
    """"worse" / "better" (the interval excludes 0), "not visible" or "not measurable"."""
    reason: str


@dataclass(frozen=True)
class GapSummary:
    """The generalization gap: every metric after the same data (`convergence.gap_epochs`)."""

    measured: bool
    """Whether any trial recorded an evaluation at the budget (`curves.at_gap_budget`)."""
    gap_epochs: float | None
    """The budget in epochs when the caller knows it (the config), else None."""
    trends: tuple[GapTrend, ...]
    reason: str
    """Why the gap was not measured ("" when it was)."""


@dataclass(frozen=True)
class AnalysisSummary:
    """Everything the narrative, the report and the metrics say about one run."""

    throughput: ThroughputSummary
    memory: MemorySummary
    step_time: StepTimeSummary
    optimal_batch_cap: float
    """The largest batch B* may take: the largest that fits, else the largest measured."""
    optimal_batch_line: str
    """The step-time line B* = sqrt(α·B_crit/β) used, in words: "" for `step_time`'s, or
    REAL_INPUT_LINE where the input pipeline is a bottleneck (what a trial pays)."""
    optimal_batch_step_time: tuple[float, float]
    """That line's (α, β) in seconds, which the report's step-time plot draws where it is not
    `step_time`'s."""
    critical_batch: dict[str, CriticalBatchSummary]
    """Per LR rule, in sorted order."""
    noise_scale: NoiseScaleSummary
    recommendation: Recommendation
    min_time_to_target_s: float
    step_time_sources: tuple[str, ...]
    """Where the step times of T(B) came from (`timetotarget.StepTimeSource` values)."""
    quality: MeasurementQuality
    target: str = ""
    """The target the table, the fits and the recommendation are for ("val_accuracy >= 0.95";
    "" without convergence trials)."""
    target_reason: str = ""
    """Why that target was chosen (`targets.choose_target`)."""
    target_metric: str | None = None
    target_value: float = math.nan
    targets: tuple[TargetCriticalBatch, ...] = ()
    """B_crit per target and LR rule ("B_crit vs target"), easiest target first per metric."""
    gap: GapSummary | None = None
    pruning: str = ""
    """The pruned trials and what pruning saved, in words (analysis/pruning.py); "" if none."""
    lr_rule_given: bool = True
    """False for a table brought without an lr_rule column: its rows' rule "tuned" is a label
    (the fewest steps per batch over the learning rates the runs used), not a rule to apply."""

    def stored(self) -> dict:
        """Every field, as summary.json keeps it: the figures physics bounds as `metrics` gives
        them (a share within [0, 1], an MFU at most 1; NaN where the measured value cannot be
        one: the markdown beside it says why)."""
        data = dataclasses.asdict(self)
        t = self.throughput
        data["throughput"].update(
            input_pipeline_share=t.input_pipeline_share if t.input_pipeline_share >= 0
            else math.nan,
            input_pipeline_share_range=t.input_share_bounds,
            mfu_at_best=t.mfu_at_best if t.mfu_at_best <= 1 else math.nan)
        return data

    def metrics(self) -> dict[str, float]:
        """Finite headline numbers, flat, for KFP Metrics (which cannot store NaN or inf)."""
        values: dict[str, object] = {
            "saturation_batch": self.throughput.saturation_batch,
            "best_samples_per_s": self.throughput.best_samples_per_s,
            # above 1 it is no utilization (fits.mfu_text): the peak or FLOP count is off
            "mfu_at_best": (self.throughput.mfu_at_best
                            if self.throughput.mfu_at_best <= 1 else None),
            # below 0 (real input timed faster) it is no share: the narrative says why
            "input_pipeline_share": (self.throughput.input_pipeline_share
                                     if self.throughput.input_pipeline_share >= 0 else None),
            "input_pipeline_share_low": self.throughput.input_share_bounds[0],
            "input_pipeline_share_high": self.throughput.input_share_bounds[1],
            "step_time_alpha_s": self.step_time.alpha_s,
            "step_time_beta_s": self.step_time.beta_s,
            "step_time_r2": self.step_time.r2,
            "memory_fixed_bytes": self.memory.fixed_bytes,
            "memory_per_sample_bytes": self.memory.per_sample_bytes,
            "largest_fitting_batch": self.memory.largest_fitting_batch,
            "b_simple_median": self.noise_scale.b_simple_median,
            "recommended_batch_size": self.recommendation.batch_size,
            "recommended_workers": self.recommendation.workers,
            "min_time_to_target_s": self.min_time_to_target_s,
            "timing_flags": len(self.quality.timing_flags),
        }
        if self.quality.recorded_rows:
            values["sweep_rows_unstable"] = len(self.quality.excluded)
        for rule, fit in self.critical_batch.items():
            values.update(_critical_metrics(rule, fit, self.optimal_batch_cap))
        if len({(t.metric, t.value) for t in self.targets}) > 1:
            for fit in self.targets:
                values.update(_target_metrics(fit))
        return {name: float(value) for name, value in values.items() if _is_finite_number(value)}


def _critical_metrics(rule: str, fit: CriticalBatchSummary, cap: float) -> dict[str, object]:
    """B_crit and its fit only when the data support a number; otherwise the bound alone
    (`b_crit_<rule>_above` = 1024), never a round-off ratio. B* likewise: held at `cap`, it
    is the bound `optimal_batch_<rule>_above`."""
    values = _fit_metrics(rule, fit)
    if "b_crit_" + rule not in values:
        return values
    if fit.optimal_batch >= cap:
        return values | {f"optimal_batch_{rule}_above": fit.optimal_batch}
    low, high = fit.optimal_batch_interval
    return values | {f"optimal_batch_{rule}": fit.optimal_batch,
                     # 0 or NaN (dropped): the interval is open at that end
                     f"optimal_batch_low_{rule}": low if low > 0 else None,
                     f"optimal_batch_high_{rule}": high if high < cap else None}


def _target_metrics(fit: TargetCriticalBatch) -> dict[str, object]:
    """Per-target B_crit under today's names with a suffix safe for KFP: `b_crit_linear` of
    val_accuracy >= 0.95 is `b_crit_linear__val_accuracy_0p95`."""
    return _fit_metrics(f"{fit.rule}__{target_suffix(fit.metric, fit.value)}", fit)


def _fit_metrics(suffix: str, fit: CriticalBatchSummary | TargetCriticalBatch) -> dict:
    """S_min, E_min, B_crit and its interval named with `suffix`, or the bound alone."""
    if fit.bound:
        return {f"b_crit_{suffix}_{fit.bound}": fit.bound_batch}
    if not math.isfinite(fit.b_crit):
        return {}
    return {
        f"s_min_{suffix}": fit.s_min,
        f"e_min_{suffix}": fit.e_min,
        f"b_crit_{suffix}": fit.b_crit,
        f"b_crit_low_{suffix}": fit.b_crit_low,
        f"b_crit_high_{suffix}": fit.b_crit_high,
    }


def target_suffix(metric: str, value: float) -> str:
    """A target as a metric-name suffix: letters, digits and underscores only (0.95 → 0p95,
    -1.5 → m1p5)."""
    number = f"{value:g}".replace("-", "m").replace(".", "p").replace("+", "")
    return re.sub(r"[^A-Za-z0-9_]", "_", f"{metric}_{number}")


def _is_finite_number(value: object) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    )
