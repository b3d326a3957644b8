"""A batchscale.Workload whose training rows live in a file read item by item (os.pread, no
mmap, nothing cached by the process): what a user's streaming Dataset does. bench_streaming.py
points BATCHSCALE_BENCH_ROWS at a generated file of ROW_FEATURES float32 per row."""

from __future__ import annotations

import os
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from batchscale import Workload

ROW_FEATURES = 1024
ROW_BYTES = ROW_FEATURES * 4
CLASSES = 10
VAL_ROWS = 1024


class FileRows(torch.utils.data.Dataset):
    """Rows `first`..`first + count` of the file; the label is a function of the row index."""

    def __init__(self, first: int, count: int | None = None):
        self.path = os.environ["BATCHSCALE_BENCH_ROWS"]
        # A wait per item (bench_prefetch: slow storage or decoding), 0 by default.
        self.wait_s = float(os.environ.get("BATCHSCALE_BENCH_ITEM_WAIT_S", "0"))
        total = os.path.getsize(self.path) // ROW_BYTES
        self.first, self.count = first, (total - first if count is None else count)
        self.fd = None

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        if self.fd is None:  # opened in the process that reads (each torchrun rank)
            self.fd = os.open(self.path, os.O_RDONLY)
        row = i + self.first
        if self.wait_s:
            time.sleep(self.wait_s)
        raw = os.pread(self.fd, ROW_BYTES, row * ROW_BYTES)
        x = torch.from_numpy(np.frombuffer(raw, dtype=np.float32).copy())
        return x, torch.tensor(row % CLASSES)


def linear() -> nn.Module:
    return nn.Linear(ROW_FEATURES, CLASSES)


def loss(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


workload = Workload(name="file-rows", model=linear, loss=loss,
                    train_data=lambda: FileRows(VAL_ROWS), val_data=lambda: FileRows(0, VAL_ROWS),
                    metrics=("val_loss",), targets=(("val_loss", 1e-6),))
