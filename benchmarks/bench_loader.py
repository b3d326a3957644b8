"""Does the input pipeline keep up? On the embedded default (digits, digits-mlp), the loader must
deliver at least 5x the samples/s that the training step consumes at its best batch size.

The loader works as the trainer uses it: the workload's contract splits (`load_data`: the
prepared shards loaded once per process, SHA-256 check, Parquet decode, numpy -> torch in bulk),
then one batched read per step in a shuffled order (`DatasetSplit.batch`: the rows' batched
`__getitems__`, the task's collate, the move to the device), beside the bare gather of the same
rows from the tensors, so the contract's own cost per read shows.
Both parts are timed: the steady delivery per step is what the 5x criterion judges; the one-time
cold load is reported next to it, with its own ratio, so a slow read cannot hide.
Training: forward, backward and SGD step of digits-mlp on an in-memory batch, per batch size.
Everything is timed with `batchscale.timing.time_steps`. The best batch is found in one pass;
then delivery, cold load and training at that batch are measured in ROUNDS interleaved rounds
and each ratio is the median of the per-round ratios with its bootstrap 90 % interval and a
verdict against the goal (benchmarks/stats.py).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from batchscale.timing import time_steps
from benchmarks import scaled
from benchmarks.stats import Goal, paired_round, ratio_figure

WORKLOAD = "digits-mlp"
TRAIN_BATCH_SIZES = (16, 64, 256, 1024)
REQUIRED_RATIO = Goal(5.0)
TIME_BUDGET_S = 1.0
ROUNDS = scaled(5, 2)
LEARNING_RATE = 0.05


def cold_load_samples_per_s(data_dir: Path) -> tuple[float, float]:
    """(rows/s, step-time CV) of `load_split` of the train split, Parquet to tensors."""
    from batchscale.shards import load_split

    rows = len(load_split(data_dir, "train")[1])
    times = time_steps(lambda: load_split(data_dir, "train"), time_budget_s=TIME_BUDGET_S)
    return rows / times.median_s, times.cv


def delivery_samples_per_s(data_dir: Path, batch_size: int,
                           bare: bool = False) -> tuple[float, float]:
    """(samples/s, step-time CV) of reading shuffled `batch_size` batches of the training split
    as the trainer does, one timed step per batch; `bare`: only the gather from the tensors."""
    import torch

    from batchscale.convergence.trialdata import load_data
    from batchscale.workloads import get_workload

    split = load_data(str(data_dir), get_workload(WORKLOAD))[0]
    x, y = split.dataset.x, split.dataset.y
    order = torch.randperm(len(split))
    offset = 0

    def next_batch() -> None:
        nonlocal offset
        idx = order.roll(-offset)[:batch_size]
        offset = (offset + batch_size) % len(split)
        if bare:
            x[idx], y[idx]
        else:
            split.batch(idx, "cpu")

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
    loss = workload.contract_for().loss

    def step() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss(model, batch).backward()
        optimizer.step()

    return batch_size / time_steps(step, time_budget_s=TIME_BUDGET_S).median_s


def run() -> dict:
    from batchscale.config import DataPrepConfig
    from batchscale.data.prep import prepare

    first = {b: train_samples_per_s(b) for b in TRAIN_BATCH_SIZES}
    best = max(first, key=first.get)
    with tempfile.TemporaryDirectory() as tmp:
        prepare(DataPrepConfig(), tmp)
        rounds = [paired_round(r, lambda: (delivery_samples_per_s(Path(tmp), best)[0],
                                           cold_load_samples_per_s(Path(tmp))[0]),
                               lambda: train_samples_per_s(best)) for r in range(ROUNDS)]
        reads = [paired_round(r, lambda: delivery_samples_per_s(Path(tmp), best)[0],
                              lambda: delivery_samples_per_s(Path(tmp), best, bare=True)[0])
                 for r in range(ROUNDS)]
    train = [t for _, t in rounds]
    delivery = ratio_figure([d for (d, _), _ in rounds], train, REQUIRED_RATIO)
    cold = ratio_figure([c for (_, c), _ in rounds], train)
    contract = ratio_figure([c for c, _ in reads], [b for _, b in reads])
    print(f"   training {WORKLOAD}: best batch {best} in a first pass (" + ", ".join(
        f"{b}: {v:,.0f}" for b, v in first.items()) + " samples/s)")
    print(f"   loader delivery ÷ training at batch {best}: {delivery.text(1)}")
    print(f"   cold load (once per process) ÷ training: {cold.text(1)}")
    print(f"   contract read ÷ bare gather at batch {best}: {contract.text(3)}")
    return {
        "train_samples_per_s_first_pass": {str(b): v for b, v in first.items()},
        "best_train_batch_size": best, "rounds": ROUNDS,
        "train_samples_per_s": train,
        "loader_to_train_ratio": delivery.as_dict(),
        "cold_load_to_train_ratio": cold.as_dict(),
        "contract_read_to_bare_gather_ratio": contract.as_dict(),
    }
