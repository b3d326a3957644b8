"""How a trial optimizes: the optimizer and the compute precision its settings name, and what
it sees at each step as pure functions of the step: the learning rate (scaling rule, warm-up,
decay) and the global batch's rows. A resumed trial therefore continues exactly as an
uninterrupted one (the optimizer's own state travels in the checkpoint)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from batchscale.errors import BadInput

OPTIMIZERS = ("sgd", "adamw")
LR_DECAYS = ("none", "cosine", "linear")


def scaled_lr(rule: str, base_lr: float, batch_size: int, reference_batch: int) -> float:
    """Peak LR of a rule: constant, linear (Goyal et al. 2017), or square-root scaling. The
    `tuned` rule has no single LR: its trials take theirs from the config's `lr_candidates`."""
    ratio = batch_size / reference_batch
    scales = {"constant": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}
    if rule not in scales:
        raise BadInput(f"lr_rule: no scaling rule {rule!r}; allowed: {', '.join(scales)} "
                       "(or tuned, whose LRs come from lr_candidates)")
    return base_lr * scales[rule]


def lr_at(step: int, peak_lr: float, warmup_steps: int, decay: str = "none",
          decay_steps: int | None = None, min_lr_ratio: float = 0.0) -> float:
    """The LR of optimizer step `step` (0-based): linear warm-up to the peak over
    `warmup_steps` (step warmup_steps - 1 is the first at the peak), then the peak (decay
    none), or a cosine or linear decay from the peak at step `warmup_steps` to
    `min_lr_ratio` x peak at step `decay_steps`, constant after it."""
    if warmup_steps and step < warmup_steps:
        return peak_lr * (step + 1) / warmup_steps
    if decay == "none":
        return peak_lr
    if decay not in LR_DECAYS:
        raise BadInput(f"lr_decay: no decay {decay!r}; allowed: {', '.join(LR_DECAYS)}")
    if decay_steps is None or decay_steps <= warmup_steps:
        raise BadInput(f"decay_steps: {decay_steps} must be larger than warmup_steps "
                       f"{warmup_steps} for the {decay} decay")
    progress = min(1.0, (step - warmup_steps) / (decay_steps - warmup_steps))
    left = 0.5 * (1.0 + math.cos(math.pi * progress)) if decay == "cosine" else 1.0 - progress
    return peak_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * left)


@dataclass(frozen=True)
class LrSchedule:
    """One trial's learning rate at every step (lr_at with the trial's settings)."""

    peak_lr: float
    warmup_steps: int
    decay: str = "none"
    decay_steps: int | None = None
    min_lr_ratio: float = 0.0

    @classmethod
    def of(cls, peak_lr: float, settings) -> LrSchedule:
        """The schedule of a trial at `peak_lr` under `settings` (spec.TrainingSettings)."""
        return cls(peak_lr, settings.warmup_steps, settings.lr_decay, settings.decay_steps,
                   settings.min_lr_ratio)

    def at(self, step: int) -> float:
        return lr_at(step, self.peak_lr, self.warmup_steps, self.decay, self.decay_steps,
                     self.min_lr_ratio)


def build_optimizer(params: list[torch.nn.Parameter], settings, lr: float) -> torch.optim.Optimizer:
    """The optimizer `settings` (spec.TrainingSettings) name, over fp32 parameters. Its LR is
    set before every step from the schedule; `lr` is only the starting value."""
    name = settings.optimizer
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=settings.momentum,
                               weight_decay=settings.weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(settings.adam_beta1, settings.adam_beta2),
                                 eps=settings.adam_eps, weight_decay=settings.weight_decay)
    raise BadInput(f"optimizer: no optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")



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
        return self.rows_from(step * batch_size, batch_size)

    def rows_from(self, start: int, count: int) -> torch.Tensor:
        """`count` row indices from position `start` of the endless stream of epochs: a run
        whose batch size changes reads on where the last batch ended."""
        epoch, offset = divmod(start, self.rows)
        if offset + count <= self.rows:  # within one epoch (most steps): a view, no copy
            return self._perm(epoch)[offset:offset + count]
        parts, pos = [], start
        while pos < start + count:
            epoch, offset = divmod(pos, self.rows)
            take = min(self.rows - offset, start + count - pos)
            parts.append(self._perm(epoch)[offset:offset + take])
            pos += take
        return torch.cat(parts)
