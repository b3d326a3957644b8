"""The batch-schedule measurement from a config to its answer: the reference run, the branches,
B_crit(t) and B_simple(t), the schedule, its check against the constant batch, and what it all
cost in device-seconds (docs/batch-schedule.md)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from batchscale.batch_schedule import fit, measure
from batchscale.batch_schedule.check import FINAL_CONSTANT
from batchscale.batch_schedule.measure import Target
from batchscale.batch_schedule.section import crit_text
from batchscale.batch_schedule.tables import Outcome
from batchscale.batch_schedule.training import Setup
from batchscale.config.batch_schedule import schedule_refusal
from batchscale.errors import BadInput
from batchscale.schemas import TUNED_RULE

if TYPE_CHECKING:
    from batchscale.config.stage_inputs import Config


def check_config(cfg) -> tuple[str, Target]:
    """The LR rule and target the measurement uses, or BadInput naming what is not allowed."""
    c = cfg.convergence
    refusal = schedule_refusal(c)
    if refusal:
        raise BadInput(refusal)
    targets = c.resolved_targets()
    primary = next((t for t in targets if t.primary), targets[0])
    return next(r for r in c.lr_rules if r != TUNED_RULE), Target(primary.metric, primary.value)


def loop_refusal(workload_spec: str) -> str:
    """Why the measurement cannot run on a TrainingLoop."""
    return (f"batch_schedule: {workload_spec} is a TrainingLoop, whose model and optimizer "
            "batchscale never holds, so it cannot branch from its checkpoints; give a "
            "batchscale.Workload (model, data, loss) instead")


def build_setup(cfg, workload, data_dir: str, work: Path, run_id: str, rule: str) -> Setup:
    from batchscale.convergence.runner import build_spec
    from batchscale.convergence.trialdata import load_data

    if workload.loop is not None:
        raise BadInput(loop_refusal(cfg.workload))
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
                 device=_device(),
                 gns_every_steps=c.gns_every_steps)


def measure_schedule(cfg, data_dir: str, work: Path, run_id: str,
                     echo: Callable[[str], None]) -> Outcome:
    """Run (or resume) every part of the measurement under `work` and return what it found."""
    from batchscale.contract_check import with_workload_targets
    from batchscale.convergence.trialdata import workload_for_data

    workload = workload_for_data(cfg.workload, data_dir)
    cfg = with_workload_targets(cfg, workload)  # a user's Workload owns its targets
    rule, target = check_config(cfg)
    bs = cfg.batch_schedule
    setup = build_setup(cfg, workload, data_dir, work, run_id, rule)
    seed = bs.check_seeds[0]
    echo(f"reference run: batch {bs.base_batch_size}, {rule} rule, to {target.metric} "
         f"{target.value:g} (checkpoints at steps {bs.checkpoint_steps})")
    curve = measure.reference_run(setup, bs, target, seed, work, echo)
    branches, fits = [], []
    for step in bs.checkpoint_steps:
        milestone = measure.value_at(curve, step + bs.milestone_steps)
        row = next(r for r in curve if r["step"] == step)
        scatter = measure.loss_scatter(curve, step, 2 * bs.milestone_steps)
        if not fit.branchable(row["val_loss"], milestone, scatter):
            fits.append(fit.unbranched(step, row, milestone, bs.milestone_steps, scatter))
            echo(f"checkpoint {step}: not branched: {fits[-1].reason}")
            continue
        rows = [measure.branch(setup, bs, row, b, milestone, seed, work)
                for b in bs.branch_batch_sizes]
        branches += rows
        fits.append(fit.fit_checkpoint(step, rows, row, rule, cfg.analysis.bootstrap_samples,
                                       cfg.analysis.b_crit_range_factor))
        echo(f"checkpoint {step}: steps to {milestone:.4f} "
             + ", ".join(f"{r['batch_size']}: {r['steps_to_milestone']:.1f}" for r in rows)
             + f" -> B_crit {crit_text(fits[-1].table_row())}")
    reference = measure.to_target(measure.on_grid(curve, bs.eval_every_steps), target)
    stages = fit.plan_schedule(fits, bs.base_batch_size, bs.branch_batch_sizes)
    outcome = Outcome(curve=curve, branches=branches, fits=fits, stages=stages,
                      prediction=fit.predicted(fits, stages, bs.base_batch_size,
                                               reference["steps_to_target"]),
                      target=target, base_batch=bs.base_batch_size, rule=rule,
                      peak_lrs={b: setup.peak_lr(b)
                                for b in (bs.base_batch_size, *bs.branch_batch_sizes)})
    outcome.check_rows = [{"schedule": "constant", "seed": seed, "reference": True,
                           **reference, "device_s": curve[-1]["train_time_s"]
                           + curve[-1]["eval_time_s"]}]
    if stages and reference["reached"]:
        plan = " -> ".join(map(str, [bs.base_batch_size, *(s.batch_size for s in stages)]))
        for s in bs.check_seeds:
            echo(f"check: scheduled run from seed {s} ({plan})")
            outcome.check_rows.append(measure.check_run(setup, bs, target, stages, s,
                                                        "scheduled", work))
            if s != seed:
                echo(f"check: constant run from seed {s}")
                outcome.check_rows.append(measure.check_run(setup, bs, target, [], s,
                                                            "constant", work))
            # the schedule's last batch from the start: what the schedule must beat in
            # examples, as the constant B0 in steps
            final = stages[-1].batch_size
            echo(f"check: constant run at the schedule's last batch {final} from seed {s}")
            outcome.check_rows.append(measure.check_run(setup, bs, target, [], s,
                                                        FINAL_CONSTANT, work, final))
    return outcome


def run_stage(config: str | Config, run_id: str, dataset_path: str, crit_path: str,
              check_path: str, summary_path: str, work_dir: str, validation_dir: str,
              echo: Callable[[str], None]):
    """The measurement as a pipeline stage (and the command's core): measure (or resume) under
    `work_dir`, write the two tables and the summary, validate both tables (their pages in
    `validation_dir`; ValidationFailed, exit 3, when one fails). Returns (findings, outcome)."""
    from batchscale.batch_schedule.findings import Findings
    from batchscale.batch_schedule.section import markdown
    from batchscale.batch_schedule.tables import tables
    from batchscale.checks.stage import check_tables
    from batchscale.config.stage_inputs import stage_config
    from batchscale.envinfo import environment
    from batchscale.storage import write_bytes_atomic, write_table_atomic

    cfg = stage_config(config)
    outcome = measure_schedule(cfg, dataset_path, Path(work_dir), run_id, echo)
    env = environment(run_id=run_id, config_hash=cfg.config_hash, experiment=cfg.name,
                      workload=cfg.workload, device=_device(), variant=cfg.variant)
    crit, check = tables(outcome, env)
    write_table_atomic(crit_path, crit)
    write_table_atomic(check_path, check)
    findings = Findings.from_tables(crit.to_pandas(), check.to_pandas(),
                                    cfg.analysis.max_cpu_wait_share)
    write_bytes_atomic(summary_path, markdown(findings, cfg.workload).encode())
    folder = Path(validation_dir)
    folder.mkdir(parents=True, exist_ok=True)
    check_tables([("critical_over_training", "critical_over_training", crit, {}),
                  ("schedule_check", "schedule_check", check, {})],
                 str(folder / "validation.json"), str(folder / "validation.html"))
    return findings, outcome


def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
