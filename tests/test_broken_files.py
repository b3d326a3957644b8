"""A corpus of broken files through every reader: each gets a clear BadInput (exit 2 from the
CLI) naming the file, never a hang and never a traceback as the user-facing message."""

import struct

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscale.data.user_parquet import load_user_parquet
from batchscale.errors import BadInput
from batchscale.shards import read_manifest
from batchscale.storage import read_table_file
from helpers import run_cli


def _good_bytes(tmp_path) -> bytes:
    path = tmp_path / "good.parquet"
    pq.write_table(pa.table({"x": list(range(1000)), "y": [float(i) for i in range(1000)]}),
                   path)
    return path.read_bytes()


def corpus(tmp_path) -> dict[str, bytes]:
    good = _good_bytes(tmp_path)
    huge_footer = good[:-8] + struct.pack("<i", 2**31 - 1) + b"PAR1"
    return {
        "empty": b"",
        "truncated": good[: len(good) // 2],
        "wrong-magic": b"NOPE" + good[4:-4] + b"NOPE",
        "text": b"label,features\n1,2\n",
        "huge-declared-footer": huge_footer,
        "footer-only": b"PAR1" + struct.pack("<i", 10**9) + b"PAR1",
    }


@pytest.fixture
def broken_files(tmp_path):
    files = {}
    for name, data in corpus(tmp_path).items():
        path = tmp_path / f"{name}.parquet"
        path.write_bytes(data)
        files[name] = path
    return files


def test_local_reader_refuses_each_broken_file(broken_files):
    for name, path in broken_files.items():
        with pytest.raises(BadInput) as err:
            read_table_file(path)
        assert str(path) in str(err.value), name
        assert "not a valid Parquet file" in str(err.value), name


def test_store_reader_refuses_each_broken_object(object_store, tmp_path):
    for name, data in corpus(tmp_path).items():
        key = object_store.key("broken", f"{name}.parquet")
        object_store.put_bytes(key, data)
        with pytest.raises(BadInput) as err:
            object_store.get_table(key)
        assert key in str(err.value), name


def test_manifest_reader_refuses_broken_manifest(broken_files, tmp_path):
    data_dir = tmp_path / "dataset"
    data_dir.mkdir()
    (data_dir / "manifest.parquet").write_bytes(broken_files["truncated"].read_bytes())
    with pytest.raises(BadInput, match="manifest.parquet"):
        read_manifest(data_dir)


def test_validate_cli_refuses_each_broken_file_without_traceback(broken_files, tmp_path):
    for name, path in broken_files.items():
        result = run_cli(["validate", "--table", "sweep", str(path)], cwd=tmp_path,
                         timeout_s=120)
        assert result.returncode == 2, (name, result.stderr)
        assert "Traceback" not in result.stderr
        assert str(path) in result.stderr


def test_wrong_schema_is_named(tmp_path):
    path = tmp_path / "other.parquet"
    pq.write_table(pa.table({"something": [1, 2]}), path)
    result = run_cli(["validate", "--table", "runs", str(path)], cwd=tmp_path, timeout_s=120)
    assert result.returncode == 3
    assert "runs table failed validation" in result.stderr
    assert "trial_id" in result.stderr  # a missing column is named


def test_duplicated_column_is_refused_without_traceback(tmp_path):
    """A readable file whose schema is wrong is a failed validation (exit 3), like a renamed
    column; the duplicated column is named."""
    path = tmp_path / "twice.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([[0.5, 1.0]] * 3), pa.array([0, 1, 1]),
                                         pa.array([1, 0, 0])],
                                        names=["features", "label", "label"]), path)
    result = run_cli(["validate", "--table", "dataset", str(path)], cwd=tmp_path, timeout_s=120)
    assert result.returncode == 3, result.stderr
    assert "Traceback" not in result.stderr
    assert "expect_column_names_to_be_unique(label)" in result.stderr
    assert str(path) in result.stderr
    assert list(tmp_path.iterdir()) == [path]  # nothing written


def test_duplicated_column_in_a_user_parquet_file(tmp_path):
    path = tmp_path / "mine.parquet"
    pq.write_table(pa.Table.from_arrays([pa.array([[0.5, 1.0]] * 2), pa.array([0, 1]),
                                         pa.array([1, 0])],
                                        names=["features", "label", "label"]), path)
    with pytest.raises(BadInput, match=f"parquet {path}: column 'label' appears 2 times"):
        load_user_parquet(str(path), "features", "label", None)
