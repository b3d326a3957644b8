"""Convergence trials of a user's training loop (batchscale/loop.py): one call of the loop's
`train(trial)` per trial of the spec, on every rank of the group, its reports turned into the
same curves and runs rows as batchscale's own trainer writes (outcome.py), so the analysis
does not know the difference.

Each report is judged on rank 0 (targets reached, diverged, stalled, out of steps, pruned, a
probe done) and the verdict is broadcast, so every rank's `should_stop()` agrees; the curve's
training time is the maximum over ranks. A loop that raises, never reports or reports what is
not a metric ends as `failed` with a message naming what went wrong, and the next trial starts.
"""

from __future__ import annotations

import math
import sys
import traceback

import torch
import torch.distributed as dist

from batchscale.convergence import trialenv
from batchscale.convergence.distributed import Dist, all_reduce, barrier
from batchscale.convergence.loop_trial import LoopTrial
from batchscale.convergence.outcome import (
    Target,
    diverged_reason,
    note_targets,
    out_of_steps_or_stalled,
    trial_files,
    trial_rows,
)
from batchscale.convergence.probe import probe_done
from batchscale.convergence.schedule import LrSchedule
from batchscale.convergence.spec import ConvergenceSpec, TrialSpec
from batchscale.convergence.trialstate import TrialState
from batchscale.errors import BadInput
from batchscale.location import Location
from batchscale.loop import NO_HALVING, LoopStop, TrainingLoop
from batchscale.metrics import METRICS
from batchscale.schemas import RunStatus, make_table

STATUS_CODES = {None: 0, **{status: i for i, status in enumerate(RunStatus, start=1)}}
"""A verdict as a number, for its broadcast from rank 0."""


class LoopOutcome:
    """One trial's reports as the trainer's TrialState holds them, and its verdict."""

    def __init__(self, spec: ConvergenceSpec, trial: TrialSpec, d: Dist, loop: TrainingLoop):
        self.spec, self.t, self.d, self.loop = spec, trial, d, loop
        self.settings = spec.training
        self.targets = [Target(METRICS[t.metric], t.value) for t in self.settings.all_targets()]
        self.schedule = LrSchedule.of(trial.lr, self.settings)
        self.state = TrialState()
        self.failure: str | None = None
        self.conditions: dict = {"cpu_wait_share": None, "gradient_bytes": None}
        """The runs columns of what the trial trained under: its CPU wait and, where the loop
        showed batchscale its model, the gradient's bytes and the all-reduce probe."""

    def on_report(self, report: dict) -> RunStatus | None:
        """Judge a report on rank 0; every rank returns rank 0's verdict."""
        wall = all_reduce(torch.tensor([report["train_time_s"]], dtype=torch.float64), self.d,
                          dist.ReduceOp.MAX if self.d.world_size > 1 else None)
        verdict = None
        if self.d.is_main:
            try:
                verdict = self.judge({**report, "train_time_s": float(wall[0])})
            except LoopStop as err:  # every rank must hear it, or the others wait forever
                self.failure, verdict = str(err), RunStatus.FAILED
        code = torch.tensor([STATUS_CODES[verdict]], dtype=torch.int64)
        if self.d.world_size > 1:
            dist.broadcast(code, src=0)
        verdict = next(s for s, c in STATUS_CODES.items() if c == int(code[0]))
        if verdict == RunStatus.FAILED:
            raise LoopStop(self.failure or "the report was refused on rank 0")
        return verdict

    def judge(self, report: dict) -> RunStatus | None:
        metrics = report["metrics"]
        unknown = sorted(set(metrics) - set(self.loop.metrics) - {"train_loss"})
        if unknown:
            raise LoopStop(f"trial.report: metrics {unknown} are not among the loop's declared "
                           f"TrainingLoop.metrics {list(self.loop.metrics)}")
        s = self.state
        step = report["step"]
        if s.curve and step <= s.curve[-1]["step"]:
            raise LoopStop(f"trial.report: step {step} after step {s.curve[-1]['step']}; "
                           "steps must increase from report to report")
        row = {"step": step, "examples_seen": report["examples_seen"],
               "train_time_s": report["train_time_s"],
               "train_batch_loss": metrics.get("train_loss"),
               "lr": (self.schedule.at(max(step - 1, 0)) if report.get("lr") is None
                      else report["lr"]),
               "b_simple": report["b_simple"],
               "at_gap_budget": False, **metrics}
        s.curve.append(row)
        s.step = step
        broken = [k for k, v in metrics.items() if not math.isfinite(v)]
        if broken:
            self.failure = f"reported non-finite {', '.join(broken)} at step {step}"
            return RunStatus.DIVERGED
        loss = metrics.get("train_loss")
        if loss is not None and (diverged := diverged_reason(
                loss, s.curve[0].get("train_loss"), self.settings.divergence_factor, step,
                "train_loss")) is not None:
            self.failure = diverged
            return RunStatus.DIVERGED
        improved = note_targets(s, self.targets, row)
        if len(s.reached) == len(self.targets):
            return RunStatus.REACHED
        s.evals_since_best = 0 if improved else s.evals_since_best + 1
        if (reason := out_of_steps_or_stalled(s, self.settings)) is not None:
            s.stop_reason = reason
            return RunStatus.NOT_REACHED
        if self.t.prune_at_step is not None and step >= self.t.prune_at_step:
            return RunStatus.PRUNED
        if self.t.probe is not None and probe_done(self.t.probe, s.curve, row["examples_seen"]):
            return RunStatus.PROBED
        return None

    def rows(self, status: RunStatus) -> list[dict]:
        if not self.state.curve:  # never reported: one row saying so, nothing measured
            self.state.curve.append({"train_time_s": 0.0})
        if self.failure:  # the loop's own failure or divergence, or its early return
            self.state.stop_reason = self.failure
        rows = trial_rows(self.state, self.t, self.d.world_size, self.targets, status)
        return [{**row, **self.conditions} for row in rows]


