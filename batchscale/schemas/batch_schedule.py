"""The batch-schedule measurement's tables (batchscale/batch_schedule/; their registry and
`make_table` are in `batchscale.schemas`)."""

from __future__ import annotations

import pyarrow as pa

from batchscale.schemas.fields import CRITICAL_BATCH_FIELDS

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
        *CRITICAL_BATCH_FIELDS,
        # Where B_crit's interval leaves the branch batches (an end cut at the range the fit
        # allows: B_crit may lie beyond it; or extrapolated) and what it rests on; null where
        # there is no interval or nothing to say, and in rows written before layout 11.
        pa.field("b_crit_interval_note", pa.string()),
        pa.field("s_min", pa.float64()),
        pa.field("e_min", pa.float64()),
        # The reference run's gradient noise scale at the checkpoint (its EMA); NaN: none yet.
        pa.field("b_simple", pa.float64()),
        # The schedule's batch from this checkpoint on, and what its branches cost (seconds of
        # the device, training and evaluation).
        pa.field("scheduled_batch_size", pa.int64(), nullable=False),
        pa.field("branch_device_s", pa.float64(), nullable=False),
        # The peak learning rate (the LR rule at the batch, after warm-up) at base_batch_size
        # and at the scheduled batch: what each stage trains at. Null in rows written before
        # layout 10.
        pa.field("base_batch_lr", pa.float64()),
        pa.field("scheduled_lr", pa.float64()),
        # Share of the runnable time the process spent waiting for a CPU (the worst of the
        # checkpoint's branches; a busy machine:
        # the seconds above are then not the device's); null where the kernel does not say.
        pa.field("cpu_wait_share", pa.float64()),
    ]
)

SCHEDULE_CHECK = pa.schema(
    [
        # The batch-size schedule's check (batchscale/batch_schedule/): one row per (schedule,
        # seed), the scheduled run, the constant-base_batch_size run and the constant run at
        # the schedule's last batch trained to the same target. Steps, examples and training
        # seconds to the target are interpolated between the evaluations around the first
        # that reached it (NaN: not reached).
        pa.field("schedule", pa.string(), nullable=False),  # scheduled, constant, constant_final
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
        # The predicted examples' range, as the steps' (null before layout 11).
        pa.field("predicted_examples_low", pa.float64()),
        pa.field("predicted_examples_high", pa.float64()),
        # Seconds of the device the run used, training and evaluation (the reference run's
        # row: the whole reference run).
        pa.field("device_s", pa.float64(), nullable=False),
        # Share of the runnable time the process spent waiting for a CPU (a busy machine:
        # the seconds above are then not the device's); null where the kernel does not say.
        pa.field("cpu_wait_share", pa.float64()),
    ]
)
