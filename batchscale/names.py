"""The one place where user-supplied names and URLs are checked before they become a path, an S3
key or a printed message: run ids, experiment and workload names, key prefixes, bucket names,
endpoint URLs and s3:// URIs.

Each check returns the value unchanged or raises BadInput naming the input and what is allowed;
the refused value is quoted short (at most QUOTE_CHARS) and with credentials redacted. Patterns
use `fullmatch` (a `$` would also match before a trailing newline) and ASCII classes only (a
`\\w` or `\\d` would also take other scripts' letters and digits).
"""

from __future__ import annotations

import re
import reprlib
from urllib.parse import SplitResult, urlsplit

from batchscale.errors import BadInput

NAME_MAX_CHARS = 128
SAFE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
"""Run ids and experiment names: one path segment, never '.', '..' or hidden."""
SAFE_NAME_RULE = ("use letters, digits, '.', '_' or '-' (at most 128, starting with a letter or "
                  "digit, no '..')")
PREFIX_SEGMENT = SAFE_NAME
BUCKET_NAME = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
"""S3 bucket naming rules: 3-63 lowercase letters, digits, '.' and '-'."""
_IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
FACTORY_SPEC = re.compile(rf"(?P<module>{_IDENTIFIER}(?:\.{_IDENTIFIER})*):(?P<attr>{_IDENTIFIER})")
"""A user model, 'package.module:factory': a dotted module path and a name in it (ASCII)."""
FACTORY_MAX_CHARS = 255
ENDPOINT_SCHEMES = ("http", "https")
S3_SCHEME = "s3"
REDACTED = "***"
QUOTE_CHARS = 100
"""Most characters of a refused value that a message quotes (the rest is cut, marked '…')."""
# What ends a URL (or a bare user:password@host) inside a text: a space, tab or line break
# only, so that a quote, bracket or odd control character inside a password cannot end it early
# (a quote around a URL is then part of the run, and a bare user:password starts after such
# openers).
_TOKEN = re.compile(r"[^ \t\r\n]+")
_TOKEN_OPENERS = "([{<=,;'\"`"


def quote(value: object) -> str:
    """`value` for a message: repr'd, credentials in URLs redacted, at most QUOTE_CHARS."""
    text = redact_url(repr(value) if isinstance(value, str) else reprlib.repr(value))
    return text if len(text) <= QUOTE_CHARS else text[:QUOTE_CHARS - 1] + "…"


def _safe(value: object, what: str, pattern: re.Pattern[str], allowed: str) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value) or ".." in value:
        raise BadInput(f"{what} {quote(value)} is not allowed; {allowed}")
    return value


def check_run_id(run_id: object) -> str:
    """A run id: it names a directory of every run and a partition of the lake."""
    return _safe(run_id, "run id", SAFE_NAME, SAFE_NAME_RULE)


def check_name(name: object, what: str = "name") -> str:
    """An experiment name or another label that may end up in a path or key."""
    return _safe(name, what, SAFE_NAME, SAFE_NAME_RULE)


def is_factory_spec(name: object) -> bool:
    """`name` has the form of a user model, 'package.module:factory' (see FACTORY_SPEC)."""
    return (isinstance(name, str) and len(name) <= FACTORY_MAX_CHARS
            and FACTORY_SPEC.fullmatch(name) is not None)


def split_factory_spec(spec: object, what: str = "workload") -> tuple[str, str]:
    """(module, factory) of 'package.module:factory'."""
    if not is_factory_spec(spec):
        raise BadInput(f"{what} {quote(spec)} is not a user model; write it as "
                       f"'package.module:factory' (ASCII letters, digits and '_', at most "
                       f"{FACTORY_MAX_CHARS} characters)")
    module, attr = str(spec).split(":")
    return module, attr


def check_workload(name: object, what: str = "workload") -> str:
    """A workload name as a user may give it: a registered name (one safe segment) or
    'package.module:factory'. Whether it exists is batchscale.workloads' concern."""
    if is_factory_spec(name):
        return str(name)
    return _safe(name, what, SAFE_NAME, "use a name from `batchscale workloads` or "
                 "'package.module:factory'")


