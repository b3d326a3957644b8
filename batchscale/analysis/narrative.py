"""The analysis in words: the Markdown that KFP shows as the run's Markdown artifact and that the
HTML report renders (the narrative and the recommendation are written only here)."""

from __future__ import annotations

import math

from batchscale.analysis.critical import BOOTSTRAP_CONFIDENCE, read_level_reason
from batchscale.analysis.gap import GAP_CONFIDENCE
from batchscale.analysis.noise_text import noise_scale_text
from batchscale.analysis.prose import bytes_text, number
from batchscale.analysis.quality import (
    headline,
    markdown_text,
    note_items,
    stable_sentence,
    what_to_do_text,
)
from batchscale.analysis.summary import (
    INPUT_BOTTLENECK_SHARE,
    AnalysisSummary,
    CriticalBatchSummary,
    MeasurementQuality,
    MemorySummary,
    Recommendation,
    StepTimeSummary,
    TargetCriticalBatch,
    ThroughputSummary,
)
from batchscale.analysis.targets import trend, trend_pairs
from batchscale.analysis.timetotarget import (
    StepTimeSource,
    open_reason,
    optimal_batch_text,
)
from batchscale.analysis.usertables import DEFAULT_LR_RULE
from batchscale.fits import mfu_text

NO_ANSWER = "not answered"
"""What the answer card says for a part it cannot answer (its reason follows on the line)."""
NARRATIVE_TITLE = "Why doesn't training get faster with a bigger batch?"
RECOMMENDATION_TITLE = "Recommendation"
BOUND_WORDS = {
    "above": "steps still fall like 1/B",
    "below": "no batch size saved steps",
}
"""What a bound on B_crit means, in the words every output uses ("above 1,024: steps still
fall like 1/B")."""
SOURCE_WORDS = {
    StepTimeSource.CONVERGENCE: "the convergence runs' own step times",
    StepTimeSource.SWEEP: "the sweep's step times",
    StepTimeSource.SWEEP_FIT: "the sweep's line t(B)",
}


def render_markdown(summary: AnalysisSummary) -> str:
    """The short answer to "why doesn't my training get faster?" and the recommendation."""
    return narrative_markdown(summary) + recommendation_markdown(
        summary.recommendation, summary.target, summary.target_reason
    )


def narrative_markdown(summary: AnalysisSummary, *, with_quality: bool = True) -> str:
    """The answer to "why doesn't my training get faster?", without the recommendation.

    `with_quality=False` leaves out the measurement-quality line (the HTML report shows it in
    its own box at the top instead)."""
    lines = [f"## {NARRATIVE_TITLE}", ""]
    if with_quality:
        text = markdown_text(quality_summary_text(summary.quality))
        lines.append(f"- **Measurement quality.** {text}")
    lines += [
        "- **Throughput.** " + _throughput_text(summary.throughput, summary.step_time,
                                                summary.quality.cpu_threads),
        f"- **Memory.** {_memory_text(summary.memory)}",
    ]
    if summary.target:
        lines.append(f"- **Target.** The steps, B_crit and the recommendation below are for"
                     f" {summary.target} ({summary.target_reason}).")
    for rule, fit in summary.critical_batch.items():
        text = _critical_text(fit, summary.optimal_batch_cap, summary.optimal_batch_line,
                              summary.throughput.failed_batches)
        label = (f"{rule} LR rule" if summary.lr_rule_given or rule != DEFAULT_LR_RULE
                 else "no LR rule given: the fewest steps over the runs' learning rates")
        lines.append(f"- **Steps to target ({label}).** {text}")
    if not summary.critical_batch:
        lines.append("- **Steps to target.** Not measured: no convergence trials.")
    lines += [f"- **B_crit vs target ({metric}).** {text}"
              for metric, text in target_trend_texts(summary)]
    if summary.gap is not None and (summary.gap.measured or summary.critical_batch):
        lines.append(f"- **Generalization gap.** {gap_text(summary)}")
    lines.append("- **Gradient noise scale.** "
                 + noise_scale_text(summary.noise_scale, summary.critical_batch))
    if summary.pruning:
        lines.append(f"- **Pruned trials.** {summary.pruning}")
    card = summary.recommendation
    if card.batch_size is not None and card.expected:
        lines.append(
            f"- **To target at the recommended batch {card.batch_size}:** {card.expected}"
            f" ({_sources_text(summary.step_time_sources)})."
        )
    return "\n".join(lines) + "\n"


