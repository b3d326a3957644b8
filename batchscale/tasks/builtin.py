"""The built-in workloads expressed through the public contract (batchscale/contract.py).

A built-in workload (digits, torchvision classifiers, detectors, segmenters, byte language
models) is a `batchscale.Workload` like a user's: its model factory, its task module's loss and
`evaluate_batches`, the prepared dataset's rows as map-style datasets, its default target and a
synthetic batch. The sweep, the convergence trials (torchrun and TrainJob), the batch-size
schedule and the checks before them read it through those members only (docs/architecture.md,
"Workloads and tasks").

The rows are read a batch at a time through torch's batched `__getitems__`, so a built-in pays
one indexed read per batch, as before the contract, and not one Python call per example.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import numpy as np
import torch
from torch import nn

from batchscale import contract


class Rows:
    """Rows of a prepared dataset read together: a sequence of (features, label) items, as
    torch's `__getitems__` returns, that also keeps them stacked for `collate`."""

    def __init__(self, x: torch.Tensor, y: torch.Tensor):
        self.x, self.y = x, y

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class PreparedRows(torch.utils.data.Dataset):
    """A split of a prepared dataset (batchscale/shards.py: a tensor, or a large training split
    read row by row from a spill file) as a map-style dataset of (features, label) items."""

    getitems_takes_tensor = True
    """`__getitems__` takes the trainer's index tensor as it is (no list per step)."""

    def __init__(self, x, y: torch.Tensor):
        self.x, self.y = x, y  # x: a tensor or a shards.RowFile

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[[i]][0], self.y[i]

    def __getitems__(self, indices: Sequence[int] | torch.Tensor) -> Rows:
        if not isinstance(indices, torch.Tensor):
            # Through numpy: a third of torch.as_tensor's cost on a list of ints.
            indices = torch.from_numpy(np.asarray(indices, dtype=np.int64))
        return Rows(self.x[indices], self.y[indices])


def collate_with(to_batch):
    """The contract's `collate` for a task: (features, label) items -> `to_batch` on the CPU
    (the trainer moves the batch to its device)."""

    def collate(items) -> contract.Batch:
        if isinstance(items, Rows):
            return to_batch(items.x, items.y, "cpu")
        x = torch.stack([torch.as_tensor(x) for x, _ in items])
        y = torch.stack([torch.as_tensor(y) for _, y in items])
        return to_batch(x, y, "cpu")

    return collate


@contextlib.contextmanager
def kept_modes(model: nn.Module) -> Iterator[None]:
    """Restore every submodule's train/eval flag on exit, exactly as it was (a model whose
    parts are in different modes stays that way; `model.train(flag)` would flatten it)."""
    modes = [(module, module.training) for module in model.modules()]
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def evaluate_rows(model, x, y, device: str, autocast, chunk_rows: int, *, to_batch,
                  evaluate_batches) -> dict[str, float]:
    """A task's `evaluate_batches` over whole rows (x, y) in chunks of `chunk_rows`, in eval
    mode without gradients (the model's modes kept): what the trainer's split does, for rows
    held in memory."""
    x = torch.as_tensor(x)
    labels = y if y is not None else torch.zeros(len(x), dtype=torch.long)
    batches = (to_batch(xb, yb, device)
               for xb, yb in zip(x.split(chunk_rows), labels.split(chunk_rows), strict=True))
    with kept_modes(model), torch.no_grad(), autocast():
        model.eval()
        return evaluate_batches(model, batches)


def as_contract(workload, data_uri: str | None = None) -> contract.Workload:
    """The built-in `workload` (batchscale/workloads.py) as a contract Workload; with
    `data_uri`, its training and validation data are the prepared dataset there (the training
    split streamed when large, the validation split in memory)."""
    from batchscale.metrics import TASK_DEFAULT_TARGETS, TASK_METRICS

    task = workload.task
    train_data = val_data = None
    if data_uri is not None:
        train_data, val_data = (_rows_factory(workload, data_uri, split) for split in SPLITS)
    return contract.Workload(
        name=workload.name, model=workload.build, loss=task.loss,
        train_data=train_data, val_data=val_data, collate=collate_with(task.to_batch),
        evaluate=task.evaluate_batches,
        eval_batch_size=task.eval_rows(workload.example_shape),
        metrics=tuple(m for m in TASK_METRICS[workload.kind] if m != "train_loss"),
        targets=(TASK_DEFAULT_TARGETS[workload.kind],),
        synthetic_batch=lambda batch_size: workload.builtin_synthetic_batch(batch_size, "cpu"),
        tokens_per_sample=workload.tokens_per_sample, description=workload.description)


SPLITS = ("train", "val")


def _rows_factory(workload, data_uri: str, split: str):
    from batchscale.shards import load_split

    shape = None if workload.shape_from_data else workload.example_shape

    def rows() -> PreparedRows:
        # The training split is streamed when large; the validation split is held in memory.
        return PreparedRows(*load_split(data_uri, split, input_shape=shape,
                                        stream=split == "train"))

    return rows
