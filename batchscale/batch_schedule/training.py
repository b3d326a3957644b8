"""One training run of the measurement, in this process on one device: the workload, optimizer,
LR rule and warm-up of the convergence settings, a batch size that may change from one step to
the next (the data stream reads on where the last batch ended), validation on a fixed subset,
and the gradient noise scale along the way. A run's whole state saves to one file and loads
back, so a branch starts exactly where the reference run was, and a killed run resumes."""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial

import torch

from batchscale.conditions import run_queue_wait_s
from batchscale.contract_check import CHECK_EXAMPLES, scalar_loss
from batchscale.convergence.noise import NoiseScale, grad_list, sq_norm
from batchscale.convergence.schedule import DataOrder, build_optimizer, lr_at, scaled_lr
from batchscale.convergence.usererror import UserCodeError, data_hint, is_user_error
from batchscale.datasplit import error_text, failure_of
from batchscale.errors import error_site
from batchscale.location import LocalLocation
from batchscale.metrics import METRICS
from batchscale.precision import autocast


@dataclass(frozen=True)
class Setup:
    """What every run of one measurement shares."""

    workload: object  # batchscale.workloads.Workload
    train: object  # datasplit.DatasetSplit of the workload's contract
    val: object  # the validation subset every evaluation uses
    settings: object  # convergence.spec.TrainingSettings
    lr_rule: str
    base_lr: float
    reference_batch: int
    device: str
    gns_every_steps: int | None

    def peak_lr(self, batch_size: int) -> float:
        return scaled_lr(self.lr_rule, self.base_lr, batch_size, self.reference_batch)


