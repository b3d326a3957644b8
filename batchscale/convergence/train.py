"""Training entry point for convergence trials: runs under `torchrun` locally and under
Kubeflow Trainer v2 on a cluster (both set RANK, WORLD_SIZE, MASTER_ADDR, ... in the env).

    torchrun --standalone --nproc-per-node=N train.py --spec spec.json

The spec (spec.py) lists trials (global batch size, LR rule, LR, seed); each trains with the
spec's optimizer (SGD+momentum or AdamW), LR schedule and precision (fp32, or bf16 autocast) to
a validation-accuracy target and rank 0 writes `trials/<trial_id>.{curves,run}.parquet`. Trials
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
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass, field
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from batchscale.conditions import run_queue_wait_s
from batchscale.convergence import checkpoint
from batchscale.convergence.distributed import Dist, all_reduce, barrier, init_distributed
from batchscale.convergence.noise import NoiseScale, grad_list, sq_norm
from batchscale.convergence.schedule import DataOrder, LrSchedule, build_optimizer
from batchscale.convergence.spec import ConvergenceSpec, TrialSpec, read_spec
from batchscale.envinfo import environment
from batchscale.errors import BadInput, BatchscaleError
from batchscale.location import Location, open_location
from batchscale.precision import autocast
from batchscale.schemas import RunStatus, make_table
from batchscale.shards import load_split
from batchscale.workloads import get_workload

EVAL_CHUNK_ROWS = 4096
# Fault-injection drill (tests, game days): the rank named by FAULT_KILL_RANK_ENV (default 0)
# SIGKILLs itself after the step named by FAULT_KILL_AT_STEP_ENV, on the group's first attempt
# only, so `torchrun --max-restarts` has something real to recover from.
FAULT_KILL_AT_STEP_ENV = "BATCHSCALE_FAULT_KILL_AT_STEP"
FAULT_KILL_RANK_ENV = "BATCHSCALE_FAULT_KILL_RANK"


# ---------------------------------------------------------------------------- fault drill
def maybe_inject_fault(step: int, rank: int) -> None:
    """The fault-injection drill (see FAULT_KILL_AT_STEP_ENV): SIGKILL, no cleanup, like an OOM
    kill or a lost node."""
    at = os.environ.get(FAULT_KILL_AT_STEP_ENV)
    if at is None or int(at) != step:
        return
    if rank == int(os.environ.get(FAULT_KILL_RANK_ENV, "0")) and \
            os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        print(f"fault drill: rank {rank} kills itself after step {step}", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


# ------------------------------------------------------------------------------ one trial
class CpuContention:
    """How long this process's threads waited for a CPU while the trial ran (the kernel's
    run-queue delay, conditions.run_queue_wait_s), as a share of their runnable time. A trial
    resumed from a checkpoint covers only its last segment. Evaluation and checkpoints are in
    the span: they run under the same conditions, and the share is about the machine, not the
    steps (docs/architecture.md, "Measurement rules")."""

    def __init__(self) -> None:
        self.wait_started = run_queue_wait_s()
        self.cpu_started = time.process_time()

    def share(self, d: Dist) -> float | None:
        """The worst share over the ranks (a collective: every rank calls it); None where the
        kernel does not report the wait."""
        wait_now = run_queue_wait_s()
        if self.wait_started is None or wait_now is None:
            local = -1.0  # unknown on this rank; the max over ranks keeps any known value
        else:
            waited = max(0.0, wait_now - self.wait_started)
            runnable = waited + (time.process_time() - self.cpu_started)
            local = waited / runnable if runnable > 0 else -1.0
        worst = all_reduce(torch.tensor([local], dtype=torch.float64), d,
                           dist.ReduceOp.MAX if d.world_size > 1 else None)
        value = float(worst[0])
        return value if value >= 0 else None


@dataclass
class TrialState:
    """The training loop's state: everything a resumed trial needs besides the model, the
    optimizer and the RNG (checkpoints store it by field name)."""

    step: int = 0
    train_time_s: float = 0.0
    first_loss: float | None = None
    loss_sum: float = 0.0
    loss_count: int = 0
    best_accuracy: float = -1.0
    evals_since_best: int = 0
    curve: list[dict] = field(default_factory=list)
    noise: NoiseScale = field(default_factory=NoiseScale)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrialState:
        return cls(**{**values, "noise": NoiseScale(**values["noise"])})


class Trial:
    def __init__(self, spec: ConvergenceSpec, trial: TrialSpec, data, d: Dist,
                 checkpoints: Location):
        self.spec, self.t, self.d, self.checkpoints = spec, trial, d, checkpoints
        self.settings = spec.training
        self.identity = spec.identity(trial)
        self.workload = get_workload(self.settings.workload)
        (self.x, self.y), (self.vx, self.vy) = data
        torch.manual_seed(trial.seed)
        model = self.workload.build().to(d.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if d.world_size > 1:
            model = torch.nn.parallel.DistributedDataParallel(model)
        self.model = model
        self.schedule = LrSchedule.of(trial.lr, self.settings)
        self.opt = build_optimizer(self.params, self.settings, trial.lr)
        # the trial's precision for a forward pass and loss (training and evaluation alike)
        self.autocast = partial(autocast, d.device, self.settings.precision)
        self.order = DataOrder(len(self.y), trial.seed)
        self.state = TrialState()
        self.finished: dict | None = None
        b, accumulation = trial.batch_size, self.settings.accumulation_steps
        if b % (d.world_size * accumulation):
            raise BadInput(f"batch size {b} is not divisible by {d.world_size} workers x "
                           f"{accumulation} accumulation steps")
        self.local_batch = b // d.world_size
        self.accumulation = accumulation

    # -- checkpoints --------------------------------------------------------------------------
    def save_checkpoint(self, summary: dict | None = None) -> None:
        """Rank 0 writes the step's checkpoint (or the final one, with the summary); all ranks
        wait, so no rank runs ahead of the newest durable state."""
        if self.d.is_main:
            tid = self.t.trial_id
            name = (checkpoint.final_name(tid) if summary
                    else checkpoint.step_name(tid, self.state.step))
            checkpoint.save(self.checkpoints, name, checkpoint.Checkpoint(
                identity=self.identity, trial_state=self.state.to_dict(),
                model=self._bare_model().state_dict(), optimizer=self.opt.state_dict(),
                rng=torch.get_rng_state(), summary=summary))
            checkpoint.drop_older(self.checkpoints, tid, keep=name)
        barrier(self.d)

    def maybe_resume(self) -> None:
        name = checkpoint.latest(self.checkpoints, self.t.trial_id)
        if name is None:
            return
        ckpt = checkpoint.load(self.checkpoints, name, self.identity, self.d.device)
        self._bare_model().load_state_dict(ckpt.model)
        self.opt.load_state_dict(ckpt.optimizer)
        torch.set_rng_state(ckpt.rng)
        self.state = TrialState.from_dict(ckpt.trial_state)
        self.finished = ckpt.summary
        self.log(f"resumed from {name} (step {self.state.step})")

    def _bare_model(self):
        return getattr(self.model, "module", self.model)

    # -- the loop -----------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        if self.d.is_main:
            print(f"[{self.t.trial_id}] {msg}", file=sys.stderr, flush=True)

    def local_indices(self, step: int) -> torch.Tensor:
        idx = self.order.batch(step, self.t.batch_size)
        return idx[self.d.rank * self.local_batch:(self.d.rank + 1) * self.local_batch]

    def _sync_context(self, last_micro: bool, manual_reduce: bool):
        """DDP all-reduces on the last micro-batch only (gradient accumulation), and never when
        the noise measurement needs the local gradient first."""
        if self.d.world_size > 1 and (manual_reduce or not last_micro):
            return self.model.no_sync()
        return contextlib.nullcontext()

    def train_step(self, step: int) -> float:
        """One optimizer step over the global batch; returns this rank's mean loss."""
        idx = self.local_indices(step)
        x, y = self.x[idx].to(self.d.device), self.y[idx].to(self.d.device)
        for group in self.opt.param_groups:
            group["lr"] = self.schedule.at(step)
        self.opt.zero_grad(set_to_none=True)
        measure = step % self.settings.gns_every_steps == 0
        ddp_noise = measure and self.d.world_size > 1
        # On one process the noise needs >= 2 micro-batches (the small batch); split if needed.
        local_noise = measure and self.d.world_size == 1 and len(y) >= 2
        parts = max(self.accumulation, 2) if local_noise else self.accumulation
        micro_sq, before, loss_value = [], None, 0.0
        xs, ys = ((x,), (y,)) if parts == 1 else (x.tensor_split(parts), y.tensor_split(parts))
        for i, (xb, yb) in enumerate(zip(xs, ys, strict=True)):
            weight = len(yb) / len(y)
            with self._sync_context(i == parts - 1, ddp_noise):
                with self.autocast():  # the forward and loss only; backward outside, as advised
                    loss = F.cross_entropy(self.model(xb), yb)
                (loss if parts == 1 else loss * weight).backward()
            loss_value += float(loss.detach()) * weight
            if local_noise:  # this micro-batch's mean gradient: (g_now - g_before) / weight
                grads = grad_list(self.params)
                delta = grads if before is None else torch._foreach_sub(grads, before)
                micro_sq.append(sq_norm(delta) / weight**2)
                before = [g.clone() for g in grads] if i < parts - 1 else None
        if ddp_noise:
            self._reduce_with_noise()
        elif local_noise:
            self.state.noise.update(sum(micro_sq) / parts, sq_norm(grad_list(self.params)),
                                    len(y) / parts, len(y))
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

    @torch.no_grad()
    def evaluate(self) -> float:
        model = self._bare_model()
        model.eval()
        correct = 0
        for xb, yb in zip(self.vx.split(EVAL_CHUNK_ROWS), self.vy.split(EVAL_CHUNK_ROWS),
                          strict=True):
            with self.autocast():
                logits = model(xb.to(self.d.device))
            correct += int((logits.argmax(1) == yb.to(self.d.device)).sum())
        model.train()
        return correct / len(self.vy)

    def record_eval(self) -> tuple[RunStatus | None, float]:
        """Evaluate (not timed), append a curve row; return (status if finished, accuracy)."""
        s = self.state
        loss_stats = all_reduce(torch.tensor([s.loss_sum, float(s.loss_count)],
                                             dtype=torch.float64), self.d)
        mean_loss = float(loss_stats[0] / max(loss_stats[1], 1.0))
        wall = all_reduce(torch.tensor([s.train_time_s], dtype=torch.float64), self.d,
                          dist.ReduceOp.MAX if self.d.world_size > 1 else None)
        acc = self.evaluate()
        s.curve.append({
            "step": s.step, "examples_seen": s.step * self.t.batch_size,
            "train_time_s": float(wall[0]), "train_loss": mean_loss, "val_accuracy": acc,
            "lr": self.schedule.at(max(s.step - 1, 0)),
            "b_simple": s.noise.b_simple,
        })
        s.loss_sum, s.loss_count = 0.0, 0
        if not math.isfinite(mean_loss) or (
                s.first_loss and mean_loss > self.settings.divergence_factor * s.first_loss):
            return RunStatus.DIVERGED, acc
        if acc >= self.settings.target_val_accuracy:
            return RunStatus.REACHED, acc
        s.best_accuracy, s.evals_since_best = (acc, 0) if acc > s.best_accuracy else (
            s.best_accuracy, s.evals_since_best + 1)
        if s.step >= self.settings.max_steps or s.evals_since_best >= self.settings.patience_evals:
            return RunStatus.NOT_REACHED, acc
        return None, acc

    def run(self) -> dict:
        self.maybe_resume()
        if self.finished is not None:
            return self.finished
        s = self.state
        sync = torch.cuda.synchronize if self.d.device.startswith("cuda") else (lambda: None)
        contention = CpuContention()
        status, acc = None, None
        if s.step == 0:
            status, acc = self.record_eval()  # the untrained model, step 0
        while status is None:
            sync()
            start = time.perf_counter()
            loss = self.train_step(s.step)
            sync()
            s.train_time_s += time.perf_counter() - start
            s.step += 1
            maybe_inject_fault(s.step, self.d.rank)
            if s.first_loss is None:
                s.first_loss = loss
            s.loss_sum += loss
            s.loss_count += 1
            if not math.isfinite(loss) and self.d.world_size == 1:
                status, acc = self.record_eval()
                status = RunStatus.DIVERGED
            elif s.step % self.settings.eval_every_steps == 0 or s.step >= self.settings.max_steps:
                status, acc = self.record_eval()
                if status is None and s.step % self.spec.checkpoint_every_steps == 0:
                    self.save_checkpoint()
        self.log(f"{status} at step {s.step} (val acc {acc:.3f}, {s.train_time_s:.2f} s)")
        summary = self.summary(status, acc)
        summary["cpu_wait_share"] = contention.share(self.d)
        self.save_checkpoint(summary)
        return summary

    def summary(self, status: RunStatus, acc: float) -> dict:
        """The trial's runs-table row (but `cpu_wait_share`, which `run` adds), of plain values
        (it is stored in the final checkpoint, which loads only plain containers)."""
        s, t = self.state, self.t
        reached = status == RunStatus.REACHED
        last = s.curve[-1]
        return {
            "trial_id": t.trial_id, "batch_size": t.batch_size, "lr_rule": t.lr_rule,
            "lr": t.lr, "seed": t.seed, "workers": self.d.world_size, "status": status.value,
            "steps_run": s.step, "steps_to_target": s.step if reached else None,
            "examples_to_target": s.step * t.batch_size if reached else None,
            "time_to_target_s": last["train_time_s"] if reached else None,
            "final_val_accuracy": acc, "target_val_accuracy": self.settings.target_val_accuracy,
            "b_simple": s.noise.b_simple, "train_time_s": last["train_time_s"],
        }


