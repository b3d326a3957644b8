"""Training entry point for convergence trials: runs under `torchrun` locally and under
Kubeflow Trainer v2 on a cluster (both set RANK, WORLD_SIZE, MASTER_ADDR, ... in the env).

    torchrun --standalone --nproc-per-node=N train.py --spec spec.json

The spec (spec.py) lists trials (global batch size, LR rule, LR, seed); each trains with the
spec's optimizer (SGD+momentum or AdamW), LR schedule and precision (fp32, or bf16 autocast)
until it has reached every target (a metric and a value: batchscale/metrics.py), and rank 0
writes `trials/<trial_id>.{curves,run}.parquet`: a curve row per evaluation with every metric
the workload measures, and a run row per target. Trials
whose result files exist are skipped, and each trial checkpoints atomically every N steps, so a
restarted group (torchrun --max-restarts) resumes where it stopped and reaches the target at
exactly the same step as an uninterrupted run (data order is a function of the step). The spec,
the dataset, the results and the checkpoints may each be a local path or an
`s3://bucket/prefix` (a TrainJob's pods share nothing but the object store).

Global batch = micro-batch x accumulation_steps x workers; the world size is fixed for a run
(a group that comes back with another size fails instead of silently changing the batch).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
import time
from functools import partial

import torch
import torch.distributed as dist

from batchscale.contract import to_device
from batchscale.contract_check import scalar_loss
from batchscale.convergence import halving, trialenv, trialstate, usererror
from batchscale.convergence.distributed import Dist, all_reduce, barrier, init_distributed
from batchscale.convergence.faults import drill_step, maybe_inject_fault
from batchscale.convergence.noise import grad_list, sq_norm
from batchscale.convergence.outcome import (
    Target,
    diverged_reason,
    note_targets,
    out_of_steps_or_stalled,
    summary_run_rows,
    trial_files,
    trial_rows,
)
from batchscale.convergence.probe import probe_done
from batchscale.convergence.schedule import DataOrder, LrSchedule, build_optimizer
from batchscale.convergence.spec import ConvergenceSpec, TrialSpec, read_spec
from batchscale.convergence.trialdata import load_data, workload_for_data
from batchscale.convergence.trialstate import TrialState
from batchscale.convergence.usererror import (
    UserCodeError,
    log_traceback,
    restarted_after_user_error,
    write_error_file,
)
from batchscale.datasplit import DataFailure, error_text, failure_of, prefetched
from batchscale.envinfo import environment
from batchscale.errors import BadInput, BatchscaleError
from batchscale.location import Location, open_location
from batchscale.metrics import METRICS
from batchscale.precision import autocast
from batchscale.schemas import RunStatus, make_table
from batchscale.stopping import die_with_parent, exit_at_once
from batchscale.workloads import Workload


# ------------------------------------------------------------------------------ one trial
class _NoContext(contextlib.nullcontext):
    """One reusable no-op context, returned instead of a new nullcontext every step."""

    def __call__(self):
        return self


_NO_CONTEXT = _NoContext()
READING = "reading the step's training examples"
"""What a trial was doing when its training data failed (usererror.data_error)."""


class Trial:
    def __init__(self, spec: ConvergenceSpec, trial: TrialSpec, data, d: Dist,
                 checkpoints: Location, workload: Workload):
        self.spec, self.t, self.d, self.checkpoints = spec, trial, d, checkpoints
        self.settings = spec.training
        self.identity = spec.identity(trial)
        self.workload = workload
        self.train, self.val = data  # datasplit.DatasetSplit: the workload's contract
        self.contract = self.train.contract
        # train_loss: always the same first rows, so every evaluation and batch size compares
        self.train_eval = self.train.head(self.settings.train_eval_rows)
        self.targets = [Target(METRICS[t.metric], t.value) for t in self.settings.all_targets()]
        self.gap_step = self._gap_step(len(self.train))
        torch.manual_seed(trial.seed)
        self.state = TrialState()
        try:
            model = self.contract.model().to(d.device)
        except Exception as err:
            usererror.fail_if_user(self, err, "Workload.model", "building the trial's model",
                              "Workload.model must build a fresh model in every trial")
            raise
        self.params = [p for p in model.parameters() if p.requires_grad]
        if d.world_size > 1:
            model = torch.nn.parallel.DistributedDataParallel(model)
        self.model = model
        self.schedule = LrSchedule.of(trial.lr, self.settings)
        self.opt = build_optimizer(self.params, self.settings, trial.lr)
        self.lr_set: float | None = None  # the LR the optimizer's groups hold now
        # the trial's precision for a forward pass and loss (training and evaluation alike)
        self.autocast = partial(autocast, d.device, self.settings.precision)
        # Looked up once: the step runs them every time (a sub-millisecond step notices).
        self.loss = self.contract.loss
        self.step_precision = (self.autocast if self.settings.precision != "fp32"
                               else _NO_CONTEXT)
        self.order = DataOrder(len(self.train), trial.seed)
        self.finished: dict | None = None
        b, accumulation = trial.batch_size, self.settings.accumulation_steps
        if b % (d.world_size * accumulation):
            raise BadInput(f"batch size {b} is not divisible by {d.world_size} workers x "
                           f"{accumulation} accumulation steps")
        self.local_batch = b // d.world_size
        self.accumulation = accumulation

    def bare_model(self):
        return getattr(self.model, "module", self.model)

    def _gap_step(self, train_rows: int) -> int | None:
        """The step at which the trial has seen gap_epochs of training rows (None: off)."""
        epochs = self.settings.gap_epochs
        if epochs is None:
            return None
        return max(1, math.ceil(epochs * train_rows / self.t.batch_size))

    # -- the loop -----------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        if self.d.is_main:
            print(f"[{self.t.trial_id}] {msg}", file=sys.stderr, flush=True)

    def local_indices(self, step: int) -> torch.Tensor:
        idx = self.order.batch(step, self.t.batch_size)
        if self.d.world_size == 1:  # the whole batch: no slice (a sub-ms step notices)
            return idx
        return idx[self.d.rank * self.local_batch:(self.d.rank + 1) * self.local_batch]

    def _sync_context(self, last_micro: bool, manual_reduce: bool):
        """DDP all-reduces on the last micro-batch only (gradient accumulation), and never when
        the noise measurement needs the local gradient first."""
        if self.d.world_size > 1 and (manual_reduce or not last_micro):
            return self.model.no_sync()
        return _NO_CONTEXT

    def micro_batches(self, step: int) -> list[torch.Tensor]:
        """This rank's rows of step `step`, split into the micro-batches it runs: the
        accumulation steps, and on one process at least 2 on a noise-measuring step (the small
        batch of the noise scale)."""
        idx = self.local_indices(step)
        local_noise = self.measures_noise(step) and self.d.world_size == 1 and len(idx) >= 2
        parts = max(self.accumulation, 2) if local_noise else self.accumulation
        return [idx] if parts == 1 else list(idx.tensor_split(parts))

    def measures_noise(self, step: int) -> bool:
        every = self.settings.gns_every_steps
        return every is not None and step % every == 0

    def step_keys(self, start: int):
        """(step, [(place in the global batch, indices), ...]) from step `start` on: what the
        background loader reads (datasplit.prefetched)."""
        step = start
        while True:
            parts, position = [], self.d.rank * self.local_batch
            for part in self.micro_batches(step):
                parts.append((position, part.tolist()))
                position += len(part)
            yield step, parts
            step += 1

    def read_batches(self, step: int, parts: list[torch.Tensor]) -> list:
        """The step's micro-batches on the device: from the background loader when there is
        one (checked to be this step's), else read now."""
        if self.loader is None:
            return [self.train.batch(part, self.d.device) for part in parts]
        ready_step, batches = next(self.loader)
        if ready_step != step:
            raise BatchscaleError(f"the background loader delivered step {ready_step} for step "
                                  f"{step}: refusing to train on the wrong rows")
        if isinstance(batches, DataFailure):  # the workload's data failed in a loader worker
            raise usererror.data_error(self, batches, batches.error, READING, "train")
        return [to_device(batch, self.d.device) for batch in batches]

    def train_step(self, step: int) -> float:
        """One optimizer step over the global batch; returns this rank's mean loss."""
        parts = self.micro_batches(step)  # this rank's rows; the split makes them a batch
        try:
            batches = self.read_batches(step, parts)
        except Exception as err:
            if failure_of(err) is not None:  # not a loader that died: that is no user error
                usererror.fail_if_user(self, err, "", READING, "")
            raise
        lr = self.schedule.at(step)
        if lr != self.lr_set:  # constant after warm-up: no per-step Python loop over groups
            for group in self.opt.param_groups:
                group["lr"] = lr
            self.lr_set = lr
        self.opt.zero_grad(set_to_none=True)
        ddp_noise = self.measures_noise(step) and self.d.world_size > 1
        local_noise = self.measures_noise(step) and len(parts) > self.accumulation or (
            self.measures_noise(step) and self.d.world_size == 1 and len(parts) > 1)
        rows = self.local_batch
        small_sq, small_batch, loss_value = 0.0, 0, 0.0
        for i, (part, batch) in enumerate(zip(parts, batches, strict=True)):
            weight = len(part) / rows
            with self._sync_context(i == len(parts) - 1, ddp_noise):
                with self.step_precision():  # the forward and loss only; backward outside
                    try:
                        loss = scalar_loss(self.loss(self.model, batch))
                    except Exception as err:
                        usererror.loss_failed(self, err, len(part), batch)
                        raise
                try:
                    (loss if len(parts) == 1 else loss * weight).backward()
                except Exception as err:
                    if self.d.world_size == 1:  # with DDP, a dead peer fails here too
                        usererror.fail_if_user(
                            self, err, "the backward pass of Workload.loss's result",
                            "training (the backward pass)", "The loss Workload.loss returns must "
                            "be differentiable (loss.backward())")
                    raise
            loss_value += float(loss.detach()) * weight
            if local_noise and i == 0:
                # The first micro-batch's mean gradient (its grads / weight) alone estimates
                # E|G_small|^2 without bias; the others would only lower the variance, at the
                # cost of a copy of every gradient per micro-batch (docs/architecture.md).
                small_sq = sq_norm(grad_list(self.params)) / weight**2
                small_batch = len(part)
        if ddp_noise:
            self._reduce_with_noise()
        elif local_noise:
            self.state.noise.update(small_sq, sq_norm(grad_list(self.params)), small_batch,
                                    rows)
        self.opt.step()
        return loss_value

    def _reduce_with_noise(self) -> None:
        """DDP: each rank's local gradient (before all-reduce) is the small batch B/W; the
        all-reduced mean is the big batch B. One all-reduce carries the gradients and the
        local squared norm together."""
        grads = grad_list(self.params)
        local_sq = torch.tensor([sq_norm(grads)], dtype=grads[0].dtype, device=grads[0].device)
        flat = torch.cat([g.reshape(-1) for g in grads] + [local_sq])
        all_reduce(flat, self.d)
        flat /= self.d.world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()
        self.state.noise.update(float(flat[-1]), sq_norm(grads), self.local_batch,
                                self.t.batch_size)

    def evaluate(self) -> dict[str, float]:
        """Every metric the workload measures: the validation split's, and train_loss on the
        fixed training subset. Every rank computes the same numbers (same model, same data)."""
        model, device = self.bare_model(), self.d.device
        try:
            val = self.val.evaluate(model, device, self.autocast)
        except Exception as err:
            usererror.evaluation_failed(self, err, "val", "evaluating the validation split "
                                        f"({len(self.val)} examples)")
            raise
        try:
            metrics = {f"val_{name}": float(value) for name, value in val.items()}
        except (TypeError, ValueError, AttributeError) as err:
            raise usererror.user_error(self, "Workload.evaluate", error_text(err),
                                  "reading the metrics it returned", "It must return a dict of "
                                  "numbers (keys without the val_ prefix)") from None
        try:
            metrics["train_loss"] = self.train_eval.loss_metric(model, device, self.autocast)
        except Exception as err:
            usererror.evaluation_failed(self, err, "train", "measuring train_loss on the first "
                                        f"{len(self.train_eval)} training examples")
            raise
        return metrics

    def record_eval(self) -> RunStatus | None:
        """Evaluate (not timed), append a curve row, note the targets reached; the trial's
        status if it is finished."""
        s = self.state
        loss_stats = all_reduce(torch.tensor([s.loss_sum, float(s.loss_count)],
                                             dtype=torch.float64), self.d)
        batch_loss = float(loss_stats[0] / max(loss_stats[1], 1.0))
        wall = all_reduce(torch.tensor([s.train_time_s], dtype=torch.float64), self.d,
                          dist.ReduceOp.MAX if self.d.world_size > 1 else None)
        metrics = self.evaluate()
        row = {
            "step": s.step, "examples_seen": s.step * self.t.batch_size,
            "train_time_s": float(wall[0]), "train_batch_loss": batch_loss,
            "lr": self.schedule.at(max(s.step - 1, 0)), "b_simple": s.noise.b_simple,
            "at_gap_budget": s.step == self.gap_step, **metrics,
        }
        s.curve.append(row)
        s.loss_sum, s.loss_count = 0.0, 0
        if (diverged := diverged_reason(batch_loss, s.first_loss, self.settings.divergence_factor,
                                        s.step, "the training batches' loss")) is not None:
            s.stop_reason = diverged
            return RunStatus.DIVERGED
        improved = self.note_targets(row)
        gap_pending = self.gap_step is not None and s.step < self.gap_step
        if len(s.reached) == len(self.targets) and not gap_pending:
            return RunStatus.REACHED
        s.evals_since_best = 0 if improved else s.evals_since_best + 1
        if len(s.reached) == len(self.targets):  # past the targets, only the gap budget waits
            if s.step >= self.settings.max_steps:
                return RunStatus.NOT_REACHED
        elif (reason := out_of_steps_or_stalled(s, self.settings)) is not None:
            s.stop_reason = reason
            return RunStatus.NOT_REACHED
        if self.t.prune_at_step is not None and s.step >= self.t.prune_at_step:
            return RunStatus.PRUNED
        if self.t.probe is not None and probe_done(self.t.probe, s.curve, row["examples_seen"]):
            return RunStatus.PROBED
        return None

    def note_targets(self, row: dict) -> bool:
        return note_targets(self.state, self.targets, row)

    def run(self, pause_at_step: int | None = None) -> dict | None:
        """Train until finished and return the summary. With `pause_at_step` (a successive
        halving rung), stop at the first evaluation from that step on with a checkpoint and
        return None while not finished."""
        trialstate.resume(self)
        if self.finished is not None:
            return self.finished
        s = self.state
        if pause_at_step is not None and s.step >= pause_at_step:
            return None  # resumed at or past the rung
        contention = trialenv.CpuContention()
        self.loader = self.start_loader(s.step)
        try:
            status = self.train_until_finished(pause_at_step)
        finally:
            self.loader = None  # its worker processes end with it
        if status is None:
            return None  # paused at the rung, checkpointed
        why = f": {s.stop_reason}" if s.stop_reason and status != RunStatus.REACHED else ""
        self.log(f"{status} at step {s.step} ({len(s.reached)} of {len(self.targets)} targets, "
                 f"{s.train_time_s:.2f} s){why}")
        return self.finish(status, contention)

    def start_loader(self, step: int):
        """Background reading from step `step` on with `loader_workers` set; None (read in the
        step) otherwise."""
        workers = self.spec.loader_workers
        if not workers:
            return None
        return prefetched(self.train, self.step_keys(step), self.t.seed, workers)

    def train_until_finished(self, pause_at_step: int | None) -> RunStatus | None:
        """Train and evaluate until the trial's status is known; None when paused at
        `pause_at_step` (with a checkpoint)."""
        s = self.state
        sync = torch.cuda.synchronize if self.d.device.startswith("cuda") else (lambda: None)
        fault_step = drill_step()  # read once: the environment does not change mid-trial
        status = None
        if s.step == 0:
            status = self.record_eval()  # the untrained model, step 0
        while status is None:
            sync()
            start = time.perf_counter()
            loss = self.train_step(s.step)
            sync()
            s.train_time_s += time.perf_counter() - start
            s.step += 1
            if s.step == fault_step:
                maybe_inject_fault(s.step, self.d.rank)
            if s.first_loss is None:
                s.first_loss = loss
            s.loss_sum += loss
            s.loss_count += 1
            if not math.isfinite(loss) and self.d.world_size == 1:
                self.record_eval()
                status = RunStatus.DIVERGED
            elif (s.step % self.settings.eval_every_steps == 0 or s.step == self.gap_step
                  or s.step >= self.settings.max_steps):
                status = self.record_eval()
                if status is None and pause_at_step is not None and s.step >= pause_at_step:
                    trialstate.save(self)
                    return None
                if status is None and s.step % self.spec.checkpoint_every_steps == 0:
                    trialstate.save(self)
        return status

    def stop_pruned(self) -> dict:
        """End a paused trial as pruned (successive halving): its summary from the state its
        last checkpoint holds."""
        trialstate.resume(self)
        if self.finished is not None:
            return self.finished
        self.log(f"pruned at step {self.state.step} (successive halving)")
        return self.finish(RunStatus.PRUNED, None)

    def finish(self, status: RunStatus, contention: trialenv.CpuContention | None) -> dict:
        """The final summary (runs rows, the CPU wait over the last segment where measured, the
        all-reduce probe), saved as the final checkpoint."""
        summary = {"rows": self.summary_rows(status),
                   "cpu_wait_share": contention.share(self.d) if contention else None,
                   "allreduce": trialenv.allreduce_probe(self.d, self.params)}
        trialstate.save(self, summary)
        return summary

    def summary_rows(self, status: RunStatus) -> list[dict]:
        return trial_rows(self.state, self.t, self.d.world_size, self.targets, status)


# ----------------------------------------------------------------------------------- driver
def write_trial_results(out: Location, trial: TrialSpec, runner: Trial, summary: dict,
                        env: dict) -> None:
    """Rank 0 writes the trial's curve and run rows; the run table, written last, marks the
    trial done. Both derive from the final checkpoint, so a rewrite after a restart produces
    the same bytes (S3 keys are create-only)."""
    ident = trial.model_dump(include={"trial_id", "batch_size", "lr_rule", "seed"})
    labels = {"optimizer": runner.settings.optimizer, "precision": runner.settings.precision}
    rows = [{**ident, **labels, **row} for row in runner.state.curve]
    curves_name, run_name = trial_files(trial.trial_id)
    out.put_table(curves_name, make_table("curves", rows, env))
    runs = summary_run_rows(summary)
    out.put_table(run_name, make_table("runs", [{**row, **labels} for row in runs], env))


def run_spec(spec: ConvergenceSpec) -> None:
    d = init_distributed(spec.training.workers)
    out = open_location(spec.out_dir)
    checkpoints = open_location(spec.checkpoint_dir)
    workload = workload_for_data(spec.training.workload, spec.data_dir)
    env = environment(run_id=spec.run_id, config_hash=spec.config_hash,
                      experiment=spec.experiment, workload=spec.training.workload,
                      device=d.device, world_size=d.world_size, variant=spec.variant)
    if workload.loop is not None:
        from batchscale.convergence.loop_runner import run_loop_spec

        run_loop_spec(spec, d, workload.loop, out, env)
        return
    data = load_data(spec.data_dir, workload)
    def start(trial: TrialSpec) -> Trial:
        return Trial(spec, trial, data, d, checkpoints, workload)

    def keep(trial: TrialSpec, runner: Trial, summary: dict) -> None:
        if d.is_main:
            write_trial_results(out, trial, runner, summary, env)
        barrier(d)

    def finished_curve(trial: TrialSpec) -> list[dict] | None:
        curves_name, run_name = trial_files(trial.trial_id)
        return out.get_table(curves_name).to_pylist() if out.exists(run_name) else None

    def log(message: str) -> None:
        if d.is_main:
            print(message, file=sys.stderr, flush=True)

    for group in halving.trial_groups(spec):
        if len(group) > 1:
            halving.run_group(group, spec.halving, finished_curve, start, keep, log)
            continue
        if not out.exists(trial_files(group[0].trial_id)[1]):
            runner = start(group[0])
            keep(group[0], runner, runner.run())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True,
                        help="trial spec JSON written by the launcher (path or s3:// URI)")
    args = parser.parse_args(argv)
    die_with_parent()  # a rank whose torchrun agent died stops too (batchscale/stopping.py)
    if restarted_after_user_error():  # a restart would only fail the same way again
        return UserCodeError.exit_code
    try:
        run_spec(read_spec(args.spec))
        if dist.is_initialized():  # the group is the spec's alone (cell_server keeps its own)
            dist.destroy_process_group()
    except UserCodeError as err:  # the launcher reads it back; no traceback, no restart
        write_error_file(err)  # first: the launcher then shows nothing printed after it
        log_traceback(err)
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    except BatchscaleError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    exit_at_once(main())  # a rank's results are durable by now (stopping.exit_at_once)
