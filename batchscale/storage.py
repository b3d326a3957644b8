"""Parquet tables and bytes in S3 (SeaweedFS, MinIO, AWS), plus the one atomic local writer.

Every object write is create-only and checksummed: results are never silently overwritten, a
retried write that already landed counts as success, and the store rejects corrupted uploads.
Every local write goes through `atomic_file` (temporary file, fsync, rename, directory fsync).
Parquet is read with `ParquetFile(...).read()`, never `pq.read_table(io.BytesIO(...))`, which
made the process abort at interpreter exit (apache/arrow#34314).
boto3 is imported lazily so that CLI commands which never touch S3 do not pay for it.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import secrets
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from batchscale.errors import BadInput, ObjectExists, StoreError

if TYPE_CHECKING:
    import pyarrow.fs

REGION = "us-east-1"
"""SeaweedFS and MinIO ignore the region, but SigV4 signing needs one."""

_REFUSED_CODES = frozenset(
    {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"}
)
_MISSING_KEY_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_MISSING_BUCKET_CODES = frozenset({"NoSuchBucket"})


@dataclass(frozen=True)
class S3Settings:
    """Where objects live and how to sign requests; the keys never show in repr or logs."""

    endpoint_url: str | None
    """http(s)://host:port of an S3-compatible server; None means AWS S3."""
    bucket: str
    prefix: str
    """Every key this project writes starts with this prefix (no leading or trailing '/')."""
    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> S3Settings:
        """Read the settings that `batchscale store env` exports (or a cluster secret sets)."""
        endpoint = environ.get("BATCHSCALE_S3_ENDPOINT") or None
        if endpoint is not None and urlsplit(endpoint).scheme not in ("http", "https"):
            raise StoreError(
                f"BATCHSCALE_S3_ENDPOINT must look like http://host:port, got {endpoint!r}"
            )
        bucket = environ.get("BATCHSCALE_S3_BUCKET", "batchscale")
        if len(bucket) < 3:
            raise StoreError(
                f"BATCHSCALE_S3_BUCKET must name a bucket of at least 3 characters, got {bucket!r}"
            )
        return cls(
            endpoint_url=endpoint,
            bucket=bucket,
            prefix=environ.get("BATCHSCALE_S3_PREFIX", "batchscale").strip("/"),
            access_key=_required(environ, "AWS_ACCESS_KEY_ID"),
            secret_key=_required(environ, "AWS_SECRET_ACCESS_KEY"),
        )


def _required(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name)
    if not value:
        raise StoreError(
            f"{name} is not set: S3 credentials are required "
            '(for the local store run `eval "$(batchscale store env)"`)'
        )
    return value


def sha256_b64(data: bytes) -> str:
    """The SHA-256 digest in the base64 form S3 uses for `ChecksumSHA256`."""
    return base64.b64encode(hashlib.sha256(data).digest()).decode("ascii")


