"""Parquet tables and bytes in S3 (SeaweedFS, MinIO, AWS) through boto3.

Every object write is create-only and checksummed: results are never silently overwritten, a
retried write that already landed counts as success, and the store rejects corrupted uploads.
boto3 is imported lazily so that CLI commands which never touch S3 do not pay for it.
Every wait on the endpoint is bounded: short for the connection check before any work
(PREFLIGHT_WAITS), longer for transfers (TRANSFER_WAITS), and each whole call (every attempt,
every byte) by a deadline, so a server that trickles its bytes cannot hold a command past it;
an answer that is not from an S3 server is named as such instead of being parsed as one.
"""


from __future__ import annotations

import base64
import contextlib
import hashlib
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import pyarrow as pa

from batchscale.deadline import DeadlinePassed, call_within
from batchscale.errors import BadInput, ObjectExists, StoreError
from batchscale.names import check_bucket, check_endpoint, check_prefix, redact_url
from batchscale.storage.files import parse_parquet

if TYPE_CHECKING:
    import pyarrow.fs

REGION = "us-east-1"
"""SeaweedFS and MinIO ignore the region, but SigV4 signing needs one."""

_REFUSED_CODES = frozenset(
    {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"})
_MISSING_KEY_CODES = frozenset({"404", "NoSuchKey", "NotFound"})
_MISSING_BUCKET_CODES = frozenset({"NoSuchBucket"})
DEFAULT_BUCKET = "batchscale"
DEFAULT_PREFIX = "batchscale"


@dataclass(frozen=True)
class Waits:
    """How long a client waits on the endpoint: to connect, for each answer, how many
    attempts (the first one included) it makes before giving up, and for the whole call."""

    connect_s: float
    read_s: float
    attempts: int
    deadline_s: float
    """The whole call, attempts and bytes: a read timeout only bounds the wait for the next
    bytes, so an endpoint that trickles them would otherwise hold the call for ever."""

    def at_most(self, other: Waits) -> Waits:
        return Waits(min(self.connect_s, other.connect_s), min(self.read_s, other.read_s),
                     min(self.attempts, other.attempts), min(self.deadline_s, other.deadline_s))


PREFLIGHT_WAITS = Waits(connect_s=5.0, read_s=10.0, attempts=2, deadline_s=25.0)
"""The connection check before any work (`ObjectStore.check`): an endpoint that accepts the
connection but never answers fails it within 2 × 10 s (plus < 1 s of backoff), one that does not
accept it within 2 × 5 s, one that trickles its answer within 25 s. Stated in docs/lake.md
("Object storage")."""
TRANSFER_WAITS = Waits(connect_s=5.0, read_s=60.0, attempts=6, deadline_s=600.0)
"""Uploads and reads once the endpoint has answered: large objects and a busy store get time,
at most 10 minutes for one call."""


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

    def __post_init__(self) -> None:
        """Every way of building settings (environment, local store, s3:// URI) is checked by
        batchscale.names, so a bad name never becomes a key or a request."""
        if self.endpoint_url is not None:
            check_endpoint(self.endpoint_url)
        check_bucket(self.bucket)
        object.__setattr__(self, "prefix", check_prefix(self.prefix))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> S3Settings:
        """Read the settings that `batchscale store env` exports (or a cluster secret sets),
        each checked at start-up: StoreError naming the variable (never a secret)."""
        endpoint = environ.get("BATCHSCALE_S3_ENDPOINT") or None
        with _naming_the_variable():
            if endpoint is not None:
                check_endpoint(endpoint, "BATCHSCALE_S3_ENDPOINT")
            bucket = check_bucket(environ.get("BATCHSCALE_S3_BUCKET", DEFAULT_BUCKET),
                                  "BATCHSCALE_S3_BUCKET")
            prefix = env_prefix(environ)
        return cls(endpoint_url=endpoint, bucket=bucket, prefix=prefix,
                   access_key=_required(environ, "AWS_ACCESS_KEY_ID"),
                   secret_key=_required(environ, "AWS_SECRET_ACCESS_KEY"))


def env_prefix(environ: Mapping[str, str] = os.environ) -> str:
    """BATCHSCALE_S3_PREFIX, checked (BadInput naming it), without leading or trailing '/'."""
    return check_prefix(environ.get("BATCHSCALE_S3_PREFIX", DEFAULT_PREFIX),
                        "BATCHSCALE_S3_PREFIX")


@contextlib.contextmanager
def _naming_the_variable() -> Iterator[None]:
    """A bad S3 variable is a store setting to fix: StoreError (exit 2), as before."""
    try:
        yield
    except BadInput as err:
        raise StoreError(str(err)) from None


def _required(environ: Mapping[str, str], name: str) -> str:
    value = environ.get(name)
    if not value:
        raise StoreError(f"{name} is not set: S3 credentials are required "
                         '(for the local store run `eval "$(batchscale store env)"`)')
    return value


def sha256_b64(data: bytes) -> str:
    """The SHA-256 digest in the base64 form S3 uses for `ChecksumSHA256`."""
    return base64.b64encode(hashlib.sha256(data).digest()).decode("ascii")


class ObjectStore:
    """Objects under one prefix: create-only, checksummed writes; reads of bytes and Parquet."""

    def __init__(
        self,
        settings: S3Settings,
        max_attempts: int = TRANSFER_WAITS.attempts - 1,
        connect_timeout_s: float = TRANSFER_WAITS.connect_s,
        read_timeout_s: float = TRANSFER_WAITS.read_s,
        deadline_s: float = TRANSFER_WAITS.deadline_s,
    ) -> None:
        self.settings = settings
        self._max_attempts = max_attempts  # retries after the first attempt, as botocore counts
        self._waits = Waits(connect_timeout_s, read_timeout_s, max_attempts + 1, deadline_s)
        self._preflight_waits = PREFLIGHT_WAITS.at_most(self._waits)
        self._client = _s3_client(settings, self._waits, _refuse_non_s3_errors)
        self._preflight = None  # the check's own client, built on first use
        self.endpoint = redact_url(self._client.meta.endpoint_url)

    def __repr__(self) -> str:
        return f"ObjectStore({self.settings!r})"

    def key(self, *parts: str) -> str:
        """The full object key for `parts` under the store prefix."""
        pieces = [self.settings.prefix, *parts]
        return "/".join(p.strip("/") for p in pieces if p.strip("/"))

    def check(self, create_bucket: bool = False) -> None:
        """Fail early, with an actionable message, if the endpoint, keys or bucket are wrong.

        The first request of every command: short timeouts and at most two attempts
        (PREFLIGHT_WAITS), and an answer that is not from an S3 server is named as such.
        `create_bucket` creates a missing bucket instead (used when starting the local store).
        """
        from botocore.exceptions import ClientError

        if self._preflight is None:
            self._preflight = _s3_client(self.settings, self._preflight_waits, _refuse_non_s3)
        bucket = self.settings.bucket
        waits = self._preflight_waits
        with self._translate(waits=waits):
            try:
                self.bounded(lambda: self._preflight.head_bucket(Bucket=bucket), waits)
            except ClientError as exc:
                if _code(exc) not in _MISSING_KEY_CODES | _MISSING_BUCKET_CODES:
                    raise
                if not create_bucket:
                    raise self._error(f"bucket {bucket!r} does not exist at S3 endpoint "
                                      f"{self.endpoint}{_unmarked(exc)}") from None
                self.bounded(lambda: self._preflight.create_bucket(Bucket=bucket), waits)

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
                self.bounded(lambda: self._client.put_object(
                    Bucket=self.settings.bucket, Key=key, Body=data, IfNoneMatch="*",
                    ChecksumSHA256=digest))
            except ClientError as exc:
                if _code(exc) not in ("PreconditionFailed", "412"):
                    raise
            else:
                return True
        if self.checksum(key) == digest:
            return False
        raise ObjectExists(f"{self._uri(key)} already exists with different contents; "
                           "stored results are never overwritten (write under a new key)")

    def get_bytes(self, key: str) -> bytes:
        """The object's bytes; StoreError naming the key if there is none."""
        with self._translate(key):
            return self.bounded(lambda: self._client.get_object(
                Bucket=self.settings.bucket, Key=key)["Body"].read())

    def get_table(self, key: str) -> pa.Table:
        """Read a Parquet object; BadInput if the bytes are not Parquet."""
        return parse_parquet(pa.BufferReader(self.get_bytes(key)), self._uri(key))

    def list(self, prefix: str = "", page_size: int = 1000) -> list[str]:
        """Full keys of all objects under `prefix` (a folder below the store prefix), sorted."""
        root = self.key(prefix)
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.settings.bucket, Prefix=f"{root}/" if root else "",
                                   PaginationConfig={"PageSize": page_size})
        with self._translate():
            return self.bounded(lambda: sorted(
                obj["Key"] for page in pages for obj in page.get("Contents", [])))

    def exists(self, key: str) -> bool:
        """Whether an object is stored under `key`."""
        from botocore.exceptions import ClientError

        with self._translate(key):
            try:
                self.bounded(lambda: self._client.head_object(Bucket=self.settings.bucket,
                                                               Key=key))
            except ClientError as exc:
                if _code(exc) in _MISSING_KEY_CODES:
                    return False
                raise
        return True

    def checksum(self, key: str) -> str | None:
        """The stored SHA-256 (base64) of the object, None if the store kept none."""
        with self._translate(key):
            head = self.bounded(lambda: self._client.head_object(
                Bucket=self.settings.bucket, Key=key, ChecksumMode="ENABLED"))
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
            access_key=self.settings.access_key, secret_key=self.settings.secret_key,
            region=REGION, connect_timeout=self._waits.connect_s,
            request_timeout=self._waits.read_s,
            retry_strategy=AwsStandardS3RetryStrategy(max_attempts=self._max_attempts), **options)

    def _uri(self, key: str) -> str:
        return f"s3://{self.settings.bucket}/{key}"

    def pyarrow_read(self, call: Callable[[], Any], what: str) -> Any:
        """`call()` reading `what` through `pyarrow_filesystem`, within the total deadline; a
        failure pyarrow raises as OSError (its network errors) becomes a StoreError that names
        the endpoint and says what pyarrow said."""
        try:
            return self.bounded(call)
        except OSError as err:
            raise self._error(f"reading {what} from S3 endpoint {self.endpoint} failed: "
                              f"{str(err).splitlines()[0]}") from None

    def bounded(self, call: Callable[[], Any], waits: Waits | None = None) -> Any:
        """`call()` (botocore requests, or pyarrow reads through `pyarrow_filesystem`), given at
        most `waits.deadline_s` in all. It runs in a daemon thread the caller waits for: neither
        library has a total timeout, and a call past its deadline is left to its own read
        timeouts (or the process's end), never waited for."""
        waits = waits or self._waits
        try:
            return call_within(call, waits.deadline_s, "s3-call")
        except DeadlinePassed:
            raise self._error(f"S3 endpoint {self.endpoint} did not complete a request within "
                              f"{waits.deadline_s:g} s (it answers, but too slowly); check the "
                              "endpoint and the network to it") from None

    @contextlib.contextmanager
    def _translate(self, key: str | None = None, waits: Waits | None = None) -> Iterator[None]:
        """Turn botocore failures into StoreErrors that say what to fix (never the secret), and
        for a wait that ran out, which endpoint did not answer and after how long."""
        from botocore import exceptions as boto

        waits = waits or self._waits
        try:
            yield
        except boto.ReadTimeoutError:
            raise self._error(f"S3 endpoint {self.endpoint} accepted the connection but did not "
                              f"answer within {waits.read_s:g} s ({_attempts(waits)})") from None
        except boto.ConnectTimeoutError:
            raise self._error(f"S3 endpoint {self.endpoint} did not accept a connection within "
                              f"{waits.connect_s:g} s ({_attempts(waits)})") from None
        except NotS3 as exc:
            raise self._error(f"S3 endpoint {self.endpoint} does not speak S3: {exc}. Point "
                              "BATCHSCALE_S3_ENDPOINT at the store's S3 port (SeaweedFS 8333, "
                              "MinIO 9000; unset for AWS)") from None
        except (boto.ConnectionError, boto.HTTPClientError) as exc:
            raise self._error(f"cannot reach S3 endpoint {self.endpoint}: {exc}") from None
        except boto.ClientError as exc:
            raise self._client_error(exc, key) from None

    def _client_error(self, exc: Any, key: str | None) -> StoreError:
        code = _code(exc)
        if code in _REFUSED_CODES:
            return self._error(f"S3 endpoint {self.endpoint} refused the credentials for bucket "
                               f"{self.settings.bucket!r} ({code}): check AWS_ACCESS_KEY_ID and "
                               "AWS_SECRET_ACCESS_KEY")
        if code in _MISSING_BUCKET_CODES:
            return self._error(f"bucket {self.settings.bucket!r} does not exist at S3 endpoint "
                               f"{self.endpoint}")
        if key is not None and code in _MISSING_KEY_CODES:
            return self._error(f"no object {self._uri(key)}")
        return self._error(f"S3 request to {self.endpoint} failed for "
                           f"{self._uri(key) if key else self.settings.bucket}: {exc}")

    @staticmethod
    def _error(message: str) -> StoreError:
        """Every store message passes here: credentials in any URL it quotes are hidden."""
        return StoreError(redact_url(message))


