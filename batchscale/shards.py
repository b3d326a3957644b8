"""Parquet shards to tensors in bulk (pyarrow -> numpy -> torch, no per-row Python), from a
local directory or S3, through a memory-mapped spill file so a split of any size fits.

Every shard's SHA-256 is checked against the manifest before it is used: a shard changed after
data prep (or damaged in transit) is refused instead of silently training on other data.
"""

from __future__ import annotations

import hashlib
import mmap
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

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


class SplitArrays(NamedTuple):
    """One split: features (rows, *shape) float32 over a spill file, labels (rows,) int64."""

    x: torch.Tensor
    y: torch.Tensor
    pages: SpillPages | None


class SpillPages:
    """The memory map of a split's spill file. `release` drops the pages read so far from the
    process (they are read again from the file when needed), so a trial's resident memory is
    what it read since the last release, not the dataset (docs/data.md, "Large datasets")."""

    def __init__(self, mapping: mmap.mmap):
        self.mapping = mapping
        # Rows are read in a random order: no read-ahead, and a fault maps one page, not the
        # cached pages around it (which would count a whole neighbourhood as resident).
        mapping.madvise(mmap.MADV_RANDOM)

    def release(self) -> None:
        self.mapping.madvise(mmap.MADV_DONTNEED)


def load_split(data: str | Path | Location, split: str, *,
               input_shape: tuple[int, ...] | None = None) -> SplitArrays:
    """(features, labels, pages) of one split of the dataset at `data`: a directory, an
    `s3://bucket/prefix` or a Location. The shards are read one at a time into an unnamed
    temporary file (in $TMPDIR, gone when the process ends, however it ends) that the features
    map: memory does not grow with the dataset, only with the rows read. Every rank of a
    data-parallel trial maps the whole split and reads its slice of each global batch, so the
    global batch is the same for any worker count."""
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
    y = np.empty(rows, dtype=np.int64)
    with tempfile.TemporaryFile(prefix=f"batchscale-{split}-") as spill:
        start = 0
        for entry in shards:
            table = read_shard(location, entry)
            x = features_to_numpy(table, shape)
            _spill(spill, x, split)
            y[start:start + len(x)] = table.column(LABEL_COLUMN).to_numpy()
            start += len(x)
        spill.flush()
        if rows == 0:
            x, pages = np.empty((0, *shape), dtype=np.float32), None
        else:  # private (copy-on-write) map: writable for torch, the file never changes
            x = np.memmap(spill, dtype=np.float32, mode="c", shape=(rows, *shape))
            pages = SpillPages(x._mmap)
    if input_shape is not None:
        x = _reshape(x, input_shape, location.where(MANIFEST_FILE))
    return SplitArrays(torch.from_numpy(x), torch.from_numpy(y), pages)


def _spill(spill, x: np.ndarray, split: str) -> None:
    try:
        spill.write(np.ascontiguousarray(x, dtype=np.float32).data)
    except OSError as err:
        raise BatchscaleError(
            f"could not write the {split} split to a temporary file in "
            f"{tempfile.gettempdir()}: {err.strerror}; it needs the split's size in free disk "
            "space (set TMPDIR to a disk with room)") from None


def _reshape(x: np.ndarray, input_shape: tuple[int, ...], name: str) -> np.ndarray:
    if int(np.prod(input_shape)) != int(np.prod(x.shape[1:])):
        raise BadInput(f"{name}: examples of shape {list(x.shape[1:])} cannot feed a model "
                       f"taking {list(input_shape)}")
    return x.reshape(len(x), *input_shape)