class ObjectStore:
    """Objects under one prefix: create-only, checksummed writes; reads of bytes and Parquet."""

    def __init__(
        self,
        settings: S3Settings,
        max_attempts: int = 5,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 60.0,
    ) -> None:
        import boto3
        from botocore.config import Config

        self.settings = settings
        self._max_attempts = max_attempts
        self._connect_timeout_s = connect_timeout_s
        self._read_timeout_s = read_timeout_s
        self._client = boto3.session.Session().client(
            "s3",
            endpoint_url=settings.endpoint_url,
            aws_access_key_id=settings.access_key,
            aws_secret_access_key=settings.secret_key,
            region_name=REGION,
            config=Config(
                retries={"mode": "standard", "max_attempts": max_attempts},
                s3={"addressing_style": "path"},
                connect_timeout=connect_timeout_s,
                read_timeout=read_timeout_s,
            ),
        )
        self.endpoint = self._client.meta.endpoint_url

    def __repr__(self) -> str:
        return f"ObjectStore({self.settings!r})"

    def key(self, *parts: str) -> str:
        """The full object key for `parts` under the store prefix."""
        pieces = [self.settings.prefix, *parts]
        return "/".join(p.strip("/") for p in pieces if p.strip("/"))

    def check(self, create_bucket: bool = False) -> None:
        """Fail early, with an actionable message, if the endpoint, keys or bucket are wrong.

        `create_bucket` creates a missing bucket instead (used when starting the local store).
        """
        from botocore.exceptions import ClientError

        bucket = self.settings.bucket
        with self._translate():
            try:
                self._client.head_bucket(Bucket=bucket)
            except ClientError as exc:
                if _code(exc) not in _MISSING_KEY_CODES | _MISSING_BUCKET_CODES:
                    raise
                if not create_bucket:
                    raise StoreError(
                        f"bucket {bucket!r} does not exist at S3 endpoint {self.endpoint}"
                    ) from None
                self._client.create_bucket(Bucket=bucket)

    def put_bytes(self, key: str, data: bytes) -> bool:
        """Store `data` under `key` unless the key exists; True if this call created it.

        The object is sent with its SHA-256 so the server rejects bytes corrupted in transit.
        An existing object with the same checksum is a repeat of this write (for instance a
        retry whose first response was lost) and returns False; different bytes raise
        ObjectExists, because results are immutable.
        """
        from botocore.exceptions import ClientError

        digest = sha256_b64(data)
        with self._translate(key):
            try:
                self._client.put_object(
                    Bucket=self.settings.bucket,
                    Key=key,
                    Body=data,
                    IfNoneMatch="*",
                    ChecksumSHA256=digest,
                )
            except ClientError as exc:
                if _code(exc) not in ("PreconditionFailed", "412"):
                    raise
            else:
                return True
        if self.checksum(key) == digest:
            return False
        raise ObjectExists(
            f"{self._uri(key)} already exists with different contents; "
            "stored results are never overwritten (write under a new key)"
        )

    def get_bytes(self, key: str) -> bytes:
        """The object's bytes; StoreError naming the key if there is none."""
        with self._translate(key):
            response = self._client.get_object(Bucket=self.settings.bucket, Key=key)
            return response["Body"].read()

    def get_table(self, key: str) -> pa.Table:
        """Read a Parquet object; BadInput if the bytes are not Parquet."""
        return _parse_parquet(pa.BufferReader(self.get_bytes(key)), self._uri(key))

    def list(self, prefix: str = "", page_size: int = 1000) -> list[str]:
        """Full keys of all objects under `prefix` (a folder below the store prefix), sorted."""
        root = self.key(prefix)
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(
            Bucket=self.settings.bucket,
            Prefix=f"{root}/" if root else "",
            PaginationConfig={"PageSize": page_size},
        )
        with self._translate():
            return sorted(obj["Key"] for page in pages for obj in page.get("Contents", []))

    def exists(self, key: str) -> bool:
        """Whether an object is stored under `key`."""
        from botocore.exceptions import ClientError

        with self._translate(key):
            try:
                self._client.head_object(Bucket=self.settings.bucket, Key=key)
            except ClientError as exc:
                if _code(exc) in _MISSING_KEY_CODES:
                    return False
                raise
        return True

    def checksum(self, key: str) -> str | None:
        """The stored SHA-256 (base64) of the object, None if the store kept none."""
        with self._translate(key):
            head = self._client.head_object(
                Bucket=self.settings.bucket, Key=key, ChecksumMode="ENABLED"
            )
        return head.get("ChecksumSHA256")

    def pyarrow_filesystem(self) -> pyarrow.fs.S3FileSystem:
        """A pyarrow filesystem on the same store, for reading Hive-partitioned datasets.

        Paths on it are "<bucket>/<key>". Use it for reads only: pyarrow's own writer can
        publish partial objects when interrupted (apache/arrow#40502).
        """
        from pyarrow.fs import AwsStandardS3RetryStrategy, S3FileSystem

        options: dict[str, Any] = {}
        if self.settings.endpoint_url is not None:
            url = urlsplit(self.settings.endpoint_url)
            options = {"endpoint_override": url.netloc, "scheme": url.scheme}
        return S3FileSystem(
            access_key=self.settings.access_key,
            secret_key=self.settings.secret_key,
            region=REGION,
            connect_timeout=self._connect_timeout_s,
            request_timeout=self._read_timeout_s,
            retry_strategy=AwsStandardS3RetryStrategy(max_attempts=self._max_attempts),
            **options,
        )

    def _uri(self, key: str) -> str:
        return f"s3://{self.settings.bucket}/{key}"

    @contextlib.contextmanager
    def _translate(self, key: str | None = None) -> Iterator[None]:
        """Turn botocore failures into StoreErrors that say what to fix (never the secret)."""
        from botocore.exceptions import ClientError, ConnectionError, HTTPClientError

        try:
            yield
        except (ConnectionError, HTTPClientError) as exc:
            raise StoreError(f"cannot reach S3 endpoint {self.endpoint}: {exc}") from None
        except ClientError as exc:
            code = _code(exc)
            if code in _REFUSED_CODES:
                raise StoreError(
                    f"S3 endpoint {self.endpoint} refused the credentials for bucket "
                    f"{self.settings.bucket!r} ({code}): check AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY"
                ) from None
            if code in _MISSING_BUCKET_CODES:
                raise StoreError(
                    f"bucket {self.settings.bucket!r} does not exist at S3 endpoint {self.endpoint}"
                ) from None
            if key is not None and code in _MISSING_KEY_CODES:
                raise StoreError(f"no object {self._uri(key)}") from None
            raise StoreError(
                f"S3 request to {self.endpoint} failed for "
                f"{self._uri(key) if key else self.settings.bucket}: {exc}"
            ) from None


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _parse_parquet(source: pa.NativeFile | str | Path, name: str) -> pa.Table:
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
    return _parse_parquet(str(path), str(path))
