"""The batch-schedule measurement from a config to its answer: the reference run, the branches,
B_crit(t) and B_simple(t), the schedule, its check against the constant batch, and what it all
cost in device-seconds (docs/batch-schedule.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from batchscale.batch_schedule import fit, measure
from batchscale.batch_schedule.measure import Stage, Target
from batchscale.batch_schedule.training import Setup
from batchscale.errors import BadInput


@dataclass
class Outcome:
    """Everything the measurement found, for tables and the summary."""

    curve: list[dict]
    branches: list[dict]
    fits: list[fit.CheckpointFit]
    tracking: dict
    stages: list[Stage]
    prediction: dict
    check_rows: list[dict] = field(default_factory=list)
    check: dict = field(default_factory=dict)
    cost_s: dict = field(default_factory=dict)
    target: Target | None = None
    base_batch: int = 0


def check_config(cfg) -> tuple[str, Target]:
    """The LR rule and target the measurement uses, or BadInput naming what is not allowed."""
    c = cfg.convergence
    rules = [r for r in c.lr_rules if r != "grid"]
    if not rules:
        raise BadInput("batch_schedule: the batch grows during a run, so its LR must follow a "
                       "rule; convergence.lr_rules has only grid (allowed: constant, linear, "
                       "sqrt)")
    if c.lr_decay != "none":
        raise BadInput(f"batch_schedule: convergence.lr_decay {c.lr_decay!r} decays over a "
                       "fixed step count that a schedule changes; use lr_decay: none")
    targets = c.resolved_targets()
    primary = next((t for t in targets if getattr(t, "primary", False)), targets[0])
    return rules[0], Target(primary.metric, primary.value)


def build_setup(cfg, data_dir: str, work: Path, run_id: str, rule: str) -> Setup:
    import torch

    from batchscale.convergence.runner import build_spec
    from batchscale.convergence.trialdata import load_data, workload_for_data

    workload = workload_for_data(cfg.workload, data_dir)
    train, val = load_data(data_dir, workload)
    bs = cfg.batch_schedule
    largest = bs.branch_batch_sizes[-1]
    if len(train) < largest:
        raise BadInput(f"batch_schedule: the training split has {len(train)} examples, fewer "
                       f"than the largest branch batch {largest} (base_batch_size x the last "
                       "branch factor)")
    c = cfg.convergence
    spec = build_spec(cfg, [bs.base_batch_size], data_dir=data_dir, out_dir=str(work),
                      run_id=run_id, workers=1)
    return Setup(workload=workload, train=train, val=val.head(bs.val_rows),
                 settings=spec.training, lr_rule=rule, base_lr=c.base_lr,
                 reference_batch=c.reference_batch_size,
                 device="cuda" if torch.cuda.is_available() else "cpu",
                 gns_every_steps=c.gns_every_steps)


def measure_schedule(cfg, data_dir: str, work: Path, run_id: str,
                     echo: Callable[[str], None]) -> Outcome:
    """Run (or resume) every part of the measurement under `work` and return what it found."""
    rule, target = check_config(cfg)
    bs = cfg.batch_schedule
    setup = build_setup(cfg, data_dir, work, run_id, rule)
    seed = bs.check_seeds[0]
    echo(f"reference run: batch {bs.base_batch_size}, {rule} rule, to {target.metric} "
         f"{target.value:g} (checkpoints at steps {bs.checkpoint_steps})")
    curve = measure.reference_run(setup, bs, target, seed, work, echo)
    branches, fits = [], []
    for step in bs.checkpoint_steps:
        milestone = measure.value_at(curve, step + bs.milestone_steps)
        row = next(r for r in curve if r["step"] == step)
        rows = [measure.branch(setup, bs, row, b, milestone, seed, work)
                for b in bs.branch_batch_sizes]
        branches += rows
        fits.append(fit.fit_checkpoint(step, rows, row, rule, cfg.analysis.bootstrap_samples,
                                       cfg.analysis.b_crit_range_factor))
        echo(f"checkpoint {step}: steps to {milestone:.4f} "
             + ", ".join(f"{r['batch_size']}: {r['steps_to_milestone']:.1f}" for r in rows)
             + f" -> {crit_text(fits[-1])}")
    reference = measure.to_target(curve, target)
    stages = fit.plan_schedule(fits, bs.base_batch_size, bs.branch_batch_sizes)
    outcome = Outcome(curve=curve, branches=branches, fits=fits, tracking=fit.tracking(fits),
                      stages=stages, prediction=fit.predicted(
                          fits, stages, bs.base_batch_size, reference["steps_to_target"]),
                      target=target, base_batch=bs.base_batch_size)
    if stages and reference["reached"]:
        outcome.check_rows = [{"schedule": "constant", "seed": seed, **reference}]
        plan = schedule_text(stages, bs.base_batch_size)
        for s in bs.check_seeds:
            echo(f"check: scheduled run from seed {s} ({plan})")
            outcome.check_rows.append(measure.check_run(setup, bs, target, stages, s,
                                                        "scheduled", work))
            if s != seed:
                echo(f"check: constant run from seed {s}")
                outcome.check_rows.append(measure.check_run(setup, bs, target, [], s,
                                                            "constant", work))
        outcome.check = fit.check_summary(outcome.check_rows)
    # Device seconds, evaluations included: the measurement pays for them as much as for steps.
    outcome.cost_s = {
        "reference": curve[-1]["train_time_s"] + curve[-1]["eval_time_s"],
        "branches": sum(r["train_time_s"] + r["eval_time_s"] for r in branches),
        "check": sum(r["device_s"] for r in outcome.check_rows[1:]),
    }
    return outcome


# ------------------------------------------------------------------------------- the text


def crit_text(f: fit.CheckpointFit) -> str:
    if math.isfinite(f.b_crit):
        interval = (f" [{f.b_crit_low:.3g}, {f.b_crit_high:.3g}]"
                    if math.isfinite(f.b_crit_low) else " (no interval)")
        return f"B_crit {f.b_crit:.3g}{interval}"
    if f.bound:
        return f"B_crit {f.bound} {f.bound_batch:g}"
    return f"no B_crit: {f.reason}"


def schedule_text(stages: list[Stage], base_batch: int) -> str:
    if not stages:
        return f"constant {base_batch}"
    return f"{base_batch}" + "".join(f", {s.batch_size} from val_loss {s.from_loss:.3f}"
                                     for s in stages)
