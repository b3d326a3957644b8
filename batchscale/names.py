"""The one place where user-supplied names and URLs are checked before they become a path, an S3
key or a printed message: run ids, experiment and workload names, key prefixes, bucket names,
endpoint URLs and s3:// URIs.

Each check returns the value unchanged or raises BadInput naming the input and what is allowed.
Patterns use `fullmatch` (a `$` would also match before a trailing newline).
"""

from __future__ import annotations

import re
from urllib.parse import SplitResult, urlsplit

from batchscale.errors import BadInput

NAME_MAX_CHARS = 128
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""Run ids and experiment names: one path segment, never '.', '..' or hidden."""
PREFIX_SEGMENT = SAFE_NAME
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
"""S3 bucket naming rules: 3-63 lowercase letters, digits, '.' and '-'."""
ENDPOINT_SCHEMES = ("http", "https")
S3_SCHEME = "s3"
REDACTED = "***"


def _safe(value: object, what: str, pattern: re.Pattern[str], allowed: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value) or ".." in value:
        raise BadInput(f"{what} {value!r} is not allowed; {allowed}")
    return value


def check_run_id(run_id: object) -> str:
    """A run id: it names a directory of every run and a partition of the lake."""
    return _safe(run_id, "run id", SAFE_NAME,
                 "use letters, digits, '.', '_' or '-' (at most 128, starting with a letter or "
                 "digit, no '..')")


def check_name(name: object, what: str = "name") -> str:
    """An experiment name or another label that may end up in a path or key."""
    return _safe(name, what, SAFE_NAME,
                 "use letters, digits, '.', '_' or '-' (at most 128, starting with a letter or "
                 "digit, no '..')")


def check_prefix(prefix: object, what: str = "S3 prefix") -> str:
    """A key prefix: '/'-separated safe segments (no empty, '.' or '..' segment); '' is the
    bucket's root. Leading and trailing '/' are dropped."""
    if not isinstance(prefix, str):
        raise BadInput(f"{what} must be text, got {prefix!r}")
    stripped = prefix.strip("/")
    if stripped and not all(PREFIX_SEGMENT.fullmatch(s) and s not in (".", "..")
                            for s in stripped.split("/")):
        raise BadInput(f"{what} {prefix!r} is not allowed; use '/'-separated parts of letters, "
                       "digits, '.', '_' or '-' (no empty, '.' or '..' part)")
    return stripped


def check_bucket(bucket: object, what: str = "bucket") -> str:
    if not isinstance(bucket, str) or not BUCKET_NAME.fullmatch(bucket) or ".." in bucket:
        raise BadInput(f"{what} {bucket!r} is not a valid S3 bucket name; use 3-63 lowercase "
                       "letters, digits, '.' or '-', starting and ending with a letter or digit")
    return bucket


def redact_url(text: str) -> str:
    """`text` with the user:password part of every URL in it replaced, for messages and logs."""
    return re.sub(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/@\s]*@", rf"\1{REDACTED}@", text)


def _split(url: str, what: str) -> SplitResult:
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number < 65536
    except ValueError as err:
        raise BadInput(f"{what} {redact_url(url)!r} is not a valid URL: {err}") from None
    if "@" in parts.netloc:
        raise BadInput(f"{what} {redact_url(url)!r} carries credentials; put the keys in "
                       "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or a Kubernetes Secret), "
                       "never in a URL")
    return parts


def check_endpoint(url: object, what: str = "S3 endpoint") -> str:
    """http(s)://host[:port], nothing after the authority (no path, query or fragment)."""
    if not isinstance(url, str):
        raise BadInput(f"{what} must be text, got {url!r}")
    parts = _split(url, what)
    if parts.scheme not in ENDPOINT_SCHEMES or not parts.hostname:
        raise BadInput(f"{what} {url!r} must look like http://host:port or https://host")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise BadInput(f"{what} {url!r} must be only scheme, host and port (no path, query or "
                       "fragment)")
    return url


def split_s3_uri(uri: object, what: str = "S3 URI") -> tuple[str, str]:
    """(bucket, prefix) of s3://bucket/prefix, each checked."""
    if not isinstance(uri, str):
        raise BadInput(f"{what} must be text, got {uri!r}")
    parts = _split(uri, what)
    if parts.scheme != S3_SCHEME or not parts.netloc:
        raise BadInput(f"{what} {uri!r} must look like s3://bucket/prefix")
    if parts.query or parts.fragment:
        raise BadInput(f"{what} {uri!r} must not have a query or fragment")
    return check_bucket(parts.netloc, f"{what} bucket"), check_prefix(parts.path, f"{what} prefix")
