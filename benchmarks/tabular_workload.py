"""A user's small tabular workload, written against the public contract: an MLP regressing a
noisy linear target from 20 features, its `Dataset` returning a tuple of tensors per item (so
every batch makes Python objects, as most map-style datasets do). bench_gc times it; it also
runs as `batchscale sweep --workload benchmarks.tabular_workload:workload …`."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from batchscale import Workload

ROWS = 4096
FEATURES = 20


class Rows(Dataset):
    """ROWS synthetic rows of FEATURES standard-normal features, y = x·w + 0.1·noise."""

    def __init__(self, split: str):
        gen = torch.Generator().manual_seed(0 if split == "train" else 1)
        self.x = torch.randn(ROWS, FEATURES, generator=gen)
        weights = torch.linspace(-1, 1, FEATURES)
        self.y = (self.x @ weights + 0.1 * torch.randn(ROWS, generator=gen)).unsqueeze(1)

    def __len__(self) -> int:
        return ROWS

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[index], self.y[index]


def build() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, 128), torch.nn.ReLU(),
                               torch.nn.Linear(128, 1))


def loss(model, batch) -> torch.Tensor:
    x, y = batch
    return F.mse_loss(model(x), y)


def evaluate(model, batches) -> dict:
    total = count = 0.0
    for x, y in batches:
        total += float(F.mse_loss(model(x), y, reduction="sum"))
        count += len(y)
    return {"loss": total / count}


workload = Workload(name="tabular-mlp", model=build, loss=loss, train_data=lambda: Rows("train"),
                    val_data=lambda: Rows("val"), evaluate=evaluate, metrics=("val_loss",),
                    targets=(("val_loss", 0.05),))
