"""Workloads of the public contract whose own code fails only past the checks before any trial
(those read two examples), for tests/test_user_code_errors.py. Imported by the CLI and its
torchrun ranks from the tests directory (their cwd). No tests here."""

from __future__ import annotations

import dataclasses

import torch.distributed as dist
from contract_workloads import Points, good
from torch import nn

LAST_GOOD_INDEX = 100


class ShortPoints(Points):
    """Says it has 600 points; items past index 100 cannot be read (a truncated file)."""

    def __getitem__(self, i: int):
        if i > LAST_GOOD_INDEX:
            raise IndexError(f"point {i} is past the end of the file ({LAST_GOOD_INDEX + 1} "
                             "points)")
        return super().__getitem__(i)


class SmallBatchesOnly(nn.Module):
    """An MLP whose forward refuses batches over 200 examples (the default eval_batch_size is
    256)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        if len(x) > 200:
            raise RuntimeError(f"this model takes at most 200 examples at once, got {len(x)}")
        return self.net(x)


class NoBigTrainingBatches(SmallBatchesOnly):
    """Refuses training batches over 16 examples; evaluation (eval mode) takes any size."""

    def forward(self, x):
        if self.training and len(x) > 16:
            raise ValueError(f"training batches of at most 16 examples, got {len(x)}")
        return self.net(x)


class FailsOnRankOne(SmallBatchesOnly):
    """Trains on rank 0 of a group; on rank 1 every training batch fails, as a bad item in one
    rank's share of the data would."""

    def forward(self, x):
        if self.training and dist.is_initialized() and dist.get_rank() == 1:
            raise ValueError("rank 1 cannot read its share of this batch")
        return self.net(x)


bad_index = dataclasses.replace(good, name="bad-index", train_data=lambda: ShortPoints(600, 0))
big_eval = dataclasses.replace(good, name="big-eval", model=SmallBatchesOnly,
                               val_data=lambda: Points(300, 1))
small_train_batches = dataclasses.replace(good, name="small-train-batches",
                                          model=NoBigTrainingBatches)
slow = dataclasses.replace(good, name="slow", targets=(("val_accuracy", 1.0),))
rank_one_fails = dataclasses.replace(good, name="rank-one-fails", model=FailsOnRankOne)


def _per_example_past_the_check(model, batch):
    """The mean loss on the check's two examples, one loss per example on any bigger batch (a
    `reduction="none"` left in)."""
    x, y = batch
    losses = nn.functional.cross_entropy(model(x), y, reduction="none")
    return losses.mean() if len(y) <= 2 else losses


per_example_loss = dataclasses.replace(good, name="per-example-loss",
                                       loss=_per_example_past_the_check)
