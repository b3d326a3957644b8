"""Plain PyTorch through batchscale's workload contract: your model, your Dataset, your loss.

A small 1-channel 16x16 CNN on scikit-learn's bundled digits, upsampled to 16x16 by the
Dataset, with label smoothing in the loss and a one-pixel shift as data augmentation. Nothing
about it is known to batchscale: the sweep, the convergence trials and the analysis learn
about it only through the `Workload` below (docs/your-model.md).

    batchscale sweep    --workload digits_cnn:workload --config config.yaml --out sweep.parquet
    batchscale converge --workload digits_cnn:workload --config config.yaml --out conv
    batchscale analyze  conv/runs.parquet --sweep sweep.parquet --out analysis
"""

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from batchscale import Workload

CLASSES = 10
SIDE_PX = 16
VAL_EVERY = 5  # every 5th image is held out for validation


class Digits16(Dataset):
    """scikit-learn's bundled 8x8 digits (1,797 images, no download), upsampled to 1x16x16 and
    scaled to [0, 1]; `split` "train" or "val"; `augment` shifts training images by a pixel."""

    def __init__(self, split: str, augment: bool = False):
        from sklearn.datasets import load_digits

        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        images = F.interpolate(images, size=(SIDE_PX, SIDE_PX), mode="bilinear")
        held_out = torch.arange(len(images)) % VAL_EVERY == 0
        keep = held_out if split == "val" else ~held_out
        self.images, self.labels = images[keep], torch.tensor(digits.target)[keep]
        self.augment = augment

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        image = self.images[i]
        if self.augment:  # a deterministic shift per example: the same epoch after a resume
            image = torch.roll(image, shifts=(i % 3) - 1, dims=-1)
        return image, self.labels[i]


def build_model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 4 * 4, CLASSES),
    )


def loss(model: nn.Module, batch) -> torch.Tensor:
    images, labels = batch
    return F.cross_entropy(model(images), labels, label_smoothing=0.1)


def evaluate(model: nn.Module, batches) -> dict[str, float]:
    """Mean cross-entropy (no smoothing) and accuracy over the validation batches."""
    total, right, count = 0.0, 0, 0
    for images, labels in batches:
        logits = model(images).float()
        total += float(F.cross_entropy(logits, labels, reduction="sum"))
        right += int((logits.argmax(1) == labels).sum())
        count += len(labels)
    return {"loss": total / count, "accuracy": right / count}


workload = Workload(
    name="digits16-cnn",
    model=build_model,
    loss=loss,
    train_data=lambda: Digits16("train", augment=True),
    val_data=lambda: Digits16("val"),
    evaluate=evaluate,
    metrics=("val_loss", "val_accuracy"),
    targets=(("val_accuracy", 0.9),),
    description="1-channel 16x16 CNN on digits, label smoothing, shifts",
)
