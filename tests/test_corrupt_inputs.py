"""Corrupted inputs, each tried through the real code path: the pipeline's validate stage on a
prepared dataset directory, or `batchscale validate --table KIND FILE`. Each is refused with a
message naming the table (or file), the expectation and the offending values; a clean dataset
passes. (The suites' logic itself is tested on in-memory tables in tests/test_checks.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchscale.checks import validate_table
from batchscale.checks.stage import validate_dataset
from batchscale.config import DataPrepConfig, ExperimentConfig
from batchscale.data.prep import MANIFEST_FILE, prepare, sha256_file
from batchscale.errors import BadInput, ValidationFailed
from batchscale.schemas import TrialStatus, make_table
from batchscale.storage import write_table_atomic
from helpers import run_cli

CONFIG_JSON = ExperimentConfig().to_json()
TRAIN_SHARD = "train-00000.parquet"
ENV = {"run_id": "r1", "config_hash": "c0ffee", "experiment": "corrupt", "workload": "digits-mlp",
       "git_commit": "deadbeef", "batchscale_version": "0.1.0", "torch_version": "2.14.1",
       "python_version": "3.11", "device_name": "cpu", "threads": 2, "world_size": 1}


@pytest.fixture
def data_dir(tmp_path) -> Path:
    out = tmp_path / "data"
    prepare(DataPrepConfig(), out)
    return out


def replace_shard(data_dir: Path, table: pa.Table, *, keep_manifest_checksum: bool = False):
    """Rewrite the train shard; unless told otherwise the manifest is updated to the new bytes,
    so that only the corruption under test can fail."""
    write_table_atomic(data_dir / TRAIN_SHARD, table)
    if keep_manifest_checksum:
        return
    rows = pq.read_table(data_dir / MANIFEST_FILE).to_pylist()
    for row in rows:
        if row["shard"] == TRAIN_SHARD:
            row["sha256"] = sha256_file(data_dir / TRAIN_SHARD)
    write_table_atomic(data_dir / MANIFEST_FILE, make_table("manifest", rows))


def run_stage(data_dir: Path, tmp_path: Path) -> Path:
    json_path = tmp_path / "validation.json"
    validate_dataset(CONFIG_JSON, str(data_dir), str(json_path), str(tmp_path / "v.html"))
    return json_path


def refused_by_stage(data_dir: Path, tmp_path: Path, capsys, *needles: str) -> str:
    with pytest.raises(ValidationFailed) as err:
        run_stage(data_dir, tmp_path)
    message = str(err.value)
    for needle in needles:
        assert needle in message, message
    assert "validate train-00000.parquet: FAILED" in capsys.readouterr().out
    results = json.loads((tmp_path / "validation.json").read_text())
    assert any(not r["success"] for r in results)
    return message


def train_table(data_dir: Path) -> pa.Table:
    return pq.read_table(data_dir / TRAIN_SHARD)


# ------------------------------------------------------------------------------ dataset
def test_clean_dataset_passes(data_dir, tmp_path, capsys):
    results = json.loads(run_stage(data_dir, tmp_path).read_text())
    assert [r["table"] for r in results] == ["manifest", "val-00000.parquet", TRAIN_SHARD]
    assert all(r["success"] for r in results)
    assert "validate train-00000.parquet: passed" in capsys.readouterr().out


def test_truncated_parquet_file(data_dir, tmp_path):
    shard = data_dir / TRAIN_SHARD
    shard.write_bytes(shard.read_bytes()[:-100])
    result = run_cli(["validate", "--table", "dataset", str(shard)], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"{shard} is not a valid Parquet file" in result.stderr
    with pytest.raises(BadInput, match=f"{shard} is not a valid Parquet file"):
        run_stage(data_dir, tmp_path)


def test_renamed_column(data_dir, tmp_path):
    shard = tmp_path / "renamed.parquet"
    pq.write_table(train_table(data_dir).rename_columns(["pixels", "label"]), shard)
    result = run_cli(["validate", "--table", "dataset", str(shard)], cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "dataset table failed validation" in result.stderr
    assert "expect_column_to_exist(features)" in result.stderr
    assert "pixels" in result.stderr  # the column found instead


def test_nans_in_features(data_dir, tmp_path, capsys):
    table = train_table(data_dir)
    features = np.stack(table.column("features").to_numpy(zero_copy_only=False))
    features[[3, 7], 5] = np.nan
    replace_shard(data_dir, table.set_column(0, "features", [list(features)]))
    refused_by_stage(data_dir, tmp_path, capsys, "dataset table failed validation",
                     "expect_column_values_to_be_between(features_nonfinite_count)",
                     "2 of 1438 unexpected")


def test_labels_out_of_range(data_dir, tmp_path, capsys):
    table = train_table(data_dir)
    labels = table.column("label").to_numpy().copy()
    labels[[0, 9]] = [10, 12]  # a 10-class dataset
    replace_shard(data_dir, table.set_column(1, "label", pa.array(labels)))
    message = refused_by_stage(data_dir, tmp_path, capsys, "dataset table failed validation",
                               "expect_column_values_to_be_between(label)")
    assert "10" in message and "12" in message


def test_shard_checksum_does_not_match_manifest(data_dir, tmp_path, capsys):
    table = train_table(data_dir)
    replace_shard(data_dir, table.take(np.arange(len(table))[::-1]), keep_manifest_checksum=True)
    with pytest.raises(ValidationFailed) as err:
        run_stage(data_dir, tmp_path)
    message = str(err.value)
    assert "manifest table failed validation" in message
    assert "expect_shard_checksums_to_match_manifest(sha256)" in message
    assert f"{TRAIN_SHARD}: manifest " in message and sha256_file(data_dir / TRAIN_SHARD) in message


# -------------------------------------------------------------------------------- sweep
def sweep_row(batch: int, samples_per_s: float) -> dict:
    step_s = batch / samples_per_s if samples_per_s > 0 else 0.01
    return {"input_mode": "synthetic", "batch_size": batch, "status": TrialStatus.OK,
            "precision": "fp32", "timed_steps": 20, "step_time_median_s": step_s,
            "step_time_p10_s": step_s * 0.9, "step_time_p90_s": step_s * 1.1, "step_time_cv": 0.05,
            "samples_per_s": samples_per_s, "peak_memory_bytes": 1000 * batch,
            "train_flops_per_sample": 1e6, "achieved_flops_per_s": 1e9,
            "peak_flops_per_s": 1e10, "mfu": 0.1}


def test_sweep_with_negative_throughput(tmp_path):
    clean = make_table("sweep", [sweep_row(4, 400.0), sweep_row(16, 1200.0)], ENV)
    assert validate_table("sweep", clean).success  # the same rows, uncorrupted, pass
    path = tmp_path / "sweep.parquet"
    write_table_atomic(path, make_table("sweep", [sweep_row(4, 400.0), sweep_row(16, -5.0)],
                                        ENV))
    result = run_cli(["validate", "--table", "sweep", str(path)], cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "sweep table failed validation" in result.stderr
    assert "expect_column_values_to_be_between(samples_per_s)" in result.stderr
    assert "-5.0" in result.stderr
