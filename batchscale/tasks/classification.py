"""Image and feature classification: dataset rows are the inputs, labels the classes.

The task interface (shared by every module in batchscale/tasks; docs/architecture.md,
"Workloads and tasks"): `to_batch` turns dataset rows into what `loss` takes, `loss` is the
training objective, `evaluate_batches` gives the validation metrics over a split's batches and
`eval_rows` how many rows one such batch holds. batchscale/tasks/builtin.py makes a built-in
workload of them through the public contract.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from batchscale.errors import BadInput
from batchscale.tasks.builtin import evaluate_rows

EVAL_CHUNK_ROWS = 4096


def to_batch(x: torch.Tensor, y: torch.Tensor, device: str):
    return x.to(device), y.to(device)


def loss(model, batch) -> torch.Tensor:
    x, y = batch
    return F.cross_entropy(model(x), y)


def eval_rows(example_shape: tuple[int, ...]) -> int:
    del example_shape
    return EVAL_CHUNK_ROWS


def evaluate_batches(model, batches) -> dict[str, float]:
    """{"loss": mean cross-entropy in nats per example, "accuracy": share right} over the
    batches (the model in eval mode, no gradients: the caller's)."""
    correct, loss_sum, rows = 0, 0.0, 0
    for x, y in batches:
        logits = model(x).float()
        loss_sum += float(F.cross_entropy(logits, y, reduction="sum"))
        correct += int((logits.argmax(1) == y).sum())
        rows += len(y)
    if rows == 0:
        raise BadInput("classification evaluate: the split has no rows")
    return {"loss": loss_sum / rows, "accuracy": correct / rows}


def evaluate(model, x: torch.Tensor, y: torch.Tensor, device: str, autocast) -> dict[str, float]:
    """`evaluate_batches` over whole rows (x, y); the model's train/eval mode is restored."""
    return evaluate_rows(model, x, y, device, autocast, EVAL_CHUNK_ROWS, to_batch=to_batch,
                         evaluate_batches=evaluate_batches)
