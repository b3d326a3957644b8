"""The loader: prepared shards to tensors, from a directory or a real S3 store, and refusing
shards that no longer match their manifest."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from batchscale import shards
from batchscale.config import DataPrepConfig
from batchscale.data.datasets import digits
from batchscale.data.prep import MANIFEST_FILE, prepare, split_indices
from batchscale.errors import BadInput
from batchscale.location import S3Location
from batchscale.shards import load_split
from batchscale.storage import ObjectStore
from helpers import store_env


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("digits")
    prepare(DataPrepConfig(), out)
    return out


@pytest.fixture(scope="module")
def sharded_dir(tmp_path_factory) -> Path:
    """Teacher-student data in 5 train shards (1,000, ..., 1,000, 200 rows)."""
    out = tmp_path_factory.mktemp("sharded")
    prepare(DataPrepConfig(name="teacher-student", synthetic_train_rows=4200,
                           rows_per_shard=1000), out)
    return out


def upload(store: ObjectStore, local: Path, prefix: str) -> None:
    for path in local.iterdir():
        store.put_bytes(store.key(prefix, path.name), path.read_bytes())


def test_split_tensors_hold_the_source_rows(digits_dir):
    x, y = load_split(digits_dir, "train")
    raw = digits()
    idx = split_indices(len(raw.labels), 0.2, 0)["train"]
    assert (x.dtype, y.dtype) == (torch.float32, torch.int64)
    assert torch.equal(x, torch.from_numpy(raw.features[idx]))
    assert torch.equal(y, torch.from_numpy(raw.labels[idx]))


def test_input_shape_reshapes_without_copying_rows(digits_dir):
    x, _ = load_split(digits_dir, "val", input_shape=(1, 8, 8))
    flat, _ = load_split(digits_dir, "val")
    assert x.shape == (len(flat), 1, 8, 8)
    assert torch.equal(x.reshape(len(x), -1), flat)
    with pytest.raises(BadInput, match=r"examples of shape \[64\] cannot feed a model taking"):
        load_split(digits_dir, "val", input_shape=(3, 8, 8))


def test_a_split_of_several_shards_is_read_whole_in_manifest_order(sharded_dir):
    x, y = load_split(sharded_dir, "train")
    shards = [pq.read_table(sharded_dir / f"train-{i:05d}.parquet") for i in range(5)]
    assert [t.num_rows for t in shards] == [1000, 1000, 1000, 1000, 200]
    expected_y = np.concatenate([t.column("label").to_numpy() for t in shards])
    expected_x = np.concatenate([np.stack(t.column("features").to_numpy(zero_copy_only=False))
                                 for t in shards])
    assert torch.equal(y, torch.from_numpy(expected_y))
    assert torch.equal(x, torch.from_numpy(expected_x))


def test_a_large_training_split_is_read_row_by_row_from_an_unnamed_file(sharded_dir, tmp_path,
                                                                       monkeypatch):
    """Streamed above IN_MEMORY_MAX_BYTES (here 0): the rows live in a temporary file with no
    name (nothing to clean up, even after SIGKILL) and are read per batch; what they read is
    what the in-memory load holds, by index list, tensor or slice, in any row shape."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    held, y = load_split(sharded_dir, "train")
    monkeypatch.setattr(shards, "IN_MEMORY_MAX_BYTES", 0)
    rows, streamed_y = load_split(sharded_dir, "train", stream=True)
    assert isinstance(rows, shards.RowFile) and list(tmp_path.iterdir()) == []
    assert torch.equal(streamed_y, y) and len(rows) == len(held) == 4200
    picked = torch.tensor([4199, 0, 17, 17, 2500])
    assert torch.equal(rows[picked], held[picked])
    assert torch.equal(rows[[3, 1]], held[[3, 1]])
    assert torch.equal(rows[:300], held[:300]) and rows[4200:].shape == (0, *held.shape[1:])
    with pytest.raises(IndexError):
        rows[[4200]]
    images, _ = load_split(sharded_dir, "train", stream=True, input_shape=(1, *held.shape[1:]))
    assert torch.equal(images[picked], held[picked][:, None])
    in_memory, _ = load_split(sharded_dir, "val", stream=False)
    assert isinstance(in_memory, torch.Tensor)


def test_reads_from_s3_by_store_and_by_uri(digits_dir, object_store: ObjectStore, monkeypatch):
    upload(object_store, digits_dir, "prepared")
    local = load_split(digits_dir, "train")
    by_store = load_split(S3Location(object_store, "prepared"), "train")
    for key, value in store_env(object_store).items():
        monkeypatch.setenv(key, value)
    uri = f"s3://{object_store.settings.bucket}/{object_store.key('prepared')}"
    by_uri = load_split(uri, "train")
    for x, y in (by_store, by_uri):
        assert torch.equal(x, local[0]) and torch.equal(y, local[1])


def test_changed_shard_on_s3_is_refused(digits_dir, tmp_path, object_store: ObjectStore):
    copy = tmp_path / "copy"
    copy.mkdir()
    for path in digits_dir.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    shard = copy / "val-00000.parquet"
    table = pq.read_table(shard)
    pq.write_table(table.slice(1), shard)  # one row fewer: valid Parquet, other bytes
    upload(object_store, copy, "tampered")
    with pytest.raises(BadInput, match=r"tampered/val-00000.parquet: sha256 [0-9a-f]{64} does "
                                       r"not match the manifest's"):
        load_split(S3Location(object_store, "tampered"), "val")


def test_missing_manifest_split_and_shard_are_named(digits_dir, tmp_path):
    with pytest.raises(BadInput, match=f"has no {MANIFEST_FILE}"):
        load_split(tmp_path, "train")
    with pytest.raises(BadInput, match=r"lists no 'test' shards; splits: \['train', 'val'\]"):
        load_split(digits_dir, "test")
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / MANIFEST_FILE).write_bytes((digits_dir / MANIFEST_FILE).read_bytes())
    with pytest.raises(BadInput, match=r"train-00000.parquet does not exist"):
        load_split(copy, "train")


def test_loader_output_trains_like_the_source(digits_dir):
    """Labels and features stay paired: a linear probe fitted on the loaded tensors separates
    the classes as on scikit-learn's arrays (a misaligned load would score near chance)."""
    x, y = load_split(digits_dir, "train")
    w = torch.linalg.lstsq(torch.cat([x, torch.ones(len(x), 1)], 1),
                           torch.nn.functional.one_hot(y, 10).float()).solution
    vx, vy = load_split(digits_dir, "val")
    accuracy = (torch.cat([vx, torch.ones(len(vx), 1)], 1) @ w).argmax(1).eq(vy).float().mean()
    assert accuracy > 0.85
    assert np.isclose(float(x.max()), 1.0) and float(x.min()) == 0.0
