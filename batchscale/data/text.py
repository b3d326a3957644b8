"""Text for the byte-level language model: the offline corpus and a user's own text.

The corpus is the Python documentation's topic pages, which ship with CPython itself as the
standard library module `pydoc_data.topics` (PSF licence): real English prose with code, present
wherever Python is, so nothing is downloaded. A user's text comes from .txt files or a Parquet
string column, on local disk or under an s3:// prefix.

Tokens are bytes (0..255): no tokenizer, no vocabulary file. Each sequence is a window of
seq_len + 1 bytes stored as float32 features (exact for integers below 2**24), so it travels
through the same Parquet shards as every other dataset; the language-model task splits it
into inputs (the first seq_len bytes) and next-byte targets (the last seq_len).
See docs/architecture.md ("How to add a dataset").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa

from batchscale.data.datasets import RawDataset
from batchscale.errors import BadInput
from batchscale.location import Location, is_s3_uri, open_file, open_location

BYTE_VOCAB = 256
TEXT_SUFFIX = ".txt"
PARQUET_SUFFIX = ".parquet"
DOCUMENT_SEPARATOR = b"\n\n"
"""Between topics of the corpus and between the files or rows of a user's text."""
PYTHON_DOCS_SOURCE = "pydoc_data.topics (Python documentation topics, PSF licence)"
MAX_SHOWN = 5
"""Offending rows named in an error message."""


def python_docs_text() -> bytes:
    """The Python documentation's topic pages from the standard library, in sorted topic
    order, joined with blank lines, as UTF-8 bytes (the same bytes on every run of one Python
    version)."""
    try:
        from pydoc_data.topics import topics
    except ImportError:
        raise BadInput("dataset python-docs needs the standard library module pydoc_data.topics, "
                       "which this Python lacks (some distributions strip it; e.g. Debian's "
                       "python3 keeps it in a separate package); install a full CPython, or "
                       "train on your own text with dataset.name: text and dataset.source_uri "
                       "(.txt files or a Parquet text column)") from None
    pages = [topics[key] for key in sorted(topics)]
    return DOCUMENT_SEPARATOR.join(page.encode("utf-8") for page in pages)


def byte_sequences(data: bytes, seq_len: int, source: str) -> RawDataset:
    """Non-overlapping windows of seq_len + 1 bytes (the tail that fills no window is
    dropped): features float32 (rows, seq_len + 1), labels the last byte of each window (the
    byte the last position predicts), 256 classes."""
    if seq_len < 1:
        raise BadInput(f"sequence length {seq_len}: must be at least 1 byte")
    window = seq_len + 1
    rows = len(data) // window
    if rows == 0:
        raise BadInput(f"{source}: {len(data)} bytes of text, fewer than one sequence of "
                       f"{window} bytes (seq_len {seq_len} + 1); give more text or a shorter "
                       "seq_len")
    ids = np.frombuffer(data, dtype=np.uint8, count=rows * window).reshape(rows, window)
    features = ids.astype(np.float32)
    labels = ids[:, -1].astype(np.int64)
    described = (f"{source}: {len(data):,} bytes as {rows:,} byte sequences of "
                 f"{seq_len}+1 (tail of {len(data) - rows * window} bytes dropped)")
    return RawDataset(features, labels, BYTE_VOCAB, described)


def load_user_text(source_uri: str, text_column: str | None, cache_dir: Path) -> bytes:
    """A user's text as UTF-8 bytes: one local file, or every .txt and .parquet file under a
    local directory or an s3:// prefix (in sorted name order), documents joined with blank
    lines. Parquet files contribute the rows of their string column `text_column`.

    `cache_dir` keeps the signature of the other loaders; text is read into memory, so nothing
    is cached there."""
    del cache_dir
    location, names = _text_files(source_uri)
    documents: list[bytes] = []
    for name in names:
        if name.endswith(PARQUET_SUFFIX):
            documents.extend(_parquet_documents(location, name, text_column))
        else:
            documents.append(_utf8_file(location, name))
    if not any(document.strip() for document in documents):
        raise BadInput(f"text {source_uri}: no text found in {len(names)} file(s) "
                       f"({', '.join(names[:MAX_SHOWN])}); every file or row is empty")
    return DOCUMENT_SEPARATOR.join(documents)


# ------------------------------------------------------------------------------ finding
def _text_files(uri: str) -> tuple[Location, list[str]]:
    """The location and names of the files to read: the one file `uri` names, or the .txt and
    .parquet files below the directory or prefix it names."""
    if _names_one_file(uri):
        location, name = open_file(uri)
        return location, [name]
    location = open_location(uri)
    names = [n for n in location.names() if n.endswith((TEXT_SUFFIX, PARQUET_SUFFIX))]
    if not names:
        raise BadInput(f"text {uri}: no *{TEXT_SUFFIX} or *{PARQUET_SUFFIX} files there; "
                       "give a text file, a directory of .txt files, Parquet files with a "
                       "text column, or an s3:// prefix holding them")
    return location, names


def _names_one_file(uri: str) -> bool:
    if is_s3_uri(uri):
        return uri.endswith((TEXT_SUFFIX, PARQUET_SUFFIX))
    path = Path(uri)
    if not path.exists():
        raise BadInput(f"text {uri}: no such file or directory; give a text file, a directory "
                       "of .txt files, Parquet files with a text column, or an s3:// prefix")
    return not path.is_dir()


# ------------------------------------------------------------------------------ reading
def _utf8_file(location: Location, name: str) -> bytes:
    data = location.get_bytes(name)
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadInput(f"text {location.where(name)}: not UTF-8 text (byte {err.start}: "
                       f"{err.reason}); convert it to UTF-8 first") from None
    return data


def _parquet_documents(location: Location, name: str, column: str | None) -> list[bytes]:
    where = location.where(name)
    if column is None:
        raise BadInput(f"text {where}: a Parquet file needs dataset.text_column, the name of "
                       "its string column holding the text")
    table = location.get_table(name)
    if column not in table.column_names:
        raise BadInput(f"text {where}: no text column {column!r}; columns are "
                       f"{table.column_names} (set dataset.text_column)")
    values = table.column(column)
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
        raise BadInput(f"text {where}: column {column!r} has type {values.type}; the text "
                       "column must hold strings")
    nulls = np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))
    if nulls.size:
        raise BadInput(f"text {where}: column {column!r} has {nulls.size} nulls, at rows "
                       f"{nulls[:MAX_SHOWN].tolist()}; drop or fill them first")
    return [text.encode("utf-8") for text in values.to_pylist()]