def quality_summary_text(quality: MeasurementQuality) -> str:
    """The measurement quality in a few sentences (the report's box says it at length), and
    its notes (`note_items`: they flag nothing, but bound what the figures say)."""
    notes = "".join(f" {label}: {text}." for label, text in note_items(quality))
    if not quality.flagged:
        return stable_sentence(quality) + notes
    text = headline(quality)
    if quality.excluded:
        listed = ", ".join(f"{r.input_mode} {r.batch_size}" for r in quality.excluded[:6])
        text += f" Left out: {listed}{' …' if len(quality.excluded) > 6 else ''}."
    return f"{text}{notes} {what_to_do_text()}"


def b_crit_text(b_crit: float, bound: str | None, bound_batch: float) -> str:
    """B_crit as every output states it: "≈ 64", "above 1,024: steps still fall like 1/B",
    "below 4: no batch size saved steps", or "not estimated"."""
    if bound in BOUND_WORDS and math.isfinite(bound_batch):
        return f"{bound} {number(bound_batch)}: {BOUND_WORDS[bound]}"
    if math.isfinite(b_crit):
        return f"≈ {number(b_crit)}"
    return "not estimated"


def _sources_text(sources: tuple[str, ...]) -> str:
    words = [SOURCE_WORDS.get(source, source) for source in sources]
    return "steps × " + (" and ".join(words) if words else "step time")


def recommendation_markdown(
    recommendation: Recommendation, target: str = "", target_reason: str = ""
) -> str:
    """The recommendation block: its heading and `recommendation_list`."""
    listed = recommendation_list(recommendation, target, target_reason)
    return f"\n## {RECOMMENDATION_TITLE}\n\n{listed}\n"


EVIDENCE = {"Batch size": "results", "LR rule": "results", "Learning rate": "results",
            "Workers": "data-parallel", "Expected to target": "convergence",
            "Against today": "results"}
"""The report section (its id) that supports each item of the recommendation."""


def recommendation_list(
    recommendation: Recommendation, target: str = "", target_reason: str = "",
    evidence_links: bool = False,
) -> str:
    """The recommendation as a Markdown list, one item per choice with its reason, after the
    target it is made for (the HTML report shows this same list in its styled box, with
    `evidence_links`: each item ends with a link to the section that supports it)."""
    # An unnamed target's label already reads "the target of your runs (...)".
    label = target if target.startswith("the target") else f"the target {target}"
    head = f"- **For {label}** — {target_reason}.\n" if target else ""
    items = (
        ("Batch size", recommendation.batch_size, recommendation.batch_reason),
        ("LR rule", recommendation.lr_rule_shown or recommendation.lr_rule,
         recommendation.lr_rule_reason),
        ("Learning rate", _lr(recommendation.learning_rate),
         recommendation.learning_rate_reason),
        ("Workers", recommendation.workers, recommendation.workers_reason),
    )
    def link(label: str) -> str:
        return f" ([evidence](#{EVIDENCE[label]}))" if evidence_links else ""

    listed = head + "\n".join(
        f"- **{label}: {NO_ANSWER if value is None else value}** — {reason}.{link(label)}"
        for label, value, reason in items
    )
    outcomes = (("Expected to target", recommendation.expected),
                ("Against today", recommendation.versus_current))
    return listed + "".join(f"\n- **{label}:** {text}.{link(label)}"
                            for label, text in outcomes if text)


# --------------------------------------------------------------------------- numbers in prose


def _lr(value: float | None) -> str | None:
    """A learning rate as the config would take it back (4 significant digits)."""
    return None if value is None else f"{value:.4g}"


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


# --------------------------------------------------------------------------- paragraphs


def _rerun_text(interval: tuple[float, float]) -> str:
    """"(its rerun interval L–H, 90 %; another sweep may land outside) " or, without an
    interval, a flag saying so. Not "a rerun would give": the interval rests on the sweep's
    rounds and an assumed drift between sweeps (sweep.between_sweep_cv), and on a noisy hour the
    next sweep fell outside more often than 10 % (docs/sweep.md)."""
    low, high = interval
    if not (math.isfinite(low) and math.isfinite(high)):
        return "(no rerun interval recorded) "
    return (f"(its rerun interval {number(low)}–{number(high)}, 90 %; another sweep may land "
            "outside) ")


