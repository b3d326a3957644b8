"""Publishing to the results lake on a real SeaweedFS: create-only, idempotent, never overwriting.

`publish_synthetic_run` (used by the history and regression tests too) builds a small run's
tables with `schemas.make_table` and publishes them through the publish stage's own entry point.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchscale.config import ExperimentConfig, PublishConfig
from batchscale.errors import BadInput, ObjectExists
from batchscale.lake.publish import (
    LAKE_TABLES,
    check_run_id,
    publish_run,
    run_manifest_key,
    run_stage,
    table_key,
)
from batchscale.schemas import make_table
from batchscale.storage import ObjectStore, write_table_atomic
from helpers import store_env

WORKLOAD = "digits-mlp"
DEVICE = "cpu: Test CPU"
S_MIN, E_MIN = 100.0, 6400.0
"""B_crit = 64 in the synthetic convergence runs."""


def env_columns(run_id: str, workload: str = WORKLOAD, device: str = DEVICE) -> dict:
    return {"run_id": run_id, "config_hash": "0123456789abcdef", "experiment": "lake-test",
            "workload": workload, "git_commit": "abc123", "batchscale_version": "0.1.0",
            "torch_version": "2.14.1", "python_version": "3.11.9", "device_name": device,
            "threads": 2, "world_size": 1}


def sweep_row(batch: int, samples_per_s: float | None, *, mode: str = "synthetic",
              status: str = "ok", precision: str = "fp32") -> dict:
    ok = status == "ok"
    return {"input_mode": mode, "batch_size": batch, "status": status, "precision": precision,
            "timed_steps": 20 if ok else 0,
            "step_time_median_s": batch / samples_per_s if ok else None,
            "step_time_cv": 0.02 if ok else None, "samples_per_s": samples_per_s if ok else None,
            "peak_memory_bytes": 50_000_000 + 100_000 * batch if ok else None,
            "error": None if ok else "CUDA out of memory"}


def runs_rows(scale: float = 1.0) -> list[dict]:
    """Trials with S(B) = scale·(S_min + E_min/B), two seeds, all reaching the target."""
    rows = []
    for batch in (8, 16, 32, 64, 128, 256):
        for seed in (0, 1):
            steps = round(scale * (S_MIN + E_MIN / batch) * (1 + 0.02 * seed))
            rows.append({"trial_id": f"linear-{batch}-{seed}", "batch_size": batch,
                         "lr_rule": "linear", "lr": 0.05, "seed": seed, "workers": 1,
                         "status": "reached", "steps_run": steps, "steps_to_target": steps,
                         "examples_to_target": steps * batch, "time_to_target_s": steps * 1e-3,
                         "final_val_accuracy": 0.95, "target_val_accuracy": 0.95,
                         "b_simple": 50.0, "train_time_s": steps * 1e-3})
    return rows


def analysis_rows(b_crit: float) -> list[dict]:
    s_min = S_MIN
    return [{"lr_rule": "linear", "batch_size": b, "steps_to_target": s_min + s_min * b_crit / b,
             "examples_to_target": b * (s_min + s_min * b_crit / b), "step_time_s": 1e-3,
             "time_to_target_s": 0.1, "samples_per_s": b / 1e-3, "regime": None,
             "s_min": s_min, "e_min": s_min * b_crit, "b_crit": b_crit,
             "b_crit_low": 0.8 * b_crit, "b_crit_high": 1.25 * b_crit, "b_simple": 50.0,
             "saturation_batch": 64} for b in (16, 64, 256)]


def manifest_rows() -> list[dict]:
    return [{"dataset": "digits", "source": "sklearn", "split": "train", "shard": "s0",
             "rows": 10, "sha256": "0" * 64, "feature_shape": [64], "feature_dtype": "float32",
             "num_classes": 10, "class_histogram": [1] * 10, "split_seed": 0}]


def config_json(history_runs: int = 5, fail_on_regression: bool = False,
                workload: str = WORKLOAD) -> str:
    publish = PublishConfig(history_runs=history_runs, fail_on_regression=fail_on_regression)
    return ExperimentConfig(name="lake-test", workload=workload, publish=publish).to_json()


def write_run_files(folder: Path, run_id: str, rates: dict[int, float], *,
                    device: str = DEVICE, workload: str = WORKLOAD, b_crit: float = 64.0,
                    sweep: list[dict] | None = None) -> dict[str, str]:
    """Local Parquet files of one run, keyed by run_stage's argument names."""
    folder.mkdir(parents=True, exist_ok=True)
    env = env_columns(run_id, workload, device)
    rows = sweep if sweep is not None else [sweep_row(b, r) for b, r in rates.items()]
    tables = {"manifest_path": make_table("manifest", manifest_rows()),
              "sweep_path": make_table("sweep", rows, env),
              "curves_path": make_table("curves", [], env),
              "runs_path": make_table("runs", runs_rows(), env),
              "analysis_path": make_table("analysis", analysis_rows(b_crit), env)}
    paths = {}
    for name, table in tables.items():
        paths[name] = str(folder / f"{name}.parquet")
        write_table_atomic(paths[name], table)
    return paths


