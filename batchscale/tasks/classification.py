"""Image and feature classification: dataset rows are the inputs, labels the classes.

The task interface (shared by every module in batchscale/tasks; docs/architecture.md,
"Workloads and tasks"): `to_batch` turns dataset rows into what `loss` takes, `loss` is the
training objective, `evaluate` gives the validation metrics over a whole split.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

EVAL_CHUNK_ROWS = 4096


def to_batch(x: torch.Tensor, y: torch.Tensor, device: str):
    return x.to(device), y.to(device)


def loss(model, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


@torch.no_grad()
def evaluate(model, x: torch.Tensor, y: torch.Tensor, device: str, autocast) -> dict[str, float]:
    """{"loss": mean cross-entropy in nats per example, "accuracy": share right} over (x, y),
    in chunks; the model's train/eval mode is restored."""
    was_training = model.training
    model.eval()
    correct, loss_sum = 0, 0.0
    for xb, yb in zip(x.split(EVAL_CHUNK_ROWS), y.split(EVAL_CHUNK_ROWS), strict=True):
        xb, yb = xb.to(device), yb.to(device)
        with autocast():
            logits = model(xb)
        logits = logits.float()
        loss_sum += float(F.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    model.train(was_training)
    return {"loss": loss_sum / len(y), "accuracy": correct / len(y)}
