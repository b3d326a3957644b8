"""A batch size at which the throughput sweep saw the workload's own code raise on real input is
refused by the convergence stage before any trial trains (batchscale/adaptive/stage.py): every
trial there would raise it again, after the trials before it had spent their time."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from batchscale.adaptive.stage import _read_sweep, refuse_failed_batches, run_stage
from batchscale.config import parse_config
from batchscale.errors import BadInput

RAISED = ("ValueError: training batches of at most 16 examples, got 32 "
          "(at /home/me/model.py:45)")


def _cfg(**convergence):
    return parse_config({"convergence": {"batch_sizes": [8, 16, 32, 64], **convergence}})


def _sweep(tmp_path, rows: list[tuple], **columns) -> str:
    """Rows of (input_mode, batch_size, status, error); `columns` set on every row."""
    path = tmp_path / "sweep.parquet"
    pd.DataFrame([{"input_mode": mode, "batch_size": batch, "status": status, "error": error,
                   "precision": "fp32", **columns}
                  for mode, batch, status, error in rows]).to_parquet(path)
    return str(path)


def _table(tmp_path, rows: list[tuple], **columns):
    """`_sweep`'s file read back as the stage reads it."""
    return _read_sweep(_sweep(tmp_path, rows, **columns))


def test_a_batch_the_workload_raised_at_is_refused_with_its_error_and_the_sizes_to_keep(
        tmp_path):
    sweep = _table(tmp_path, [("real", 8, "ok", None), ("real", 32, "error", RAISED),
                              ("real", 64, "error", RAISED.replace("32", "64")),
                              ("synthetic", 32, "error", RAISED)])
    with pytest.raises(BadInput) as refused:
        refuse_failed_batches(sweep, [8, 16, 32, 64], _cfg(), workers=1)
    text = str(refused.value)
    assert ("the throughput sweep found the workload's code failing on real input at "
            f"convergence.batch_sizes 32, 64 (batch 32: {RAISED}); every trial there would fail "
            "the same way, so none was started") in text
    assert "leave 32, 64 out of convergence.batch_sizes ([8, 16])" in text


def test_the_sweeps_batch_is_per_device_and_the_cells_is_global(tmp_path):
    """With 2 workers and 2 accumulation steps a global batch of 128 trains 32 per device,
    where the sweep saw the model raise; a global 32 (8 per device) trains."""
    sweep = _table(tmp_path, [("real", 8, "ok", None), ("real", 32, "error", RAISED)])
    cfg = _cfg(batch_sizes=[32, 64, 128], accumulation_steps=2, workers=2)
    refuse_failed_batches(sweep, [32, 64], cfg, workers=2)
    with pytest.raises(BadInput, match=r"convergence.batch_sizes 128 \(batch 128 "
                                        r"\(32 per device\): ValueError"):
        refuse_failed_batches(sweep, [32, 128], cfg, workers=2)


def test_what_is_not_the_users_code_as_the_trials_run_it_is_not_refused(tmp_path):
    """The machine, batchscale's own checks, a batch that had been timed, a sweep compiled or
    in another precision or memory layout than the trials, another cell's batch: not
    refused."""
    sweep = _table(tmp_path, [
        ("real", 16, "error", "trial process exited with code 1 before reporting a result"),
        ("real", 32, "error", "ValueError: the dataset has 20 training rows, fewer than 32"),
        ("real", 64, "error", f"round 2/2: {RAISED} (earlier trials had timed it at 1.0 ms per "
                              "step; a batch that fails once is not counted as fitting)"),
        ("real", 128, "oom", "CUDA out of memory"), ("synthetic", 8, "error", RAISED),
        ("real", 256, "error", RAISED)])
    refuse_failed_batches(sweep, [8, 16, 32, 64, 128], _cfg(), workers=1)
    refuse_failed_batches(None, [256], _cfg(), workers=1)  # no sweep given: nothing to read
    with pytest.raises(BadInput, match="give convergence.batch_sizes sizes it accepts"):
        refuse_failed_batches(sweep, [256], _cfg(batch_sizes=[256]), workers=1)
    for other in ({"compiled": True}, {"channels_last": True}, {"precision": "bf16"}):
        refuse_failed_batches(_table(tmp_path, [("real", 256, "error", RAISED)], **other),
                              [256], _cfg(), workers=1)


def test_the_stage_refuses_before_starting_any_trial(tmp_path, monkeypatch):
    from batchscale.convergence import runner

    started = []
    monkeypatch.setattr(runner, "run_stage", lambda *args: started.append(args))
    sweep = _sweep(tmp_path, [("real", 32, "error", RAISED)])
    with pytest.raises(BadInput, match="convergence.batch_sizes 32 "):
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
    cfg = _cfg(batch_sizes=[8, 32])
    refuse_failed_batches(_read_sweep(str(out)), [8], cfg, workers=1)
    with pytest.raises(BadInput, match=r"at convergence.batch_sizes 32 \(batch 32: .*"
                                        r"leave 32 out of convergence.batch_sizes \(\[8\]\)"):
        refuse_failed_batches(_read_sweep(str(out)), [8, 32], cfg, workers=1)


def test_where_larger_batches_failed_in_the_sweep_no_output_asks_to_measure_them():
    """After leaving the batches the model refuses out of the convergence, the sweep's error
    rows remain: the saturation line and B_crit's bound say those batches failed instead of
    "measure larger batches"."""
    from dataclasses import replace

    from batchscale.analysis.narrative import _bound_text
    from batchscale.analysis.summary import CriticalBatchSummary
    from batchscale.fits import failed_batches, find_saturation

    rows = [{"input_mode": "synthetic", "batch_size": b, "status": "ok",
             "step_time_median_s": 0.001 * (1 + b / 64),
             "samples_per_s": b / (0.001 * (1 + b / 64))} for b in (16, 32, 64)]
    rows += [{"input_mode": mode, "batch_size": b, "status": "error", "error": RAISED}
             for mode in ("synthetic", "real") for b in (256, 128)]
    rows.append({"input_mode": "real", "batch_size": 512, "status": "error",
                 "error": "trial process exited with code 0 before reporting a result"})
    sweep = pd.DataFrame(rows)
    assert failed_batches(sweep) == [128, 256]  # 512's process died: the machine, not the code
    batch, reason = find_saturation(sweep, 0.01)
    assert batch is None and reason.endswith(
        "no saturation seen; batch 128, 256 failed in the sweep (status error), so no larger "
        "batch can be measured as the workload is")
    assert find_saturation(sweep[sweep["status"] == "ok"], 0.01)[1].endswith(
        "measure larger batches")
    fields = {name: math.nan for name in CriticalBatchSummary.__dataclass_fields__}
    fit = replace(CriticalBatchSummary(**fields), bound="above", bound_batch=64.0, reason="",
                  regimes=())
    assert "(batch 128, 256 failed in the sweep, so the workload as it is cannot run a bigger " \
           "one)" in _bound_text(fit, (128, 256))
    assert "(measure a bigger one to find B_crit)" in _bound_text(fit, ())
