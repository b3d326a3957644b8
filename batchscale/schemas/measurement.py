"""The tables of one run's measurement: the dataset and its manifest, the sweep, the
convergence curves and runs, the analysis, the regression verdicts and the what-if plan
(their registry and `make_table` are in `batchscale.schemas`)."""

from __future__ import annotations

import pyarrow as pa

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
        # The same CV over the steps no full garbage collection ran in (the scatter check's;
        # equal to step_time_cv where none ran or the clock cannot tell: CUDA); null in rows
        # written before it was recorded.
        pa.field("step_time_cv_outside_gc", pa.float64()),
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
        # The standard deviation of the log of the row's trials' median step times, every
        # trial (retries too): how far two measurements of the same row in this sweep
        # disagree, which comparisons within one sweep pool (analysis/input_share.py);
        # null with fewer than two trials or in rows written before it was recorded.
        pa.field("trial_log_sd", pa.float64()),
        pa.field("retries", pa.int64()),
        pa.field("quality", pa.string()),
        pa.field("quality_reason", pa.string()),
        # The conditions the trial ran under.
        pa.field("load_avg_1m", pa.float64()),
        pa.field("usable_cpus", pa.int64()),
        pa.field("process_cpu_per_wall", pa.float64()),
        pa.field("cpu_wait_share", pa.float64()),
        # The share of the timed steps' span Python's garbage collector ran, the row's trials
        # pooled (timing.GcPauses); null in rows written before it was recorded.
        pa.field("gc_share", pa.float64()),
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
        # The gradient noise scale estimate at this step, as measured (convergence/noise.py): a
        # ratio of two noisy estimates, so ≤ 0 where the noise swamped tr Σ or |G|² (a failed
        # estimate, which plots and the analysis leave out); null where |G|² estimated ≤ 0.
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
        # steps_to_target is the first evaluation that met the target; this is the step of the
        # evaluation before it (0 where it was the first), so the target was crossed in
        # (steps_before_target, steps_to_target]. Null where not reached, and in rows written
        # before layout 7 or by tables that do not say.
        pa.field("steps_before_target", pa.int64()),
        pa.field("final_val_accuracy", pa.float64()),
        # The one val_accuracy target of version 1 rows; in version 2 rows, target_value where
        # target_metric is val_accuracy, else null.
        pa.field("target_val_accuracy", pa.float64()),
        # The trial's last gradient noise scale estimate, as measured (≤ 0: failed, as in
        # curves.b_simple; null: failed or not measured); the analysis leaves both out and
        # counts the ≤ 0 ones.
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
        # Why a trial stopped short of this row's target, in words: ran max_steps, stalled
        # (patience_evals), diverged (with the loss), or a training loop's own failure. Null
        # when the target was reached, for pruned and probed trials (the status says it), and
        # in rows written before it was recorded.
        pa.field("stop_reason", pa.string()),
        # Where this row's trial was not trained itself because another trial trains exactly
        # the same (another LR rule's, at the rules' shared reference batch): that trial's id,
        # whose results these are. Null for a trained trial, and in rows before layout 8.
        pa.field("trained_as", pa.string()),
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
        # The spread behind steps_to_target (layout 9; null before): the trials at the row's
        # learning rate (its seeds; every LR tried where no LR's median reached), how many
        # reached the target, the lowest and highest steps of those (the low end reaching back
        # over the evaluation gap, steps_before_target), and their measured times to target
        # placed around time_to_target_s as shares of their median (null where none was).
        pa.field("trials_at_lr", pa.int64()),
        pa.field("reached_at_lr", pa.int64()),
        pa.field("steps_low", pa.float64()),
        pa.field("steps_high", pa.float64()),
        pa.field("time_to_target_s_low", pa.float64()),
        pa.field("time_to_target_s_high", pa.float64()),
        pa.field("regime", pa.string()),
        pa.field("s_min", pa.float64()),
        pa.field("e_min", pa.float64()),
        # Their standard errors from the fit (layout 8; null before, and without B_crit).
        pa.field("s_min_se", pa.float64()),
        pa.field("e_min_se", pa.float64()),
        pa.field("b_crit", pa.float64()),
        pa.field("b_crit_low", pa.float64()),
        pa.field("b_crit_high", pa.float64()),
        # The batch's final gradient noise scale: the median over its trials of every LR rule
        # whose estimate did not fail, their lowest and highest, and how many (layout 9; null
        # before).
        pa.field("b_simple", pa.float64()),
        pa.field("b_simple_low", pa.float64()),
        pa.field("b_simple_high", pa.float64()),
        pa.field("b_simple_trials", pa.int64()),
        pa.field("saturation_batch", pa.int64()),
        # When the data support no B_crit: "above" or "below" `b_crit_bound_batch`.
        pa.field("b_crit_bound", pa.string()),
        pa.field("b_crit_bound_batch", pa.float64()),
        # Why no B_crit was estimated, in the report's words (null where it was, or where the
        # data support a bound; null in rows written before layout 10).
        pa.field("b_crit_reason", pa.string()),
        # Regime from the fitted curve's local slope; the measured slope beside it.
        pa.field("fit_slope", pa.float64()),
        pa.field("measured_slope", pa.float64()),
        # Where step_time_s came from, the sweep's figure, and why they disagree (if they do).
        pa.field("step_time_source", pa.string()),
        pa.field("sweep_step_time_s", pa.float64()),
        # Where sweep_step_time_s came from: the sweep timed this batch ("sweep") or its line
        # α + βB stands in ("sweep_fit"); null in rows before layout 7 and where it is unknown.
        pa.field("sweep_step_time_source", pa.string()),
        pa.field("timing_flag", pa.string()),
        # The target these rows are for (the recommendation's: the primary target, or the
        # hardest reached at enough batch sizes); null in version 1 rows (val_accuracy).
        pa.field("target_metric", pa.string()),
        pa.field("target_value", pa.float64()),
        # The answer card (analysis/summary.py Recommendation) as a row: `answer` is true on
        # the recommended (lr_rule, batch_size) and false elsewhere (all false when no batch
        # size is recommended); the other answer_ columns are set on that row only. A part of
        # the card with no answer is null, and `answer_unanswered` says why. Null in rows
        # written before version 5.
        pa.field("answer", pa.bool_()),
        pa.field("answer_learning_rate", pa.float64()),
        pa.field("answer_workers", pa.int64()),
        pa.field("answer_expected", pa.string()),
        pa.field("answer_versus_current", pa.string()),
        pa.field("answer_unanswered", pa.string()),
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
        # fields that differ; too_noisy: the drop its history's noise lets pass;
        # insufficient_history), and the speed fingerprint it was judged under
        # ("field=value; ..."; batchscale/lake/comparable.py). Null in older tables.
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
        # Where the next comparable run of the cell should land, at 90 % (batchscale/lake/
        # next_run.py): centred on this run's samples/s, as wide as the wider of the row's
        # own rerun interval and the run-to-run steps of the cell's history; the basis says
        # which ("history of N runs", "this run's rounds"). Null where the cell did not time
        # well, or in older tables.
        pa.field("next_run_low", pa.float64()),
        pa.field("next_run_high", pa.float64()),
        pa.field("next_run_basis", pa.string()),
    ]
)
"""One row per cell of this run's sweep; `verdict` is confirmed, suspected, ok, too_noisy,
insufficient_history, not_judged or environment_changed ("regression" in tables published before
change points); `change` is current / median − 1 (for environment_changed, against the previous
environment's baseline), `allowed_drop` the noise threshold in samples/s."""

PLAN = pa.schema(
    [
        # What-if plan (batchscale/planner/table.py): one row per (workers,
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
        # "measured", "assumed" (a link the user stated, or what the data cannot separate),
        # "effective" (a bandwidth fitted to the data-parallel steps) or, for the hidden share,
        # "set to 0" (the steps exposed more than the bare all-reduce).
        pa.field("bandwidth_source", pa.string(), nullable=False),
        pa.field("latency_source", pa.string(), nullable=False),
        pa.field("hidden_share_source", pa.string(), nullable=False),
        pa.field("comm_note", pa.string()),
        pa.field("band_note", pa.string()),
        pa.field("memory_note", pa.string()),
        pa.field("max_per_worker_batch", pa.int64()),
    ]
)
