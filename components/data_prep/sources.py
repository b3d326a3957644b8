"""Where dataset files live: a local directory or an `s3://bucket/prefix`, read through the
project's storage module so S3 reads get the same credentials, retries and error messages as
every other stage.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from batchscale.errors import BadInput
from batchscale.storage import ObjectStore, S3Settings

S3_SCHEME = "s3"


def is_s3_uri(uri: str | Path) -> bool:
    return isinstance(uri, str) and uri.startswith(f"{S3_SCHEME}://")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """(bucket, prefix) of `s3://bucket/prefix`; BadInput for anything else."""
    parts = urlsplit(uri)
    if parts.scheme != S3_SCHEME or not parts.netloc:
        raise BadInput(f"{uri!r} is not an S3 URI; expected s3://bucket/prefix")
    return parts.netloc, parts.path.strip("/")


def store_for_uri(uri: str, environ: Mapping[str, str] = os.environ) -> ObjectStore:
    """A store rooted at the URI's bucket and prefix. The endpoint and keys come from the
    environment (BATCHSCALE_S3_ENDPOINT, AWS_*), as for the results store, because a URI in a
    config must never carry credentials."""
    bucket, prefix = parse_s3_uri(uri)
    settings = dataclasses.replace(S3Settings.from_env(environ), bucket=bucket, prefix=prefix)
    return ObjectStore(settings)


def relative_key(store: ObjectStore, key: str) -> str:
    """`key` relative to the store's prefix (the path a file has inside the dataset)."""
    root = store.key()
    return key[len(root) + 1:] if root else key


def download_prefix(store: ObjectStore, folder: str, dest: Path) -> list[Path]:
    """Copy every object under `folder` (below the store prefix) to the same relative path
    under `dest`, so that a reader written for a local directory reads the S3 copy unchanged."""
    keys = store.list(folder)
    if not keys:
        raise BadInput(f"s3://{store.settings.bucket}/{store.key(folder)}/ holds no objects")
    written = []
    for key in keys:
        target = dest / relative_key(store, key)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(store.get_bytes(key))
        written.append(target)
    return written


def local_root(uri: str, folder: str, cache_dir: Path) -> Path:
    """A local directory holding `folder` of the dataset at `uri`: the directory itself, or a
    copy of the S3 prefix's `folder` in `cache_dir`."""
    if is_s3_uri(uri):
        download_prefix(store_for_uri(uri), folder, cache_dir)
        return cache_dir
    root = Path(uri)
    if not root.is_dir():
        raise BadInput(f"source_uri {uri!r} is not a directory (or an s3://bucket/prefix)")
    return root
