"""Faults injected for real: a store stopped in the middle of publish, two stores started at
once (two whole runs at once: test_reliability_runs.py; a run killed in the middle of
convergence: tests/test_pipeline.py, whose study is killed in its second variant and resumed).
Nothing is mocked: the processes really die and the SeaweedFS server really stops."""

import subprocess
from pathlib import Path

import pyarrow as pa
import pytest

from batchscale import localstore
from batchscale.errors import StoreError
from batchscale.lake.publish import publish_run, run_manifest_key
from batchscale.storage import ObjectStore, sha256_b64, write_table_atomic
from helpers import BATCHSCALE

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