def _throughput_text(throughput: ThroughputSummary, step: StepTimeSummary,
                     cpu_threads: int | None) -> str:
    if throughput.timing_input_mode is None:
        return f"Not measured: {throughput.saturation_reason}."
    best, saturation = throughput.best_batch, throughput.saturation_batch
    text = (
        f"The best samples/s is {number(throughput.best_samples_per_s)} "
        f"{_rerun_text(throughput.best_rerun_interval)}at batch {best} "
        f"({throughput.timing_input_mode} input"
    )
    mfu, (low, high) = throughput.mfu_at_best, throughput.best_rerun_interval
    shares = (low / throughput.best_samples_per_s, high / throughput.best_samples_per_s)
    text += f", {mfu_text(mfu, shares)})." if math.isfinite(mfu) else ")."
    if saturation is None:
        text += f" No saturation batch: {throughput.saturation_reason}."
    elif throughput.saturated_at_smallest_batch:
        text += (
            f" The device is already saturated at batch {saturation}, the smallest measured: a"
            " bigger batch does not raise samples/s, each step just takes longer."
        )
    else:
        uncertain = (f" ({throughput.saturation_range})" if throughput.saturation_range
                     else "")
        text += (
            f" Batch {saturation} is the smallest within "
            f"{throughput.saturation_tolerance:.0%} of the best{uncertain}: past it a bigger "
            "batch mostly makes each step longer."
        )
    if math.isfinite(step.alpha_s):
        text += f" Step time {step_line_text(step)}."
    return text + _input_text(throughput, cpu_threads)


def step_line_text(step: StepTimeSummary) -> str:
    """"t(B) ≈ 0.386 ± 0.05 ms + 2.24 ± 0.48 µs × B (± one standard error; R² 0.85)", or, where
    the points leave no degrees of freedom, says that the line has no error estimate."""
    alpha, beta = 1e3 * step.alpha_s, 1e6 * step.beta_s
    if math.isfinite(step.alpha_se_s) and math.isfinite(step.beta_se_s):
        return (f"t(B) ≈ {alpha:.3g} ± {1e3 * step.alpha_se_s:.2g} ms + {beta:.3g} ± "
                f"{1e6 * step.beta_se_s:.2g} µs × B (± one standard error; R² {step.r2:.2f})")
    return (f"t(B) ≈ {alpha:.3g} ms + {beta:.3g} µs × B (R² {step.r2:.2f}; no error estimate: "
            "a line through two batch sizes fits them exactly)")


def _input_text(throughput: ThroughputSummary, cpu_threads: int | None) -> str:
    """Real input against synthetic at the best batch, with its 90 % range and what that
    range was computed from. Real input timed faster is no finding: reading data cannot make a step
    faster, so the rows were timed at different machine speeds. One thread is suggested only
    to a CPU sweep on several (`cpu_threads`, MeasurementQuality's)."""
    share, best = throughput.input_pipeline_share, throughput.best_batch
    if not math.isfinite(share):
        return ""
    low, high = throughput.input_pipeline_share_range
    known = math.isfinite(low) and math.isfinite(high)
    least, most = throughput.input_share_bounds  # never above 100 % of synthetic
    if not known:
        ratio = " (no range: the rows recorded neither their trials' spread nor rerun intervals)"
    elif math.isfinite(least):
        basis = throughput.input_pipeline_share_basis
        ratio = f" ({1 - most:.0%}–{1 - least:.0%}, 90 %, from {basis})"
    else:  # the whole range above 100 %: the cause below says so
        ratio = ""
    if share < 0:
        cause = ("the two rows were timed at different machine speeds, beyond what "
                 f"{throughput.input_pipeline_share_basis} allow" if known and high < 0 else
                 "the two rows differ by their timing noise")
        advice = (" (a sweep on one thread, sweep.threads: 1, times rows more alike)"
                  if cpu_threads and cpu_threads > 1 else "")
        return (f" Real input was timed at {1 - share:.0%} of synthetic throughput at batch {best}"
                f"{ratio}; reading data cannot make a step faster, so {cause}, and the input "
                f"pipeline's cost is not resolved{advice}.")
    text = f" Real input reaches {1 - share:.0%} of synthetic throughput at batch {best}{ratio}"
    if throughput.input_bottleneck:
        return text + (": the input pipeline is a bottleneck. Read ahead of the step with "
                       "convergence.loader_workers (background processes), or give your "
                       "dataset a batched __getitems__ (one call per batch): "
                       "docs/your-model.md.")
    if share <= INPUT_BOTTLENECK_SHARE:
        return text + "."
    return text + ": the input pipeline may be a bottleneck (the range allows either)."


