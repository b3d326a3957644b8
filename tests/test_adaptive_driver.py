"""The adaptive search for real: `batchscale converge --strategy adaptive` trains its cells with
torchrun on digits, writes its decisions, and resumes after being killed without re-training a
finished cell."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from batchscale.adaptive.futility import STOP_FUTILE
from batchscale.checks import validate_table
from batchscale.storage import read_table_file
from helpers import BATCHSCALE, cli_env, run_cli

pytestmark = pytest.mark.slow

RUN_ID = "20261201T120000Z-search"
# Ten cells or so: one-worker cells train in one process (convergence/cell_server.py), a few
# tenths of a second each, so the search must be long enough to be killed midway.
ARGS = ["converge", "--workload", "digits-mlp", "--strategy", "adaptive",
        "--batch-sizes", "8", "16", "32", "64", "128", "256", "--seeds", "0", "1", "2",
        "--lr-rules", "sqrt", "--target", "val_accuracy=0.9", "--max-steps", "600",
        "--target-interval-ratio", "1.5", "--run-id", RUN_ID]


def _trial_files(out) -> dict:
    return {p: p.stat().st_mtime_ns for p in (out / "work").rglob("trials/*.run.parquet")}


def _servers_in(cwd) -> list[int]:
    """Cell servers (convergence/cell_server.py) still running in `cwd`."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            cmdline = (proc / "cmdline").read_bytes()
            here = os.readlink(proc / "cwd") == str(cwd)
        except OSError:
            continue
        if here and b"batchscale.convergence.cell_server" in cmdline:
            found.append(int(proc.name))
    return found


def test_an_adaptive_search_killed_midway_resumes_and_reuses_finished_cells(tmp_path):
    out = tmp_path / "out"
    cmd = BATCHSCALE + [*ARGS, "--out", str(out)]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=cli_env(), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while len(_trial_files(out)) < 3 and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read()[-3000:]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    finished = _trial_files(out)
    assert len(finished) >= 3 and not (out / "decisions.parquet").exists()
    deadline = time.monotonic() + 5  # the cell server goes with the search
    while _servers_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _servers_in(tmp_path)

    result = run_cli([*ARGS, "--out", str(out)], cwd=tmp_path, timeout_s=900)
    assert result.returncode == 0, result.stderr[-3000:]
    for path, mtime in finished.items():
        assert path.stat().st_mtime_ns == mtime  # read back, not trained again

    decisions = read_table_file(out / "decisions.parquet")
    assert validate_table("decisions", decisions).success
    rows = decisions.to_pylist()
    actions = [r["action"] for r in rows]
    assert actions[:3] == ["probe", "probe", "predict"] and actions[-1] == "stop"
    assert rows[2]["prediction_method"] in ("near target", "extrapolated")
    spent = [r["examples_spent"] for r in rows]
    assert spent == sorted(spent) and spent[-1] > 0
    held = [r["device_s_held"] for r in rows]  # each launch's wall time: start-up included
    assert held == sorted(held) and held[-1] > 0
    ran = {(r["batch_size"], r["seed"]) for r in rows if r["batch_size"] is not None}
    runs = pq.read_table(out / "runs.parquet").to_pylist()
    assert {(r["batch_size"], r["seed"]) for r in runs} == ran
    assert len(ran) < 6 * 3 or rows[-1]["reason"] == "nothing left to measure"
    assert rows[-1]["reason"] in ("interval narrow enough at 90 %", "nothing left to measure",
                                  "cell limit reached",
                                  "no cell left is expected to narrow the interval") \
        or rows[-1]["reason"].startswith(STOP_FUTILE)
    stderr = result.stderr
    assert "predicts B_crit" in stderr or "no prediction" in stderr

    again = run_cli([*ARGS, "--out", str(out)], cwd=tmp_path, timeout_s=300)
    assert again.returncode == 0, again.stderr[-3000:]
    replayed = read_table_file(out / "decisions.parquet").to_pylist()
    assert [(r["action"], r["batch_size"], r["seed"], r["b_crit"]) for r in replayed] == \
        [(r["action"], r["batch_size"], r["seed"], r["b_crit"]) for r in rows]
    # The device time each cell held is kept beside it, not the moment a replay reads it back.
    assert [r["device_s_held"] for r in replayed] == held
    assert {(tuple(r["grid_batch_sizes"]), r["grid_seeds"]) for r in rows} == \
        {((8, 16, 32, 64, 128, 256), 3)}

    # The search's output analysed on its own: the same "Adaptive search" section as the
    # pipeline's report, its cost against the grid its decisions record.
    analyzed = run_cli(["analyze", str(out / "runs.parquet"), "--out", str(tmp_path / "an")],
                       cwd=tmp_path, timeout_s=300)
    assert analyzed.returncode == 0, analyzed.stderr[-3000:]
    assert "Adaptive search\n---" in analyzed.stdout
    assert "a grid of 6 batch sizes × 3 seeds" in analyzed.stdout
    assert "<h2>Adaptive search</h2>" in (tmp_path / "an" / "report.html").read_text()


