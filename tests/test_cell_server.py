"""Cells trained one after another in one long-lived process, or one torchrun group of two
ranks (the adaptive search's cells): the same trial files as a torchrun launch, one process (or
the same ranks) for every cell, a failed cell handed back (the caller launches it with
torchrun), a cell past its limit stopped with its process and its ranks, and nothing left
running once the server is closed."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from batchscale.config import parse_config
from batchscale.convergence import runner
from batchscale.convergence.cell_server import CellServer
from batchscale.data.prep import prepare
from batchscale.errors import BatchscaleError
from batchscale.stopping import child_pids
from helpers import processes_marked

pytestmark = pytest.mark.slow
FAST = {"target_val_accuracy": 0.8, "max_steps": 200, "eval_every_steps": 10,
        "checkpoint_every_steps": 50, "seeds": [0], "lr_rules": ["sqrt"]}


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits")
    prepare(parse_config({}).dataset, out)
    return out


def _cell(tmp_path: Path, digits_dir: Path, batch: int, **convergence) -> tuple:
    cfg = parse_config({"convergence": {**FAST, "batch_sizes": [batch], **convergence}})
    out = tmp_path / f"b{batch}"
    return cfg, dict(data_dir=str(digits_dir), out_dir=str(out), run_id="served")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split()[0] != "Z"


def _gone_within(pids: set[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while any(_alive(pid) for pid in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_cells_train_in_one_process_and_write_what_torchrun_writes(tmp_path, digits_dir):
    with CellServer(runner.torchrun_env(1)) as server:
        tables = {}
        for batch in (16, 64):
            cfg, where = _cell(tmp_path, digits_dir, batch)
            tables[batch] = runner.run_convergence(cfg, [batch], server=server, **where)
            if batch == 16:
                pid = server.proc.pid
        assert server.proc.pid == pid  # the second cell paid no start-up
    assert not _alive(pid)  # closed with the block
    for batch, (curves, runs) in tables.items():
        (row,) = runs.to_pylist()
        assert (row["batch_size"], row["workers"], row["status"]) == (batch, 1, "reached")
        assert curves.num_rows > 0
        files = tmp_path / f"b{batch}" / "trials"
        assert pq.read_table(next(files.glob("*.run.parquet"))).num_rows == 1


def test_a_cell_the_server_fails_on_goes_to_torchrun(tmp_path, digits_dir, capsys):
    """A spec the server cannot read makes it hand the cell back and stop, saying why."""
    bad = tmp_path / "bad.json"
    bad.write_text("{not a spec")
    server = CellServer(runner.torchrun_env(1))
    assert server.run(bad, timeout_s=120) is False
    assert server.proc is None
    said = capsys.readouterr().err
    assert f"the cell server failed on {tmp_path.name} (" in said
    assert "that cell trains in a torchrun launch of its own" in said
    cfg, where = _cell(tmp_path, digits_dir, 32)
    _, runs = runner.run_convergence(cfg, [32], server=server, **where)
    assert runs.column("status").to_pylist() == ["reached"]
    server.close()


@pytest.mark.parametrize("workers", [1, 2])
def test_a_cell_past_its_limit_is_stopped_with_the_server(tmp_path, digits_dir, workers):
    cfg, where = _cell(tmp_path, digits_dir, 4, target_val_accuracy=0.999, max_steps=100_000,
                       patience_evals=100_000, timeout_s=3.0)
    server = CellServer({**runner.torchrun_env(workers), "BATCHSCALE_TEST_MARK": str(tmp_path)},
                        workers)
    with pytest.raises(BatchscaleError, match="timed out after 3 s") as raised:
        runner.run_convergence(cfg, [4], workers=workers, server=server, **where)
    # the same words as a torchrun launch's timeout: no trial had finished, so no folder of
    # finished trials is named (it would not exist)
    assert ("no trial of this launch had finished (those of earlier launches are kept under "
            f"{tmp_path})") in str(raised.value)
    assert server.proc is None
    assert not processes_marked(f"BATCHSCALE_TEST_MARK={tmp_path}")  # the ranks went with it


def test_two_worker_cells_train_in_one_process_group(tmp_path, digits_dir):
    """A search of two-worker cells: one torchrun group of two ranks trains every cell, and no
    cell starts a torchrun of its own (whose log a launch leaves in the cell's directory)."""
    # A user's PET_TEE (torchrun's --tee) would prefix the ranks' stdout, the answers' pipe.
    with CellServer({**runner.torchrun_env(2), "PET_TEE": "3"}, workers=2) as server:
        tables = {}
        for batch in (16, 64):
            cfg, where = _cell(tmp_path, digits_dir, batch)
            tables[batch] = runner.run_convergence(cfg, [batch], workers=2, server=server,
                                                   **where)
            if batch == 16:
                pid = server.proc.pid
                ranks = set(child_pids(pid))
        assert server.proc.pid == pid
        assert len(ranks) == 2 and set(child_pids(pid)) == ranks  # the same two ranks throughout
    assert not _alive(pid)  # closed with the block, its ranks at once after it
    assert _gone_within(ranks, seconds=5.0)
    for batch, (curves, runs) in tables.items():
        (row,) = runs.to_pylist()
        assert (row["batch_size"], row["workers"], row["world_size"], row["status"]) == (
            batch, 2, 2, "reached")
        assert curves.num_rows > 0
        assert not (tmp_path / f"b{batch}" / runner.TORCHRUN_LOG).exists()
