"""What a trial sees at each step, as pure functions of the step: the learning rate (scaling
rule and warm-up) and the global batch's rows. A resumed trial therefore continues exactly as
an uninterrupted one."""

from __future__ import annotations

import math

import torch

from batchscale.errors import BadInput


def scaled_lr(rule: str, base_lr: float, batch_size: int, reference_batch: int) -> float:
    """Peak LR of a rule: constant, linear (Goyal et al. 2017), or square-root scaling. The
    `grid` rule has no single LR: its trials take theirs from the config's `lr_grid`."""
    ratio = batch_size / reference_batch
    scales = {"constant": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}
    if rule not in scales:
        raise BadInput(f"lr_rule: no scaling rule {rule!r}; allowed: {', '.join(scales)} "
                       "(or grid, whose LRs come from lr_grid)")
    return base_lr * scales[rule]


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