# ----------------------------------------------------------------------------------- driver
def trial_files(trial_id: str) -> tuple[str, str]:
    """Names of a trial's (curves, run) tables under the output location."""
    return f"trials/{trial_id}.curves.parquet", f"trials/{trial_id}.run.parquet"


def load_data(data_uri: str, input_shape: tuple[int, ...]):
    """(train, val) tensors of the dataset at `data_uri` (a directory or an s3:// prefix).
    Every rank holds the full, small split and slices each global batch by rank, so the global
    batch is identical for any worker count."""
    return (load_split(data_uri, "train", input_shape=input_shape),
            load_split(data_uri, "val", input_shape=input_shape))


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
    out.put_table(run_name, make_table("runs", [{**summary, **labels}], env))


def run_spec(spec: ConvergenceSpec) -> None:
    d = init_distributed(spec.training.workers)
    out = open_location(spec.out_dir)
    checkpoints = open_location(spec.checkpoint_dir)
    workload = get_workload(spec.training.workload)
    data = load_data(spec.data_dir, workload.input_shape)
    env = environment(run_id=spec.run_id, config_hash=spec.config_hash,
                      experiment=spec.experiment, workload=spec.training.workload,
                      device=d.device, world_size=d.world_size)
    for trial in spec.trials:
        if out.exists(trial_files(trial.trial_id)[1]):
            continue
        runner = Trial(spec, trial, data, d, checkpoints)
        summary = runner.run()
        if d.is_main:
            write_trial_results(out, trial, runner, summary, env)
        barrier(d)
    if dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True,
                        help="trial spec JSON written by the launcher (path or s3:// URI)")
    args = parser.parse_args(argv)
    try:
        run_spec(read_spec(args.spec))
    except BatchscaleError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