def check_prefix(prefix: object, what: str = "S3 prefix") -> str:
    """A key prefix: '/'-separated safe segments (no empty, '.' or '..' segment); '' is the
    bucket's root. Leading and trailing '/' are dropped."""
    if not isinstance(prefix, str):
        raise BadInput(f"{what} must be text, got {quote(prefix)}")
    stripped = prefix.strip("/")
    if stripped and not all(PREFIX_SEGMENT.fullmatch(s) and ".." not in s
                            for s in stripped.split("/")):
        raise BadInput(f"{what} {quote(prefix)} is not allowed; use '/'-separated parts of "
                       "letters, digits, '.', '_' or '-' (no empty, '.' or '..' part)")
    return stripped


def check_bucket(bucket: object, what: str = "bucket") -> str:
    if not isinstance(bucket, str) or not BUCKET_NAME.fullmatch(bucket) or ".." in bucket:
        raise BadInput(f"{what} {quote(bucket)} is not a valid S3 bucket name; use 3-63 "
                       "lowercase letters, digits, '.' or '-', starting and ending with a letter "
                       "or digit")
    return bucket


def redact_url(text: str) -> str:
    """`text` with the credentials of every URL in it replaced by '***', for messages and logs.

    Generous on purpose, since what it misses is printed: in each run of text without
    whitespace that holds an '@', everything from after '://' (or, without a scheme,
    from the start of a `user:password@` run) up to the last '@' is replaced, so a password
    with '@' or '/' in it, or an endpoint typed without its scheme, is hidden too. One pass over
    the text (linear time)."""
    out, done = [], 0
    for token in _TOKEN.finditer(text):
        at = token.group().rfind("@")
        if at < 0:
            continue
        start = _userinfo_start(token.group()[:at])
        if start is None:
            continue
        out += [text[done:token.start() + start], REDACTED]
        done = token.start() + at
    return "".join(out) + text[done:] if out else text


def _userinfo_start(before_at: str) -> int | None:
    """Where the credentials begin in the part of a token before its last '@': after '://', or
    after any opening punctuation of a bare 'user:password'; None when there are none."""
    scheme_end = before_at.find("://")
    if scheme_end >= 0:
        return scheme_end + 3
    start = len(before_at) - len(before_at.lstrip(_TOKEN_OPENERS))
    return start if ":" in before_at[start:] else None


def _split(url: str, what: str) -> SplitResult:
    # No '@' is valid anywhere in an endpoint or an s3:// URI (bucket names and key parts
    # exclude it): refusing it first keeps a password out of urlsplit's own error texts.
    if "@" in url:
        raise BadInput(f"{what} {quote(url)} carries credentials; put the keys in "
                       "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (or a Kubernetes Secret), "
                       "never in a URL")
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number < 65536
    except ValueError as err:
        raise BadInput(f"{what} {quote(url)} is not a valid URL: {err}") from None
    return parts


def check_endpoint(url: object, what: str = "S3 endpoint") -> str:
    """http(s)://host[:port], nothing after the authority (no path, query or fragment)."""
    if not isinstance(url, str):
        raise BadInput(f"{what} must be text, got {quote(url)}")
    parts = _split(url, what)
    if parts.scheme not in ENDPOINT_SCHEMES or not parts.hostname:
        raise BadInput(f"{what} {quote(url)} must look like http://host:port or https://host")
    if parts.path.strip("/") or parts.query or parts.fragment:
        raise BadInput(f"{what} {quote(url)} must be only scheme, host and port (no path, query "
                       "or fragment)")
    return url


def split_s3_uri(uri: object, what: str = "S3 URI") -> tuple[str, str]:
    """(bucket, prefix) of s3://bucket/prefix, each checked."""
    if not isinstance(uri, str):
        raise BadInput(f"{what} must be text, got {quote(uri)}")
    parts = _split(uri, what)
    if parts.scheme != S3_SCHEME or not parts.netloc:
        raise BadInput(f"{what} {quote(uri)} must look like s3://bucket/prefix")
    if parts.query or parts.fragment:
        raise BadInput(f"{what} {quote(uri)} must not have a query or fragment")
    return check_bucket(parts.netloc, f"{what} bucket"), check_prefix(parts.path, f"{what} prefix")
