"""A batch-schedule measurement as its two tables (schemas.CRITICAL_OVER_TRAINING,
schemas.SCHEDULE_CHECK): what the command writes, the pipeline validates and publishes, and
`batch_schedule/section.py` turns into the summary, the report's section and the plot."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pyarrow as pa

from batchscale.batch_schedule import fit
from batchscale.batch_schedule.measure import Stage, Target
from batchscale.schemas import make_table


@dataclass
class Outcome:
    """What the measurement found: what `report.tables` stores."""

    curve: list[dict]
    branches: list[dict]
    fits: list[fit.CheckpointFit]
    stages: list[Stage]
    prediction: dict
    target: Target
    base_batch: int
    rule: str
    check_rows: list[dict] = field(default_factory=list)
    """The reference run's row (always), then the check's runs (when a schedule was found)."""
    peak_lrs: dict[int, float] = field(default_factory=dict)
    """The LR rule's peak learning rate at B0 and at each branch batch: what each stage of the
    schedule trains at."""


def tables(outcome: Outcome, env: dict) -> tuple[pa.Table, pa.Table]:
    return (make_table("critical_over_training", _checkpoint_rows(outcome), env),
            make_table("schedule_check", _check_rows(outcome), env))


def _scheduled_batches(outcome: Outcome) -> dict[int, int]:
    """The schedule's batch from each checkpoint on."""
    by_loss = {s.from_loss: s.batch_size for s in outcome.stages}
    batch, result = outcome.base_batch, {}
    for f in sorted(outcome.fits, key=lambda f: f.checkpoint_step):
        batch = by_loss.get(f.val_loss, batch)
        result[f.checkpoint_step] = batch
    return result


def _checkpoint_rows(outcome: Outcome) -> list[dict]:
    scheduled = _scheduled_batches(outcome)
    cost: dict[int, float] = {}
    waits: dict[int, list[float]] = {}
    for row in outcome.branches:
        step = row["checkpoint_step"]
        cost[step] = cost.get(step, 0.0) + row["train_time_s"] + row["eval_time_s"]
        if row.get("cpu_wait_share") is not None:
            waits.setdefault(step, []).append(row["cpu_wait_share"])
    return [{
        "checkpoint_step": f.checkpoint_step, "examples": f.examples, "val_loss": f.val_loss,
        "milestone_loss": f.milestone_loss, "base_batch_size": outcome.base_batch,
        "lr_rule": outcome.rule, "batches_reached": f.batches_reached, "b_crit": f.b_crit,
        "b_crit_low": f.b_crit_low, "b_crit_high": f.b_crit_high,
        "b_crit_bound": f.bound or None, "b_crit_bound_batch": f.bound_batch,
        "b_crit_reason": f.reason or None, "b_crit_interval_note": f.interval_note or None,
        "s_min": f.s_min, "e_min": f.e_min,
        "b_simple": f.b_simple, "scheduled_batch_size": scheduled[f.checkpoint_step],
        "base_batch_lr": outcome.peak_lrs.get(outcome.base_batch),
        "scheduled_lr": outcome.peak_lrs.get(scheduled[f.checkpoint_step]),
        "branch_device_s": cost.get(f.checkpoint_step, 0.0),
        "cpu_wait_share": max(waits[f.checkpoint_step]) if f.checkpoint_step in waits else None}
        for f in outcome.fits]


def _check_rows(outcome: Outcome) -> list[dict]:
    stages = ",".join(f"{s.from_loss:.6g}:{s.batch_size}" for s in outcome.stages)
    p = outcome.prediction
    predicted = math.isfinite(p["reference_steps"]) and bool(outcome.stages)
    common = {"base_batch_size": outcome.base_batch, "lr_rule": outcome.rule,
              "target_metric": outcome.target.metric, "target_value": outcome.target.value,
              "reference_steps": p["reference_steps"]}
    rows = []
    for row in outcome.check_rows:
        scheduled = row["schedule"] == "scheduled"
        rows.append({
            **common, "schedule": row["schedule"], "seed": row["seed"],
            "reference": bool(row.get("reference", False)), "reached": bool(row["reached"]),
            "diverged": bool(row.get("diverged", False)),
            "steps_to_target": row["steps_to_target"],
            "examples_to_target": row["examples_to_target"],
            "train_time_s_to_target": row["train_time_s_to_target"],
            "batch_sizes": row["batch_sizes"], "stages": stages if scheduled else "",
            "steps_run": row["steps_run"], "final_val_loss": row["final_val_loss"],
            "final_metric": row["final_metric"], "device_s": row["device_s"],
            "cpu_wait_share": row.get("cpu_wait_share"),
            **{f"predicted_{k}": (p[k] if scheduled and predicted else math.nan)
               for k in ("steps", "steps_low", "steps_high", "examples", "examples_low",
                         "examples_high")}})
    return rows
