"""Parquet shards to tensors in bulk (pyarrow -> numpy -> torch, no per-row Python), from a
local directory or S3.

Every shard's SHA-256 is checked against the manifest before it is used: a shard changed after
data prep (or damaged in transit) is refused instead of silently training on other data.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchscale.errors import BadInput
from batchscale.location import Location, open_location

if TYPE_CHECKING:
    import torch

MANIFEST_FILE = "manifest.parquet"
HASH_CHUNK_BYTES = 2**20
FEATURE_COLUMN = "features"
LABEL_COLUMN = "label"
SHARD_COLUMNS = (FEATURE_COLUMN, LABEL_COLUMN)


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(HASH_CHUNK_BYTES), b""):
            digest.update(chunk)
    return digest.hexdigest()


def read_manifest(data: str | Path | Location) -> pa.Table:
    """The manifest of the dataset at `data` (a directory, an s3://bucket/prefix or a
    Location); BadInput if it has none or it is not Parquet."""
    location = open_location(data)
    if not location.exists(MANIFEST_FILE):
        raise BadInput(f"{location.uri} has no {MANIFEST_FILE}: not a batchscale dataset "
                       "directory")
    return location.get_table(MANIFEST_FILE)


def read_shard(location: Location, entry: dict) -> pa.Table:
    """One shard, checked against the manifest's SHA-256 and row count."""
    name = location.where(entry["shard"])
    data = location.get_bytes(entry["shard"])
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"]:
        raise BadInput(f"{name}: sha256 {digest} does not match the manifest's "
                       f"{entry['sha256']}; the shard changed after data prep (prepare it again)")
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        missing = [c for c in SHARD_COLUMNS if c not in parquet.schema_arrow.names]
        if missing:
            raise BadInput(f"{name} lacks columns {missing}; a dataset shard has "
                           f"{list(SHARD_COLUMNS)}, found {parquet.schema_arrow.names}")
        table = parquet.read(columns=list(SHARD_COLUMNS))
    except (pa.ArrowException, OSError) as err:
        raise BadInput(f"{name} is not a valid Parquet file: {err}") from None
    if table.num_rows != entry["rows"]:
        raise BadInput(f"{name}: {table.num_rows} rows, the manifest says {entry['rows']}")
    return table


def features_to_numpy(table: pa.Table, feature_shape: tuple[int, ...]) -> np.ndarray:
    column = table.column(FEATURE_COLUMN).combine_chunks()
    values = column.flatten().to_numpy(zero_copy_only=False)
    width = int(np.prod(feature_shape))
    if values.size != len(table) * width:
        raise BadInput(f"feature lengths disagree with the manifest's shape {feature_shape}")
    return values.reshape(len(table), *feature_shape).astype(np.float32, copy=False)


def load_split(data: str | Path | Location, split: str, *,
               input_shape: tuple[int, ...] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, labels) tensors of one split of the dataset at `data`: a directory, an
    `s3://bucket/prefix` or a Location. Every rank of a data-parallel trial loads the whole
    (small) split and slices each global batch by rank, so the global batch is the same for any
    worker count."""
    import torch

    location = open_location(data)
    manifest = read_manifest(location).to_pylist()
    shards = [m for m in manifest if m["split"] == split]
    if not shards:
        splits = sorted({m["split"] for m in manifest})
        raise BadInput(f"{location.where(MANIFEST_FILE)} lists no {split!r} shards; "
                       f"splits: {splits}")
    table = pa.concat_tables([read_shard(location, s) for s in shards])
    x = features_to_numpy(table, tuple(shards[0]["feature_shape"]))
    if input_shape is not None:
        x = _reshape(x, input_shape, location.where(MANIFEST_FILE))
    y = table.column(LABEL_COLUMN).to_numpy()
    # Arrow buffers are read-only; torch needs writable memory, hence one bulk copy.
    return torch.from_numpy(np.array(x, copy=True)), torch.from_numpy(y.astype(np.int64))


def _reshape(x: np.ndarray, input_shape: tuple[int, ...], name: str) -> np.ndarray:
    if int(np.prod(input_shape)) != int(np.prod(x.shape[1:])):
        raise BadInput(f"{name}: examples of shape {list(x.shape[1:])} cannot feed a model "
                       f"taking {list(input_shape)}")
    return x.reshape(len(x), *input_shape)
