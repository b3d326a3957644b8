"""Training entry point for convergence trials: runs under `torchrun` locally and under
Kubeflow Trainer v2 on a cluster (both set RANK, WORLD_SIZE, MASTER_ADDR, ... in the env).

    torchrun --standalone --nproc-per-node=N train.py --spec spec.json

The spec lists trials (global batch size, LR rule, LR, seed); each trains with SGD+momentum to
a validation-accuracy target and rank 0 writes `trials/<trial_id>.{curves,run}.parquet`.
Trials whose result files exist are skipped, and each trial checkpoints atomically every N
steps, so a restarted group (torchrun --max-restarts) resumes where it stopped and reaches the
target at exactly the same step as an uninterrupted run (data order is a function of the step).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from batchscale.components.data_prep.loader import load_split

from batchscale.envinfo import environment
from batchscale.errors import BadInput, BatchscaleError
from batchscale.schemas import make_table
from batchscale.storage import write_table_atomic
from batchscale.workloads import get_workload

GNS_EMA_BETA = 0.99


# ---------------------------------------------------------------------------------- plumbing
@dataclass(frozen=True)
class Dist:
    rank: int
    world_size: int
    device: str

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(expected_world_size: int) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != expected_world_size:
        # Elastic shrink would silently change the global batch: refuse instead.
        raise BatchscaleError(
            f"world size is {world} but the spec asks for {expected_world_size} workers; "
            "refusing to continue with a different global batch")
    rank = int(os.environ.get("RANK", "0"))
    use_cuda = torch.cuda.is_available()
    device = f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}" if use_cuda else "cpu"
    if use_cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
    return Dist(rank, world, device)


def all_reduce(value: torch.Tensor, d: Dist, op=None) -> torch.Tensor:
    if d.world_size > 1:
        dist.all_reduce(value, op=op or dist.ReduceOp.SUM)
    return value


def barrier(d: Dist) -> None:
    if d.world_size > 1:
        dist.barrier()


# ------------------------------------------------------------------------------ the schedule
def scaled_lr(rule: str, base_lr: float, batch_size: int, reference_batch: int) -> float:
    """Peak LR of a rule: constant, linear (Goyal et al. 2017), or square-root scaling."""
    ratio = batch_size / reference_batch
    scale = {"constant": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[rule]
    return base_lr * scale


def lr_at(step: int, peak_lr: float, warmup_steps: int) -> float:
    """Linear warm-up to the peak over `warmup_steps`, then constant."""
    if warmup_steps and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    return peak_lr


class DataOrder:
    """Global batch indices as a pure function of (seed, step): a fresh permutation per epoch,
    batches crossing epoch boundaries. Resuming at step s therefore sees the same data."""

    def __init__(self, rows: int, seed: int):
        self.rows = rows
        self.seed = seed
        self._perms: dict[int, torch.Tensor] = {}

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            gen = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            # Keep only the epochs a batch can straddle: the previous one and this one.
            self._perms = {e: p for e, p in self._perms.items() if e == epoch - 1}
            self._perms[epoch] = torch.randperm(self.rows, generator=gen)
        return self._perms[epoch]

    def batch(self, step: int, batch_size: int) -> torch.Tensor:
        start = step * batch_size
        parts, pos = [], start
        while pos < start + batch_size:
            epoch, offset = divmod(pos, self.rows)
            take = min(self.rows - offset, start + batch_size - pos)
            parts.append(self._perm(epoch)[offset:offset + take])
            pos += take
        return torch.cat(parts)


# --------------------------------------------------------------------- gradient noise scale
@dataclass
class NoiseScale:
    """B_simple = tr(Sigma) / |G|^2 (McCandlish et al. 2018, App. A) from squared gradient norms
    at a small and a big batch, as a ratio of bias-corrected EMAs (not an average of ratios)."""

    g2_ema: float = 0.0
    trace_ema: float = 0.0
    updates: int = 0

    def update(self, small_sq: float, big_sq: float, b_small: float, b_big: float) -> None:
        g2 = (b_big * big_sq - b_small * small_sq) / (b_big - b_small)
        trace = (small_sq - big_sq) / (1.0 / b_small - 1.0 / b_big)
        self.g2_ema = GNS_EMA_BETA * self.g2_ema + (1 - GNS_EMA_BETA) * g2
        self.trace_ema = GNS_EMA_BETA * self.trace_ema + (1 - GNS_EMA_BETA) * trace
        self.updates += 1

    @property
    def b_simple(self) -> float | None:
        if not self.updates:
            return None
        correction = 1 - GNS_EMA_BETA**self.updates
        g2, trace = self.g2_ema / correction, self.trace_ema / correction
        return trace / g2 if g2 > 0 else None


def _grad_sq_norm(params) -> float:
    return float(sum(p.grad.detach().float().pow(2).sum() for p in params if p.grad is not None))


# ------------------------------------------------------------------------------ one trial
@dataclass
class TrialState:
    step: int = 0
    train_time_s: float = 0.0
    first_loss: float | None = None
    loss_sum: float = 0.0
    loss_count: int = 0
    best_accuracy: float = -1.0
    evals_since_best: int = 0
    curve: list[dict] = field(default_factory=list)
    noise: NoiseScale = field(default_factory=NoiseScale)


class Trial:
    def __init__(self, spec: dict, trial: dict, data, d: Dist):
        self.spec, self.t, self.d = spec, trial, d
        self.workload = get_workload(spec["workload"])
        (self.x, self.y), (self.vx, self.vy) = data
        torch.manual_seed(trial["seed"])
        model = self.workload.build().to(d.device)
        self.params = [p for p in model.parameters() if p.requires_grad]
        if d.world_size > 1:
            model = torch.nn.parallel.DistributedDataParallel(model)
        self.model = model
        self.opt = torch.optim.SGD(self.params, lr=trial["lr"], momentum=spec["momentum"])
        self.order = DataOrder(len(self.y), trial["seed"])
        self.state = TrialState()
        b = trial["batch_size"]
        if b % d.world_size:
            raise BadInput(f"batch size {b} is not divisible by {d.world_size} workers")
        self.local_batch = b // d.world_size

    # -- checkpoints --------------------------------------------------------------------------
    @property
    def ckpt_path(self) -> Path:
        return Path(self.spec["out_dir"]) / "checkpoints" / f"{self.t['trial_id']}.pt"

    def save_checkpoint(self) -> None:
        if self.d.is_main:
            s = self.state
            payload = {
                "trial": self.t, "world_size": self.d.world_size, "step": s.step,
                "train_time_s": s.train_time_s, "first_loss": s.first_loss, "curve": s.curve,
                "best": [s.best_accuracy, s.evals_since_best],
                "noise": [s.noise.g2_ema, s.noise.trace_ema, s.noise.updates],
                "model": self._bare_model().state_dict(), "opt": self.opt.state_dict(),
            }
            self.ckpt_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.ckpt_path.with_suffix(".tmp")
            torch.save(payload, tmp)
            os.replace(tmp, self.ckpt_path)  # readers see the old or the new file, never half
        barrier(self.d)

    def maybe_resume(self) -> None:
        if not self.ckpt_path.exists():
            return
        payload = torch.load(self.ckpt_path, map_location=self.d.device, weights_only=True)
        if payload["trial"] != self.t or payload["world_size"] != self.d.world_size:
            raise BadInput(
                f"checkpoint {self.ckpt_path} does not match this trial's config "
                f"(stored {payload['trial']} with {payload['world_size']} workers); "
                "remove it or use a new output directory")
        self._bare_model().load_state_dict(payload["model"])
        self.opt.load_state_dict(payload["opt"])
        s = self.state
        s.step, s.train_time_s, s.first_loss = payload["step"], payload["train_time_s"], \
            payload["first_loss"]
        s.curve = list(payload["curve"])
        s.best_accuracy, s.evals_since_best = payload["best"]
        s.noise = NoiseScale(*payload["noise"])
        self.log(f"resumed from step {s.step}")

    def _bare_model(self):
        return getattr(self.model, "module", self.model)

    # -- the loop -----------------------------------------------------------------------------
    def log(self, msg: str) -> None:
        if self.d.is_main:
            print(f"[{self.t['trial_id']}] {msg}", file=sys.stderr, flush=True)

    def local_indices(self, step: int) -> torch.Tensor:
        idx = self.order.batch(step, self.t["batch_size"])
        return idx[self.d.rank * self.local_batch:(self.d.rank + 1) * self.local_batch]

    def train_step(self, step: int) -> float:
        idx = self.local_indices(step)
        x, y = self.x[idx].to(self.d.device), self.y[idx].to(self.d.device)
        for group in self.opt.param_groups:
            group["lr"] = lr_at(step, self.t["lr"], self.spec["warmup_steps"])
        self.opt.zero_grad(set_to_none=True)
        measure_noise = step % self.spec["gns_every_steps"] == 0
        if measure_noise and self.d.world_size > 1:
            loss = self._ddp_step_with_noise(x, y)
        elif measure_noise and len(y) >= 2:
            loss = self._split_step_with_noise(x, y)
        else:
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
        self.opt.step()
        return float(loss)

    def _split_step_with_noise(self, x, y) -> torch.Tensor:
        """One process: two half-batch backward passes accumulate the full-batch gradient;
        their separate norms give |G_small|^2 at B/2 and the sum gives |G_big|^2 at B."""
        half = len(y) // 2
        losses = []
        snapshot = None
        for part in (slice(0, half), slice(half, len(y))):
            weight = (part.stop - part.start) / len(y)
            loss = F.cross_entropy(self.model(x[part]), y[part])
            (loss * weight).backward()
            losses.append(loss.detach() * weight)
            if snapshot is None:
                snapshot = [p.grad.detach().clone() for p in self.params]
        first_sq = sum(float((g / 0.5).pow(2).sum()) for g in snapshot)
        second_sq = sum(float(((p.grad - g) / 0.5).pow(2).sum())
                        for p, g in zip(self.params, snapshot, strict=True))
        big_sq = _grad_sq_norm(self.params)
        self.state.noise.update((first_sq + second_sq) / 2, big_sq, len(y) / 2, len(y))
        return sum(losses)

    def _ddp_step_with_noise(self, x, y) -> torch.Tensor:
        """DDP: each rank's local gradient (before all-reduce) is the small batch B/W; the
        all-reduced mean is the big batch B."""
        with self.model.no_sync():
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
        local_sq = torch.tensor([_grad_sq_norm(self.params)])
        all_reduce(local_sq, self.d)
        for p in self.params:
            all_reduce(p.grad, self.d)
            p.grad /= self.d.world_size
        big_sq = _grad_sq_norm(self.params)
        self.state.noise.update(float(local_sq) / self.d.world_size, big_sq,
                                self.local_batch, self.t["batch_size"])
        return loss

    @torch.no_grad()
    def evaluate(self) -> float:
        model = self._bare_model()
        model.eval()
        correct = 0
        for xb, yb in zip(self.vx.split(4096), self.vy.split(4096), strict=True):
            correct += int((model(xb.to(self.d.device)).argmax(1) == yb.to(self.d.device)).sum())
        model.train()
        return correct / len(self.vy)

    def record_eval(self) -> tuple[str | None, float]:
        """Evaluate (not timed), append a curve row; return (status if finished, accuracy)."""
        s = self.state
        loss_stats = all_reduce(torch.tensor([s.loss_sum, float(s.loss_count)],
                                             dtype=torch.float64), self.d)
        mean_loss = float(loss_stats[0] / max(loss_stats[1], 1.0))
        wall = all_reduce(torch.tensor([s.train_time_s], dtype=torch.float64), self.d,
                          dist.ReduceOp.MAX if self.d.world_size > 1 else None)
        acc = self.evaluate()
        s.curve.append({
            "step": s.step, "examples_seen": s.step * self.t["batch_size"],
            "train_time_s": float(wall[0]), "train_loss": mean_loss, "val_accuracy": acc,
            "lr": lr_at(max(s.step - 1, 0), self.t["lr"], self.spec["warmup_steps"]),
            "b_simple": s.noise.b_simple,
        })
        s.loss_sum, s.loss_count = 0.0, 0
        if not math.isfinite(mean_loss) or (
                s.first_loss and mean_loss > self.spec["divergence_factor"] * s.first_loss):
            return "diverged", acc
        if acc >= self.spec["target_val_accuracy"]:
            return "reached", acc
        s.best_accuracy, s.evals_since_best = (acc, 0) if acc > s.best_accuracy else (
            s.best_accuracy, s.evals_since_best + 1)
        if s.step >= self.spec["max_steps"] or s.evals_since_best >= self.spec["patience_evals"]:
            return "not_reached", acc
        return None, acc

    def run(self) -> dict:
        self.maybe_resume()
        s = self.state
        sync = torch.cuda.synchronize if self.d.device.startswith("cuda") else (lambda: None)
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
            if s.first_loss is None:
                s.first_loss = loss
            s.loss_sum += loss
            s.loss_count += 1
            if not math.isfinite(loss) and self.d.world_size == 1:
                status, acc = self.record_eval()
                status = "diverged"
            elif s.step % self.spec["eval_every_steps"] == 0 or s.step >= self.spec["max_steps"]:
                status, acc = self.record_eval()
                if status is None and s.step % self.spec["checkpoint_every_steps"] == 0:
                    self.save_checkpoint()
        self.log(f"{status} at step {s.step} (val acc {acc:.3f}, {s.train_time_s:.2f} s)")
        return self.summary(status, acc)

    def summary(self, status: str, acc: float) -> dict:
        s, t = self.state, self.t
        reached = status == "reached"
        last = s.curve[-1]
        return {
            "trial_id": t["trial_id"], "batch_size": t["batch_size"], "lr_rule": t["lr_rule"],
            "lr": t["lr"], "seed": t["seed"], "workers": self.d.world_size, "status": status,
            "steps_run": s.step, "steps_to_target": s.step if reached else None,
            "examples_to_target": s.step * t["batch_size"] if reached else None,
            "time_to_target_s": last["train_time_s"] if reached else None,
            "final_val_accuracy": acc, "target_val_accuracy": self.spec["target_val_accuracy"],
            "b_simple": s.noise.b_simple, "train_time_s": last["train_time_s"],
        }


# ----------------------------------------------------------------------------------- driver
def trial_files(out_dir: Path, trial_id: str) -> tuple[Path, Path]:
    base = out_dir / "trials"
    return base / f"{trial_id}.curves.parquet", base / f"{trial_id}.run.parquet"


def run_spec(spec: dict) -> None:
    d = init_distributed(spec["workers"])
    out_dir = Path(spec["out_dir"])
    (out_dir / "trials").mkdir(parents=True, exist_ok=True)
    workload = get_workload(spec["workload"])
    # Every rank holds the full (small) split and slices each global batch by rank, so the
    # global batch is identical for any worker count.
    data = (load_split(spec["data_dir"], "train", input_shape=workload.input_shape),
            load_split(spec["data_dir"], "val", input_shape=workload.input_shape))
    env = environment(run_id=spec["run_id"], config_hash=spec["config_hash"],
                      experiment=spec["experiment"], workload=spec["workload"],
                      device=d.device, world_size=d.world_size)
    for trial in spec["trials"]:
        curves_path, run_path = trial_files(out_dir, trial["trial_id"])
        if run_path.exists():
            continue
        runner = Trial(spec, trial, data, d)
        summary = runner.run()
        if d.is_main:
            ident = {k: trial[k] for k in ("trial_id", "batch_size", "lr_rule", "seed")}
            rows = [{**ident, **row} for row in runner.state.curve]
            write_table_atomic(curves_path, make_table("curves", rows, env))
            write_table_atomic(run_path, make_table("runs", [summary], env))
            runner.ckpt_path.unlink(missing_ok=True)
        barrier(d)
    if dist.is_initialized():
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", required=True, help="trial spec JSON written by the launcher")
    args = parser.parse_args(argv)
    try:
        run_spec(json.loads(Path(args.spec).read_text()))
    except BatchscaleError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