def _memory_text(memory: MemorySummary) -> str:
    text = _sentence(memory.largest_fitting_reason)
    b_max = memory.largest_fitting_batch
    if math.isfinite(b_max):
        text += f" The largest batch that fits is {int(b_max)}."
    if math.isfinite(memory.fixed_bytes) and math.isfinite(memory.per_sample_bytes):
        text += f" Peak memory ≈ {memory_line_text(memory)}."
    elif math.isfinite(memory.fixed_bytes):
        text += f" Peak memory ≈ {bytes_text(memory.fixed_bytes)}; {memory.reason}."
    return text


def memory_line_text(memory: MemorySummary) -> str:
    """"416 ± 2.1 MiB + 31.2 ± 1.1 KiB per sample (± one standard error; R² 0.98)", or, where
    two batch sizes fix the line, says that it has no error estimate."""
    fixed, per_sample = bytes_text(memory.fixed_bytes), bytes_text(memory.per_sample_bytes)
    if math.isfinite(memory.fixed_se_bytes) and math.isfinite(memory.per_sample_se_bytes):
        return (f"{fixed} ± {bytes_text(memory.fixed_se_bytes)} + {per_sample} ± "
                f"{bytes_text(memory.per_sample_se_bytes)} per sample (± one standard error; "
                f"R² {memory.r2:.2f})")
    return (f"{fixed} + {per_sample} per sample (no error estimate: a line through two batch "
            "sizes fits them exactly)")


def _se(value: float) -> str:
    """" ± 4.1", or "" where the standard error is not known."""
    return f" ± {number(value)}" if math.isfinite(value) else ""


def _critical_text(fit: CriticalBatchSummary, cap: float, line: str = "",
                   failed: tuple[int, ...] = ()) -> str:
    if fit.bound:
        return _bound_text(fit, failed)
    if fit.reason or not math.isfinite(fit.b_crit):
        return f"B_crit not estimated: {fit.reason or 'no fit'}."
    text = (
        f"S_min ≈ {number(fit.s_min)}{_se(fit.s_min_se)} steps and E_min ≈ {number(fit.e_min)}"
        f"{_se(fit.e_min_se)} examples{' (± one standard error)' if _se(fit.s_min_se) else ''},"
        f" so B_crit = E_min/S_min ≈ {number(fit.b_crit)}"
    )
    if math.isnan(fit.b_crit_low):
        text += f" (no interval: {fit.interval_note})."
    else:
        note = f"; {fit.interval_note}" if fit.interval_note else ""
        text += (f" ({BOOTSTRAP_CONFIDENCE:.0%} interval {_interval_text(fit)}{_level_text(fit)}"
                 f"{note}).")
    text += " Past B_crit each doubling of the batch saves less than a quarter of the steps."
    text += _regimes_text(fit)
    b_star = fit.optimal_batch
    with_line = line[0].upper() + line[1:] if line else "With t(B)"
    if math.isfinite(b_star) and b_star >= cap:
        text += (f" {with_line}, time to target keeps falling up to batch {number(cap)} "
                 "(B* capped).")
    elif math.isfinite(b_star):
        why = open_reason(fit.b_crit_low, fit.b_crit_high)
        text += (f" {with_line}, time to target is lowest near B* "
                 f"{optimal_batch_text(b_star, fit.optimal_batch_interval, cap, why_open=why)}.")
    return text


def _level_text(fit: CriticalBatchSummary) -> str:
    """Why an interval was read above its nominal level: the trials an adaptive search chose."""
    why = read_level_reason(fit.interval_level)
    return f", read at the {fit.interval_level:.0%} level: {why}" if why else ""


def _bound_text(fit: CriticalBatchSummary, failed: tuple[int, ...] = ()) -> str:
    """A B_crit the data bound but do not pin down: the bound and what it means, no number;
    where the sweep saw the bigger batches fail (`failed`), that instead of "measure one"."""
    text = f"B_crit {b_crit_text(fit.b_crit, fit.bound, fit.bound_batch)}"
    # Said of the fit, not of the table beside it: with scattered steps a measured drop can
    # sit inside what the fit cannot tell from noise.
    if fit.bound == "above":
        bigger = [b for b in failed if b > fit.bound_batch]
        advice = (f"batch {', '.join(f'{b:,}' for b in bigger)} failed in the sweep, so the "
                  "workload as it is cannot run a bigger one" if bigger
                  else "measure a bigger one to find B_crit")
        text += (
            " — the fit cannot tell S_min from zero: as far as these data show, a bigger batch"
            f" still saves steps in proportion ({advice})."
        )
    else:
        text += (
            " — the fit cannot tell E_min from zero: these data do not show that a bigger"
            " batch saves steps (the table beside gives each batch's steps)."
        )
    return text + _regimes_text(fit)


