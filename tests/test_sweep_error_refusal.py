"""A batch size at which the throughput sweep saw the workload's own code raise on real input is
refused by the convergence stage before any trial trains (batchscale/adaptive/stage.py): every
trial there would raise it again, after the trials before it had spent their time."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import pytest

from batchscale.adaptive.stage import refuse_failed_batches, run_stage
from batchscale.errors import BadInput

RAISED = ("ValueError: training batches of at most 16 examples, got 32 "
          "(at /home/me/model.py:45)")


def _sweep(tmp_path, rows: list[tuple[str, int, str, str | None]]) -> str:
    path = tmp_path / "sweep.parquet"
    pd.DataFrame([{"input_mode": mode, "batch_size": batch, "status": status, "error": error}
                  for mode, batch, status, error in rows]).to_parquet(path)
    return str(path)


def test_a_batch_the_workload_raised_at_is_refused_with_its_error_and_the_sizes_to_keep(
        tmp_path):
    sweep = _sweep(tmp_path, [("real", 8, "ok", None), ("real", 32, "error", RAISED),
                              ("real", 64, "error", RAISED.replace("32", "64")),
                              ("synthetic", 32, "error", RAISED)])
    with pytest.raises(BadInput) as refused:
        refuse_failed_batches(sweep, [8, 16, 32, 64])
    text = str(refused.value)
    assert ("the throughput sweep found the workload's code failing at batch size 32, 64 on "
            f"real input (batch 32: {RAISED}); every convergence trial there would fail the "
            "same way, so none was started") in text
    assert "leave 32, 64 out (convergence.batch_sizes, --batch-sizes 8 16)" in text


def test_what_the_machine_did_or_another_cell_raised_is_not_refused(tmp_path):
    sweep = _sweep(tmp_path, [
        ("real", 32, "error", "trial process exited with code 1 before reporting a result"),
        ("real", 64, "error", RAISED), ("synthetic", 16, "error", RAISED),
        ("real", 128, "oom", "CUDA out of memory")])
    refuse_failed_batches(sweep, [16, 32, 128])  # 64 raised, but is not this cell's
    refuse_failed_batches(None, [64])  # no sweep given: nothing to read
    with pytest.raises(BadInput, match="or use batch sizes it accepts"):
        refuse_failed_batches(sweep, [64])


def test_the_stage_refuses_before_starting_any_trial(tmp_path, monkeypatch):
    from batchscale.convergence import runner

    started = []
    monkeypatch.setattr(runner, "run_stage", lambda *args: started.append(args))
    sweep = _sweep(tmp_path, [("real", 32, "error", RAISED)])
    with pytest.raises(BadInput, match="batch size 32"):
        run_stage("{}", "r1", "8,32", 1, str(tmp_path), str(tmp_path / "c"), str(tmp_path / "r"),
                  str(tmp_path / "d"), sweep_path=sweep)
    assert not started


def test_a_real_sweep_names_the_users_line_and_the_convergence_refuses_that_batch(tmp_path):
    """A real `batchscale sweep` of a user's model that refuses training batches over 16: its
    row at 32 names the line of the user's code, and the convergence stage refuses batch 32
    with it while batch 8 alone passes."""
    from batchscale.schemas import TrialStatus
    from helpers import run_cli

    out = tmp_path / "sweep.parquet"
    done = run_cli(["sweep", "--workload", "user_code_error_workloads:small_train_batches",
                    "--batch-sizes", "8", "32", "--time-budget-s", "0.3", "--out", str(out)],
                   cwd=Path(__file__).parent, timeout_s=300)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = pd.read_parquet(out)
    real_32 = rows[(rows["input_mode"] == "real") & (rows["batch_size"] == 32)].iloc[0]
    assert real_32["status"] == TrialStatus.ERROR
    assert re.fullmatch(r"ValueError: training batches of at most 16 examples, got 32 "
                        r"\(at \S+user_code_error_workloads\.py:\d+\)", real_32["error"])
    refuse_failed_batches(str(out), [8])
    with pytest.raises(BadInput, match=r"at batch size 32 on real input .*--batch-sizes 8\)"):
        refuse_failed_batches(str(out), [8, 32])
