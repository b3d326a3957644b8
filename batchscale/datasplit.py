"""A split of a workload's data as the trainer and the sweep read it: items by index, made into
a batch on the device, and the split's metrics.

Every workload comes through the public contract (batchscale/contract.py): a user's own
map-style dataset, or a built-in's prepared rows (batchscale/tasks/builtin.py). Items are read a
global batch at a time (through torch's batched `__getitems__` where the dataset has one), so
only the rows a rank trains on are ever read. The trainer picks a global batch's indices (a
function of the seed and the step), each rank reads its slice: the global batch is the same for
any worker count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass

import torch

from batchscale.contract import Batch, default_collate, to_device


@dataclass(frozen=True)
class DataFailure:
    """Which part of a workload's data failed, and on what: `member` names the Workload member
    ("Workload.train_data (its dataset's __getitem__)", "Workload.collate"), `where` the items
    ("index 123", "indices 96..127 (32 items)", "a list of 32 items"). Noted on the exception
    (`failure_of`), so a trial names the member; the exception itself is unchanged. A loader
    worker sends it back instead of raising (`error` then holds the exception's `Type: text`)."""

    member: str
    where: str
    error: str = ""


_FAILURE_ATTR = "_batchscale_data_failure"
ERROR_TEXT_CHARS = 300
"""An exception's text in a message is cut to this many characters (as the sweep's rows are)."""


def error_text(err: BaseException) -> str:
    """`Type: text` of an exception on one line, its text cut to ERROR_TEXT_CHARS."""
    text = " ".join(str(err).split())
    if len(text) > ERROR_TEXT_CHARS:
        text = text[:ERROR_TEXT_CHARS - 1] + "…"
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def note_failure(err: BaseException, member: str, where: str) -> None:
    """Note on `err` which member failed on what (the innermost note is kept)."""
    if getattr(err, _FAILURE_ATTR, None) is None:
        with suppress(Exception):  # an exception that takes no attributes stays unnamed
            setattr(err, _FAILURE_ATTR, DataFailure(member, where))


def failure_of(err: BaseException) -> DataFailure | None:
    """The DataFailure noted on `err` or on an exception it was raised from or during (a
    workload's `evaluate` may wrap what its batches raised)."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        failure = getattr(err, _FAILURE_ATTR, None)
        if isinstance(failure, DataFailure):
            return failure
        err = err.__cause__ or err.__context__
    return None


def _index_range(indices) -> str:
    n = len(indices)
    if not n:
        return "no indices"
    low, high = ((int(indices.min()), int(indices.max())) if isinstance(indices, torch.Tensor)
                 else (min(indices), max(indices)))
    return f"index {low}" if n == 1 else f"indices {low}..{high} ({n} items)"


class DatasetSplit:
    """A contract workload's dataset: `dataset[i]` items, collated by the workload."""

    def __init__(self, contract, dataset: Sequence, member: str):
        self.contract, self.dataset, self.member = contract, dataset, member
        self.collate = contract.collate or default_collate
        # Looked up once: it runs every step.
        self.reads_batches = hasattr(dataset, "__getitems__")
        self._read = dataset.__getitems__ if self.reads_batches else self._read_each
        # A dataset that takes the index tensor itself spares the list (sub-ms steps notice).
        self._as_list = not getattr(dataset, "getitems_takes_tensor", False)
        # What a failure names (DataFailure): the Workload member, as contract_check does.
        reader = "__getitems__" if self.reads_batches else "__getitem__"
        self.read_member = f"Workload.{member} (its dataset's {reader})"
        self.collate_member = ("Workload.collate" if contract.collate is not None
                               else "torch's default_collate (Workload.collate is not given)")

    def __len__(self) -> int:
        return len(self.dataset)

    def _read_each(self, indices: list[int]) -> list:
        return [self.dataset[i] for i in indices]

    def items(self, idx: torch.Tensor) -> object:
        """The items at `idx`, as `collate` takes them."""
        indices = idx.tolist() if self._as_list else idx
        try:
            return self._read(indices)
        except Exception as err:
            note_failure(err, self.read_member, self._failed_at(indices))
            raise

    def _failed_at(self, indices) -> str:
        """Which of `indices` a read failed on: the first whose item fails again, read one by
        one (the read itself stays a list comprehension: a loop that tracked its index costs
        microseconds a step); the range when none does, or the dataset reads batches."""
        if not self.reads_batches:
            for i in (indices.tolist() if isinstance(indices, torch.Tensor) else indices):
                try:
                    self.dataset[i]
                except Exception:
                    return f"index {i}"
        return _index_range(indices)

    def collated(self, items, count: int) -> Batch:
        """`collate` of `count` items (a failure noted with the member that raised)."""
        try:
            return self.collate(items)
        except Exception as err:
            note_failure(err, self.collate_member, f"a list of {count} items")
            raise

    def batch(self, idx: torch.Tensor, device: str) -> Batch:
        return to_device(self.collated(self.items(idx), len(idx)), device)

    def head(self, rows: int) -> DatasetSplit:
        return DatasetSplit(self.contract, _Head(self.dataset, min(rows, len(self))), self.member)

    def batches(self, device: str) -> Iterator[tuple[int, Batch]]:
        """(examples, batch) over the whole split in order, `eval_batch_size` at a time."""
        n, size = len(self), self.contract.eval_batch_size
        for start in range(0, n, size):
            idx = torch.arange(start, min(n, start + size))
            yield len(idx), self.batch(idx, device)

    def evaluate(self, model, device: str, autocast: Callable) -> dict[str, float]:
        """The workload's `evaluate` over the split (model in eval mode, no gradients), or the
        mean loss when it has none."""
        if self.contract.evaluate is None:
            return {"loss": self.mean_loss(model, device, autocast)}
        with _evaluating(model), autocast():
            return dict(self.contract.evaluate(model, (b for _, b in self.batches(device))))

    def loss_metric(self, model, device: str, autocast: Callable) -> float:
        """The split's loss as the workload defines it: `evaluate`'s "loss" when it returns
        one, else the mean of `loss` (train_loss on the fixed training subset)."""
        if self.contract.evaluate is not None:
            metrics = self.evaluate(model, device, autocast)
            if "loss" in metrics:
                return float(metrics["loss"])
        return self.mean_loss(model, device, autocast)

    def mean_loss(self, model, device: str, autocast: Callable) -> float:
        """The example-weighted mean of the workload's loss over the split."""
        total, count = 0.0, 0
        with _evaluating(model):
            for n, batch in self.batches(device):
                with autocast():
                    total += float(self.contract.loss(model, batch)) * n
                count += n
        return total / count if count else math.nan


PREFETCH_STEPS = 2
"""Steps each loader worker prepares ahead of the one training (DataLoader prefetch_factor)."""


def seed_item(seed: int, step: int, position: int) -> None:
    """Seed the random state an item's __getitem__ may draw from (torch, random, numpy) as a
    function of the trial's seed, the step and the item's place in the global batch: the same
    item gets the same augmentation whichever rank or loader worker reads it, and after a
    resume."""
    import random
    import sys

    value = ((seed * 1_000_003 + step) * 1_000_033 + position) % 2**63
    # The CPU generator only: torch.manual_seed also seeds every accelerator's (~120 µs here
    # against ~1 µs, per item), and a __getitem__ draws on the CPU.
    torch.default_generator.manual_seed(value)
    random.seed(value)
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(value % 2**32)


class _SeededSteps(torch.utils.data.Dataset):
    """A step's micro-batches as one DataLoader item: key (step, [(position, indices), ...])
    -> (step, [collated micro-batch, ...]), each dataset item read under `seed_item`."""

    def __init__(self, split: DatasetSplit, seed: int):
        self.split, self.seed = split, seed

    def __len__(self) -> int:  # keys come from the batch sampler; the length is not used
        return 0

    def __getitem__(self, key):
        """(step, batches); (step, DataFailure) when the workload's data failed: the trial names
        it (a raised exception would come back as the loader's traceback text)."""
        step, parts = key
        batches = []
        try:
            for position, idx in parts:
                if self.split.reads_batches:
                    # One seed for the micro-batch: a batched read draws once for all its items.
                    seed_item(self.seed, step, position)
                    items = self.split.items(torch.as_tensor(idx))
                else:
                    items = []
                    for offset, i in enumerate(idx):
                        seed_item(self.seed, step, position + offset)
                        try:
                            items.append(self.split.dataset[i])
                        except Exception as err:
                            note_failure(err, self.split.read_member, f"index {i}")
                            raise
                batches.append(self.split.collated(items, len(idx)))
        except Exception as err:
            failure = failure_of(err)
            if failure is None:
                raise
            return step, DataFailure(failure.member, failure.where, error_text(err))
        return step, batches


def prefetched(split: DatasetSplit, keys: Iterator, seed: int,
               workers: int) -> Iterator[tuple[int, list[Batch]]]:
    """(step, [micro-batch, ...]) for each key of `keys` ((step, [(position, indices), ...]),
    see _SeededSteps), read by `workers` background processes PREFETCH_STEPS steps ahead."""
    from torch.utils.data import DataLoader

    # Its own generator: a DataLoader draws its workers' base seed from torch's global random
    # state otherwise, so a resumed trial (a new loader) would continue another random stream.
    loader = DataLoader(_SeededSteps(split, seed), batch_sampler=([key] for key in keys),
                        num_workers=workers, collate_fn=_only, prefetch_factor=PREFETCH_STEPS,
                        generator=torch.Generator().manual_seed(seed))
    return iter(loader)


def _only(items: list):
    return items[0]


class _Head:
    """The first `rows` items of a dataset (a fixed training subset for train_loss)."""

    def __init__(self, dataset: Sequence, rows: int):
        self.dataset, self.rows = dataset, rows
        if hasattr(dataset, "__getitems__"):
            self.__getitems__ = self._getitems
            self.getitems_takes_tensor = getattr(dataset, "getitems_takes_tensor", False)

    def __len__(self) -> int:
        return self.rows

    def __getitem__(self, i: int):
        if not 0 <= i < self.rows:
            raise IndexError(i)
        return self.dataset[i]

    def _getitems(self, indices):
        if len(indices):
            tensor = isinstance(indices, torch.Tensor)
            low, high = ((int(indices.min()), int(indices.max())) if tensor
                         else (min(indices), max(indices)))
            if not 0 <= low <= high < self.rows:
                raise IndexError(f"rows {low}..{high} of the first {self.rows}")
        return self.dataset.__getitems__(indices)


@contextmanager
def _evaluating(model) -> Iterator[None]:
    """Eval mode and no gradients for the block; the model's mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)
