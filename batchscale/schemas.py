"""One pyarrow schema per table. Every result row also carries the run's environment columns.

Units are in the column names. `make_table` is the only way tables are built, so a missing or
mistyped column fails where it is produced, not three stages later.
"""

from __future__ import annotations

from enum import StrEnum

import pyarrow as pa

from batchscale.errors import BadInput


class TrialStatus(StrEnum):
    """`status` of a sweep row: did the batch fit and run?"""

    OK = "ok"
    OOM = "oom"
    ERROR = "error"


class Quality(StrEnum):
    """`quality` of a timed sweep row: can its figures be trusted?"""

    OK = "ok"
    UNSTABLE = "unstable"


class RunStatus(StrEnum):
    """`status` of a convergence trial (runs table)."""

    REACHED = "reached"
    NOT_REACHED = "not_reached"
    DIVERGED = "diverged"
    PRUNED = "pruned"
    """Stopped by the adaptive study: hopelessly behind what its fit implies (excluded from
    the fit; convergence.adaptive_prune_factor)."""
    FAILED = "failed"
    """A user's training loop raised, never reported, or reported what is not a metric
    (batchscale/loop.py); its message is in the converge log. Excluded from the fit."""


ENV_FIELDS = [
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("config_hash", pa.string(), nullable=False),
    pa.field("experiment", pa.string(), nullable=False),
    pa.field("workload", pa.string(), nullable=False),
    pa.field("git_commit", pa.string(), nullable=False),
    pa.field("batchscale_version", pa.string(), nullable=False),
    pa.field("torch_version", pa.string(), nullable=False),
    pa.field("python_version", pa.string(), nullable=False),
    pa.field("device_name", pa.string(), nullable=False),
    pa.field("threads", pa.int32(), nullable=False),
    pa.field("world_size", pa.int32(), nullable=False),
    # Software under torch (null on a CPU, and in rows written before version 4): the CUDA
    # runtime torch was built with, the NVIDIA driver, and the image reference the pipeline task
    # ran (images.IMAGE_REF_ENV; null outside a pipeline).
    pa.field("cuda_version", pa.string()),
    pa.field("gpu_driver", pa.string()),
    pa.field("image", pa.string()),
    # The table layout the row was written with (SCHEMA_VERSION); null in rows written before
    # the column existed (version 1). Readers take older partitions under today's schema, the
    # columns added since reading as null (docs/architecture.md, "Schema versions").
    pa.field("schema_version", pa.int32()),
    # A study's variant (config `variant`) and the study (its run id less the variant's name);
    # null for a single run, and in rows written before version 3.
    pa.field("study_id", pa.string()),
    pa.field("variant", pa.string()),
]
SCHEMA_VERSION = 4
"""2: several targets per trial (runs: a row per trial and target, target_metric and
target_value), every evaluated metric in curves, curves' train_loss on a fixed training subset
(the running batch mean moved to train_batch_loss). 3: `study_id` and `variant` in every result
row. 4: `cuda_version`, `gpu_driver` and `image` (the regression check's software fields)."""

DATASET = pa.schema(
    [
        pa.field("features", pa.list_(pa.float32()), nullable=False),
        pa.field("label", pa.int64(), nullable=False),
    ]
)