def _attempts(waits: Waits) -> str:
    return "1 attempt" if waits.attempts == 1 else f"{waits.attempts} attempts"


def _s3_client(settings: S3Settings, waits: Waits, on_response: Callable[..., None]) -> Any:
    """A botocore S3 client with `waits`; `on_response` sees every raw answer before botocore
    parses it (botocore would otherwise follow a web server's redirects until it overflows
    the stack, or call its 404 page a missing bucket)."""
    import boto3
    from botocore.config import Config

    client = boto3.session.Session().client(
        "s3", endpoint_url=settings.endpoint_url, aws_access_key_id=settings.access_key,
        aws_secret_access_key=settings.secret_key, region_name=REGION,
        config=Config(retries={"mode": "standard", "total_max_attempts": waits.attempts},
                      s3={"addressing_style": "path"}, connect_timeout=waits.connect_s,
                      read_timeout=waits.read_s))
    client.meta.events.register("before-parse.s3.*", on_response)
    return client


class NotS3(Exception):
    """The endpoint answered, but not as an S3 server does."""


_XML_TYPES = ("application/xml", "text/xml")


def _speaks_s3(status: int, headers: Mapping[str, str]) -> bool:
    """Whether an answer comes from an S3 server: those mark every answer with x-amz-* headers
    (x-amz-request-id) or answer in XML; a plain web server sends HTML, redirects a bucket
    "directory" (301) or refuses S3 methods (501) with neither."""
    if any(name.lower().startswith("x-amz-") for name in headers):
        return True
    content_type = headers.get("content-type", "").lower()
    if content_type.startswith(_XML_TYPES):
        return True
    return not content_type and not 300 <= status < 400


