"""Named datasets, each returned as dense float32 features and int64 labels.

Nothing is downloaded: the embedded default (scikit-learn's bundled 8x8 digits) ships with pip,
and the synthetic teacher-student task is generated from a seed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from batchscale.errors import BadInput

DATASET_NAMES = ("digits", "teacher-student")
TEACHER_INPUT_DIM = 32
TEACHER_HIDDEN = 64
TEACHER_CLASSES = 10
# Held-out rows for the synthetic task: enough for a validation accuracy with ~0.5 % resolution.
TEACHER_VAL_ROWS = 2000


@dataclass(frozen=True)
class RawDataset:
    features: np.ndarray  # (rows, *feature_shape) float32
    labels: np.ndarray  # (rows,) int64
    num_classes: int
    source: str


def digits() -> RawDataset:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    # Pixel intensities are 0..16; scale to [0, 1] so one learning rate suits the MLP and CNN.
    features = (bunch.data / 16.0).astype(np.float32)
    return RawDataset(features, bunch.target.astype(np.int64), 10, "sklearn.datasets.load_digits")


def teacher_student(rows: int, noise: float, seed: int) -> RawDataset:
    """Labels from a fixed random two-layer teacher; `noise` replaces that share of labels at
    random. More noise means noisier gradients and a larger critical batch size."""
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((TEACHER_INPUT_DIM, TEACHER_HIDDEN)) / np.sqrt(TEACHER_INPUT_DIM)
    w2 = rng.standard_normal((TEACHER_HIDDEN, TEACHER_CLASSES)) / np.sqrt(TEACHER_HIDDEN)
    x = rng.standard_normal((rows, TEACHER_INPUT_DIM)).astype(np.float32)
    labels = np.argmax(np.tanh(x @ w1) @ w2, axis=1).astype(np.int64)
    flip = rng.random(rows) < noise
    labels[flip] = rng.integers(0, TEACHER_CLASSES, int(flip.sum()))
    source = f"teacher-student(seed={seed}, noise={noise}, dim={TEACHER_INPUT_DIM})"
    return RawDataset(x, labels, TEACHER_CLASSES, source)


def load_dataset(name: str, *, synthetic_rows: int = 20000, noise: float = 0.1,
                 seed: int = 0) -> RawDataset:
    if name == "digits":
        return digits()
    if name == "teacher-student":
        return teacher_student(synthetic_rows + TEACHER_VAL_ROWS, noise, seed)
    raise BadInput(f"unknown dataset {name!r}; allowed: {', '.join(DATASET_NAMES)}")
