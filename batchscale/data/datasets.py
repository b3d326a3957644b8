"""Named datasets, each returned as dense float32 features and int64 labels.

Nothing is downloaded: the embedded default (scikit-learn's bundled 8x8 digits) ships with pip,
the synthetic teacher-student task is generated from a seed, and the torchvision datasets and
user Parquet files are read from a local directory or an S3 prefix that the config names.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from batchscale.errors import BadInput

if TYPE_CHECKING:
    from batchscale.config import DataPrepConfig

from batchscale.catalog import (  # noqa: F401
    DATASET_NAMES,
    DATASETS,
    SOURCE_DATASETS,
    TEXT_DATASETS,
)

TEACHER_INPUT_DIM = 32
TEACHER_HIDDEN = 64
TEACHER_CLASSES = 10
PREPARED_STREAM = 0
"""Sample stream of the rows data prep writes; fresh batches draw from streams above it."""


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


@dataclass(frozen=True)
class TeacherStudent:
    """Labels from a fixed random two-layer teacher; `noise` replaces that share of labels at
    random. More noise means noisier gradients and a larger critical batch size.

    The teacher depends on `seed` only, so every stream (the prepared rows, fresh training
    batches) is labelled by the same function, and any number of fresh samples can be drawn:
    training on them has no epoch effects."""

    seed: int
    noise: float

    def _teacher(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        w1 = rng.standard_normal((TEACHER_INPUT_DIM, TEACHER_HIDDEN)) / np.sqrt(TEACHER_INPUT_DIM)
        w2 = rng.standard_normal((TEACHER_HIDDEN, TEACHER_CLASSES)) / np.sqrt(TEACHER_HIDDEN)
        return w1, w2

    def teacher_labels(self, x: np.ndarray) -> np.ndarray:
        """The noiseless labels the teacher gives inputs `x`."""
        w1, w2 = self._teacher()
        return np.argmax(np.tanh(x @ w1) @ w2, axis=1).astype(np.int64)

    def sample(self, rows: int, stream: int = PREPARED_STREAM) -> tuple[np.ndarray, np.ndarray]:
        """`rows` examples of `stream`. Labels are replaced where a uniform draw falls below
        `noise`, and the draws do not depend on `noise`: a higher noise flips a superset of the
        rows a lower one flips, so noise levels compare on the same inputs."""
        rng = np.random.default_rng([self.seed, stream])
        x = rng.standard_normal((rows, TEACHER_INPUT_DIM)).astype(np.float32)
        flip = rng.random(rows) < self.noise
        random_labels = rng.integers(0, TEACHER_CLASSES, rows)
        labels = np.where(flip, random_labels, self.teacher_labels(x))
        return x, labels.astype(np.int64)

    def batches(self, batch_size: int, stream: int = PREPARED_STREAM + 1
                ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """Unlimited fresh batches: each one a new sample, never a repeat."""
        for index in itertools.count(stream):
            yield self.sample(batch_size, stream=index)

    @property
    def source(self) -> str:
        return (f"teacher-student(seed={self.seed}, noise={self.noise}, "
                f"dim={TEACHER_INPUT_DIM}, hidden={TEACHER_HIDDEN})")


def teacher_student_rows(train_rows: int, val_fraction: float) -> int:
    """Rows to generate so that the split leaves `train_rows` for training."""
    return train_rows + round(train_rows * val_fraction / (1.0 - val_fraction))


def load_dataset(cfg: DataPrepConfig, cache_dir: Path) -> RawDataset:
    """The configured dataset, capped at `max_rows`; `cache_dir` takes S3 downloads and
    unpacked files (the caller removes it)."""
    raw = _load(cfg, cache_dir)
    if cfg.max_rows is not None and len(raw.labels) > cfg.max_rows:
        keep = np.sort(np.random.default_rng(cfg.split_seed).choice(
            len(raw.labels), cfg.max_rows, replace=False))
        raw = RawDataset(raw.features[keep], raw.labels[keep], raw.num_classes,
                         f"{raw.source}, {cfg.max_rows} rows sampled with seed {cfg.split_seed}")
    return raw


def _load(cfg: DataPrepConfig, cache_dir: Path) -> RawDataset:
    if cfg.name == "digits":
        return digits()
    if cfg.name == "teacher-student":
        task = TeacherStudent(cfg.split_seed, cfg.synthetic_noise)
        x, y = task.sample(teacher_student_rows(cfg.synthetic_train_rows, cfg.val_fraction))
        return RawDataset(x, y, TEACHER_CLASSES, task.source)
    if cfg.name == "parquet":
        from batchscale.data.user_parquet import load_user_parquet

        return load_user_parquet(cfg.source_uri, cfg.feature_column, cfg.label_column,
                                 cfg.feature_shape)
    if cfg.name in TEXT_DATASETS:
        from batchscale.data.text import byte_sequences, load_user_text, python_docs_text

        if cfg.name == "python-docs":
            text, source = python_docs_text(), "pydoc_data.topics (CPython, PSF licence)"
        else:
            text, source = load_user_text(cfg.source_uri, cfg.text_column, cache_dir), \
                cfg.source_uri
        return byte_sequences(text, cfg.sequence_length_tokens, source)
    if cfg.name == "shapes":
        from batchscale.data.shapes import shapes

        rows = teacher_student_rows(cfg.synthetic_train_rows, cfg.val_fraction)
        return shapes(rows, cfg.shapes_image_size_px, cfg.split_seed)
    if cfg.name in SOURCE_DATASETS:
        from batchscale.data.vision import load_vision

        return load_vision(cfg.name, cfg.source_uri, cache_dir)
    raise BadInput(f"unknown dataset {cfg.name!r}; allowed: {', '.join(DATASET_NAMES)}")
