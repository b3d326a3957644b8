"""Local files, written atomically, and Parquet bytes read safely: the half of storage that
needs no object store.

Every local write goes through `atomic_file` (temporary file, fsync, rename, directory fsync).
Parquet is read with `ParquetFile(...).read()`, never `pq.read_table(io.BytesIO(...))`, which
made the process abort at interpreter exit (apache/arrow#34314).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from batchscale.errors import BadInput


def parse_parquet(source: pa.NativeFile | str | Path, name: str) -> pa.Table:
    """Read a whole Parquet file; BadInput naming `name` when it is corrupt or truncated.

    ParquetFile(...).read() rather than pq.read_table(io.BytesIO(...)): the latter made the
    process abort at interpreter exit (apache/arrow#34314).
    """
    try:
        return pq.ParquetFile(source).read()
    except (pa.ArrowException, OSError) as exc:
        raise BadInput(f"{name} is not a valid Parquet file: {exc}") from None


@contextlib.contextmanager
def atomic_file(path: str | Path, mode: int = 0o666) -> Iterator[BinaryIO]:
    """An open binary file that replaces `path` only once the block completes.

    Writes go to a temporary file in the same directory, created with its final `mode` (less
    the umask); on success it is fsynced and renamed over `path`, and the directory is synced
    so the rename survives a crash. Readers see the old file or the whole new one, never a
    truncated one; a failure inside the block removes the temporary file and keeps the old one.
    Every local result, checkpoint and state file of the project is written through this.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def write_bytes_atomic(path: str | Path, data: bytes, mode: int = 0o666) -> None:
    """Write `data` to `path` atomically (see atomic_file)."""
    with atomic_file(path, mode) as fh:
        fh.write(data)


def write_table_atomic(
    path: str | Path, table: pa.Table, row_group_size: int | None = None
) -> None:
    """Write `table` as a Parquet file at `path` atomically (see atomic_file)."""
    with atomic_file(path) as fh:
        pq.write_table(table, fh, row_group_size=row_group_size)


def parquet_bytes(table: pa.Table) -> bytes:
    """`table` as the bytes of one Parquet file, for a single create-only upload (pyarrow's
    own S3 writer can publish partial objects: apache/arrow#40502)."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def _fsync_dir(directory: Path) -> None:
    """Make a rename durable: the directory entry is only on disk once the directory is synced."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_table_file(path: str | Path) -> pa.Table:
    """Read a local Parquet file; BadInput naming the path if it is missing or corrupt."""
    path = Path(path)
    if not path.is_file():
        raise BadInput(f"{path} does not exist or is not a file")
    return parse_parquet(str(path), str(path))