class Run:
    """A model and optimizer trained step by step at whatever batch size each step asks."""

    def __init__(self, setup: Setup, seed: int):
        self.setup, self.seed = setup, seed
        torch.manual_seed(seed)
        self.model = setup.train.contract.model().to(setup.device)
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = build_optimizer(self.params, setup.settings, setup.base_lr)
        self.order = DataOrder(len(setup.train), seed)
        self.step, self.examples, self.train_time_s = 0, 0, 0.0
        self.eval_time_s = 0.0  # device time spent evaluating: the measurement pays it too
        self.stream_start = 0  # examples seen when the current data stream began
        self.noise = NoiseScale()
        self.loss = setup.train.contract.loss
        self.autocast = partial(autocast, setup.device, setup.settings.precision)
        self.mark_conditions()

    def mark_conditions(self) -> None:
        """Start the span `cpu_wait_share` covers (a run's start, a branch's, a resume's)."""
        self._waited_from, self._cpu_from = run_queue_wait_s(), time.process_time()

    def cpu_wait_share(self) -> float | None:
        """Share of this process's runnable time spent waiting for a CPU since the mark (a busy
        machine: its timings are not the device's); None where the kernel does not say."""
        waited_now = run_queue_wait_s()
        if self._waited_from is None or waited_now is None:
            return None
        waited = max(0.0, waited_now - self._waited_from)
        runnable = waited + time.process_time() - self._cpu_from
        return waited / runnable if runnable > 0 else None

    def branch(self, seed: int) -> None:
        """Read the data from here on from a fresh stream (and reseed dropout): every branch of
        a checkpoint sees the same new examples in the same order, whatever its batch size."""
        torch.manual_seed(seed)
        self.seed = seed
        self.order = DataOrder(len(self.setup.train), seed)
        self.stream_start = self.examples
        self.mark_conditions()

    def train_step(self, batch_size: int) -> float:
        """One optimizer step on the next `batch_size` examples; the mean loss. Every
        `gns_every_steps`-th step also updates the noise scale from the batch's two halves.
        The workload's own code failing is bad input (UserCodeError), said in one line."""
        try:
            return self._train_step(batch_size)
        except Exception as err:
            self._fail_if_users(
                err, "Workload.loss (the model's forward and the loss)",
                f"training at batch size {batch_size}",
                "The model and the loss must accept every batch the data make (the check "
                f"before the runs uses a batch of {CHECK_EXAMPLES} examples only), and the "
                "loss must be one differentiable number", self.setup.train)
            raise

    def _train_step(self, batch_size: int) -> float:
        idx = self.order.rows_from(self.examples - self.stream_start, batch_size)
        every = self.setup.gns_every_steps
        noise = every is not None and self.step % every == 0 and batch_size >= 2
        parts = list(idx.tensor_split(2)) if noise else [idx]
        lr = lr_at(self.step, self.setup.peak_lr(batch_size), self.setup.settings.warmup_steps)
        for group in self.opt.param_groups:
            group["lr"] = lr
        began = time.perf_counter()
        self.opt.zero_grad(set_to_none=True)
        total, small_sq = 0.0, 0.0
        for i, part in enumerate(parts):
            weight = len(part) / batch_size
            with self.autocast():
                batch = self.setup.train.batch(part, self.setup.device)
                loss = scalar_loss(self.loss(self.model, batch))
            (loss * weight).backward()
            total += float(loss.detach()) * weight
            if noise and i == 0:
                small_sq = sq_norm(grad_list(self.params)) / weight**2
        if noise:
            self.noise.update(small_sq, sq_norm(grad_list(self.params)), len(parts[0]),
                              batch_size)
        self.opt.step()
        if self.setup.device.startswith("cuda"):
            torch.cuda.synchronize()
        self.train_time_s += time.perf_counter() - began
        self.step += 1
        self.examples += batch_size
        return total

    def evaluate(self) -> dict[str, float]:
        """The validation metrics on the fixed subset, keys as in the curves table
        (val_loss, val_accuracy, ...)."""
        began = time.perf_counter()
        try:
            values = self.setup.val.evaluate(self.model, self.setup.device, self.autocast)
        except Exception as err:
            contract = self.setup.val.contract
            size = contract.eval_batch_size
            self._fail_if_users(
                err, ("Workload.evaluate" if contract.evaluate is not None
                      else "Workload.loss (the model's forward and the loss, in evaluation)"),
                f"evaluating in batches of up to Workload.eval_batch_size={size}",
                f"The model must accept batches of up to eval_batch_size ({size}) examples in "
                "eval mode without gradients: lower Workload.eval_batch_size if it cannot",
                self.setup.val)
            raise
        self.eval_time_s += time.perf_counter() - began
        return {f"val_{name}": float(value) for name, value in values.items()}

    def _fail_if_users(self, err: Exception, member: str, doing: str, hint: str,
                       data) -> None:
        """Raise UserCodeError naming the member, the run (seed, step), what it was doing and
        the error where `err` is the workload's own failure; return otherwise (the caller
        re-raises a crash, an out-of-memory or batchscale's own error as it was)."""
        if not is_user_error(err):
            return
        failure, on = failure_of(err), ""
        if failure is not None:
            member, hint, on = failure.member, data_hint(data, failure), f" on {failure.where}"
        found = UserCodeError(
            f"workload {self.setup.train.contract.name!r}: {member} failed{on} in the batch "
            f"schedule's run from seed {self.seed} at step {self.step}, {doing}: "
            f"{error_text(err)}{error_site(err)}. {hint}")
        found.original = err
        raise found from None

    # -- state ------------------------------------------------------------------------------
    def save(self, directory: str, name: str, extra: dict) -> None:
        LocalLocation(directory).put_bytes(name, _to_bytes({
            "model": self.model.state_dict(), "optimizer": self.opt.state_dict(),
            "rng": torch.get_rng_state(), "step": self.step, "examples": self.examples,
            "train_time_s": self.train_time_s, "eval_time_s": self.eval_time_s,
            "noise": vars(self.noise), "extra": extra}))

    def load(self, directory: str, name: str) -> dict:
        """Load a saved state; returns its `extra`."""
        import io

        state = torch.load(io.BytesIO(LocalLocation(directory).get_bytes(name)),
                           map_location=self.setup.device, weights_only=True)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        self.step, self.examples = int(state["step"]), int(state["examples"])
        self.train_time_s = float(state["train_time_s"])
        self.eval_time_s = float(state["eval_time_s"])
        self.noise = NoiseScale(**state["noise"])
        return state["extra"]


def _to_bytes(state: dict) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(state, buffer)
    return buffer.getvalue()


def crossing(before: tuple[float, float], after: tuple[float, float], target: float) -> float:
    """Where a quantity reaches `target` between two evaluations (x, value), by linear
    interpolation; `after` reached it, `before` did not (or is the same point)."""
    (x0, v0), (x1, v1) = before, after
    if x1 == x0 or v1 == v0:
        return float(x1)
    share = min(1.0, max(0.0, (v0 - target) / (v0 - v1)))
    return float(x0 + share * (x1 - x0))


def reached(metric: str, value: float, target: float) -> bool:
    return METRICS[metric].reached(value, target)
