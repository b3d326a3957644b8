"""data_prep core: a named dataset to train/val Parquet shards plus a manifest.

The whole source is read and checked before the first byte is written, so bad input leaves
nothing behind.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from batchscale.catalog import MASK_DATASETS, TEXT_DATASETS
from batchscale.config import DataPrepConfig
from batchscale.data.datasets import RawDataset, load_dataset
from batchscale.errors import BadInput
from batchscale.schemas import make_table, not_measured_table
from batchscale.shards import FEATURE_BYTES, MANIFEST_FILE, sha256_file
from batchscale.storage import write_table_atomic

if TYPE_CHECKING:
    from batchscale.config.stage_inputs import Config

ROW_GROUP_TARGET_BYTES = 32 * 2**20
"""Row groups of about this size: large enough for efficient bulk reads, small enough that a
streaming reader holds one in memory without trouble (CIFAR-10: ~2,700 rows a group)."""
"""float32 features."""
MIN_SPLIT_ROWS = 2
"""Fewest rows either split may hold, and never fewer than the dataset has classes (one per
class on average): a validation split of one row reads as accuracy 0 or 1 (a trial "reached"
the target at step 0), and an empty training split has nothing to train on."""


LABEL_NOISE_STREAM = 1
"""Seeds the label-noise draws apart from the split's shuffle (which uses `split_seed` alone)."""


def val_rows(rows: int, val_fraction: float) -> int:
    """Rows of the validation split: the nearest whole number to the fraction, at least 1."""
    return max(1, int(round(rows * val_fraction)))


def train_rows(rows: int, val_fraction: float, train_fraction: float = 1.0) -> int:
    """Rows of the training split: what validation leaves, times `train_fraction` (rounded),
    at least 1 when any are left."""
    left = rows - val_rows(rows, val_fraction)
    return min(left, max(1, int(round(left * train_fraction))))


def split_indices(rows: int, val_fraction: float, seed: int,
                  train_fraction: float = 1.0) -> dict[str, np.ndarray]:
    """A deterministic shuffle-split; the same seed gives the same split on every machine.
    `train_fraction` keeps a prefix of the shuffled training rows: a smaller fraction is a
    subset of a larger one, and the validation rows do not depend on it."""
    order = np.random.default_rng(seed).permutation(rows)
    n_val = val_rows(rows, val_fraction)
    n_train = train_rows(rows, val_fraction, train_fraction)
    return {"val": np.sort(order[:n_val]), "train": np.sort(order[n_val:n_val + n_train])}


def check_split(raw: RawDataset, cfg: DataPrepConfig) -> None:
    """Refuse a split that leaves either side fewer than max(MIN_SPLIT_ROWS, classes) rows
    (MIN_SPLIT_ROWS for text and masks), naming the fields that set it; called before anything
    is written."""
    rows = len(raw.labels)
    n_val = val_rows(rows, cfg.val_fraction)
    sizes = {"training": train_rows(rows, cfg.val_fraction, cfg.train_fraction),
             "validation": n_val}
    # A label per row (classification): one row per class on average; a text or mask row
    # holds many targets (bytes, pixels), so only the minimum applies there.
    dense = cfg.name in TEXT_DATASETS + MASK_DATASETS
    need = MIN_SPLIT_ROWS if dense else max(MIN_SPLIT_ROWS, raw.num_classes)
    short = [split for split, n in sizes.items() if n < need]
    if not short:
        return
    fields = ["dataset.val_fraction"]
    if cfg.train_fraction < 1.0:
        fields.append("dataset.train_fraction")
    if cfg.max_rows is not None:
        fields.append("dataset.max_rows")
    if cfg.name in ("teacher-student", "shapes"):
        fields.append("dataset.synthetic_train_rows")
    raise BadInput(
        f"dataset {cfg.name}: {rows} rows split into {sizes['training']} training and "
        f"{sizes['validation']} validation rows (val_fraction {cfg.val_fraction}"
        + (f", max_rows {cfg.max_rows}" if cfg.max_rows is not None else "")
        + (f", train_fraction {cfg.train_fraction}" if cfg.train_fraction < 1.0 else "")
        + f"); each split needs at least {need} rows ("
        + ("" if dense else f"one per class on average for {raw.num_classes} classes, and ")
        + f"at least {MIN_SPLIT_ROWS}); the {' and '.join(short)} "
        f"split falls short: change {', '.join(fields)}")


def noisy_labels(labels: np.ndarray, num_classes: int, noise: float, seed: int) -> np.ndarray:
    """`labels` with a `noise` share replaced by a uniformly random class (which may be the
    same one). The draws do not depend on `noise`: a higher noise replaces a superset of the
    rows a lower one does, so noise levels compare on the same rows."""
    if noise <= 0:
        return labels
    rng = np.random.default_rng([seed, LABEL_NOISE_STREAM])
    replace = rng.random(len(labels)) < noise
    random_labels = rng.integers(0, num_classes, len(labels))
    return np.where(replace, random_labels, labels).astype(labels.dtype)


