"""The `trial` a user's training loop gets (batchscale/loop.py): the trial's settings, a
batch sampler giving each rank its slice of the global batch, the DDP wrapper that measures the
gradient noise scale, and the two calls that connect the loop to batchscale (`report`,
`should_stop`). loop_runner.py judges the reports."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from batchscale.loop import LoopStop


class BatchSampler:
    """This rank's indices of each global batch, step after step, for a DataLoader's
    `batch_sampler`: the global order is a function of the seed and the step only (a fresh
    permutation per epoch), so the global batch is the same for any worker count."""

    def __init__(self, dataset_size: int, batch_size: int, seed: int, rank: int,
                 world_size: int, start_step: int = 0,
                 on_first_batch: Callable[[], None] = lambda: None):
        from batchscale.convergence.schedule import DataOrder

        self.order = DataOrder(dataset_size, seed)
        self.batch_size, self.start_step = batch_size, start_step
        self.local = batch_size // world_size
        self.offset = rank * self.local
        self.on_first_batch = on_first_batch

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start_step
        self.on_first_batch()
        while True:
            idx = self.order.batch(step, self.batch_size)
            yield idx[self.offset:self.offset + self.local].tolist()
            step += 1


class LoopTrial:
    """What `train(trial)` gets: the trial's settings, where to train, and the two calls that
    connect the loop to batchscale (`report`, `should_stop`)."""

    def __init__(self, spec, trial, d, targets: list, noise_every_steps: int | None,
                 on_report: Callable[[dict], str | None]):
        from batchscale.convergence.schedule import LrSchedule

        self._on_report = on_report
        self.trial_id: str = trial.trial_id
        self.batch_size: int = trial.batch_size
        """The global batch: every rank's batch together (x accumulation, if you accumulate)."""
        self.lr: float = trial.lr
        """The peak learning rate of this trial (the LR rule applied to the config's base LR)."""
        self.lr_rule: str = trial.lr_rule
        self.seed: int = trial.seed
        self.world_size: int = d.world_size
        self.rank: int = d.rank
        self.device: str = d.device
        """"cpu" or "cuda:<local rank>"."""
        self.local_batch_size: int = trial.batch_size // d.world_size
        self.max_steps: int = spec.training.max_steps
        self.eval_every_steps: int = spec.training.eval_every_steps
        self.targets = tuple((t.metric.name, t.value) for t in targets)
        self._schedule = LrSchedule.of(trial.lr, spec.training)
        self._noise_every = noise_every_steps
        self._noise = None
        self._eval_s = 0.0
        self._start = time.perf_counter()
        self._sampling = self._training = False
        self.gradient_bytes: int | None = None
        """What one gradient all-reduce of the loop's model carries, once `prepare` or
        `measure_noise` has seen the model (the planner's communication size)."""
        self._status: str | None = None

    # -- what the loop asks ------------------------------------------------------------------
    def lr_at(self, step: int) -> float:
        """The LR of optimizer step `step` (0-based) under the config's warm-up and decay."""
        return self._schedule.at(step)

    def batch_sampler(self, dataset_size: int, start_step: int = 0) -> BatchSampler:
        """A DataLoader `batch_sampler` giving this rank its slice of each global batch
        (`local_batch_size` indices), endlessly: stop when `should_stop()` says so."""
        self._sampling = True
        return BatchSampler(dataset_size, self.batch_size, self.seed, self.rank,
                            self.world_size, start_step, self.start_training)

    def _train_time_s(self) -> float:
        """Training time so far: since `start_training` (0 before it in a loop that draws its
        batches from `batch_sampler`, which calls it), else since `train` was called."""
        if self._sampling and not self._training:
            return 0.0
        return time.perf_counter() - self._start - self._eval_s

    def start_training(self) -> None:
        """Training time starts here (the first batch drawn from `batch_sampler` calls it):
        the loop's set-up before it (its data, its model, a first import) is paid once per
        trial, not per step, and would otherwise make the first trial of each process look
        several times slower per step. Later calls do nothing."""
        if not self._training:
            self._training = True
            self._sync()
            self._start, self._eval_s = time.perf_counter(), 0.0

    def prepare(self, model):
        """`model` on `device`; with more than one worker, wrapped in DistributedDataParallel
        with a communication hook that measures the gradient noise scale from the ranks' local
        gradients and the all-reduced one (`noise_comm_hook`)."""
        model = model.to(self.device)
        self._count_gradient(model)
        if self.world_size == 1:
            return model
        import torch

        ddp = torch.nn.parallel.DistributedDataParallel(model)
        self.measure_noise(ddp)
        return ddp

    def measure_noise(self, ddp) -> None:
        """Measure the gradient noise scale on a DistributedDataParallel your framework made (a
        Hugging Face Trainer's, Lightning's): the hook `prepare` registers. Call it before the
        first backward, on a DDP with no communication hook of its own (DDP takes one). Does
        nothing on one worker: B_simple needs two batch sizes, each rank's and the group's."""
        self._count_gradient(getattr(ddp, "module", ddp))
        if self.world_size == 1 or self._noise_every is None:  # gns_every_steps: null
            return
        import torch

        from batchscale.convergence.noise import NoiseScale

        if not isinstance(ddp, torch.nn.parallel.DistributedDataParallel):
            raise LoopStop(f"trial.measure_noise: got a {type(ddp).__name__}, not the "
                           "DistributedDataParallel that trains; pass the wrapped model (a "
                           "Trainer's `model_wrapped`, the `model` its training_step gets)")
        if self._noise is not None:
            raise LoopStop("trial.measure_noise: the noise scale is already measured on this "
                           "trial's model (trial.prepare registers the same hook); call one")
        self._noise = NoiseHook(NoiseScale(), self.world_size, self.local_batch_size,
                                self.batch_size, self._noise_every)
        ddp.register_comm_hook(self._noise, noise_comm_hook)

    def _count_gradient(self, model) -> None:
        from batchscale.convergence.trialenv import gradient_bytes

        params = getattr(model, "parameters", None)
        if callable(params):
            self.gradient_bytes = gradient_bytes([p for p in params() if p.requires_grad])

    @contextmanager
    def evaluating(self) -> Iterator[None]:
        """Time in this block (evaluation) is not training time."""
        self._sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._sync()
            self._eval_s += time.perf_counter() - start

    def report(self, step: int, metrics: dict[str, float], examples: int | None = None,
               lr: float | None = None) -> None:
        """Record an evaluation after `step` optimizer steps (`examples` default step x
        batch_size): the metrics by target name (val_accuracy, val_loss, train_loss, ...), and
        `lr`, the learning rate your optimizer used for the step (default `lr_at(step - 1)`:
        give it when your loop has its own schedule, so the curves table holds yours). Call it
        on every rank at the same steps; rank 0's metrics are recorded."""
        if self._status is not None:
            return  # already finished: the loop ran on past should_stop()
        self._sync()
        row = {"step": int(step), "examples_seen": int(examples if examples is not None
                                                        else step * self.batch_size),
               "train_time_s": self._train_time_s(),
               "metrics": {k: _number(k, v) for k, v in dict(metrics).items()},
               "lr": None if lr is None else _learning_rate(lr),
               "b_simple": self._noise.noise.b_simple if self._noise else None}
        self._status = self._on_report(row)

    def should_stop(self) -> bool:
        """True once the trial is finished (targets reached, diverged, stalled, out of steps,
        pruned, or a probe's noise scale measured): return from `train` then."""
        return self._status is not None

    # -- batchscale's side -------------------------------------------------------------------
    @property
    def status(self):
        """The trial's verdict (schemas.RunStatus) once finished, else None."""
        return self._status

    @property
    def noise(self):
        """The gradient noise scale measured by the DDP hook of `prepare` or `measure_noise`
        (None: not measured)."""
        return self._noise.noise if self._noise else None

    def _sync(self) -> None:
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.synchronize(self.device)


