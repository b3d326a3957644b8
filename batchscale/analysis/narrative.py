"""The analysis in words: the Markdown that KFP shows as the run's Markdown artifact and that the
HTML report renders (the narrative and the recommendation are written only here)."""

from __future__ import annotations

import math

from batchscale.analysis.critical import BOOTSTRAP_CONFIDENCE
from batchscale.analysis.quality import (
    headline,
    markdown_text,
    stable_sentence,
    what_to_do_text,
)
from batchscale.analysis.summary import (
    AnalysisSummary,
    CriticalBatchSummary,
    MeasurementQuality,
    MemorySummary,
    NoiseScaleSummary,
    Recommendation,
    StepTimeSummary,
    ThroughputSummary,
)
from batchscale.analysis.timetotarget import StepTimeSource

INPUT_BOTTLENECK_SHARE = 0.2
"""Real input losing more than this share of synthetic throughput: the input pipeline limits."""
NOT_AVAILABLE = "n/a"
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
    return narrative_markdown(summary) + recommendation_markdown(summary.recommendation)


def narrative_markdown(summary: AnalysisSummary, *, with_quality: bool = True) -> str:
    """The answer to "why doesn't my training get faster?", without the recommendation.

    `with_quality=False` leaves out the measurement-quality line (the HTML report shows it in
    its own box at the top instead)."""
    lines = [f"## {NARRATIVE_TITLE}", ""]
    if with_quality:
        text = markdown_text(quality_summary_text(summary.quality))
        lines.append(f"- **Measurement quality.** {text}")
    lines += [
        f"- **Throughput.** {_throughput_text(summary.throughput, summary.step_time)}",
        f"- **Memory.** {_memory_text(summary.memory)}",
    ]
    for rule, fit in summary.critical_batch.items():
        text = _critical_text(fit, summary.optimal_batch_cap)
        lines.append(f"- **Steps to target ({rule} LR rule).** {text}")
    if not summary.critical_batch:
        lines.append("- **Steps to target.** Not measured: no convergence trials.")
    lines.append(f"- **Gradient noise scale.** {_b_simple_text(summary.noise_scale)}")
    if summary.recommendation.batch_size is not None:
        lines.append(
            f"- **Fastest to target:** {_num(summary.min_time_to_target_s)} s of training"
            f" ({_sources_text(summary.step_time_sources)})."
        )
    return "\n".join(lines) + "\n"


def quality_summary_text(quality: MeasurementQuality) -> str:
    """The measurement quality in a few sentences (the report's box says it at length)."""
    if not quality.flagged:
        return stable_sentence(quality)
    text = headline(quality)
    if quality.excluded:
        listed = ", ".join(f"{r.input_mode} {r.batch_size}" for r in quality.excluded[:6])
        text += f" Left out: {listed}{' …' if len(quality.excluded) > 6 else ''}."
    return f"{text} {what_to_do_text()}"


def b_crit_text(b_crit: float, bound: str | None, bound_batch: float) -> str:
    """B_crit as every output states it: "≈ 64", "above 1,024: steps still fall like 1/B",
    "below 4: no batch size saved steps", or "not estimated"."""
    if bound in BOUND_WORDS and math.isfinite(bound_batch):
        return f"{bound} {_num(bound_batch)}: {BOUND_WORDS[bound]}"
    if math.isfinite(b_crit):
        return f"≈ {_num(b_crit)}"
    return "not estimated"


def _sources_text(sources: tuple[str, ...]) -> str:
    words = [SOURCE_WORDS.get(source, source) for source in sources]
    return "steps × " + (" and ".join(words) if words else "step time")


def recommendation_markdown(recommendation: Recommendation) -> str:
    """The recommendation block: its heading and `recommendation_list`."""
    return f"\n## {RECOMMENDATION_TITLE}\n\n{recommendation_list(recommendation)}\n"


def recommendation_list(recommendation: Recommendation) -> str:
    """The recommendation as a Markdown list, one item per choice with its reason (the HTML
    report shows this same list in its styled box)."""
    items = (
        ("Batch size", recommendation.batch_size, recommendation.batch_reason),
        ("LR rule", recommendation.lr_rule, recommendation.lr_rule_reason),
        ("Workers", recommendation.workers, recommendation.workers_reason),
    )
    return "\n".join(
        f"- **{label}: {NOT_AVAILABLE if value is None else value}** — {reason}."
        for label, value, reason in items
    )


# --------------------------------------------------------------------------- numbers in prose


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


# --------------------------------------------------------------------------- paragraphs