def run_loop_trial(spec: ConvergenceSpec, trial: TrialSpec, d: Dist,
                   loop: TrainingLoop) -> tuple[LoopOutcome, RunStatus]:
    """Call the loop for `trial` on this rank; its outcome and final status."""
    outcome = LoopOutcome(spec, trial, d, loop)
    context = LoopTrial(spec, trial, d, outcome.targets, spec.training.gns_every_steps,
                        outcome.on_report)
    torch.manual_seed(trial.seed)
    name = f"{loop.name} (TrainingLoop.train)"
    contention = trialenv.CpuContention()
    try:
        loop.train(context)
    except LoopStop as err:
        outcome.failure = str(err)
    except Exception as err:  # the user's code: the trial fails, the next one runs
        frame = traceback.extract_tb(err.__traceback__)[-1]
        outcome.failure = (f"{name} raised {type(err).__name__}: {err} "
                           f"(at {frame.filename}:{frame.lineno})")
    if context.noise is not None:  # measured by the DDP hook along the loop's own steps
        outcome.state.noise = context.noise
    # Collectives: every rank gets here, whatever its loop did.
    outcome.conditions = {
        "cpu_wait_share": contention.share(d),
        **trialenv.probe_columns(d, trialenv.agreed_gradient_bytes(d, context.gradient_bytes))}
    status = context.status
    if (outcome.failure and status is None) or not outcome.state.curve:
        status = RunStatus.FAILED
        if not outcome.failure:
            outcome.failure = (f"{name} returned without calling trial.report(); call it at "
                               "each evaluation with the declared metrics")
    elif status is None:
        outcome.failure = (f"{name} returned before trial.should_stop() was true (last report "
                           f"at step {outcome.state.step}): counted as not reached")
        status = RunStatus.NOT_REACHED
    message = f": {outcome.failure}" if outcome.failure else ""
    _log(d, f"[{trial.trial_id}] {status} at step {outcome.state.step}{_progress(outcome)}"
            f"{message}")
    barrier(d)
    return outcome, status


def _progress(outcome: LoopOutcome) -> str:
    """" (1 of 1 targets, 0.74 s)", as a Workload's trial says it: the targets reached and the
    training time at the last report (rank 0's judge holds them); "" without a report."""
    s = outcome.state
    if not s.curve or "step" not in s.curve[-1]:
        return ""
    return (f" ({len(s.reached)} of {len(outcome.targets)} targets, "
            f"{s.curve[-1]['train_time_s']:.2f} s)")


def _log(d: Dist, message: str) -> None:
    if d.is_main:
        print(message, file=sys.stderr, flush=True)


def run_loop_spec(spec: ConvergenceSpec, d: Dist, loop, out: Location, env: dict) -> None:
    """The spec's trials with a user's training loop (loop_runner.py): a trial whose tables
    exist is skipped; an unfinished one starts again (a loop keeps no checkpoint of ours)."""
    if spec.halving is not None:
        raise BadInput(NO_HALVING)
    labels = {"optimizer": None, "precision": None}  # the loop's own: not known to batchscale
    for trial in spec.trials:
        curves_name, run_name = trial_files(trial.trial_id)
        if out.exists(run_name):
            continue
        outcome, status = run_loop_trial(spec, trial, d, loop)
        if d.is_main:
            ident = trial.model_dump(include={"trial_id", "batch_size", "lr_rule", "seed"})
            curve = [{**ident, **labels, **row} for row in outcome.state.curve if "step" in row]
            out.put_table(curves_name, make_table("curves", curve, env))
            out.put_table(run_name, make_table("runs", [{**r, **labels}
                                                        for r in outcome.rows(status)], env))
        barrier(d)
