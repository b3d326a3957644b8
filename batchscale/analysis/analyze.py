"""The analysis of one run: from the sweep, runs and curves tables to the analysis table rows,
the typed summary, the KFP metrics and the Markdown narrative.

The pieces live by concern: sweep fits in `batchscale.fits`, steps to result and the critical
batch fit in `critical` (what of it is reported in `critical_summary`), step times and time to
target in `timetotarget`, measurement quality in `quality`, B_simple and workers in
`parallel`, the choice in `recommend`, the summary types in `summary`, the prose in
`narrative`. Missing pieces (no reached trial for a rule, OOM
rows, a single seed, an empty table) give NaN or None with a reason, never an exception: a
report that says "not measured" is more useful than a failed pipeline step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from batchscale import schemas
from batchscale.analysis.critical import steps_to_result
from batchscale.analysis.critical_summary import critical_by_rule
from batchscale.analysis.expected import at_fewest_workers, row_bands
from batchscale.analysis.gap import gap_summary
from batchscale.analysis.input_share import input_pipeline_share
from batchscale.analysis.narrative import render_markdown
from batchscale.analysis.parallel import noise_scale
from batchscale.analysis.pruning import pruning_text
from batchscale.analysis.quality import measurement_quality
from batchscale.analysis.recommend import recommend
from batchscale.analysis.summary import (
    AnalysisSummary,
    MemorySummary,
    Recommendation,
    StepTimeSummary,
    ThroughputSummary,
)
from batchscale.analysis.targets import (
    Target,
    choose_target,
    split_by_target,
    target_fits,
    target_tables,
)
from batchscale.analysis.timetotarget import (
    REAL_INPUT_LINE,
    BStar,
    cell_step_times,
    open_reason,
    optimal_batch_cap,
    step_times,
    time_to_target,
)
from batchscale.config import AnalysisConfig
from batchscale.fits import (
    NO_SWEEP_GIVEN,
    TIMING_MODES,
    StepTimeFit,
    ensure_columns,
    failed_batches,
    find_saturation,
    fit_memory,
    fit_step_time,
    largest_fitting_batch,
    numeric_column,
    saturation_range,
    throughput_curve,
    timing_mode,
)

ANALYSIS_COLUMNS: list[str] = list(schemas.ANALYSIS.names)


@dataclass(frozen=True)
class AnalysisResult:
    """What the analysis component writes: the analysis table, headline numbers and text."""

    rows: list[dict]
    """One dict per (lr_rule, batch_size), with exactly the columns of schemas.ANALYSIS."""
    summary: AnalysisSummary
    """Headline numbers with the reasons behind them."""
    markdown: str
    """Short answer to "why doesn't my training get faster?" with the numbers."""

    @property
    def metrics(self) -> dict[str, float]:
        """Flat name → finite float, for KFP Metrics (non-finite values are left out)."""
        return self.summary.metrics()


def without_pruned(runs: pd.DataFrame) -> pd.DataFrame:
    """The trials the fits use: all but those the adaptive search pruned (stopped hopelessly
    behind its own fit; convergence.adaptive_prune_factor) or stopped as probes (they measured
    the noise scale, not the steps to the target; convergence.adaptive_probe_budget_examples),
    and a user's training loop that failed (it says nothing about how many steps the batch
    needs)."""
    left_out = (schemas.RunStatus.PRUNED, schemas.RunStatus.PROBED, schemas.RunStatus.FAILED)
    return runs[~runs["status"].isin(left_out).to_numpy(dtype=bool)]


def analyze(
    sweep: pd.DataFrame | None,
    runs: pd.DataFrame | None,
    curves: pd.DataFrame | None,
    settings: AnalysisConfig | None = None,
    primary_target: tuple[str, float] | None = None,
    gap_epochs: float | None = None,
    learning_rates_given: bool = True,
    lr_rule_given: bool = True,
    warmup_steps: int | None = None,
) -> AnalysisResult:
    """Fits, regimes and recommendation on one run's tables (`settings`: the experiment's
    `analysis` config, its defaults when None).

    The runs table has a row per (trial, target): the table rows, the critical batch per rule
    and the recommendation are for one target, `primary_target` (metric, value) when the runs
    have it, else the hardest reached at enough batch sizes (`targets.choose_target`); B_crit
    of every target is in `summary.targets`. `gap_epochs` (the config's
    `convergence.gap_epochs`) only labels the generalization gap. `learning_rates_given`
    false: the runs' `lr` is a stand-in (a table brought without one), never recommended;
    `lr_rule_given` false: their rule "tuned" is only a label, said as "not given".
    `warmup_steps` (the config's `convergence.warmup_steps`) goes with the learning rate on
    the card; None for tables from elsewhere."""
    settings = settings or AnalysisConfig()
    sweep = ensure_columns(sweep, schemas.SWEEP)
    every_trial = schemas.current_lr_rules(ensure_columns(runs, schemas.RUNS))
    all_runs = without_pruned(every_trial)
    curves = ensure_columns(curves, schemas.CURVES)
    fewest = at_fewest_workers(all_runs)
    groups = split_by_target(fewest)
    tables = target_tables(groups)
    choice = choose_target(tables, primary_target)
    runs = groups[choice.target] if choice.target is not None else fewest
    # The worker-count line, the card's cells and B_simple read every worker count's trials.
    every_count = (split_by_target(all_runs).get(choice.target, all_runs)
                   if choice.target is not None else all_runs)
    throughput = _throughput_summary(sweep, settings.saturation_tolerance)
    memory = _memory_summary(sweep)
    table, step_fit, source = _cell_table(sweep, runs, settings)
    cap = optimal_batch_cap(sweep, table, memory.largest_fitting_batch)
    b_star_fit, b_star_line = _b_star_line(sweep, throughput, step_fit)
    critical, labels = critical_by_rule(runs, table, settings, b_star_fit, cap)
    b_simple, noise = noise_scale(every_count, curves)
    b_star = {rule: BStar(fit.optimal_batch, *fit.optimal_batch_interval, cap, b_star_line,
                          open_reason(fit.b_crit_low, fit.b_crit_high))
              for rule, fit in critical.items()}
    times = numeric_column(table, "time_to_target_s")
    summary = AnalysisSummary(
        throughput=throughput,
        memory=memory,
        step_time=StepTimeSummary(
            source, step_fit.alpha_s, step_fit.beta_s, step_fit.r2, step_fit.reason,
            *(math.sqrt(v) if v >= 0 else math.nan for v in step_fit.covariance[:2]),
        ),
        optimal_batch_cap=cap,
        optimal_batch_line=b_star_line,
        optimal_batch_step_time=(b_star_fit.alpha_s, b_star_fit.beta_s),
        critical_batch=critical,
        noise_scale=noise,
        recommendation=recommend(table, every_count, b_star, settings.max_cpu_wait_share,
                                 learning_rates_given,
                                 (settings.current_batch_size, settings.current_lr),
                                 memory.largest_fitting_batch, lr_rule_given, warmup_steps),
        min_time_to_target_s=float(np.nanmin(times)) if np.isfinite(times).any() else math.nan,
        step_time_sources=_sources(table),
        quality=measurement_quality(sweep, table),
        target=choice.label,
        target_reason=choice.reason,
        target_metric=choice.target[0] if choice.target else None,
        target_value=choice.target[1] if choice.target else math.nan,
        targets=_target_fits(groups, tables, settings, b_star_fit, cap, choice.target,
                             critical),
        gap=gap_summary(curves, gap_epochs, choice.target[0] if choice.target else None),
        pruning=pruning_text(every_trial),
        lr_rule_given=lr_rule_given,
    )
    rows = _rows(table, summary, labels, b_simple, runs)
    return AnalysisResult(rows, summary, render_markdown(summary))


def _target_fits(groups, tables, settings, step_fit, cap, chosen: Target | None, critical):
    """B_crit per target and rule, the chosen target's fits reused."""
    known = {chosen: critical} if chosen is not None else {}
    return target_fits(groups, tables, settings, step_fit, cap, known)


def _throughput_summary(sweep: pd.DataFrame, tolerance: float) -> ThroughputSummary:
    mode = timing_mode(sweep)
    if mode is None:
        return ThroughputSummary(
            timing_input_mode=None,
            saturation_batch=None,
            saturation_reason=_untimed_reason(sweep),
            failed_batches=tuple(failed_batches(sweep)),
            saturation_tolerance=tolerance,
            saturated_at_smallest_batch=False,
            best_samples_per_s=math.nan,
            best_batch=None,
            mfu_at_best=math.nan,
            smallest_timed_batch=None,
            input_pipeline_share=math.nan,
        )
    curve = throughput_curve(sweep, mode)
    best = curve.loc[curve["samples_per_s"].idxmax()]
    best_batch = int(best["batch_size"])
    smallest = int(curve["batch_size"].min())
    saturation, reason = find_saturation(sweep, tolerance, mode)
    uncertain = saturation_range(sweep, tolerance, mode)
    shares = input_pipeline_share(sweep).set_index("batch_size")
    at_best = (shares.loc[float(best_batch)] if float(best_batch) in shares.index
               else pd.Series({"share": math.nan, "share_low": math.nan,
                               "share_high": math.nan, "basis": ""}))
    return ThroughputSummary(
        timing_input_mode=mode,
        failed_batches=tuple(failed_batches(sweep)),
        saturation_batch=saturation,
        saturation_reason=reason,
        saturation_tolerance=tolerance,
        saturated_at_smallest_batch=saturation == smallest,
        best_samples_per_s=float(best["samples_per_s"]),
        best_batch=best_batch,
        mfu_at_best=float(best["mfu"]),
        smallest_timed_batch=smallest,
        input_pipeline_share=float(at_best["share"]),
        input_pipeline_share_range=(float(at_best["share_low"]), float(at_best["share_high"])),
        input_pipeline_share_basis=str(at_best["basis"]),
        best_rerun_interval=(float(best["samples_per_s_low"]),
                             float(best["samples_per_s_high"])),
        saturation_range=uncertain,
    )


def _untimed_reason(sweep: pd.DataFrame) -> str:
    """Why no stable timing exists: no sweep, nothing ran, or every timed row was flagged
    unstable."""
    if sweep.empty:
        return NO_SWEEP_GIVEN
    if any(not throughput_curve(sweep, m, include_unstable=True).empty for m in TIMING_MODES):
        return "every timed batch size was flagged unstable (see the measurement quality)"
    return "no batch size was timed successfully"


def _memory_summary(sweep: pd.DataFrame) -> MemorySummary:
    # Unstable rows count here: peak memory does not depend on how busy the CPU was, only the
    # timing does, so the memory model keeps every row that ran.
    modes = [m for m in TIMING_MODES if not throughput_curve(sweep, m, include_unstable=True).empty]
    curve = throughput_curve(sweep, (modes or TIMING_MODES)[0], include_unstable=True)
    fit = fit_memory(curve["batch_size"], curve["peak_memory_bytes"])
    b_max, b_max_reason = largest_fitting_batch(sweep)
    return MemorySummary(
        fixed_bytes=fit.fixed_bytes,
        per_sample_bytes=fit.per_sample_bytes if fit.per_sample_clear else math.nan,
        r2=fit.r2,
        reason=(fit.reason if math.isnan(fit.fixed_bytes) or not fit.per_sample_clear
                else ""),
        largest_fitting_batch=b_max,
        largest_fitting_reason=b_max_reason,
        fixed_se_bytes=fit.fixed_se_bytes,
        per_sample_se_bytes=fit.per_sample_se_bytes,
    )


def _cell_table(
    sweep: pd.DataFrame, runs: pd.DataFrame, settings: AnalysisConfig
) -> tuple[pd.DataFrame, StepTimeFit, str]:
    """Per (lr_rule, batch): S, E, the step time and its source, the sweep's step time, the
    timing flag, time to target and samples/s; and the sweep's t(B) line that B* uses."""
    table = steps_to_result(runs)
    _, fit, source = step_times(sweep, runs, table["batch_size"], settings.max_cpu_wait_share)
    timing = cell_step_times(sweep, runs, table["batch_size"],
                             settings.step_time_disagreement_factor, settings.max_cpu_wait_share)
    table = pd.concat([table.reset_index(drop=True), timing], axis=1)
    times = numeric_column(table, "step_time_s")
    table = table.assign(
        time_to_target_s=time_to_target(numeric_column(table, "steps_to_target"), times),
        samples_per_s=numeric_column(table, "batch_size") / times,
    )
    table["sweep_timed_low"], table["sweep_timed_high"] = _sweep_timed(sweep)
    return table, fit, source


def _sweep_timed(sweep: pd.DataFrame) -> tuple[float, float]:
    """The smallest and largest batch whose row the sweep's line t(B) is fitted to; NaN where
    it timed none. Past them the line is an extrapolation."""
    mode = timing_mode(sweep)
    timed = throughput_curve(sweep, mode)["batch_size"] if mode else []
    return (float(min(timed)), float(max(timed))) if len(timed) else (math.nan, math.nan)


def _b_star_line(sweep: pd.DataFrame, throughput: ThroughputSummary,
                 device: StepTimeFit) -> tuple[StepTimeFit, str]:
    """The step-time line B* is placed on, and how to say so ("": `device`, the t(B) the
    summary gives). Where the input pipeline is a bottleneck, the real-input line: a trial
    reads its data in the step, as real input does, so on the device's line alone B* would
    land past the batch the trials are fastest at."""
    if not throughput.input_bottleneck:
        return device, ""
    real = throughput_curve(sweep, "real")
    line = fit_step_time(list(real["batch_size"]), list(real["step_time_median_s"]))
    if not (math.isfinite(line.alpha_s) and math.isfinite(line.beta_s)):
        return device, ""
    return line, REAL_INPUT_LINE


def _sources(table: pd.DataFrame) -> tuple[str, ...]:
    """The step-time sources of the cells that reached the target, in order of first use."""
    reached = table[np.isfinite(numeric_column(table, "time_to_target_s"))]
    return tuple(dict.fromkeys(s for s in reached["step_time_source"] if isinstance(s, str)))


def _rows(
    table: pd.DataFrame,
    summary: AnalysisSummary,
    labels: dict[str, pd.DataFrame],
    b_simple: pd.DataFrame,
    runs: pd.DataFrame,
) -> list[dict]:
    """The analysis table: one row per (lr_rule, batch), columns of schemas.ANALYSIS."""
    slopes = {
        (rule, float(label.batch_size)): label
        for rule, per_batch in labels.items()
        for label in per_batch.itertuples(index=False)
    }
    rows = []
    for cell in table.itertuples(index=False):
        fit = summary.critical_batch[cell.lr_rule]
        label = slopes.get((cell.lr_rule, float(cell.batch_size)))
        row = {
            "lr_rule": str(cell.lr_rule),
            "batch_size": int(cell.batch_size),
            "steps_to_target": float(cell.steps_to_target),
            "examples_to_target": float(cell.examples_to_target),
            "step_time_s": float(cell.step_time_s),
            "time_to_target_s": float(cell.time_to_target_s),
            "samples_per_s": float(cell.samples_per_s),
            "regime": label.regime if label is not None else None,
            **_b_simple_columns(b_simple, cell.batch_size),
            **_band_columns(runs, table, cell),
            "saturation_batch": summary.throughput.saturation_batch,
            "s_min": float(fit.s_min),
            "e_min": float(fit.e_min),
            "s_min_se": float(fit.s_min_se),
            "e_min_se": float(fit.e_min_se),
            "b_crit": float(fit.b_crit),
            "b_crit_low": float(fit.b_crit_low),
            "b_crit_high": float(fit.b_crit_high),
            "b_crit_bound": fit.bound or None,
            "b_crit_bound_batch": float(fit.bound_batch),
            "b_crit_reason": (fit.reason or None) if not fit.bound else None,
            "fit_slope": float(label.fit_slope) if label is not None else math.nan,
            "measured_slope": float(label.measured_slope) if label is not None else math.nan,
            "step_time_source": cell.step_time_source,
            "sweep_step_time_s": float(cell.sweep_step_time_s),
            "sweep_step_time_source": cell.sweep_step_time_source,
            "timing_flag": cell.timing_flag,
            "target_metric": summary.target_metric,
            "target_value": (summary.target_value
                             if math.isfinite(summary.target_value) else None),
        }
        row.update(answer_columns(summary.recommendation, row["lr_rule"], row["batch_size"]))
        rows.append({name: row[name] for name in ANALYSIS_COLUMNS})
    return rows


def _band_columns(runs: pd.DataFrame, table: pd.DataFrame, cell) -> dict:
    """The row's spread over its seeds (`expected.row_bands`): NaN where no trial at the row's
    learning rate reached the target, or no time was measured."""
    lr = float(cell.best_lr)
    if not math.isfinite(lr):  # no learning rate's median reached: count every trial
        return {"trials_at_lr": int(cell.trials), "reached_at_lr": int(cell.reached),
                "steps_low": math.nan,
                "steps_high": math.nan, "time_to_target_s_low": math.nan,
                "time_to_target_s_high": math.nan}
    bands = row_bands(runs, table, str(cell.lr_rule), int(cell.batch_size), lr)
    steps, time = bands.steps, bands.time
    return {"trials_at_lr": bands.trials, "reached_at_lr": bands.reached,
            "steps_low": steps.low if steps else math.nan,
            "steps_high": steps.high if steps else math.nan,
            "time_to_target_s_low": time.low if time else math.nan,
            "time_to_target_s_high": time.high if time else math.nan}


def _b_simple_columns(b_simple: pd.DataFrame, batch: int) -> dict:
    """The batch's final B_simple over its trials (every LR rule's): median, lowest, highest."""
    if float(batch) not in b_simple.index:
        return {"b_simple": math.nan, "b_simple_low": math.nan, "b_simple_high": math.nan,
                "b_simple_trials": 0}
    found = b_simple.loc[float(batch)]
    return {"b_simple": float(found["median"]), "b_simple_low": float(found["low"]),
            "b_simple_high": float(found["high"]), "b_simple_trials": int(found["trials"])}


def answer_columns(recommendation: Recommendation, lr_rule: str, batch_size: int) -> dict:
    """The answer card's columns of one analysis row: set where the row is the recommended
    cell, null elsewhere (`answer` false)."""
    chosen = (recommendation.batch_size == batch_size and recommendation.lr_rule == lr_rule)
    if not chosen:
        return {"answer": False, "answer_learning_rate": None, "answer_workers": None,
                "answer_expected": None, "answer_versus_current": None,
                "answer_unanswered": None}
    missing = [f"{part}: {reason}" for part, value, reason in (
        ("learning rate", recommendation.learning_rate, recommendation.learning_rate_reason),
        ("workers", recommendation.workers, recommendation.workers_reason)) if value is None]
    return {"answer": True, "answer_learning_rate": recommendation.learning_rate,
            "answer_workers": recommendation.workers,
            "answer_expected": recommendation.expected or None,
            "answer_versus_current": recommendation.versus_current or None,
            "answer_unanswered": "; ".join(missing) or None}
