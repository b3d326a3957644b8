"""Text for the language model: the Python-docs corpus, byte windows, and a user's text from
.txt files or a Parquet column, local or on S3, with a clear message for each bad input."""

from __future__ import annotations

import re
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscale.data.text import byte_sequences, load_user_text, python_docs_text
from batchscale.errors import BadInput
from batchscale.storage import ObjectStore, parquet_bytes
from helpers import store_env

# The corpus of CPython 3.11's topic pages is ~466 KB; any CPython 3.x has well over 100 KB.
MIN_CORPUS_BYTES = 100_000


# ------------------------------------------------------------------------------ corpus
def test_python_docs_text_is_real_utf8_prose_in_a_fixed_order():
    text = python_docs_text()
    assert len(text) > MIN_CORPUS_BYTES
    decoded = text.decode("utf-8")
    assert re.search(r"The .if. statement", decoded)  # the topic page of `if`
    assert text == python_docs_text()


def test_python_docs_text_missing_module_names_the_way_out(monkeypatch):
    monkeypatch.setitem(sys.modules, "pydoc_data.topics", None)  # import now raises ImportError
    with pytest.raises(BadInput, match="pydoc_data.topics.*own text"):
        python_docs_text()


# ------------------------------------------------------------------------------ windows
def test_byte_sequences_are_non_overlapping_windows_with_the_last_byte_as_label():
    data = bytes(range(23))  # 3 windows of 7 bytes, a tail of 2 dropped
    raw = byte_sequences(data, 6, "test")
    assert raw.features.shape == (3, 7) and raw.features.dtype == np.float32
    assert raw.labels.dtype == np.int64 and raw.num_classes == 256
    assert raw.features[1].tolist() == list(range(7, 14))
    assert raw.labels.tolist() == [6, 13, 20]
    assert "23 bytes as 3 byte sequences" in raw.source


def test_byte_sequences_keep_high_bytes_exact():
    data = "é€😀".encode() * 10  # multi-byte UTF-8: ids up to 0xF0
    raw = byte_sequences(data, 8, "test")
    assert bytes(raw.features.astype(np.uint8).ravel().tolist()) == data[:len(raw.features) * 9]


@pytest.mark.parametrize(("data", "seq_len", "needle"), [
    (b"abcd", 4, "4 bytes of text, fewer than one sequence of 5 bytes"),
    (b"", 1, "0 bytes of text"),
    (b"abcd", 0, "sequence length 0: must be at least 1"),
])
def test_byte_sequences_refuse_too_little_text(data, seq_len, needle):
    with pytest.raises(BadInput, match=needle):
        byte_sequences(data, seq_len, "test")


# --------------------------------------------------------------------------- user text
def test_one_text_file(tmp_path):
    (tmp_path / "book.md").write_text("hello world", encoding="utf-8")
    assert load_user_text(str(tmp_path / "book.md"), None, tmp_path) == b"hello world"


def test_a_directory_of_txt_files_in_sorted_order(tmp_path):
    (tmp_path / "b.txt").write_text("second")
    (tmp_path / "a.txt").write_text("first")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.txt").write_text("third")
    (tmp_path / "notes.md").write_text("not read")
    assert load_user_text(str(tmp_path), None, tmp_path) == b"first\n\nsecond\n\nthird"


def test_parquet_text_column(tmp_path):
    pq.write_table(pa.table({"text": ["one", "two"], "id": [1, 2]}), tmp_path / "t.parquet")
    assert load_user_text(str(tmp_path), "text", tmp_path) == b"one\n\ntwo"
    assert load_user_text(str(tmp_path / "t.parquet"), "text", tmp_path) == b"one\n\ntwo"


def test_text_from_s3_prefix_and_object(tmp_path, object_store: ObjectStore, monkeypatch):
    object_store.put_bytes(object_store.key("corpus", "a.txt"), "naïve".encode())
    object_store.put_bytes(object_store.key("corpus", "b.parquet"),
                           parquet_bytes(pa.table({"body": ["row"]})))
    for key, value in store_env(object_store).items():
        monkeypatch.setenv(key, value)
    uri = f"s3://{object_store.settings.bucket}/{object_store.key('corpus')}"
    assert load_user_text(uri, "body", tmp_path) == "naïve\n\nrow".encode()
    assert load_user_text(f"{uri}/a.txt", None, tmp_path) == "naïve".encode()


def write_parquet(path, columns: dict) -> str:
    pq.write_table(pa.table(columns), path / "t.parquet")
    return str(path / "t.parquet")


@pytest.mark.parametrize(("columns", "column", "needle"), [
    ({"body": ["x"], "id": [1]}, "text", r"no text column 'text'; columns are \['body', 'id'\]"),
    ({"text": [1, 2]}, "text", "column 'text' has type int64; the text column must hold strings"),
    ({"text": ["a", None]}, "text", "1 nulls, at rows \\[1\\]"),
    ({"text": ["", ""]}, "text", "no text found"),
    ({"text": ["a"]}, None, "needs dataset.text_column"),
])
def test_bad_parquet_text(tmp_path, columns, column, needle):
    uri = write_parquet(tmp_path, columns)
    with pytest.raises(BadInput, match=needle):
        load_user_text(uri, column, tmp_path)


def test_missing_path_and_empty_directory_and_binary_file(tmp_path):
    with pytest.raises(BadInput, match="no such file or directory"):
        load_user_text(str(tmp_path / "absent"), None, tmp_path)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "image.png").write_bytes(b"\x89PNG")
    with pytest.raises(BadInput, match=r"no \*.txt or \*.parquet files"):
        load_user_text(str(tmp_path / "empty"), None, tmp_path)
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    with pytest.raises(BadInput, match="latin1.txt: not UTF-8 text"):
        load_user_text(str(tmp_path / "latin1.txt"), None, tmp_path)
    (tmp_path / "blank.txt").write_text("  \n")
    with pytest.raises(BadInput, match="no text found"):
        load_user_text(str(tmp_path / "blank.txt"), None, tmp_path)
