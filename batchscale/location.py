"""Where files live: a local directory or an `s3://bucket/prefix`, behind one `Location` type.

The same code runs on a laptop (files on local disk) and in a Kubeflow TrainJob (pods that share
nothing but the object store), so every file a stage reads or writes by URI — dataset shards and
sources, the convergence spec, trial results, checkpoints — goes through a `Location`. Writes are
atomic in both: a local file through `storage.atomic_file` (write aside, fsync, rename), an S3
object as one create-only, checksummed PUT through `storage.ObjectStore` (which also gives S3
reads the project's credentials, retries and error messages).

Why not `fsspec` or `pyarrow.fs`: neither offers a create-only PUT (If-None-Match) with a
SHA-256 checksum, and pyarrow's S3 writer can publish partial objects (apache/arrow#40502); what
is left once writes go through ObjectStore is a few lines of listing and naming.
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

import pyarrow as pa

from batchscale.errors import BadInput
from batchscale.names import S3_SCHEME, quote, split_s3_uri
from batchscale.storage import (
    ObjectStore,
    S3Settings,
    parquet_bytes,
    read_table_file,
    write_bytes_atomic,
)


def is_s3_uri(uri: str | Path) -> bool:
    return isinstance(uri, str) and uri.startswith(f"{S3_SCHEME}://")


class Location(ABC):
    """Named files under one root; names are '/'-separated paths relative to the root."""

    @property
    @abstractmethod
    def uri(self) -> str:
        """The root as a path or s3:// URI."""

    @abstractmethod
    def exists(self, name: str) -> bool: ...

    @abstractmethod
    def get_bytes(self, name: str) -> bytes:
        """The file's bytes; BadInput (local) or StoreError (S3) naming it if there is none."""

    @abstractmethod
    def put_bytes(self, name: str, data: bytes) -> None:
        """Write the file atomically (S3: create-only; identical bytes again are a no-op)."""

    @abstractmethod
    def get_table(self, name: str) -> pa.Table:
        """A Parquet file; BadInput naming it if it is missing or not Parquet."""

    @abstractmethod
    def names(self, prefix: str = "") -> list[str]:
        """Sorted names of the files under `prefix` (a folder below the root), at any depth."""

    @abstractmethod
    def child(self, name: str) -> Location:
        """The folder `name` below the root."""

    @abstractmethod
    def local_dir(self, folder: str, cache_dir: Path) -> Path:
        """A local directory holding `folder` (below the root) under the same relative path:
        the root itself, or a copy of the folder in `cache_dir` for readers that need files."""

    def put_table(self, name: str, table: pa.Table) -> None:
        self.put_bytes(name, parquet_bytes(table))

    def where(self, name: str) -> str:
        """The file's full path or URI, for messages."""
        return f"{self.uri.rstrip('/')}/{name}"


