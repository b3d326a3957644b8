"""End to end: the real pipeline under kfp.local, publishing to a real SeaweedFS.

The tiny config keeps it around a minute on 2 cores; the assertions read the published tables
back from the store and check their contents, not only that they exist.
"""

import json
import uuid

import pyarrow.dataset as ds
import pytest

from batchscale.config import load_config
from batchscale.lake.publish import LAKE_TABLES, run_manifest_key
from batchscale.storage import sha256_b64
from helpers import run_cli, store_env

pytestmark = pytest.mark.slow
PLANTED_SECRET = "planted-secret-7f3a9c1e5b"


@pytest.fixture(scope="module")
def published(tmp_path_factory, seaweed):
    from batchscale.storage import ObjectStore

    store = ObjectStore(seaweed.settings(prefix=f"e2e-{uuid.uuid4().hex[:8]}"))
    workdir = tmp_path_factory.mktemp("e2e")
    from helpers import TINY_CONFIG

    (workdir / "tiny.yaml").write_text(TINY_CONFIG)
    run_id = "20261129T000000Z-e2etest"
    env = {**store_env(store), "KF_PIPELINES_TOKEN": PLANTED_SECRET}
    result = run_cli(["run", "--config", "tiny.yaml", "--run-id", run_id], cwd=workdir,
                     env=env, timeout_s=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    return store, run_id, workdir, result, load_config(workdir / "tiny.yaml")


def _table(store, name, run_id):
    key = store.key(name, "date=2026-11-29", f"run_id={run_id}", "part-0.parquet")
    return store.get_table(key).to_pylist()


def test_every_table_is_published_with_checksums(published):
    store, run_id, _, _, _ = published
    manifest = json.loads(store.get_bytes(run_manifest_key(store, run_id)))
    keys = {o["key"] for o in manifest["objects"]}
    for name in LAKE_TABLES:
        assert store.key(name, "date=2026-11-29", f"run_id={run_id}", "part-0.parquet") in keys
    for obj in manifest["objects"]:
        assert sha256_b64(store.get_bytes(obj["key"])) == obj["sha256"]


def test_dataset_manifest_covers_all_digits(published):
    store, run_id, _, _, cfg = published
    rows = _table(store, "dataset_manifest", run_id)
    assert sum(r["rows"] for r in rows) == 1797  # sklearn's bundled digits
    assert {r["split"] for r in rows} == {"train", "val"}
    assert all(len(r["sha256"]) == 64 for r in rows)


def test_sweep_measured_every_batch_and_mode(published):
    store, run_id, _, _, cfg = published
    rows = _table(store, "sweep", run_id)
    cells = {(r["input_mode"], r["batch_size"]) for r in rows}
    assert cells == {(m, b) for m in ("synthetic", "real") for b in cfg.sweep.batch_sizes}
    for r in rows:
        assert r["status"] == "ok"
        assert r["samples_per_s"] == pytest.approx(r["batch_size"] / r["step_time_median_s"])
        assert r["timed_steps"] >= cfg.sweep.min_timed_steps
        assert r["run_id"] == run_id and r["config_hash"] == cfg.config_hash
        assert r["torch_version"] and r["device_name"] and r["threads"] >= 1


def test_convergence_reaches_target_and_fewer_steps_at_larger_batch(published):
    store, run_id, _, _, cfg = published
    runs = _table(store, "runs", run_id)
    assert {r["batch_size"] for r in runs} == set(cfg.convergence.batch_sizes)
    assert all(r["status"] == "reached" for r in runs)
    steps = {r["batch_size"]: r["steps_to_target"] for r in runs}
    assert steps[16] > steps[256]  # the critical-batch curve falls
    curves = _table(store, "curves", run_id)
    for r in runs:
        curve = [c for c in curves if c["trial_id"] == r["trial_id"]]
        target = cfg.convergence.target_val_accuracy
        first = min(c["step"] for c in curve if c["val_accuracy"] >= target)
        assert first == r["steps_to_target"]
        assert r["examples_to_target"] == r["steps_to_target"] * r["batch_size"]


def test_analysis_fits_critical_batch(published):
    store, run_id, _, _, cfg = published
    rows = _table(store, "analysis", run_id)
    assert {r["batch_size"] for r in rows} >= set(cfg.convergence.batch_sizes)
    fit = rows[0]
    assert fit["b_crit"] > 0 and fit["s_min"] > 0
    assert fit["b_crit"] == pytest.approx(fit["e_min"] / fit["s_min"])


def test_summary_printed_and_report_saved(published):
    _, run_id, workdir, result, _ = published
    assert f"batchscale run {run_id}" in result.stdout
    assert "B_crit" in result.stdout and "samples/s" in result.stdout
    report = workdir / ".batchscale" / "runs" / run_id / "report.html"
    assert "<img" in report.read_text()


def test_lake_reads_with_pyarrow_dataset_and_hive_partitions(published):
    store, run_id, _, _, _ = published
    fs = store.pyarrow_filesystem()
    for name in LAKE_TABLES:
        table = ds.dataset(f"{store.settings.bucket}/{store.key(name)}", filesystem=fs,
                           format="parquet", partitioning="hive").to_table()
        assert table.num_rows > 0
        assert set(table.column("run_id").to_pylist()) == {run_id}
        assert set(table.column("date").to_pylist()) == {"2026-11-29"}


def test_scaling_run_uses_two_workers(published):
    store, run_id, _, _, cfg = published
    runs = _table(store, "runs", run_id)
    two = [r for r in runs if r["workers"] == 2]
    assert {r["batch_size"] for r in two} == set(cfg.convergence.scaling_batch_sizes)
    assert all(r["world_size"] == 2 for r in two)
    one = {r["batch_size"]: r for r in runs if r["workers"] == 1}
    for r in two:
        # Same global batch, same data order: the 2-worker run takes about the same steps.
        assert abs(r["steps_to_target"] - one[r["batch_size"]]["steps_to_target"]) <= 20


def test_no_secret_in_any_output(published):
    """Plant a recognizable secret in the environment, then search every output: logs, task
    artifacts, local report, and every published object (tables, report, manifest)."""
    store, run_id, workdir, result, _ = published
    secrets = [PLANTED_SECRET.encode(), store.settings.secret_key.encode()]
    assert all(s not in (result.stdout + result.stderr).encode() for s in secrets)
    files = [p for p in (workdir / ".batchscale").rglob("*") if p.is_file()]
    assert any(p.name == "pipeline.log" for p in files)
    for path in files:
        data = path.read_bytes()
        assert all(s not in data for s in secrets), path
    for key in store.list():
        data = store.get_bytes(key)
        assert all(s not in data for s in secrets), key
