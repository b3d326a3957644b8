"""Parquet shards to tensors in bulk (pyarrow -> numpy -> torch, no per-row Python)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
from batchscale.components.data_prep.prep import MANIFEST_FILE

from batchscale.errors import BadInput
from batchscale.storage import read_table_file


def read_manifest(data_dir: str | Path) -> pa.Table:
    path = Path(data_dir) / MANIFEST_FILE
    if not path.exists():
        raise BadInput(f"{data_dir} has no {MANIFEST_FILE}: not a batchscale dataset directory")
    return read_table_file(path)


def features_to_numpy(table: pa.Table, feature_shape: tuple[int, ...]) -> np.ndarray:
    column = table.column("features").combine_chunks()
    values = column.flatten().to_numpy(zero_copy_only=False)
    width = int(np.prod(feature_shape))
    if values.size != len(table) * width:
        raise BadInput(f"feature lengths disagree with the manifest's shape {feature_shape}")
    return values.reshape(len(table), *feature_shape).astype(np.float32, copy=False)


def load_split(data_dir: str | Path, split: str, *, input_shape: tuple[int, ...] | None = None,
               rank: int = 0, world_size: int = 1):
    """(features, labels) tensors of one split. With world_size > 1, rank r keeps shard files
    r, r + W, ...; with fewer shards than ranks every rank reads all (the trainer then slices
    each global batch by rank)."""
    import torch

    manifest = read_manifest(data_dir).to_pylist()
    shards = [m for m in manifest if m["split"] == split]
    if not shards:
        raise BadInput(f"{data_dir}: manifest lists no {split!r} shards")
    if len(shards) >= world_size > 1:
        shards = shards[rank::world_size]
    shape = tuple(shards[0]["feature_shape"])
    tables = [read_table_file(Path(data_dir) / s["shard"]) for s in shards]
    table = pa.concat_tables(tables)
    x = features_to_numpy(table, shape)
    if input_shape is not None:
        x = x.reshape(len(x), *input_shape)
    y = table.column("label").to_numpy()
    return torch.from_numpy(np.array(x, copy=True)), torch.from_numpy(y.astype(np.int64))
