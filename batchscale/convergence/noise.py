"""The gradient noise scale B_simple, measured during training from squared gradient norms."""

from __future__ import annotations

from dataclasses import dataclass

import torch

GNS_EMA_BETA = 0.99


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


def grad_list(params) -> list[torch.Tensor]:
    return [p.grad for p in params if p.grad is not None]


def sq_norm(tensors: list[torch.Tensor]) -> float:
    """Sum of squared entries over a list of tensors, in a few fused kernels (the noise scale
    is measured during training, so its cost shows in samples/s)."""
    return float(torch.stack(torch._foreach_norm(tensors)).float().square().sum())