def _number(name: str, value: Any, what: str = "metric") -> float:
    """A metric's value as a float: a number, or a one-element tensor or array. Text is refused
    though float() would read it: "0.92" is a loop reporting the wrong thing."""
    if not isinstance(value, (str, bytes)):
        try:
            return float(value)
        except (TypeError, ValueError, RuntimeError):
            pass
    raise LoopStop(f"trial.report: {what} {name!r} is {type(value).__name__} {value!r}, not a "
                   "number (a Python or NumPy number, or a one-element tensor)")


def _learning_rate(value: Any) -> float:
    """`report(lr=...)` as a float: a finite number at or above 0 (a warm-up starts at 0)."""
    lr = _number("lr", value, what="argument")
    if not math.isfinite(lr) or lr < 0:
        raise LoopStop(f"trial.report: lr is {lr!r}; it must be a finite learning rate, 0 or "
                       "more (the one your optimizer used for the step)")
    return lr


class NoiseHook:
    """The state of the noise-measuring DDP communication hook: squared norms of each rank's
    local gradient (the small batch B/W) and of the all-reduced one (the big batch B), summed
    over the step's buckets, fed to the noise scale when the step's last bucket is reduced."""

    def __init__(self, noise, world_size: int, local_batch: int, global_batch: int,
                 every_steps: int):
        self.noise, self.world_size = noise, world_size
        self.local_batch, self.global_batch, self.every = local_batch, global_batch, every_steps
        self.step, self.local_sq, self.reduced_sq = 0, 0.0, 0.0

    @property
    def measuring(self) -> bool:
        return self.step % self.every == 0

    def bucket_done(self, local_sq: float | None, reduced_sq: float | None, last: bool) -> None:
        if local_sq is not None:
            self.local_sq += local_sq
            self.reduced_sq += reduced_sq
        if last:
            if self.measuring:
                # |G_small|^2 averaged over the ranks' local gradients: the same on every rank
                self.noise.update(self.local_sq, self.reduced_sq, self.local_batch,
                                  self.global_batch)
            self.step += 1
            self.local_sq = self.reduced_sq = 0.0


def noise_comm_hook(state: NoiseHook, bucket):
    """DDP's mean all-reduce of a gradient bucket; on measured steps also the mean over ranks of
    the bucket's local squared norm (one scalar beside it), and the all-reduced bucket's: W
    small-batch estimates per step, as a Workload's trial takes (convergence/train.py)."""
    import torch
    import torch.distributed as dist

    grads = bucket.buffer()
    measure = state.measuring
    local = grads.float().square().sum().reshape(1) if measure else None
    reduced_bucket = dist.all_reduce(grads.div_(state.world_size), async_op=True).get_future()
    if not measure:
        def counted(fut):
            state.bucket_done(None, None, bucket.is_last())
            return fut.value()[0]

        return reduced_bucket.then(counted)
    reduced_local = dist.all_reduce(local, async_op=True).get_future()

    def reduced(_):
        out = reduced_bucket.value()[0]
        state.bucket_done(float(reduced_local.value()[0][0]) / state.world_size,
                          float(out.float().square().sum()), bucket.is_last())
        return out

    return torch.futures.collect_all([reduced_bucket, reduced_local]).then(reduced)
