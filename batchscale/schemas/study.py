"""The tables of a study: its comparison of its variants (their registry and `make_table` are
in `batchscale.schemas`)."""

from __future__ import annotations

import pyarrow as pa

from batchscale.schemas.fields import CRITICAL_BATCH_FIELDS

STUDY = pa.schema(
    [
        # A study's comparison (batchscale/study/): one row per (variant, target, LR rule),
        # the figures the variant's own analysis gives, recomputed from its published tables.
        # `run_id` is the study id; the variant's own run is `variant_run_id`.
        pa.field("variant_run_id", pa.string(), nullable=False),
        # The variant's axis values as JSON ({"dataset_fraction": 0.25, "model": "..."}).
        pa.field("axis_values", pa.string(), nullable=False),
        pa.field("target_metric", pa.string(), nullable=False),
        pa.field("target_value", pa.float64(), nullable=False),
        pa.field("lr_rule", pa.string(), nullable=False),
        # B_crit with its 90 % interval; NaN where the data support only a bound (b_crit_bound
        # "above"/"below" b_crit_bound_batch) or nothing (`b_crit_reason`).
        *CRITICAL_BATCH_FIELDS,
        # Where the interval is cut at the measured batch range or extrapolates past it (then it
        # is narrower than 90 % on that side; the slope fit leaves the variant out); null: inside.
        pa.field("b_crit_interval_note", pa.string()),
        pa.field("s_min", pa.float64()),
        pa.field("e_min", pa.float64()),
        # Their standard errors from the fit (NaN where not fitted; layout 10 on).
        pa.field("s_min_se", pa.float64()),
        pa.field("e_min_se", pa.float64()),
        # The gradient noise scale at the end of the variant's trials (median over trials).
        pa.field("b_simple", pa.float64()),
        pa.field("saturation_batch", pa.int64()),
        # B* = sqrt(α·B_crit/β) with B_crit's interval through the same square root.
        pa.field("b_star", pa.float64()),
        pa.field("b_star_low", pa.float64()),
        pa.field("b_star_high", pa.float64()),
        # The largest batch B* may take (the analysis's optimal_batch_cap: the largest that
        # fits, or past the measured batches): an end at it is a bound, "≥ cap, capped". NaN:
        # no cap known; null in rows written before layout 11.
        pa.field("b_star_cap", pa.float64()),
        # The model's parameter count (the model-size axis's x when the axis names workloads).
        pa.field("parameters", pa.int64()),
        # The variant's own answer where it was made for this row's target and LR rule: the
        # recommended batch and its time to target (steps × step time) with its seeds' range;
        # null on the other rows and where the variant recommended no batch (layout 10 on).
        pa.field("answer_batch_size", pa.int64()),
        pa.field("answer_time_to_target_s", pa.float64()),
        pa.field("answer_time_to_target_s_low", pa.float64()),
        pa.field("answer_time_to_target_s_high", pa.float64()),
        # How many seeds reached the target at the recommended cell (one: its range is only
        # the gap between evaluations), and why its time cannot be trusted (the analysis row's
        # timing_flag; null where nothing flags it). Layout 11 on.
        pa.field("answer_seeds", pa.int64()),
        pa.field("answer_timing_flag", pa.string()),
    ]
)

STUDY_AXES = pa.schema(
    [
        # One row per (axis, target, LR rule): does B_crit move with this axis? The slope of
        # log B_crit on log x (x_scale "log"; "linear" when an axis value is not positive), its
        # 90 % interval from the variants' B_crit intervals, and the factor B_crit changes by
        # over the axis's studied range. NaN slope: `verdict` says why it was not fitted.
        pa.field("axis", pa.string(), nullable=False),
        pa.field("x_name", pa.string(), nullable=False),
        pa.field("x_scale", pa.string(), nullable=False),
        pa.field("target_metric", pa.string(), nullable=False),
        pa.field("target_value", pa.float64(), nullable=False),
        pa.field("lr_rule", pa.string(), nullable=False),
        pa.field("variants_fitted", pa.int64(), nullable=False),
        pa.field("slope", pa.float64()),
        pa.field("slope_low", pa.float64()),
        pa.field("slope_high", pa.float64()),
        pa.field("range_factor", pa.float64()),
        pa.field("range_factor_low", pa.float64()),
        pa.field("range_factor_high", pa.float64()),
        # "grows", "shrinks", "no detectable change" or "not fitted: <why>".
        pa.field("verdict", pa.string(), nullable=False),
    ]
)
