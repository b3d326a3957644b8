"""Parquet shards to tensors in bulk (pyarrow -> numpy -> torch, no per-row Python), from a
local directory or S3; a large training split is read row by row from a spill file.

Every shard's SHA-256 is checked against the manifest before it is used: a shard changed after
data prep (or damaged in transit) is refused instead of silently training on other data.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchscale.errors import BadInput, BatchscaleError
from batchscale.location import Location, open_location

if TYPE_CHECKING:
    import torch

MANIFEST_FILE = "manifest.parquet"
HASH_CHUNK_BYTES = 2**20
FEATURE_COLUMN = "features"
LABEL_COLUMN = "label"
FEATURE_BYTES = 4  # float32
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


IN_MEMORY_MAX_BYTES = 256 * 2**20
"""A streamed split whose features take up to this much is still held in memory (reading rows
from memory is free; from a file it costs a read per row); a bigger one is read row by row from
a spill file (docs/data.md, "Large datasets")."""


class RowFile:
    """Float32 rows in an unnamed temporary file, read with pread: a batch's rows cost one read
    each and none of them stays in memory. Indexing gives tensors, like the tensor it stands in
    for: `rows[idx]` (a 1-D tensor or list of row numbers) and `rows[a:b]`."""

    def __init__(self, file, rows: int, row_shape: tuple[int, ...]):
        self.file, self.rows, self.row_shape = file, rows, row_shape  # the file dies with us
        self.row_bytes = int(np.prod(row_shape)) * FEATURE_BYTES
        self.shape = (rows, *row_shape)

    def __len__(self) -> int:
        return self.rows

    def reshaped(self, row_shape: tuple[int, ...]) -> RowFile:
        return RowFile(self.file, self.rows, row_shape)

    def __getitem__(self, key):
        import torch

        if isinstance(key, slice):
            start, stop, step = key.indices(self.rows)
            if step != 1:
                raise IndexError("a row file reads contiguous slices only")
            count = max(0, stop - start)
            out = np.empty((count, *self.row_shape), dtype=np.float32)
            if count:
                os.preadv(self.file.fileno(), [memoryview(out).cast("B")],
                          start * self.row_bytes)
            return torch.from_numpy(out)
        rows = torch.as_tensor(key).reshape(-1).tolist()
        out = np.empty((len(rows), *self.row_shape), dtype=np.float32)
        fd = self.file.fileno()
        for place, row in enumerate(rows):
            if not 0 <= row < self.rows:
                raise IndexError(f"row {row} of {self.rows}")
            os.preadv(fd, [memoryview(out[place]).cast("B")], row * self.row_bytes)
        return torch.from_numpy(out)


def load_split(data: str | Path | Location, split: str, *,
               input_shape: tuple[int, ...] | None = None,
               stream: bool = False) -> tuple[torch.Tensor | RowFile, torch.Tensor]:
    """(features, labels) of one split of the dataset at `data`: a directory, an
    `s3://bucket/prefix` or a Location. The shards are read one at a time. With `stream`, a
    split whose features take more than IN_MEMORY_MAX_BYTES goes to an unnamed temporary file
    (in $TMPDIR; gone when the process ends, however it ends) read row by row (a RowFile), so
    memory does not grow with it; otherwise the features are one tensor. Every rank of a
    data-parallel trial reads its slice of each global batch, so the global batch is the same
    for any worker count."""
    import torch

    location = open_location(data)
    manifest = read_manifest(location).to_pylist()
    shards = [m for m in manifest if m["split"] == split]
    if not shards:
        splits = sorted({m["split"] for m in manifest})
        raise BadInput(f"{location.where(MANIFEST_FILE)} lists no {split!r} shards; "
                       f"splits: {splits}")
    shape = tuple(shards[0]["feature_shape"])
    rows = sum(int(entry["rows"]) for entry in shards)
    spill = stream and rows * int(np.prod(shape)) * FEATURE_BYTES > IN_MEMORY_MAX_BYTES
    x = tempfile.TemporaryFile(prefix=f"batchscale-{split}-") if spill else \
        np.empty((rows, *shape), dtype=np.float32)
    y = np.empty(rows, dtype=np.int64)
    start = 0
    for entry in shards:
        table = read_shard(location, entry)
        features = features_to_numpy(table, shape)
        if spill:
            _spill(x, features, split)
        else:
            x[start:start + len(features)] = features
        y[start:start + len(features)] = table.column(LABEL_COLUMN).to_numpy()
        start += len(features)
        del table, features
        pa.default_memory_pool().release_unused()  # Arrow's pool would keep every shard
    where = location.where(MANIFEST_FILE)
    if spill:
        x.flush()
        rows_file = RowFile(x, rows, shape)
        if input_shape is not None:
            _check_reshape(shape, input_shape, where)
            rows_file = rows_file.reshaped(input_shape)
        return rows_file, torch.from_numpy(y)
    if input_shape is not None:
        x = _reshape(x, input_shape, where)
    return torch.from_numpy(x), torch.from_numpy(y)


def _spill(spill, x: np.ndarray, split: str) -> None:
    try:
        spill.write(np.ascontiguousarray(x, dtype=np.float32).data)
    except OSError as err:
        raise BatchscaleError(
            f"could not write the {split} split to a temporary file in "
            f"{tempfile.gettempdir()}: {err.strerror}; it needs the split's size in free disk "
            "space (set TMPDIR to a disk with room)") from None


def _check_reshape(shape: tuple[int, ...], input_shape: tuple[int, ...], name: str) -> None:
    if int(np.prod(input_shape)) != int(np.prod(shape)):
        raise BadInput(f"{name}: examples of shape {list(shape)} cannot feed a model "
                       f"taking {list(input_shape)}")


def _reshape(x: np.ndarray, input_shape: tuple[int, ...], name: str) -> np.ndarray:
    _check_reshape(tuple(x.shape[1:]), input_shape, name)
    return x.reshape(len(x), *input_shape)