def _regimes_text(fit: CriticalBatchSummary) -> str:
    if not fit.regimes:
        return ""
    parts = [
        f"{r.regime.replace('_', ' ')} {r.first_batch}"
        + (f"–{r.last_batch}" if r.last_batch != r.first_batch else "")
        for r in fit.regimes
    ]
    return f" Regimes: {', '.join(parts)}."


def _interval_text(fit: CriticalBatchSummary) -> str:
    """The bootstrap interval in words; an end clipped to the measured range reads as open."""
    return interval_words(fit.b_crit_low, fit.b_crit_high, *fit.batch_range)


def target_interval_text(fit: TargetCriticalBatch) -> str:
    """A target's B_crit interval in words, against the batches that reached that target (an
    end beyond them is the fit's range cut, not an estimate: it reads as open)."""
    if not fit.reached_batches:
        return f"{number(fit.b_crit_low)}–{number(fit.b_crit_high)}"
    return interval_words(fit.b_crit_low, fit.b_crit_high, min(fit.reached_batches),
                          max(fit.reached_batches))


def interval_words(low: float, high: float, smallest: float, largest: float) -> str:
    """An interval against the measured batches [smallest, largest]: an end at or beyond one of
    them says "below"/"above" that batch instead of printing the fit range's cut."""
    if low >= largest:
        return f"entirely above {number(largest)}, the largest batch measured"
    if high <= smallest:
        return f"entirely below {number(smallest)}, the smallest batch measured"
    if low <= smallest and high >= largest:
        return f"spanning the whole measured range {number(smallest)}–{number(largest)}"
    if high >= largest:
        return f"{number(low)} to above {number(largest)}, the largest batch measured"
    if low <= smallest:
        return f"below {number(smallest)}, the smallest batch measured, to {number(high)}"
    return f"{number(low)}–{number(high)}"


# --------------------------------------------------------------------------- several targets

TREND_WORDS = {
    "grows": "B_crit grows as the target gets harder, as McCandlish et al. 2018 predict",
    "falls": "B_crit falls as the target gets harder, against McCandlish et al. 2018's"
             " prediction that it grows",
    "overlap": "no detectable change (intervals overlap)",
    "unknown": "cannot tell: the data give no interval or bound for one of them",
}


def target_trend_texts(summary: AnalysisSummary) -> list[tuple[str, str]]:
    """(metric, sentence) per metric with two or more targets: whether B_crit moves from the
    easiest to the hardest target, per LR rule; a change is claimed only where their
    intervals (a bound counts as a half-line) do not overlap."""
    by_metric: dict[str, list[str]] = {}
    for metric, rule, easiest, hardest in trend_pairs(summary.targets):
        verdict = TREND_WORDS[trend(easiest, hardest)]
        by_metric.setdefault(metric, []).append(
            f"{rule} rule: {verdict} — {_target_b_crit(easiest)} at {easiest.label},"
            f" {_target_b_crit(hardest)} at {hardest.label}"
        )
    return [(metric, _sentence("; ".join(parts))) for metric, parts in by_metric.items()]


def _target_b_crit(fit: TargetCriticalBatch) -> str:
    """B_crit of one target for prose: the number with its interval, or the bound."""
    text = f"B_crit {b_crit_text(fit.b_crit, fit.bound, fit.bound_batch)}"
    if not fit.bound and math.isfinite(fit.b_crit_low):
        text += f" ({target_interval_text(fit)})"
    return text


def gap_text(summary: AnalysisSummary) -> str:
    """The generalization gap in a sentence per LR rule, from the slopes at the budget."""
    gap = summary.gap
    if gap is None or not gap.measured or not gap.trends:
        return _sentence(gap.reason if gap is not None else "not measured")
    budget = (f"{gap.gap_epochs:g} epochs" if gap.gap_epochs is not None
              else "the same examples seen")
    parts = []
    for t in gap.trends:
        if t.verdict == "not measurable":
            parts.append(f"{t.rule} rule: not measurable ({t.reason})")
            continue
        change = (f"{t.metric} changes by {t.slope_per_doubling:+.3g} per doubling of the batch"
                  f" ({GAP_CONFIDENCE:.0%} interval {t.slope_low:+.3g} to"
                  f" {t.slope_high:+.3g}, {t.interval_source})")
        verdict = {"worse": "larger batches generalize worse: the gap is visible",
                   "better": "larger batches do better here: no gap",
                   "not visible": "not visible at this noise"}[t.verdict]
        parts.append(f"{t.rule} rule: {change}: {verdict}")
    return f"At equal data seen ({budget}): " + "; ".join(parts) + "."
