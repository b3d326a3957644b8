"""Faults injected for real: a store stopped in the middle of publish, a pipeline killed in the
middle of convergence, two stores started at once (two whole runs at once:
test_reliability_runs.py). Nothing is mocked: the processes really die and the SeaweedFS server
really stops."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow as pa
import pytest

from batchscale import localstore
from batchscale.errors import StoreError
from batchscale.lake.publish import publish_run, run_manifest_key
from batchscale.storage import ObjectStore, read_table_file, sha256_b64, write_table_atomic
from helpers import BATCHSCALE, TINY_CONFIG, cli_env, run_cli, store_env

pytestmark = pytest.mark.slow


def _lake_files(tmp_path: Path, rows: int = 2000) -> dict[str, Path]:
    """Small but real Parquet files standing in for a run's tables."""
    files = {}
    for i, name in enumerate(("sweep", "curves", "runs", "analysis", "dataset_manifest")):
        path = tmp_path / f"{name}.parquet"
        write_table_atomic(path, pa.table({"x": list(range(i, i + rows))}))
        files[name] = path
    return files


class StoreKilledAfterFirstUpload(ObjectStore):
    """A real ObjectStore whose server is stopped (SIGTERM to weed) right after the first
    object of a publish lands: the fault happens mid-publish, at a known point."""

    def __init__(self, settings, workdir: Path):
        super().__init__(settings, max_attempts=2, connect_timeout_s=1.0, read_timeout_s=5.0)
        self.workdir = workdir
        self.uploads = 0

    def put_bytes(self, key: str, data: bytes) -> bool:
        created = super().put_bytes(key, data)
        self.uploads += 1
        if self.uploads == 1:
            localstore.down(self.workdir)
        return created


def test_store_stopping_mid_publish_then_rerun_completes_exactly_once(tmp_path):
    workdir = tmp_path / "store"
    info = localstore.up(workdir)
    try:
        settings = info.settings(prefix="lake")
        files = _lake_files(tmp_path)
        run_id = "20261129T101010Z-fault1"
        faulty = StoreKilledAfterFirstUpload(settings, workdir)
        with pytest.raises(StoreError) as err:
            publish_run(faulty, run_id, files)
        assert info.endpoint_url.split("//")[1] in str(err.value)  # names the endpoint

        info = localstore.up(workdir)  # the store is back, with its data
        store = ObjectStore(info.settings(prefix="lake"))
        assert not store.exists(run_manifest_key(store, run_id))  # incomplete run: no manifest
        for key in store.list():
            assert store.get_table(key).num_rows == 2000  # no partial object is visible

        manifest = publish_run(store, run_id, files)
        keys = store.list()
        assert sorted(keys) == sorted([o["key"] for o in manifest["objects"]]
                                      + [run_manifest_key(store, run_id)])
        for obj in manifest["objects"]:
            assert sha256_b64(store.get_bytes(obj["key"])) == obj["sha256"]
        publish_run(store, run_id, files)  # a third publish changes nothing
        assert store.list() == keys
    finally:
        localstore.down(workdir)


def test_store_restart_keeps_earlier_results(tmp_path):
    workdir = tmp_path / "store"
    info = localstore.up(workdir)
    try:
        store = ObjectStore(info.settings(prefix="lake"))
        manifest = publish_run(store, "20261129T111111Z-keep01", _lake_files(tmp_path, 10))
        localstore.down(workdir)
        info = localstore.up(workdir)
        store = ObjectStore(info.settings(prefix="lake"))
        for obj in manifest["objects"]:
            assert sha256_b64(store.get_bytes(obj["key"])) == obj["sha256"]
    finally:
        localstore.down(workdir)


def test_concurrent_store_up_starts_one_server(tmp_path):
    procs = [subprocess.Popen(BATCHSCALE + ["store", "up"], cwd=tmp_path, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=120) for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        pids = {line.split("pid ")[1].split(",")[0] for out, _ in outs
                for line in out.splitlines() if "pid" in line}
        assert len(pids) == 1
    finally:
        localstore.down(tmp_path)


def _wait_for(predicate, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended early:\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError("timed out waiting")


def test_run_killed_in_convergence_keeps_rows_publishes_nothing_and_resumes(
        tmp_path, object_store):
    (tmp_path / "tiny.yaml").write_text(TINY_CONFIG)
    run_id = "20261129T121212Z-killed"
    env = cli_env(store_env(object_store))
    trials = tmp_path / ".batchscale" / "work" / run_id
    proc = subprocess.Popen(BATCHSCALE + ["run", "--config", "tiny.yaml", "--run-id", run_id],
                            cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for(lambda: any(trials.glob("*/trials/*.run.parquet")), 600, proc)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode != 0
    finished = sorted(trials.glob("*/trials/*.run.parquet"))
    assert finished
    before = {p: (p.stat().st_mtime_ns, read_table_file(p).to_pylist()) for p in finished}
    assert not object_store.exists(run_manifest_key(object_store, run_id))
    assert object_store.list() == []  # publish never ran: nothing half-written is visible

    result = run_cli(["run", "--config", "tiny.yaml", "--run-id", run_id], cwd=tmp_path,
                     env=store_env(object_store), timeout_s=900)
    assert result.returncode == 0, result.stderr[-3000:]
    for path, (mtime, rows) in before.items():
        assert path.stat().st_mtime_ns == mtime  # finished trials were kept, not re-run
        assert read_table_file(path).to_pylist() == rows
    manifest = json.loads(object_store.get_bytes(run_manifest_key(object_store, run_id)))
    runs_key = next(o["key"] for o in manifest["objects"] if "/runs/" in o["key"])
    published = object_store.get_table(runs_key).to_pylist()
    assert {r["trial_id"] for r in published} >= {
        rows[0]["trial_id"] for _, rows in before.values()}