def to_arrow(features: np.ndarray, labels: np.ndarray) -> pa.Table:
    flat = features.reshape(len(features), -1).astype(np.float32, copy=False)
    values = pa.array(flat.ravel())
    offsets = pa.array(np.arange(0, flat.size + 1, flat.shape[1], dtype=np.int32))
    column = pa.ListArray.from_arrays(offsets, values)
    return pa.table({"features": column, "label": pa.array(labels, pa.int64())},
                    schema=make_table("dataset", []).schema)


def row_group_rows(feature_shape: tuple[int, ...], rows_per_shard: int) -> int:
    """Rows per row group: about ROW_GROUP_TARGET_BYTES of features, at most one shard."""
    row_bytes = max(1, int(np.prod(feature_shape)) * FEATURE_BYTES)
    return max(1, min(rows_per_shard, ROW_GROUP_TARGET_BYTES // row_bytes))


def write_shards(raw: RawDataset, cfg: DataPrepConfig, out_dir: Path) -> list[dict]:
    rows = []
    group_rows = row_group_rows(raw.features.shape[1:], cfg.rows_per_shard)
    splits = split_indices(len(raw.labels), cfg.val_fraction, cfg.split_seed, cfg.train_fraction)
    labels_by_split = {split: raw.labels[idx] for split, idx in splits.items()}
    labels_by_split["train"] = noisy_labels(labels_by_split["train"], raw.num_classes,
                                            cfg.train_label_noise, cfg.split_seed)
    for split, idx in splits.items():
        for shard_no, start in enumerate(range(0, len(idx), cfg.rows_per_shard)):
            part = idx[start:start + cfg.rows_per_shard]
            name = f"{split}-{shard_no:05d}.parquet"
            labels = labels_by_split[split][start:start + cfg.rows_per_shard]
            hist = np.bincount(labels, minlength=raw.num_classes).tolist()
            write_table_atomic(out_dir / name, to_arrow(raw.features[part], labels),
                               row_group_size=group_rows)
            rows.append({
                "dataset": cfg.name, "source": raw.source, "split": split, "shard": name,
                "rows": len(part), "sha256": sha256_file(out_dir / name),
                "feature_shape": list(raw.features.shape[1:]), "feature_dtype": "float32",
                "num_classes": raw.num_classes, "class_histogram": hist,
                "split_seed": cfg.split_seed,
            })
    return rows


def prepare(cfg: DataPrepConfig, out_dir: str | Path) -> pa.Table:
    """Write shards and `manifest.parquet` under `out_dir`; return the manifest."""
    with tempfile.TemporaryDirectory(prefix="batchscale-data-") as cache_dir:
        raw = load_dataset(cfg, Path(cache_dir))
    check_split(raw, cfg)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = make_table("manifest", write_shards(raw, cfg, out_dir))
    write_table_atomic(out_dir / MANIFEST_FILE, manifest)
    return manifest


OWN_DATA = ("nothing prepared: {name} reads its own data ({how}), so the config's dataset "
            "({dataset}) is neither prepared nor recorded as this run's")
"""What the data-prep stage says, in its empty manifest, for a workload that brings its data."""


def own_data_reason(workload_spec: str, dataset_name: str) -> str | None:
    """Why no dataset is prepared for `workload_spec` (a Workload with its own train_data, or
    a TrainingLoop), or None when it trains on the prepared dataset."""
    from batchscale.workloads import get_workload

    workload = get_workload(workload_spec)
    if not workload.has_own_data:
        return None
    how = ("a TrainingLoop" if workload.loop is not None
           else "Workload.train_data and val_data")
    return OWN_DATA.format(name=workload.name, how=how, dataset=dataset_name)


def run_stage(config: str | Config, out_dir: str) -> None:
    """Pipeline entry: prepare the configured dataset into `out_dir`; for a workload with its
    own data, an empty manifest that says why (its split sizes are the trials' to read)."""
    from batchscale.config.stage_inputs import stage_config

    cfg = stage_config(config)
    if (reason := own_data_reason(cfg.workload, cfg.dataset.name)) is not None:
        Path(out_dir).mkdir(parents=True, exist_ok=True)
        write_table_atomic(Path(out_dir) / MANIFEST_FILE,
                           not_measured_table("manifest", None, reason))
        print(f"data_prep: {reason}")
        return
    manifest = prepare(cfg.dataset, out_dir)
    print(f"data_prep: {cfg.dataset.name}: "
          + ", ".join(f"{r['split']}/{r['shard']} {r['rows']} rows" for r in manifest.to_pylist()))
