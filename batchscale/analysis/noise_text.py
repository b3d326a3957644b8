"""The gradient noise scale in words: its median over the trials with their spread, the trials
left out and why, and how it stands against the fitted B_crit (parallel.noise_scale measures
it)."""

from __future__ import annotations

import math

from batchscale.analysis.prose import number
from batchscale.analysis.summary import NoiseScaleSummary


def noise_scale_text(noise: NoiseScaleSummary, fits: dict) -> str:
    """The report's "Gradient noise scale" item: `b_simple_text`, then `against_b_crit` of
    each rule's fit in `fits`."""
    return b_simple_text(noise) + against_b_crit(noise, fits)


def against_b_crit(noise: NoiseScaleSummary, fits: dict) -> str:
    """" It lies below B_crit's 90% interval (sqrt: 70.1–90.5), 0.23× its fit: …" for each
    rule with a bounded interval, so the cheap predictor is not read beside the fit unjudged;
    "" where there is nothing to compare."""
    if not math.isfinite(noise.b_simple_median):
        return ""
    parts = []
    for rule, fit in fits.items():
        low, high = getattr(fit, "b_crit_low", math.nan), getattr(fit, "b_crit_high", math.nan)
        if getattr(fit, "bound", None) or not (math.isfinite(low) and math.isfinite(high)):
            continue
        where = ("inside" if low <= noise.b_simple_median <= high else
                 "below" if noise.b_simple_median < low else "above")
        parts.append((rule, where, f"{rule}: {number(low)}–{number(high)}",
                      noise.b_simple_median / fit.b_crit))
    if not parts:
        return ""
    inside = [text for _, where, text, _ in parts if where == "inside"]
    outside = [f"{where} {text}, {ratio:.2g}× the fit" for _, where, text, ratio in parts
               if where != "inside"]
    said = ([f"inside B_crit's 90% interval ({'; '.join(inside)}): the two agree"]
            if inside else [])
    if outside:
        where = "and outside it" if inside else "outside B_crit's 90% interval"
        said.append(f"{where} ({'; '.join(outside)}): as a "
                    "predictor it is off there by more than the fit's uncertainty, so go by the "
                    "fitted B_crit (McCandlish et al. 2018 give B_simple as a rough guide to it)")
    return f" It lies {'; '.join(said)}."


def b_simple_text(noise: NoiseScaleSummary) -> str:
    if not math.isfinite(noise.b_simple_median):
        return f"Not available: {noise.reason}."
    text = (
        "The gradient noise scale (McCandlish et al. 2018), a cheap predictor of B_crit, has"
        f" median {number(noise.b_simple_median)} over {noise.trials} trials"
    )
    if noise.trials > 1 and math.isfinite(noise.quartile_low):
        text += (f" (half of them between {number(noise.quartile_low)} and"
                 f" {number(noise.quartile_high)})")
    failed = [f"{noise.dropped} ended with an estimate ≤ 0" if noise.dropped else "",
              f"{noise.unrecorded} recorded none" if noise.unrecorded else ""]
    if any(failed):
        count = noise.dropped + noise.unrecorded
        text += (f"; {count} more trial{'s' if count > 1 else ''} left out: "
                 f"{' and '.join(f for f in failed if f)} (the gradient noise swamped |G|²"
                 f"{', or the trial ended before its first estimate' if noise.unrecorded else ''}"
                 ")")
    return text + "."