class LocalLocation(Location):
    """A directory."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def __repr__(self) -> str:
        return f"LocalLocation({str(self.root)!r})"

    @property
    def uri(self) -> str:
        return str(self.root)

    def exists(self, name: str) -> bool:
        return (self.root / name).is_file()

    def get_bytes(self, name: str) -> bytes:
        path = self.root / name
        if not path.is_file():
            raise BadInput(f"{path} does not exist or is not a file")
        return path.read_bytes()

    def put_bytes(self, name: str, data: bytes) -> None:
        write_bytes_atomic(self.root / name, data)

    def get_table(self, name: str) -> pa.Table:
        return read_table_file(self.root / name)

    def names(self, prefix: str = "") -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        # Sorted as paths (folder by folder), the order readers of a directory tree have
        # always used: it decides the row order of a dataset read from several files.
        return [p.as_posix() for p in
                sorted(p.relative_to(self.root) for p in base.rglob("*") if p.is_file())]

    def remove(self, name: str) -> None:
        """Delete a file (local checkpoints of finished trials; S3 objects are immutable)."""
        (self.root / name).unlink(missing_ok=True)

    def child(self, name: str) -> LocalLocation:
        return LocalLocation(self.root / name)

    def local_dir(self, folder: str, cache_dir: Path) -> Path:
        return self.root


class S3Location(Location):
    """A folder under an ObjectStore's prefix. Objects are create-only: a name is written once
    (checkpoints therefore use one key per step, and the newest step wins on resume)."""

    def __init__(self, store: ObjectStore, folder: str = ""):
        self.store, self.folder = store, folder.strip("/")

    def __repr__(self) -> str:
        return f"S3Location({self.uri!r})"

    @classmethod
    def from_uri(cls, uri: str, environ: Mapping[str, str] = os.environ) -> S3Location:
        """Bucket and prefix from the URI; endpoint and keys from the environment
        (BATCHSCALE_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY), as for the results
        store, because a URI in a config must never carry credentials (refused, not echoed)."""
        bucket, prefix = split_s3_uri(uri, "S3 location")
        env = S3Settings.from_env({**environ, "BATCHSCALE_S3_BUCKET": bucket})
        return cls(ObjectStore(S3Settings(env.endpoint_url, bucket, prefix,
                                          env.access_key, env.secret_key)))

    @property
    def uri(self) -> str:
        return f"{S3_SCHEME}://{self.store.settings.bucket}/{self.store.key(self.folder)}"

    def _key(self, name: str) -> str:
        return self.store.key(self.folder, name)

    def exists(self, name: str) -> bool:
        return self.store.exists(self._key(name))

    def get_bytes(self, name: str) -> bytes:
        return self.store.get_bytes(self._key(name))

    def put_bytes(self, name: str, data: bytes) -> None:
        self.store.put_bytes(self._key(name), data)

    def get_table(self, name: str) -> pa.Table:
        return self.store.get_table(self._key(name))

    def names(self, prefix: str = "") -> list[str]:
        root = self.store.key(self.folder)
        cut = len(root) + 1 if root else 0
        return [key[cut:] for key in self.store.list(f"{self.folder}/{prefix}")]

    def child(self, name: str) -> S3Location:
        return S3Location(self.store, f"{self.folder}/{name}")

    def local_dir(self, folder: str, cache_dir: Path) -> Path:
        source = self.child(folder)
        if not source.names():
            raise BadInput(f"{source.uri}/ holds no objects")
        copy_files(source, LocalLocation(cache_dir / folder))
        return cache_dir


def open_location(uri: str | Path | Location) -> Location:
    """`s3://bucket/prefix` or a local path (a Location is returned as it is)."""
    if isinstance(uri, Location):
        return uri
    text = str(uri)
    try:
        scheme = urlsplit(text).scheme
    except ValueError as err:  # e.g. an unclosed '[' of an IPv6 address
        raise BadInput(f"{quote(text)} is neither a local path nor an s3:// URI: {err}") from None
    if scheme == S3_SCHEME:
        return S3Location.from_uri(text)
    if scheme and len(scheme) > 1:  # a Windows drive letter is not a scheme
        raise BadInput(f"{quote(text)}: unsupported location; use a local path or "
                       "s3://bucket/prefix")
    return LocalLocation(text)


def open_file(uri: str | Path) -> tuple[Location, str]:
    """(the location of the folder holding the file at `uri`, the file's name in it)."""
    text = str(uri)
    if is_s3_uri(text):
        split_s3_uri(text, "S3 file")  # every part of the key checked, the file name too
        parent, _, name = text.rstrip("/").rpartition("/")
        return open_location(parent), name
    path = Path(text)
    return LocalLocation(path.parent), path.name


def copy_files(source: Location, target: Location) -> list[str]:
    """Copy every file of `source` to the same name in `target`; the names copied."""
    names = source.names()
    for name in names:
        target.put_bytes(name, source.get_bytes(name))
    return names

