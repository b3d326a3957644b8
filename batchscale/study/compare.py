"""A study's comparison: each variant's figures from its own published tables, through the same
analysis a single run gets (`analysis.analyze`), then the axes' slopes and the answer."""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Sequence

import pandas as pd

from batchscale.analysis.analyze import analyze, without_pruned
from batchscale.analysis.critical import interval_note
from batchscale.analysis.stage import primary_target, settings_for
from batchscale.analysis.targets import same_target, split_by_target
from batchscale.analysis.timetotarget import closed_interval
from batchscale.config.study import axis_key
from batchscale.config.variants import Variant
from batchscale.planner.inputs import BYTES_PER_GRADIENT_VALUE, gradient_bytes
from batchscale.study.slopes import AxisPoint, AxisSlope, fit_slopes

MODEL_AXIS_KEY = "workload"
"""A model axis names workloads; its x is the model's parameter count."""


def _finite(value) -> float:
    return float(value) if value is not None and math.isfinite(value) else math.nan


@functools.cache
def parameters(workload: str, image_size: int) -> int:
    """Trainable parameters of a workload's model (10 classes, as the embedded data have);
    built once per workload, not once per variant."""
    return int(gradient_bytes(workload, None, image_size) // BYTES_PER_GRADIENT_VALUE)


def variant_rows(variant: Variant, run_id: str, frames: dict[str, pd.DataFrame]) -> list[dict]:
    """The study table's rows of one variant: per target and LR rule, B_crit with its interval
    (or its bound), S_min, E_min, B_simple, the saturation batch and B*."""
    cfg = variant.config
    adaptive = cfg.convergence.strategy == "adaptive"
    result = analyze(frames.get("sweep"), frames.get("runs"), frames.get("curves"),
                     settings_for(cfg.analysis, adaptive), primary_target=primary_target(cfg),
                     gap_epochs=cfg.convergence.gap_epochs,
                     warmup_steps=cfg.convergence.warmup_steps)
    summary = result.summary
    common = {
        "variant": variant.name, "variant_run_id": run_id, "workload": cfg.workload,
        "axis_values": json.dumps(variant.values, sort_keys=True),
        "b_simple": _finite(summary.noise_scale.b_simple_median),
        "saturation_batch": summary.throughput.saturation_batch,
        "parameters": parameters(cfg.workload, cfg.sweep.image_size_px),
    }
    groups = split_by_target(without_pruned(frames["runs"])) if "runs" in frames else {}
    answer = next((r for r in result.rows if r.get("answer")), None)
    rows = []
    for fit in summary.targets:
        b_star = [_finite(fit.optimal_batch), *closed_interval(fit.optimal_batch_interval)]
        rows.append({
            **common, "target_metric": fit.metric, "target_value": fit.value,
            "lr_rule": fit.rule, "b_crit": _finite(fit.b_crit),
            "b_crit_low": _finite(fit.b_crit_low), "b_crit_high": _finite(fit.b_crit_high),
            "b_crit_bound": fit.bound or None, "b_crit_bound_batch": _finite(fit.bound_batch),
            "b_crit_reason": fit.reason or None,
            "b_crit_interval_note": _interval_note(groups, fit, cfg.analysis.b_crit_range_factor),
            "s_min": _finite(fit.s_min), "s_min_se": _finite(fit.s_min_se),
            "e_min": _finite(fit.e_min), "e_min_se": _finite(fit.e_min_se),
            "b_star": b_star[0], "b_star_low": b_star[1], "b_star_high": b_star[2],
            "b_star_cap": _finite(summary.optimal_batch_cap),
            **_answer_columns(answer, fit.metric, fit.value, fit.rule),
        })
    return rows


def _answer_columns(answer: dict | None, metric: str, value: float, rule: str) -> dict:
    """The variant's recommended batch and its time to target with the seeds' range, how many
    seeds it is over and why its time cannot be trusted, on the row of the target and rule the
    answer was made for; null elsewhere."""
    mine = (answer is not None and answer["lr_rule"] == rule
            and answer.get("target_metric") in (None, metric)
            and (answer.get("target_value") is None
                 or math.isclose(answer["target_value"], value)))
    if not mine:
        return {"answer_batch_size": None, "answer_time_to_target_s": math.nan,
                "answer_time_to_target_s_low": math.nan,
                "answer_time_to_target_s_high": math.nan, "answer_seeds": None,
                "answer_timing_flag": None}
    seeds = answer.get("reached_at_lr")
    return {"answer_batch_size": int(answer["batch_size"]),
            "answer_time_to_target_s": _finite(answer["time_to_target_s"]),
            "answer_time_to_target_s_low": _finite(answer.get("time_to_target_s_low")),
            "answer_time_to_target_s_high": _finite(answer.get("time_to_target_s_high")),
            "answer_seeds": int(seeds) if seeds is not None and seeds > 0 else None,
            "answer_timing_flag": answer.get("timing_flag") or None}


def _interval_note(groups, fit, range_factor: float) -> str | None:
    """Where a B_crit interval leaves the measured batches (cut or extrapolated); None inside
    them, or without an interval."""
    if not (math.isfinite(fit.b_crit_low) and math.isfinite(fit.b_crit_high)):
        return None
    runs = next((r for t, r in groups.items() if same_target(t, (fit.metric, fit.value))), None)
    if runs is None:
        return None
    note = interval_note(runs, fit.rule, (fit.b_crit_low, fit.b_crit_high),
                         range_factor=range_factor)
    return note or None


def axis_x(axis: str, row: dict) -> float | None:
    """The number an axis is fitted against in a variant's row: its value, or for a model
    axis the parameter count; None for a value that is no number (compared by name only)."""
    if axis_key(axis) == MODEL_AXIS_KEY:
        return float(row["parameters"])
    value = json.loads(row["axis_values"])[axis]
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def x_name(axis: str) -> str:
    return "parameters" if axis_key(axis) == MODEL_AXIS_KEY else axis


def axis_rows(study: pd.DataFrame, axes: Sequence[str]) -> list[dict]:
    """The study_axes table: per (target, LR rule) one fit over every numeric axis."""
    rows = []
    for (metric, value, rule), group in study.groupby(
            ["target_metric", "target_value", "lr_rule"], sort=False):
        records = group.to_dict("records")
        numeric = [a for a in axes if all(axis_x(a, r) is not None for r in records)]
        points = [AxisPoint({a: axis_x(a, r) for a in numeric}, r["b_crit"], r["b_crit_low"],
                            r["b_crit_high"], not _note(r)) for r in records]
        slopes = {s.axis: s for s in fit_slopes(points, numeric)}
        for axis in axes:
            slope = slopes.get(axis) or _categorical(axis, len(records))
            rows.append({"axis": axis, "x_name": x_name(axis), "target_metric": metric,
                         "target_value": value, "lr_rule": rule, **_slope_columns(slope)})
    return rows


def _note(row: dict) -> str:
    note = row.get("b_crit_interval_note")
    return note if isinstance(note, str) else ""


def _categorical(axis: str, count: int) -> AxisSlope:
    nan = math.nan
    return AxisSlope(axis, "categorical", count, nan, nan, nan, nan, nan, nan,
                     "not fitted: its values are not numbers (compare the variants' rows)")


def _slope_columns(slope: AxisSlope) -> dict:
    return {"x_scale": slope.x_scale, "variants_fitted": slope.variants_fitted,
            "slope": slope.slope, "slope_low": slope.slope_low, "slope_high": slope.slope_high,
            "range_factor": slope.range_factor, "range_factor_low": slope.range_factor_low,
            "range_factor_high": slope.range_factor_high, "verdict": slope.verdict}
