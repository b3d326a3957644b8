"""The loader: prepared shards to tensors, sharded by rank, from a directory or a real S3 store,
and refusing shards that no longer match their manifest."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from batchscale.components.data_prep.datasets import digits
from batchscale.components.data_prep.loader import load_split
from batchscale.components.data_prep.prep import MANIFEST_FILE, prepare, split_indices
from batchscale.config import DataPrepConfig
from batchscale.errors import BadInput
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


def test_ranks_split_the_shards_between_them(sharded_dir):
    full_x, full_y = load_split(sharded_dir, "train")
    parts = [load_split(sharded_dir, "train", rank=r, world_size=2) for r in range(2)]
    assert [len(p[1]) for p in parts] == [2200, 2000]  # shards 0, 2, 4 and 1, 3
    joined = torch.cat([parts[0][0][:1000], parts[1][0][:1000], parts[0][0][1000:2000],
                        parts[1][0][1000:], parts[0][0][2000:]])
    assert torch.equal(joined, full_x)
    assert sorted(torch.cat([p[1] for p in parts]).tolist()) == sorted(full_y.tolist())


def test_fewer_shards_than_ranks_gives_every_rank_the_split(digits_dir):
    x0, _ = load_split(digits_dir, "val", rank=0, world_size=4)
    x3, _ = load_split(digits_dir, "val", rank=3, world_size=4)
    assert torch.equal(x0, x3)
    with pytest.raises(BadInput, match=r"rank 4 is outside 0..3"):
        load_split(digits_dir, "val", rank=4, world_size=4)


def test_reads_from_s3_by_store_and_by_uri(digits_dir, object_store: ObjectStore, monkeypatch):
    upload(object_store, digits_dir, "prepared")
    local = load_split(digits_dir, "train")
    by_store = load_split("prepared", "train", store=object_store)
    for key, value in store_env(object_store).items():
        monkeypatch.setenv(key, value)
    uri = f"s3://{object_store.settings.bucket}/{object_store.key('prepared')}"
    by_uri = load_split(uri, "train", rank=0, world_size=2)
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
        load_split("tampered", "val", store=object_store)


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