MANIFEST = pa.schema(
    [
        pa.field("dataset", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("shard", pa.string(), nullable=False),
        pa.field("rows", pa.int64(), nullable=False),
        pa.field("sha256", pa.string(), nullable=False),
        pa.field("feature_shape", pa.list_(pa.int64()), nullable=False),
        pa.field("feature_dtype", pa.string(), nullable=False),
        pa.field("num_classes", pa.int64(), nullable=False),
        pa.field("class_histogram", pa.list_(pa.int64()), nullable=False),
        pa.field("split_seed", pa.int64(), nullable=False),
    ]
)

SWEEP = pa.schema(
    [
        pa.field("input_mode", pa.string(), nullable=False),
        pa.field("batch_size", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("precision", pa.string(), nullable=False),
        pa.field("timed_steps", pa.int64(), nullable=False),
        pa.field("step_time_median_s", pa.float64()),
        pa.field("step_time_p10_s", pa.float64()),
        pa.field("step_time_p90_s", pa.float64()),
        pa.field("step_time_cv", pa.float64()),
        pa.field("samples_per_s", pa.float64()),
        # The range a rerun of the row would report, at 90 % (sweep/rounds.py, rerun_interval);
        # null when fewer than two trials or half-trials of two steps were timed.
        pa.field("samples_per_s_low", pa.float64()),
        pa.field("samples_per_s_high", pa.float64()),
        # Language models: samples (sequences) per second x tokens per sequence; else null.
        pa.field("tokens_per_s", pa.float64()),
        pa.field("peak_memory_bytes", pa.int64()),
        pa.field("train_flops_per_sample", pa.float64()),
        pa.field("achieved_flops_per_s", pa.float64()),
        pa.field("peak_flops_per_s", pa.float64()),
        pa.field("mfu", pa.float64()),
        pa.field("error", pa.string()),
        pa.field("memory_source", pa.string()),
        pa.field("memory_cap_bytes", pa.int64()),
        pa.field("channels_last", pa.bool_()),
        pa.field("compiled", pa.bool_()),
        pa.field("image_size_px", pa.int64()),
        pa.field("search_phase", pa.string()),
        # Measurement quality (docs/architecture.md, "Measurement rules"): rounds visit the
        # batch sizes in a different order each time; a row whose rounds disagree or whose
        # steps scatter is re-measured, then kept with quality "unstable" and the reason.
        pa.field("rounds", pa.int64()),
        pa.field("round_spread", pa.float64()),
        pa.field("retries", pa.int64()),
        pa.field("quality", pa.string()),
        pa.field("quality_reason", pa.string()),
        # The conditions the trial ran under.
        pa.field("load_avg_1m", pa.float64()),
        pa.field("usable_cpus", pa.int64()),
        pa.field("process_cpu_per_wall", pa.float64()),
        pa.field("cpu_wait_share", pa.float64()),
        pa.field("threads_oversubscribed", pa.bool_()),
        pa.field("gpu_other_processes", pa.int64()),
        pa.field("gpu_sm_clock_mhz", pa.float64()),
        pa.field("gpu_temperature_c", pa.float64()),
    ]
)

CURVES = pa.schema(
    [
        pa.field("trial_id", pa.string(), nullable=False),
        pa.field("batch_size", pa.int64(), nullable=False),
        pa.field("lr_rule", pa.string(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("step", pa.int64(), nullable=False),
        pa.field("examples_seen", pa.int64(), nullable=False),
        pa.field("train_time_s", pa.float64(), nullable=False),
        # Schema version 2: the mean loss on a fixed training subset (train_eval_rows); in
        # version 1 rows, the running mean of the batches since the last evaluation.
        pa.field("train_loss", pa.float64()),
        pa.field("val_accuracy", pa.float64()),
        pa.field("lr", pa.float64(), nullable=False),
        pa.field("b_simple", pa.float64()),
        # The trial's optimizer (sgd, adamw) and compute precision (fp32, bf16); null in rows
        # written before they were recorded (then sgd and fp32) or in a user's table.
        pa.field("optimizer", pa.string()),
        pa.field("precision", pa.string()),
        # Every metric the workload evaluates (batchscale/metrics.py; null where it does not),
        # the running mean of the training batches since the last evaluation, and whether this
        # evaluation is the generalization-gap budget's (convergence.gap_epochs).
        pa.field("val_loss", pa.float64()),
        pa.field("val_perplexity", pa.float64()),
        pa.field("val_miou", pa.float64()),
        pa.field("val_pixel_accuracy", pa.float64()),
        pa.field("val_map50", pa.float64()),
        pa.field("train_batch_loss", pa.float64()),
        pa.field("at_gap_budget", pa.bool_()),
    ]
)

RUNS = pa.schema(
    [
        pa.field("trial_id", pa.string(), nullable=False),
        pa.field("batch_size", pa.int64(), nullable=False),
        pa.field("lr_rule", pa.string(), nullable=False),
        pa.field("lr", pa.float64(), nullable=False),
        pa.field("seed", pa.int64(), nullable=False),
        pa.field("workers", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("steps_run", pa.int64(), nullable=False),
        pa.field("steps_to_target", pa.int64()),
        pa.field("examples_to_target", pa.int64()),
        pa.field("time_to_target_s", pa.float64()),
        pa.field("final_val_accuracy", pa.float64()),
        # The one val_accuracy target of version 1 rows; in version 2 rows, target_value where
        # target_metric is val_accuracy, else null.
        pa.field("target_val_accuracy", pa.float64()),
        pa.field("b_simple", pa.float64()),
        pa.field("train_time_s", pa.float64(), nullable=False),
        # Share of the trial threads' runnable time spent waiting for a CPU (a busy machine;
        # docs/architecture.md, "Measurement rules"); null where the kernel does not say.
        pa.field("cpu_wait_share", pa.float64()),
        # As in `curves`: the trial's optimizer and precision; null where not recorded.
        pa.field("optimizer", pa.string()),
        pa.field("precision", pa.string()),
        # The row's target (a trial has a row per target; the steps, examples, time and status
        # are this target's) and the trial's last value of its metric. Null in version 1 rows:
        # their target is val_accuracy >= target_val_accuracy.
        pa.field("target_metric", pa.string()),
        pa.field("target_value", pa.float64()),
        pa.field("final_metric_value", pa.float64()),
        # The trial's environment for the planner (convergence/trialenv.py): the bytes one
        # gradient all-reduce carries, and, with 2+ workers, the group's bare all-reduce timed
        # at a small message and at the gradient's size (median of repeats, their CV) over
        # its backend. Null with one worker and in rows written before the probe.
        pa.field("gradient_bytes", pa.int64()),
        pa.field("allreduce_backend", pa.string()),
        pa.field("allreduce_small_bytes", pa.int64()),
        pa.field("allreduce_small_s", pa.float64()),
        pa.field("allreduce_gradient_s", pa.float64()),
        pa.field("allreduce_cv", pa.float64()),
    ]
)

ANALYSIS = pa.schema(
    [
        pa.field("lr_rule", pa.string(), nullable=False),
        pa.field("batch_size", pa.int64(), nullable=False),
        pa.field("steps_to_target", pa.float64()),
        pa.field("examples_to_target", pa.float64()),
        pa.field("step_time_s", pa.float64()),
        pa.field("time_to_target_s", pa.float64()),
        pa.field("samples_per_s", pa.float64()),
        pa.field("regime", pa.string()),
        pa.field("s_min", pa.float64()),
        pa.field("e_min", pa.float64()),
        pa.field("b_crit", pa.float64()),
        pa.field("b_crit_low", pa.float64()),
        pa.field("b_crit_high", pa.float64()),
        pa.field("b_simple", pa.float64()),
        pa.field("saturation_batch", pa.int64()),
        # When the data support no B_crit: "above" or "below" `b_crit_bound_batch`.
        pa.field("b_crit_bound", pa.string()),
        pa.field("b_crit_bound_batch", pa.float64()),
        # Regime from the fitted curve's local slope; the measured slope beside it.
        pa.field("fit_slope", pa.float64()),
        pa.field("measured_slope", pa.float64()),
        # Where step_time_s came from, the sweep's figure, and why they disagree (if they do).
        pa.field("step_time_source", pa.string()),
        pa.field("sweep_step_time_s", pa.float64()),
        pa.field("timing_flag", pa.string()),
        # The target these rows are for (the recommendation's: the primary target, or the
        # hardest reached at enough batch sizes); null in version 1 rows (val_accuracy).
        pa.field("target_metric", pa.string()),
        pa.field("target_value", pa.float64()),
    ]
)

REGRESSIONS = pa.schema(
    [
        pa.field("run_id", pa.string(), nullable=False),
        pa.field("workload", pa.string(), nullable=False),
        pa.field("device_name", pa.string(), nullable=False),
        pa.field("precision", pa.string(), nullable=False),
        pa.field("input_mode", pa.string(), nullable=False),
        pa.field("batch_size", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("samples_per_s", pa.float64()),
        pa.field("history_runs", pa.int64(), nullable=False),
        pa.field("history_median", pa.float64()),
        pa.field("history_mad", pa.float64()),
        pa.field("allowed_drop", pa.float64()),
        pa.field("change", pa.float64()),
        pa.field("verdict", pa.string(), nullable=False),
        # Why a cell got its verdict where the figures do not say it (not_judged: the row's
        # quality reason or "measurement disturbed: ..."; environment_changed: the fingerprint
        # fields that differ; insufficient_history), and the speed fingerprint it was judged
        # under ("field=value; ..."; batchscale/lake/comparable.py). Null in older tables.
        pa.field("reason", pa.string()),
        pa.field("fingerprint", pa.string()),
        # The change-point test (batchscale/lake/changepoints.py): how many latest runs, this
        # one included, lie below the baseline (null where not judged); for a confirmed
        # regression, its last good and first bad run with their commits, and the sentence
        # naming them with their samples/s and what changed. Null in older tables.
        pa.field("runs_below", pa.int64()),
        pa.field("last_good_run_id", pa.string()),
        pa.field("last_good_commit", pa.string()),
        pa.field("first_bad_run_id", pa.string()),
        pa.field("first_bad_commit", pa.string()),
        pa.field("attribution", pa.string()),
    ]
)
"""One row per cell of this run's sweep; `verdict` is confirmed, suspected, ok,
insufficient_history, not_judged or environment_changed ("regression" in tables published before
change points); `change` is current / median − 1 (for environment_changed, against the previous
environment's baseline), `allowed_drop` the noise threshold in samples/s."""

PLAN = pa.schema(
    [
        # What-if plan (batchscale/analysis/plan_table.py): one row per (workers,
        # per-worker batch). Open band ends (B_crit's interval unbounded above) are null.
        pa.field("target_metric", pa.string()),
        pa.field("target_value", pa.float64()),
        pa.field("lr_rule", pa.string(), nullable=False),
        pa.field("workers", pa.int64(), nullable=False),
        pa.field("per_worker_batch", pa.int64(), nullable=False),
        pa.field("global_batch", pa.int64(), nullable=False),
        # Micro-batches of ceil(b/k) per optimizer step where b exceeds the memory limit
        # (gradient accumulation: k passes, one all-reduce); 1 where b fits as one batch.
        pa.field("accumulation_steps", pa.int64(), nullable=False),
        # A worker count the run did not measure: communication from the model alone.
        pa.field("extrapolated", pa.bool_(), nullable=False),
        pa.field("compute_s", pa.float64(), nullable=False),
        pa.field("compute_source", pa.string(), nullable=False),
        pa.field("comm_s", pa.float64(), nullable=False),
        pa.field("step_time_s", pa.float64(), nullable=False),
        pa.field("comm_share", pa.float64(), nullable=False),
        pa.field("steps", pa.float64(), nullable=False),
        pa.field("steps_low", pa.float64()),
        pa.field("steps_high", pa.float64()),
        pa.field("time_to_target_s", pa.float64(), nullable=False),
        pa.field("time_to_target_s_low", pa.float64()),
        pa.field("time_to_target_s_high", pa.float64()),
        pa.field("device_hours", pa.float64(), nullable=False),
        pa.field("device_hours_low", pa.float64()),
        pa.field("device_hours_high", pa.float64()),
        pa.field("b_crit", pa.float64(), nullable=False),
        pa.field("b_crit_low", pa.float64()),
        pa.field("b_crit_high", pa.float64()),
        pa.field("feasible", pa.bool_(), nullable=False),
        # Why adding workers stops helping here: memory, past B_crit, communication; or null.
        pa.field("limit", pa.string()),
        pa.field("on_pareto_front", pa.bool_(), nullable=False),
        pa.field("recommended", pa.bool_(), nullable=False),
        pa.field("step_time_source", pa.string(), nullable=False),
        pa.field("gradient_bytes", pa.int64(), nullable=False),
        pa.field("bandwidth_Bps", pa.float64(), nullable=False),
        pa.field("latency_s", pa.float64(), nullable=False),
        pa.field("hidden_share", pa.float64(), nullable=False),
        # "measured" or "assumed" (a link the user stated, or what the data cannot separate).
        pa.field("bandwidth_source", pa.string(), nullable=False),
        pa.field("latency_source", pa.string(), nullable=False),
        pa.field("hidden_share_source", pa.string(), nullable=False),
        pa.field("comm_note", pa.string()),
        pa.field("band_note", pa.string()),
        pa.field("memory_note", pa.string()),
        pa.field("max_per_worker_batch", pa.int64()),
    ]
)

DECISIONS = pa.schema(
    [
        # The adaptive study's decisions (batchscale/study/driver.py): one row per decision, in
        # order. A row that ran a cell names it (batch_size, seed); the interval is the one
        # after that cell (null while the fit gives none), the spend is cumulative.
        pa.field("decision", pa.int64(), nullable=False),
        pa.field("action", pa.string(), nullable=False),  # probe, predict, place, refine, stop
        pa.field("batch_size", pa.int64()),
        pa.field("seed", pa.int64()),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("lr_rule", pa.string(), nullable=False),
        pa.field("target_metric", pa.string(), nullable=False),
        pa.field("target_value", pa.float64(), nullable=False),
        # B_crit predicted from the gradient noise scale, with the spread of B_simple near the
        # target; method: near target, extrapolated, or none.
        pa.field("predicted_b_crit", pa.float64()),
        pa.field("predicted_low", pa.float64()),
        pa.field("predicted_high", pa.float64()),
        pa.field("prediction_method", pa.string(), nullable=False),
        pa.field("b_crit", pa.float64()),
        pa.field("b_crit_low", pa.float64()),
        pa.field("b_crit_high", pa.float64()),
        pa.field("interval_ratio", pa.float64()),
        # B* = sqrt(B_crit·α/β) and its interval (B_crit's mapped), where the trials' own step
        # times give the line t = α + βB; the adaptive_objective b_star narrows it.
        pa.field("b_star", pa.float64()),
        pa.field("b_star_low", pa.float64()),
        pa.field("b_star_high", pa.float64()),
        # What the simulated results of this cell made the study expect the ratio to become.
        pa.field("expected_ratio", pa.float64()),
        pa.field("examples_spent", pa.int64(), nullable=False),
        pa.field("device_s_spent", pa.float64(), nullable=False),
        pa.field("workers", pa.int64(), nullable=False),
    ]
)

STUDY = pa.schema(
    [
        # A study's comparison (batchscale/variants/): one row per (variant, target, LR rule),
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
        pa.field("b_crit", pa.float64()),
        pa.field("b_crit_low", pa.float64()),
        pa.field("b_crit_high", pa.float64()),
        pa.field("b_crit_bound", pa.string()),
        pa.field("b_crit_bound_batch", pa.float64()),
        pa.field("b_crit_reason", pa.string()),
        # Where the interval is cut at the measured batch range or extrapolates past it (then it
        # is narrower than 90 % on that side; the slope fit leaves the variant out); null: inside.
        pa.field("b_crit_interval_note", pa.string()),
        pa.field("s_min", pa.float64()),
        pa.field("e_min", pa.float64()),
        # The gradient noise scale at the end of the variant's trials (median over trials).
        pa.field("b_simple", pa.float64()),
        pa.field("saturation_batch", pa.int64()),
        # B* = sqrt(α·B_crit/β) with B_crit's interval through the same square root.
        pa.field("b_star", pa.float64()),
        pa.field("b_star_low", pa.float64()),
        pa.field("b_star_high", pa.float64()),
        # The model's parameter count (the model-size axis's x when the axis names workloads).
        pa.field("parameters", pa.int64()),
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

CRITICAL_OVER_TRAINING = pa.schema(
    [
        # The critical batch over training (batchscale/batch_schedule/): one row per checkpoint
        # of the reference run (batch base_batch_size), from branches trained at several batch
        # sizes to the checkpoint's milestone (the validation loss the reference reached
        # milestone_steps later). B_crit with its 90 % interval; NaN where the branches support
        # only a bound (b_crit_bound) or nothing (b_crit_reason).
        pa.field("checkpoint_step", pa.int64(), nullable=False),
        pa.field("examples", pa.int64(), nullable=False),
        pa.field("val_loss", pa.float64(), nullable=False),
        pa.field("milestone_loss", pa.float64(), nullable=False),
        pa.field("base_batch_size", pa.int64(), nullable=False),
        pa.field("lr_rule", pa.string(), nullable=False),
        pa.field("batches_reached", pa.int64(), nullable=False),
        pa.field("b_crit", pa.float64()),
        pa.field("b_crit_low", pa.float64()),
        pa.field("b_crit_high", pa.float64()),
        pa.field("b_crit_bound", pa.string()),
        pa.field("b_crit_bound_batch", pa.float64()),
        pa.field("b_crit_reason", pa.string()),
        pa.field("s_min", pa.float64()),
        pa.field("e_min", pa.float64()),
        # The reference run's gradient noise scale at the checkpoint (its EMA); NaN: none yet.
        pa.field("b_simple", pa.float64()),
        # The schedule's batch from this checkpoint on, and what its branches cost (seconds of
        # the device, training and evaluation).
        pa.field("scheduled_batch_size", pa.int64(), nullable=False),
        pa.field("branch_device_s", pa.float64(), nullable=False),
    ]
)

SCHEDULE_CHECK = pa.schema(
    [
        # The batch-size schedule's check (batchscale/batch_schedule/): one row per (schedule,
        # seed), the scheduled run and the constant-base_batch_size run trained to the same
        # target. Steps, examples and training seconds to the target are interpolated between
        # the evaluations around the first that reached it (NaN: not reached).
        pa.field("schedule", pa.string(), nullable=False),  # scheduled, constant
        pa.field("seed", pa.int64(), nullable=False),
        # The constant run that is the reference run itself (the first check seed's): its row
        # is there even when no check ran.
        pa.field("reference", pa.bool_(), nullable=False),
        pa.field("base_batch_size", pa.int64(), nullable=False),
        pa.field("lr_rule", pa.string(), nullable=False),
        pa.field("target_metric", pa.string(), nullable=False),
        pa.field("target_value", pa.float64(), nullable=False),
        pa.field("reached", pa.bool_(), nullable=False),
        pa.field("diverged", pa.bool_(), nullable=False),
        pa.field("steps_to_target", pa.float64()),
        pa.field("examples_to_target", pa.float64()),
        pa.field("train_time_s_to_target", pa.float64()),
        # The batch sizes the run trained at, in order ("8>16>32").
        pa.field("batch_sizes", pa.string(), nullable=False),
        # The schedule itself, as "from_loss:batch" stages ("2.79:16,2.52:32"); empty: constant.
        pa.field("stages", pa.string(), nullable=False),
        pa.field("steps_run", pa.int64(), nullable=False),
        pa.field("final_val_loss", pa.float64(), nullable=False),
        pa.field("final_metric", pa.float64(), nullable=False),
        # The schedule's steps and examples to the target predicted from B_crit(t) before it
        # was trained, with their range from B_crit's intervals (scheduled rows; null on
        # constant rows), and the reference run's steps they are set against.
        pa.field("predicted_steps", pa.float64()),
        pa.field("predicted_steps_low", pa.float64()),
        pa.field("predicted_steps_high", pa.float64()),
        pa.field("predicted_examples", pa.float64()),
        pa.field("reference_steps", pa.float64()),
        # Seconds of the device the run used, training and evaluation (the reference run's
        # row: the whole reference run).
        pa.field("device_s", pa.float64(), nullable=False),
    ]
)

RESULT_TABLES = {
    "sweep": SWEEP,
    "curves": CURVES,
    "runs": RUNS,
    "analysis": ANALYSIS,
    "plan": PLAN,
    "decisions": DECISIONS,
    "study": STUDY,
    "study_axes": STUDY_AXES,
    "critical_over_training": CRITICAL_OVER_TRAINING,
    "schedule_check": SCHEDULE_CHECK,
}
TABLES = {"dataset": DATASET, "manifest": MANIFEST, **RESULT_TABLES, "regressions": REGRESSIONS}


def schema_for(kind: str) -> pa.Schema:
    """The full schema of a table kind (result tables include the environment columns)."""
    if kind not in TABLES:
        raise BadInput(f"unknown table kind {kind!r}; allowed: {', '.join(TABLES)}")
    base = TABLES[kind]
    if kind in RESULT_TABLES:
        return pa.schema(ENV_FIELDS + list(base))
    return base


def make_table(kind: str, rows: list[dict], env: dict | None = None) -> pa.Table:
    """Build a table of `kind` from row dicts, adding `env` to every row of result tables."""
    schema = schema_for(kind)
    if kind in RESULT_TABLES:
        if env is None:
            raise ValueError(f"{kind} rows need the environment columns")
        rows = [{**env, "schema_version": SCHEMA_VERSION, **row} for row in rows]
    names = set(schema.names)
    for row in rows:
        extra = set(row) - names
        if extra:
            raise ValueError(f"{kind} row has columns outside the schema: {sorted(extra)}")
    return pa.Table.from_pylist(rows, schema=schema)
