"""Parquet shards to tensors in bulk (pyarrow -> numpy -> torch, no per-row Python), from a
local directory or S3.

Every shard's SHA-256 is checked against the manifest before it is used: a shard changed after
data prep (or damaged in transit) is refused instead of silently training on other data.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchscale.components.data_prep.prep import MANIFEST_FILE
from batchscale.components.data_prep.sources import is_s3_uri, store_for_uri
from batchscale.errors import BadInput
from batchscale.storage import ObjectStore, read_table_file

if TYPE_CHECKING:
    import torch

FEATURE_COLUMN = "features"
LABEL_COLUMN = "label"
SHARD_COLUMNS = (FEATURE_COLUMN, LABEL_COLUMN)


@dataclass(frozen=True)
class DatasetLocation:
    """A prepared dataset: a local directory, or a prefix in an object store."""

    root: str
    store: ObjectStore | None = None

    @classmethod
    def of(cls, data: str | Path, store: ObjectStore | None = None) -> DatasetLocation:
        """`data` is a directory, an s3://bucket/prefix, or (with `store`) a prefix in it."""
        if store is None and is_s3_uri(str(data)):
            return cls("", store_for_uri(str(data)))
        return cls(str(data), store)

    def name(self, file: str) -> str:
        """Where `file` of the dataset is, for messages."""
        if self.store is None:
            return str(Path(self.root) / file)
        return f"s3://{self.store.settings.bucket}/{self.store.key(self.root, file)}"

    def read_bytes(self, file: str) -> bytes:
        if self.store is not None:
            return self.store.get_bytes(self.store.key(self.root, file))
        path = Path(self.root) / file
        if not path.is_file():
            raise BadInput(f"{path} does not exist or is not a file")
        return path.read_bytes()

    def read_manifest(self) -> pa.Table:
        if self.store is not None:
            return self.store.get_table(self.store.key(self.root, MANIFEST_FILE))
        path = Path(self.root) / MANIFEST_FILE
        if not path.exists():
            raise BadInput(f"{self.root} has no {MANIFEST_FILE}: not a batchscale dataset "
                           "directory")
        return read_table_file(path)


def read_manifest(data_dir: str | Path, store: ObjectStore | None = None) -> pa.Table:
    return DatasetLocation.of(data_dir, store).read_manifest()


def read_shard(location: DatasetLocation, entry: dict) -> pa.Table:
    """One shard, checked against the manifest's SHA-256 and row count."""
    name = location.name(entry["shard"])
    data = location.read_bytes(entry["shard"])
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


def rank_shards(shards: list[dict], rank: int, world_size: int) -> list[dict]:
    """Rank r keeps shard files r, r + W, ...; with fewer shards than ranks every rank keeps all
    (the trainer then slices each global batch by rank)."""
    if not 0 <= rank < world_size:
        raise BadInput(f"rank {rank} is outside 0..{world_size - 1} (world size {world_size})")
    if len(shards) >= world_size > 1:
        return shards[rank::world_size]
    return shards


def load_split(data_dir: str | Path, split: str, *, input_shape: tuple[int, ...] | None = None,
               rank: int = 0, world_size: int = 1, store: ObjectStore | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(features, labels) tensors of one split of the dataset at `data_dir`: a directory, an
    `s3://bucket/prefix`, or a prefix inside `store`. See `rank_shards` for data parallelism."""
    import torch

    location = DatasetLocation.of(data_dir, store)
    manifest = location.read_manifest().to_pylist()
    shards = [m for m in manifest if m["split"] == split]
    if not shards:
        splits = sorted({m["split"] for m in manifest})
        raise BadInput(f"{location.name(MANIFEST_FILE)} lists no {split!r} shards; "
                       f"splits: {splits}")
    shards = rank_shards(shards, rank, world_size)
    table = pa.concat_tables([read_shard(location, s) for s in shards])
    x = features_to_numpy(table, tuple(shards[0]["feature_shape"]))
    if input_shape is not None:
        x = _reshape(x, input_shape, location.name(MANIFEST_FILE))
    y = table.column(LABEL_COLUMN).to_numpy()
    # Arrow buffers are read-only; torch needs writable memory, hence one bulk copy.
    return torch.from_numpy(np.array(x, copy=True)), torch.from_numpy(y.astype(np.int64))


def _reshape(x: np.ndarray, input_shape: tuple[int, ...], name: str) -> np.ndarray:
    if int(np.prod(input_shape)) != int(np.prod(x.shape[1:])):
        raise BadInput(f"{name}: examples of shape {list(x.shape[1:])} cannot feed a model "
                       f"taking {list(input_shape)}")
    return x.reshape(len(x), *input_shape)
