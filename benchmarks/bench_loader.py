"""Does the input pipeline keep up? On the embedded default (digits, digits-mlp), the loader must
deliver at least 5x the samples/s that the training step consumes at its best batch size.

The loader works as the trainer uses it: `load_split` once per process (SHA-256 check, Parquet
decode, numpy -> torch in bulk), then one gather per step from the tensors in a shuffled order.
Both parts are timed: the steady delivery per step is what the 5x criterion judges; the one-time
cold load is reported next to it, with its own ratio, so a slow read cannot hide.
Training: forward, backward and SGD step of digits-mlp on an in-memory batch, per batch size.
Everything is timed with `batchscale.timing.time_steps`.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from batchscale.timing import time_steps

WORKLOAD = "digits-mlp"
TRAIN_BATCH_SIZES = (16, 64, 256, 1024)
REQUIRED_RATIO = 5.0
TIME_BUDGET_S = 3.0
LEARNING_RATE = 0.05


def cold_load_samples_per_s(data_dir: Path) -> tuple[float, float]:
    """(rows/s, step-time CV) of `load_split` of the train split, Parquet to tensors."""
    from batchscale.shards import load_split

    rows = len(load_split(data_dir, "train")[1])
    times = time_steps(lambda: load_split(data_dir, "train"), time_budget_s=TIME_BUDGET_S)
    return rows / times.median_s, times.cv


def delivery_samples_per_s(data_dir: Path, batch_size: int) -> tuple[float, float]:
    """(samples/s, step-time CV) of gathering shuffled `batch_size` batches from the loaded
    split, one timed step per batch as in the trainer."""
    import torch

    from batchscale.shards import load_split

    x, y = load_split(data_dir, "train")
    order = torch.randperm(len(y))
    offset = 0

    def next_batch() -> None:
        nonlocal offset
        idx = order.roll(-offset)[:batch_size]
        offset = (offset + batch_size) % len(y)
        x[idx], y[idx]

    times = time_steps(next_batch, time_budget_s=TIME_BUDGET_S)
    return batch_size / times.median_s, times.cv


def train_samples_per_s(batch_size: int) -> float:
    """Samples/s of digits-mlp training steps at `batch_size` (median step time)."""
    import torch

    from batchscale.workloads import get_workload

    workload = get_workload(WORKLOAD)
    model = workload.build()
    optimizer = torch.optim.SGD(model.parameters(), lr=LEARNING_RATE)
    batch = workload.synthetic_batch(batch_size, "cpu")

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        workload.loss(model, batch).backward()
        optimizer.step()

    return batch_size / time_steps(step, time_budget_s=TIME_BUDGET_S).median_s


def run() -> dict:
    from batchscale.config import DataPrepConfig
    from batchscale.data.prep import prepare

    train = {b: train_samples_per_s(b) for b in TRAIN_BATCH_SIZES}
    best_batch = max(train, key=train.get)
    with tempfile.TemporaryDirectory() as tmp:
        prepare(DataPrepConfig(), tmp)
        delivery, delivery_cv = delivery_samples_per_s(Path(tmp), best_batch)
        cold, cold_cv = cold_load_samples_per_s(Path(tmp))
    ratio = delivery / train[best_batch]
    print(f"   training {WORKLOAD}: best {train[best_batch]:,.0f} samples/s at batch "
          f"{best_batch} (" + ", ".join(f"{b}: {v:,.0f}" for b, v in train.items()) + ")")
    print(f"   loader delivery: {delivery:,.0f} samples/s (cv {delivery_cv:.2f}) = {ratio:.1f}x "
          f"training (required {REQUIRED_RATIO:.0f}x): "
          f"{'PASS' if ratio >= REQUIRED_RATIO else 'FAIL'}")
    print(f"   loader cold load (once per process): {cold:,.0f} samples/s (cv {cold_cv:.2f}) = "
          f"{cold / train[best_batch]:.1f}x training")
    return {
        "train_samples_per_s": {str(b): v for b, v in train.items()},
        "best_train_batch_size": best_batch,
        "loader_delivery_samples_per_s": delivery,
        "loader_delivery_step_time_cv": delivery_cv,
        "loader_cold_load_samples_per_s": cold,
        "loader_cold_load_step_time_cv": cold_cv,
        "loader_to_train_ratio": ratio,
        "cold_load_to_train_ratio": cold / train[best_batch],
        "required_ratio": REQUIRED_RATIO,
        "passed": ratio >= REQUIRED_RATIO,
    }
