"""The public workload contract: what batchscale needs to know about *your* training.

    from batchscale import Workload

    def workload() -> Workload:
        return Workload(name="my-cnn", model=build_model, loss=loss,
                        train_data=lambda: MyDataset("train"), val_data=lambda: MyDataset("val"),
                        metrics=("val_loss", "val_accuracy"), evaluate=evaluate,
                        targets=(("val_accuracy", 0.9),))

and `batchscale sweep --workload mypkg.mymodule:workload` (or `workload: mypkg.mymodule:workload`
in a config). The sweep, the largest-batch search and the convergence trials (torchrun and
TrainJob) build the model, read the data and compute the loss only through these members, so
what they measure is your model, your data and your loss (docs/your-model.md).

Nothing here imports torch at module level: a config can name a workload without paying for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

Batch = Any
"""Whatever `collate` makes of a list of dataset items and `loss` takes: a tensor, a tuple, a
dict (e.g. a Hugging Face batch) or any nesting of them; batchscale moves its tensors to the
device and never looks inside."""


@dataclass(frozen=True)
class Workload:
    """A model, its data and its loss, as batchscale measures and trains them."""

    name: str
    """A short name for messages; result rows record the `--workload` spec that loaded it."""
    model: Callable[[], Any]
    """No-argument factory returning a fresh `torch.nn.Module` (random weights; every trial
    builds its own after seeding torch, so a factory without its own RNG is reproducible)."""
    loss: Callable[[Any, Batch], Any]
    """`loss(model, batch)`: the training objective as a finite scalar tensor (mean over the
    batch's examples). Your own loss: label smoothing, auxiliary terms, `outputs.loss`."""
    train_data: Callable[[], Sequence] | None = None
    """No-argument factory returning the training split as a map-style dataset (`__len__`,
    `__getitem__`, e.g. a `torch.utils.data.Dataset`). Items are read by index, a global batch
    at a time, so the dataset may load lazily from disk; nothing holds the whole split. A
    dataset with torch's batched `__getitems__(indices)` is read through it, one call per
    batch, and `collate` gets what it returns (the built-in workloads read rows that way); with
    a class attribute `getitems_takes_tensor = True` the indices come as the trainer's 1-D
    int64 tensor instead of a list (tens of µs per step: it matters at sub-millisecond steps)."""
    val_data: Callable[[], Sequence] | None = None
    """The validation split, like `train_data`; the validation metrics are computed on all
    of it at every evaluation."""
    collate: Callable[[list], Batch] | None = None
    """Turns a list of dataset items into a batch (on the CPU); default
    `torch.utils.data.default_collate` (tuples of tensors stacked per position). Data
    augmentation belongs in your dataset's `__getitem__` or here."""
    evaluate: Callable[[Any, Iterable[Batch]], dict[str, float]] | None = None
    """`evaluate(model, batches)`: the validation metrics over an iterable of batches (already
    on the device, the model in eval mode, no gradients), keys without the `val_` prefix, e.g.
    {"loss": 0.41, "accuracy": 0.88}. Default: {"loss": the example-weighted mean of `loss`}.
    Its "loss", when it returns one, is also what train_loss measures on a fixed training
    subset (one meaning of the loss for both splits)."""
    eval_batch_size: int = 256
    """Examples per batch when a split is evaluated (`evaluate`'s batches; the fixed training
    subset of train_loss too): as large as memory allows, it changes no metric."""
    metrics: tuple[str, ...] = ("val_loss",)
    """The validation metrics `evaluate` returns, as target names (`batchscale metrics`:
    val_loss, val_accuracy, val_perplexity, ...; their direction is known). `train_loss`, the
    loss on a fixed training subset, is always measured too."""
    targets: tuple[tuple[str, float], ...] = ()
    """The workload's default targets, e.g. (("val_accuracy", 0.9),): used when the config sets
    none (`convergence.targets`). Empty: a config must name one."""
    synthetic_batch: Callable[[int], Batch] | None = None
    """`synthetic_batch(batch_size)`: a batch of that many examples for the sweep's synthetic
    input (pure compute, no input pipeline). Default: real training examples, cycled to the
    batch size, collated once."""
    flops_per_sample: float | None = None
    """Training FLOPs per example (forward + backward), for MFU; default: counted by torch's
    FlopCounterMode on one step."""
    tokens_per_sample: int | None = None
    """Language models: tokens in one example, so throughput is also given in tokens/s."""
    description: str = ""
    """One line for `batchscale workloads` and the report."""


def is_contract(value: object) -> bool:
    """Whether `value` is a Workload of this contract."""
    return isinstance(value, Workload)


def default_collate(items: list) -> Batch:
    from torch.utils.data import default_collate as torch_collate

    return torch_collate(items)


def to_device(batch: Batch, device: str) -> Batch:
    """The batch with every tensor in it on `device` (containers rebuilt, other values kept)."""
    import torch

    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, dict):
        return type(batch)({k: to_device(v, device) for k, v in batch.items()})
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # a namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, list | tuple):
        return type(batch)(to_device(v, device) for v in batch)
    if hasattr(batch, "to") and callable(batch.to):  # e.g. transformers' BatchEncoding
        return batch.to(device)
    return batch