def _throughput_text(throughput: ThroughputSummary, step: StepTimeSummary) -> str:
    if throughput.timing_input_mode is None:
        return f"Not measured: {throughput.saturation_reason}."
    best, saturation = throughput.best_batch, throughput.saturation_batch
    text = (
        f"Samples/s peaks at {_num(throughput.best_samples_per_s)} at batch {best} "
        f"({throughput.timing_input_mode} input"
    )
    mfu = throughput.mfu_at_best
    text += f", {mfu:.1%} MFU)." if math.isfinite(mfu) else ")."
    if throughput.saturated_at_smallest_batch:
        text += (
            f" The device is already saturated at batch {saturation}, the smallest measured: a"
            " bigger batch does not raise samples/s, each step just takes longer."
        )
    else:
        text += (
            f" From batch {saturation} on, throughput is within "
            f"{throughput.saturation_tolerance:.0%} of the best: a bigger batch mostly makes"
            " each step longer."
        )
    if math.isfinite(step.alpha_s):
        text += (
            f" Step time t(B) ≈ {1e3 * step.alpha_s:.3g} ms + "
            f"{1e6 * step.beta_s:.3g} µs × B (R² {step.r2:.2f})."
        )
    share = throughput.input_pipeline_share
    if math.isfinite(share):
        text += f" Real input reaches {1 - share:.0%} of synthetic throughput at batch {best}"
        text += ": the input pipeline is a bottleneck." if share > INPUT_BOTTLENECK_SHARE else "."
    return text


def _memory_text(memory: MemorySummary) -> str:
    text = _sentence(memory.largest_fitting_reason)
    b_max = memory.largest_fitting_batch
    if math.isfinite(b_max):
        text += f" The largest batch that fits is {int(b_max)}."
    if math.isfinite(memory.fixed_bytes):
        text += (
            f" Peak memory ≈ {_bytes(memory.fixed_bytes)} + "
            f"{_bytes(memory.per_sample_bytes)} per sample."
        )
    return text


def _critical_text(fit: CriticalBatchSummary, cap: float) -> str:
    if fit.bound:
        return _bound_text(fit)
    if fit.reason or not math.isfinite(fit.b_crit):
        return f"B_crit not estimated: {fit.reason or 'no fit'}."
    text = (
        f"S_min ≈ {_num(fit.s_min)} steps and E_min ≈ {_num(fit.e_min)} examples, so"
        f" B_crit = E_min/S_min ≈ {_num(fit.b_crit)}"
    )
    if math.isnan(fit.b_crit_low):
        text += f" (no interval: {fit.interval_note})."
    else:
        text += f" ({BOOTSTRAP_CONFIDENCE:.0%} interval {_interval_text(fit)})."
    text += " Past B_crit each doubling of the batch saves less than a quarter of the steps."
    text += _regimes_text(fit)
    b_star = fit.optimal_batch
    if math.isfinite(b_star) and b_star >= cap:
        text += f" With t(B), time to target keeps falling up to batch {_num(cap)} (B* capped)."
    elif math.isfinite(b_star):
        text += f" With t(B), time to target is lowest near B* ≈ {_num(b_star)}."
    return text


def _bound_text(fit: CriticalBatchSummary) -> str:
    """A B_crit the data bound but do not pin down: the bound and what it means, no number."""
    text = f"B_crit {b_crit_text(fit.b_crit, fit.bound, fit.bound_batch)}"
    if fit.bound == "above":
        text += (
            " — doubling the batch still about halves the steps across the measured batches,"
            " so a bigger batch may still save steps (measure one to find B_crit)."
        )
    else:
        text += (
            " — the steps to target hardly change across the measured batches, so a bigger"
            " batch only spends more examples."
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
    low, high = fit.b_crit_low, fit.b_crit_high
    smallest, largest = fit.batch_range
    if low >= largest:
        return f"entirely above {_num(largest)}, the largest batch measured"
    if low <= smallest and high >= largest:
        return f"spanning the whole measured range {_num(smallest)}–{_num(largest)}"
    if high >= largest:
        return f"{_num(low)} to above {_num(largest)}, the largest batch measured"
    if low <= smallest:
        return f"below {_num(smallest)}, the smallest batch measured, to {_num(high)}"
    return f"{_num(low)}–{_num(high)}"


def _b_simple_text(noise: NoiseScaleSummary) -> str:
    if not math.isfinite(noise.b_simple_median):
        return f"Not available: {noise.reason}."
    return (
        "The gradient noise scale (McCandlish et al. 2018), a cheap predictor of B_crit, has"
        f" median {_num(noise.b_simple_median)} over {noise.trials} trials."
    )
