"""The study's answer in words: a sentence per axis from its fitted slope, and Golmant et al.'s
question ("does the critical batch depend more on the model and the data's complexity than on
the dataset's size?") answered from those slopes, with the numbers."""

from __future__ import annotations

import json
import math

import pandas as pd

from batchscale.config.study import axis_key
from batchscale.study.slopes import AxisPoint, usable

DATASET_SIZE_KEYS = ("dataset.train_fraction", "dataset.synthetic_train_rows", "dataset.max_rows")
MODEL_KEYS = ("workload", "sweep.image_size_px")
COMPLEXITY_KEYS = ("dataset.train_label_noise", "dataset.synthetic_noise", "dataset.name",
                   "dataset.shapes_image_size_px", "dataset.sequence_length_tokens")
"""What makes the data harder to learn; other dataset keys (the split, its seed) are "other"."""


def kind_of(axis: str) -> str:
    """What an axis varies, for Golmant's question: dataset size, model, or data complexity
    (any other dataset option); "other" for training settings."""
    key = axis_key(axis)
    if key in DATASET_SIZE_KEYS:
        return "dataset size"
    if key in MODEL_KEYS:
        return "model"
    if key in COMPLEXITY_KEYS:
        return "data complexity"
    return "other"


def _n(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else "?"


def _fitted(study: pd.DataFrame) -> pd.DataFrame:
    """The variants the slope fit used (a B_crit interval inside the measured batches)."""
    if study.empty:
        return study
    return study[[usable(point) for point in _points(study)]]


def _points(study: pd.DataFrame) -> list[AxisPoint]:
    notes = study.get("b_crit_interval_note", pd.Series([None] * len(study), index=study.index))
    return [AxisPoint({}, b, low, high, not isinstance(note, str))
            for b, low, high, note in zip(study["b_crit"], study["b_crit_low"],
                                          study["b_crit_high"], notes, strict=True)]


def _range(study: pd.DataFrame, axis: str, x_name: str) -> str:
    """The span the factor is over: the fitted variants' values of the axis ("" with none)."""
    study = _fitted(study)
    if x_name == "parameters":
        values = sorted(set(study["parameters"].dropna().astype(int)))
        return f"{values[0]:,} → {values[-1]:,} parameters" if values else ""
    found = {json.dumps(json.loads(v).get(axis)) for v in study["axis_values"]}
    values = sorted(found, key=lambda text: (type(json.loads(text)).__name__, text))
    return f"{axis} {json.loads(values[0])} → {json.loads(values[-1])}" if values else ""


def axis_sentence(row: dict, study: pd.DataFrame) -> str:
    span = _range(study, row["axis"], row["x_name"])
    if row["verdict"].startswith("not fitted"):
        over = f" ({span})" if span else ""  # no variant fitted: no span to name
        return f"**{row['axis']}**{over}: {row['verdict']}."
    power = "exponent" if row["x_scale"] == "log" else "slope of ln B_crit per unit"
    numbers = (f"B_crit ×{_n(row['range_factor'])} [{_n(row['range_factor_low'])}, "
               f"{_n(row['range_factor_high'])}] over {span} ({power} {_n(row['slope'])} "
               f"[{_n(row['slope_low'])}, {_n(row['slope_high'])}], {row['variants_fitted']} "
               "variants)")
    if row["verdict"] == "no detectable change":
        return f"**{row['axis']}**: no detectable change: {numbers}; the interval covers ×1."
    return f"**{row['axis']}**: B_crit {row['verdict']}: {numbers}."


def _effect(row: dict) -> tuple[float, float, float]:
    """|log factor| over the range, with its interval's ends (nearest and farthest from 0)."""
    ends = sorted(abs(math.log(row[k])) for k in ("range_factor_low", "range_factor_high"))
    if row["verdict"] == "no detectable change":
        ends[0] = 0.0
    return abs(math.log(row["range_factor"])), ends[0], ends[1]


def golmant_answer(rows: list[dict]) -> str:
    """Which kind of axis moved B_crit, and whether by more than dataset size did."""
    fitted = [r for r in rows if not r["verdict"].startswith("not fitted")
              and kind_of(r["axis"]) != "other"]
    size = [r for r in fitted if kind_of(r["axis"]) == "dataset size"]
    others = [r for r in fitted if kind_of(r["axis"]) in ("model", "data complexity")]
    if not size or not others:
        missing = "dataset size" if not size else "model or data complexity"
        return (f"Golmant et al.'s question cannot be answered from this study: no {missing} "
                "axis was fitted.")
    moved = [r for r in others if r["verdict"] != "no detectable change"]
    size_row = size[0]
    size_text = (f"dataset size ({size_row['axis']}: ×{_n(size_row['range_factor'])} "
                 f"[{_n(size_row['range_factor_low'])}, {_n(size_row['range_factor_high'])}])")
    if not moved and size_row["verdict"] == "no detectable change":
        return ("Not distinguishable here: neither " + size_text + " nor the model or data "
                "complexity moved B_crit beyond the intervals; more seeds or wider ranges are "
                "needed.")
    if not moved:
        return (f"No, here: {size_text} moved B_crit, and neither the model nor the data "
                "complexity did detectably.")
    moved.sort(key=lambda r: _effect(r)[0], reverse=True)
    strongest = moved[0]
    other_text = " and ".join(
        f"{kind_of(r['axis'])} ({r['axis']}: ×{_n(r['range_factor'])} "
        f"[{_n(r['range_factor_low'])}, {_n(r['range_factor_high'])}])" for r in moved)
    _, strong_low, _ = _effect(strongest)
    _, _, size_high = _effect(size_row)
    if size_row["verdict"] == "no detectable change":
        if strong_low > size_high:
            return (f"Yes, here: B_crit moved with {other_text}, by more than {size_text} "
                    "could have moved it unseen, over the ranges studied.")
        return (f"Not distinguishable here, leaning yes: B_crit moved detectably with "
                f"{other_text} and not with {size_text}; but the dataset-size interval still "
                f"allows a change as large as {strongest['axis']}'s, so which matters more is "
                "not settled at this precision (more seeds or wider ranges would settle it).")
    if strong_low > size_high:
        return (f"Yes, here: both moved B_crit, {other_text} by more than {size_text} "
                f"({strongest['axis']}'s interval and dataset size's do not overlap), over the "
                "ranges studied.")
    return (f"Not distinguishable here: both {other_text} and {size_text} moved B_crit, by "
            "amounts whose intervals overlap.")


def answer_markdown(study: pd.DataFrame, axes: pd.DataFrame) -> str:
    """The answer for the study's first target and LR rule (the others are in the tables)."""
    if axes.empty:
        return "No axis to compare."
    first = axes.iloc[0]
    mask = ((axes["target_metric"] == first["target_metric"])
            & (axes["target_value"] == first["target_value"])
            & (axes["lr_rule"] == first["lr_rule"]))
    rows = axes[mask].to_dict("records")
    same = ((study["target_metric"] == first["target_metric"])
            & (study["target_value"] == first["target_value"])
            & (study["lr_rule"] == first["lr_rule"]))
    variants = study[same]
    target = f"{first['target_metric']} {first['target_value']:g}, {first['lr_rule']} rule"
    lines = [f"## What moves the critical batch? ({target}, {len(variants)} variants)", ""]
    lines += [f"- {axis_sentence(r, variants)}" for r in rows]
    lines += ["", *fastest_lines(variants)]
    lines += ["", "**Golmant et al. (2018)**: does B_crit depend more on the model and the "
              "data's complexity than on the dataset's size? " + golmant_answer(rows), "",
              "Intervals are 90 %, from each variant's B_crit interval; they do not include "
              "the error of the additive model itself (an axis whose effect depends on "
              "another's value)."]
    return "\n".join(lines)


def fastest_lines(variants: pd.DataFrame) -> list[str]:
    """Which variant reaches the target soonest, each at the batch its own analysis recommends,
    with its seeds' range; told apart only where the ranges do not overlap, every variant has
    more than one seed and no variant's time is flagged untrusted."""
    if "answer_time_to_target_s" not in variants:
        return []
    timed = variants[pd.to_numeric(variants["answer_time_to_target_s"],
                                   errors="coerce").notna()].sort_values(
        "answer_time_to_target_s")
    if timed.empty:
        return ["**Fastest variant**: none recommended a batch for this target and rule."]
    lines = ["**Fastest variant** (each at the batch its own analysis recommends; seconds to "
             "the target on this run's devices, with the range over seeds):"]
    lines += [f"- {r['variant']}: batch {int(r['answer_batch_size'])}, "
              f"{_n(r['answer_time_to_target_s'])} s {_seeds_range(r)}{_flag_text(r)}"
              for r in timed.to_dict("records")]
    if len(timed) < 2:
        return [*lines, "Only one variant recommended a batch: nothing to compare it with."]
    best, *others = timed.to_dict("records")
    top = _ends(best)[1]
    close = [o["variant"] for o in others if not top < _ends(o)[0]]
    flagged = [r["variant"] for r in (best, *others) if _flag(r)]
    if flagged:
        return [*lines, f"**{best['variant']}** is fastest at its point, but the time of "
                        f"{', '.join(flagged)} is NOT TRUSTED (above): no variant is shown "
                        "faster on these timings."]
    if not close and not any(_one_seed(r) for r in (best, *others)):
        return [*lines, f"**{best['variant']}** reaches the target soonest: its seeds' range "
                        "lies below every other variant's."]
    why = ("a variant has one seed, so no range over seeds tells them apart"
           if any(_one_seed(r) for r in (best, *others)) else
           f"its seeds' range overlaps {', '.join(close)}'s: these seeds do not tell them "
           "apart (more seeds would)")
    return [*lines, f"**{best['variant']}** is fastest at its point, but {why}."]


def _one_seed(row: dict) -> bool:
    """Whether the variant's answer is over one seed (rows before layout 11 record no count:
    then a missing range says it)."""
    seeds = pd.to_numeric(pd.Series([row.get("answer_seeds")]), errors="coerce").iloc[0]
    if math.isfinite(seeds):
        return seeds < 2
    return not math.isfinite(row["answer_time_to_target_s_low"])


def _flag(row: dict) -> str:
    flag = row.get("answer_timing_flag")
    return flag if isinstance(flag, str) and flag else ""


def _flag_text(row: dict) -> str:
    return f" — NOT TRUSTED: {_flag(row)}" if _flag(row) else ""


def _seeds_range(row: dict) -> str:
    low, high = row["answer_time_to_target_s_low"], row["answer_time_to_target_s_high"]
    if not (math.isfinite(low) and math.isfinite(high)):
        return "(one seed: no range)"
    if _one_seed(row):
        return f"[{_n(low)}, {_n(high)}] (one seed: only the gap between its evaluations)"
    return f"[{_n(low)}, {_n(high)}]"


def _ends(row: dict) -> tuple[float, float]:
    low, high = row["answer_time_to_target_s_low"], row["answer_time_to_target_s_high"]
    value = row["answer_time_to_target_s"]
    return (low, high) if math.isfinite(low) and math.isfinite(high) else (value, value)