def publish_synthetic_run(store: ObjectStore, monkeypatch: pytest.MonkeyPatch, tmp: Path,
                          run_id: str, rates: dict[int, float], *, history_runs: int = 5,
                          fail_on_regression: bool = False, **files) -> dict:
    """Publish one synthetic run with the pipeline's publish entry point; returns the manifest
    (the verdicts are next to it, at `<tmp>/<run_id>/out/regressions.parquet`)."""
    for name, value in store_env(store).items():
        monkeypatch.setenv(name, value)
    paths = write_run_files(tmp / run_id, run_id, rates, **files)
    out = tmp / run_id / "out"
    out.mkdir(exist_ok=True)
    return run_stage(config_json(history_runs, fail_on_regression), run_id,
                     regressions_path=str(out / "regressions.parquet"),
                     markdown_path=str(out / "regressions.md"), **paths)


def snapshot(store: ObjectStore) -> dict[str, str | None]:
    """Every object under the store's prefix with its stored SHA-256."""
    return {key: store.checksum(key) for key in store.list()}


# --------------------------------------------------------------------------------- tests


def test_publish_writes_every_table_under_hive_partitions_and_manifest_last(
        object_store, monkeypatch, tmp_path):
    run_id = "20260301T120000Z-aaaaaa"
    manifest = publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id,
                                     {4: 1000.0, 64: 9000.0})
    keys = {o["key"] for o in manifest["objects"]}
    for name in LAKE_TABLES:
        assert table_key(object_store, name, "2026-03-01", run_id) in keys
    stored = json.loads(object_store.get_bytes(run_manifest_key(object_store, run_id)))
    assert stored == json.loads(json.dumps(manifest))
    assert stored["workload"] == WORKLOAD and stored["regressions"] == []
    assert stored["analysis_config"]["bootstrap_samples"] == 200
    for obj in stored["objects"]:
        assert object_store.checksum(obj["key"]) == obj["sha256"]
    report = object_store.get_bytes(next(k for k in keys if k.endswith(".html"))).decode()
    assert "<h2>Regressions</h2>" in report and "Not judged" in report


def test_republishing_the_same_run_is_a_no_op(object_store, monkeypatch, tmp_path, capsys):
    run_id = "20260301T120000Z-bbbbbb"
    first = publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id, {4: 1000.0})
    before = snapshot(object_store)
    capsys.readouterr()
    again = publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id, {4: 1000.0})
    assert again == first
    assert snapshot(object_store) == before
    out = capsys.readouterr().out
    assert "wrote" not in out and out.count("already there") == len(first["objects"])


def test_retry_after_other_runs_published_reuses_the_stored_verdicts(
        object_store, monkeypatch, tmp_path):
    """History changes between two attempts; the retry still sends identical bytes."""
    for i in range(3):
        publish_synthetic_run(object_store, monkeypatch, tmp_path, f"20260301T00000{i}Z-hist",
                              {64: 1000.0})
    run_id = "20260302T000000Z-retry0"
    first = publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id, {64: 700.0})
    assert first["regressions"] == []  # one slow run is only suspected: nothing to fail on
    publish_synthetic_run(object_store, monkeypatch, tmp_path, "20260303T000000Z-later",
                          {64: 700.0})
    before = snapshot(object_store)
    assert publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id,
                                 {64: 700.0}) == first
    assert snapshot(object_store) == before


def test_different_bytes_for_a_published_run_are_refused_and_nothing_is_overwritten(
        object_store, monkeypatch, tmp_path):
    run_id = "20260301T120000Z-cccccc"
    publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id, {4: 1000.0})
    before = snapshot(object_store)
    changed = write_run_files(tmp_path / "changed", run_id, {4: 1234.0})
    files = {"sweep": changed["sweep_path"], "analysis": changed["analysis_path"]}
    with pytest.raises(ObjectExists) as err:
        publish_run(object_store, run_id, files)
    message = str(err.value)
    assert f"publish of run {run_id} refused" in message
    assert "sweep/date=2026-03-01" in message and "never overwritten" in message
    assert snapshot(object_store) == before
    sweep = object_store.get_table(table_key(object_store, "sweep", "2026-03-01", run_id))
    assert sweep.column("samples_per_s").to_pylist() == [1000.0]


def test_a_run_id_that_cannot_be_a_partition_is_refused():
    for bad in ("", "a/b", "../x", "run id", "-leading-dash"):
        with pytest.raises(BadInput, match="run id"):
            check_run_id(bad)
    assert check_run_id("20261129T000000Z-abc123") == "20261129T000000Z-abc123"


@pytest.mark.parametrize("damage, why", [
    (b"{not json", "is not JSON"),
    (b'["a list"]', 'is not a JSON object with a string "date"'),
    (b'{"objects": []}', 'is not a JSON object with a string "date"'),
])
def test_a_damaged_manifest_is_named_not_a_traceback_and_nothing_is_written(
        object_store, monkeypatch, tmp_path, damage, why):
    """A retry of a run whose manifest is damaged (a foreign or truncated file in the lake)
    stops naming the manifest's key, before writing anything."""
    run_id = "20260301T120000Z-damage"
    object_store.put_bytes(run_manifest_key(object_store, run_id), damage)
    before = snapshot(object_store)
    with pytest.raises(BadInput) as err:
        publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id, {4: 1000.0})
    message = str(err.value)
    assert f"the manifest of run {run_id}" in message and why in message
    assert run_manifest_key(object_store, run_id) in message
    assert snapshot(object_store) == before