USER_WORKLOAD = '''
"""A user's own training the tests do not otherwise know: two Gaussian blobs in 16-d, 10 % of
the training labels flipped, a small MLP, a Dataset of its own."""
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

from batchscale import Workload


class Blobs(Dataset):
    def __init__(self, split):
        g = torch.Generator().manual_seed(0 if split == "train" else 1)
        n = 4000 if split == "train" else 800
        y = torch.randint(0, 2, (n,), generator=g)
        x = torch.randn(n, 16, generator=g) + (y[:, None] * 2 - 1) * 0.3
        if split == "train":
            y = torch.where(torch.rand(n, generator=g) < 0.1, 1 - y, y)
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def evaluate(model, batches):
    right = count = 0
    for x, y in batches:
        right += int((model(x).argmax(1) == y).sum())
        count += len(y)
    return {"accuracy": right / count}


workload = Workload(
    name="blobs", model=lambda: nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)),
    loss=lambda model, batch: F.cross_entropy(model(batch[0]), batch[1]),
    train_data=lambda: Blobs("train"), val_data=lambda: Blobs("val"), evaluate=evaluate,
    metrics=("val_accuracy",), targets=(("val_accuracy", 0.86),))
'''


def test_the_search_trains_a_users_own_workload_module(tmp_path):
    """`--workload blobs:workload` from the user's directory: the search's cell server imports
    the user's module, its probes' noise scale predicts B_crit, it trains its cells to the
    workload's own target and stops with a reason; every trial it ran is in the runs table.
    (One run here: predicted ≈ 68, stopped "interval narrow enough" after 11 decisions at
    B_crit 9.95 [5.38, 16.7].)"""
    (tmp_path / "blobs.py").write_text(USER_WORKLOAD)
    result = run_cli(["converge", "--workload", "blobs:workload", "--strategy", "adaptive",
                      "--batch-sizes", "4", "8", "16", "32", "64", "128", "--seeds", "0", "1",
                      "--lr-rules", "sqrt", "--max-steps", "800", "--out", "out"],
                     cwd=tmp_path, timeout_s=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the cell server failed" not in result.stderr  # no fallback to a torchrun per cell
    decisions = read_table_file(tmp_path / "out" / "decisions.parquet")
    assert validate_table("decisions", decisions).success
    rows = decisions.to_pylist()
    assert rows[0]["action"] == "probe" and rows[-1]["action"] == "stop"
    assert {r["target_metric"] for r in rows} == {"val_accuracy"}
    assert {r["target_value"] for r in rows} == {0.86}
    predicted = next(r for r in rows if r["action"] == "predict")
    assert predicted["prediction_method"] in ("near target", "extrapolated")
    ran = {(r["batch_size"], r["seed"]) for r in rows if r["batch_size"] is not None}
    runs = pq.read_table(tmp_path / "out" / "runs.parquet").to_pylist()
    assert {(r["batch_size"], r["seed"]) for r in runs} >= ran
    assert {r["workload"] for r in runs} == {"blobs:workload"}
