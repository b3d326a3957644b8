"""Where a convergence run keeps its files: a local directory or an S3 prefix.

The same training script runs under local torchrun (files on the disk it shares with the
launcher) and as a Kubeflow TrainJob (pods that share nothing but the object store), so every
file it reads or writes — spec, dataset shards, trial results, checkpoints — goes through a
`Location`. Writes are atomic in both: a local file is written aside and renamed, an S3 object
is one create-only, checksummed PUT (batchscale.storage.ObjectStore).
"""

from __future__ import annotations

import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from batchscale.errors import BadInput
from batchscale.storage import ObjectStore, S3Settings

S3_SCHEME = "s3"


class Location(Protocol):
    """Named files under one root; names are '/'-separated paths relative to the root."""

    uri: str

    def exists(self, name: str) -> bool: ...

    def put_bytes(self, name: str, data: bytes) -> None: ...

    def get_bytes(self, name: str) -> bytes: ...

    def names(self, prefix: str) -> list[str]: ...

    def child(self, name: str) -> Location: ...


@dataclass(frozen=True)
class LocalLocation:
    """A directory; each write lands in a temporary file first, then `os.replace` publishes it,
    so a killed writer leaves the old file or the new one, never half of one."""

    root: Path

    @property
    def uri(self) -> str:
        return str(self.root)

    def exists(self, name: str) -> bool:
        return (self.root / name).is_file()

    def put_bytes(self, name: str, data: bytes) -> None:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def get_bytes(self, name: str) -> bytes:
        return (self.root / name).read_bytes()

    def names(self, prefix: str) -> list[str]:
        base = self.root / prefix
        if not base.is_dir():
            return []
        return sorted(str(p.relative_to(self.root)) for p in base.rglob("*")
                      if p.is_file() and not p.name.startswith("."))

    def remove(self, name: str) -> None:
        """Delete a file (local checkpoints of finished trials; S3 objects are immutable)."""
        (self.root / name).unlink(missing_ok=True)

    def child(self, name: str) -> LocalLocation:
        return LocalLocation(self.root / name)


class S3Location:
    """A folder under an ObjectStore's prefix. Objects are create-only: a name is written once,
    so checkpoints use one key per step and the newest step wins on resume."""

    def __init__(self, store: ObjectStore, folder: str = ""):
        self.store, self.folder = store, folder.strip("/")

    @classmethod
    def from_uri_parts(cls, bucket: str, prefix: str) -> S3Location:
        """Endpoint and keys from the environment (BATCHSCALE_S3_ENDPOINT, AWS_ACCESS_KEY_ID,
        AWS_SECRET_ACCESS_KEY), bucket and prefix from the URI."""
        env = S3Settings.from_env({**os.environ, "BATCHSCALE_S3_BUCKET": bucket})
        return cls(ObjectStore(S3Settings(env.endpoint_url, bucket, prefix.strip("/"),
                                          env.access_key, env.secret_key)))

    @property
    def uri(self) -> str:
        return f"{S3_SCHEME}://{self.store.settings.bucket}/{self.store.key(self.folder)}"

    def _key(self, name: str) -> str:
        return self.store.key(self.folder, name)

    def exists(self, name: str) -> bool:
        return self.store.exists(self._key(name))

    def put_bytes(self, name: str, data: bytes) -> None:
        self.store.put_bytes(self._key(name), data)

    def get_bytes(self, name: str) -> bytes:
        return self.store.get_bytes(self._key(name))

    def names(self, prefix: str) -> list[str]:
        root = self.store.key(self.folder)
        cut = len(root) + 1 if root else 0
        return [key[cut:] for key in self.store.list(f"{self.folder}/{prefix}")]

    def child(self, name: str) -> S3Location:
        return S3Location(self.store, f"{self.folder}/{name}")


def open_location(uri: str | Path) -> Location:
    """`s3://bucket/prefix` or a local path."""
    text = str(uri)
    parts = urlsplit(text)
    if parts.scheme == S3_SCHEME:
        if not parts.netloc:
            raise BadInput(f"{text!r}: an S3 location must look like s3://bucket/prefix")
        return S3Location.from_uri_parts(parts.netloc, parts.path)
    if parts.scheme and len(parts.scheme) > 1:  # a Windows drive letter is not a scheme
        raise BadInput(f"{text!r}: unsupported location; use a local path or s3://bucket/prefix")
    return LocalLocation(Path(text))


def table_bytes(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


def bytes_table(data: bytes) -> pa.Table:
    """ParquetFile(...).read(), not pq.read_table(BytesIO): see DESIGN §3 (apache/arrow#34314)."""
    return pq.ParquetFile(pa.BufferReader(data)).read()
