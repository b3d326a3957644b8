"""Workloads of the public contract (batchscale.Workload) for tests/test_contract.py: a good one
and one broken member each. Imported by the CLI from the tests directory (its cwd)."""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from batchscale import Workload

CLASSES = 3


class Points(Dataset):
    """`n` 2-feature points in 3 linearly separable clusters (deterministic)."""

    def __init__(self, n: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        self.y = torch.randint(0, CLASSES, (n,), generator=gen)
        centres = torch.tensor([[2.0, 0.0], [-2.0, 0.0], [0.0, 2.5]])
        self.x = centres[self.y] + 0.5 * torch.randn(n, 2, generator=gen)
        self.reads = 0

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        self.reads += 1
        return self.x[i], self.y[i]


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, CLASSES))


def cross_entropy(model, batch):
    x, y = batch
    return F.cross_entropy(model(x), y)


def accuracy_and_loss(model, batches):
    right = count = 0
    total = 0.0
    for x, y in batches:
        logits = model(x)
        total += float(F.cross_entropy(logits, y, reduction="sum"))
        right += int((logits.argmax(1) == y).sum())
        count += len(y)
    return {"loss": total / count, "accuracy": right / count}


good = Workload(name="points-mlp", model=mlp, loss=cross_entropy,
                train_data=lambda: Points(600, 0), val_data=lambda: Points(200, 1),
                evaluate=accuracy_and_loss, metrics=("val_loss", "val_accuracy"),
                targets=(("val_accuracy", 0.9),))


def good_function() -> Workload:
    """The same workload behind a function (built on first use)."""
    return good


loss_only = dataclasses.replace(good, name="points-loss-only", evaluate=None,
                                metrics=("val_loss",), targets=(("val_loss", 0.3),))


def image_model() -> nn.Module:
    """Wants 1x16x16 images: it rejects the 2-feature points."""
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4 * 14 * 14, CLASSES))


wrong_input = dataclasses.replace(good, name="wrong-input", model=image_model)


class ListPoints(Points):
    """Items as {"x": [two floats], "y": label}: a Python list, which the default collate
    turns into one tensor per list position."""

    def __getitem__(self, i: int):
        x, y = super().__getitem__(i)
        return {"x": [float(v) for v in x], "y": y}


list_features = dataclasses.replace(
    good, name="list-features", train_data=lambda: ListPoints(600, 0),
    val_data=lambda: ListPoints(200, 1),
    loss=lambda model, batch: F.cross_entropy(model(batch["x"]), batch["y"]))
vector_loss = dataclasses.replace(
    good, name="vector-loss",
    loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1], reduction="none"))
nan_loss = dataclasses.replace(good, name="nan-loss",
                               loss=lambda model, batch: cross_entropy(model, batch) * math_nan())
no_accuracy = dataclasses.replace(good, name="no-accuracy",
                                  evaluate=lambda model, batches: {"loss": 1.0})
unknown_metric = dataclasses.replace(good, name="unknown-metric", metrics=("val_f1",))
unreported_target = dataclasses.replace(good, name="unreported-target", metrics=("val_loss",),
                                        evaluate=None)
tiny_data = dataclasses.replace(good, name="tiny-data", train_data=lambda: Points(5, 0))
no_val = dataclasses.replace(good, name="no-val", val_data=None)
zero_eval_batch = dataclasses.replace(good, name="zero-eval-batch", eval_batch_size=0)
failing_data = dataclasses.replace(good, name="failing-data",
                                   train_data=lambda: open("/nonexistent/points.bin"))


def math_nan() -> float:
    return float("nan")


def _fails_from_batch_4(model, batch):
    x, y = batch
    if len(y) >= 4:
        raise RuntimeError(f"this loss takes at most 3 examples, got {len(y)}")
    return cross_entropy(model, batch)


# Passes the two-example check, fails in every trial of the sweep's batch sizes.
fails_in_trials = dataclasses.replace(good, name="fails-in-trials", loss=_fails_from_batch_4)


def one_channel_cnn() -> nn.Module:
    """A model factory (the older form) that wants 1-channel 16x16 images."""
    return image_model()


class NoisyPoints(Points):
    """Points with fresh Gaussian noise on every read: augmentation that draws from torch's
    global random state, as a user's __getitem__ would."""

    def __getitem__(self, i: int):
        x, y = super().__getitem__(i)
        return x + 0.3 * torch.randn(2), y


augmented = dataclasses.replace(good, name="points-augmented",
                                train_data=lambda: NoisyPoints(600, 0))


def _loss_behind_a_progress_bar(model, batch):
    """As Hugging Face datasets' torch formatting does on every read: a tqdm bar (disabled),
    whose class lock is a multiprocessing semaphore made on first use in each process."""
    from tqdm import tqdm

    for _ in tqdm([0], disable=True):
        pass
    return cross_entropy(model, batch)


progress_bar_lock = dataclasses.replace(good, name="progress-bar-lock",
                                        loss=_loss_behind_a_progress_bar)