def _describe(status: int, headers: Mapping[str, str]) -> str:
    what = headers.get("content-type") or "no content type"
    server = f", server {headers['server']!r}" if headers.get("server") else ""
    return f"it answered HTTP {status} ({what}{server}) without any S3 header"


def _refuse_non_s3(response_dict: dict, **_: Any) -> None:
    """The check's hook: any answer, success or error, must come from an S3 server."""
    status, headers = response_dict["status_code"], response_dict["headers"]
    if not _speaks_s3(status, headers):
        raise NotS3(_describe(status, headers))


def _refuse_non_s3_errors(response_dict: dict, **_: Any) -> None:
    """Transfers' hook: only error answers are judged (an object's own content type is the
    uploader's choice, and some S3 servers send no x-amz-* header with an object)."""
    if response_dict["status_code"] >= 300:
        _refuse_non_s3(response_dict)


def _unmarked(exc: Any) -> str:
    """What a 'not found' without any S3 header may also mean (a bare 404 from another web
    server looks like a missing bucket to an S3 client)."""
    headers = exc.response.get("ResponseMetadata", {}).get("HTTPHeaders", {})
    if any(name.lower().startswith("x-amz-") for name in headers):
        return ""
    return (f", or it is not an S3 server: it answered HTTP "
            f"{exc.response.get('ResponseMetadata', {}).get('HTTPStatusCode', '?')} with no S3 "
            "header (x-amz-request-id); check BATCHSCALE_S3_ENDPOINT (SeaweedFS 8333, MinIO "
            "9000; unset for AWS)")


def _code(exc: Any) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


