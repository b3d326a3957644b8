"""Compute precision, the same way in the sweep and in the convergence runs."""

import contextlib

PRECISIONS = ("fp32", "bf16")


def autocast(device: str, precision: str):
    """bf16 autocast for the forward pass and loss, or no context at all for fp32 (even a
    disabled torch.autocast costs microseconds per step, a few per cent of a small model's
    step). Parameters stay fp32, so gradients and optimizer state do too."""
    import torch

    from batchscale.errors import BadInput

    if precision == "fp32":
        return contextlib.nullcontext()
    if precision == "bf16":
        return torch.autocast(device_type=device.split(":")[0], dtype=torch.bfloat16)
    raise BadInput(f"precision: no precision {precision!r}; allowed: {', '.join(PRECISIONS)}")
