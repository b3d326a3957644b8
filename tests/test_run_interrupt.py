"""Ctrl-C on `batchscale run`: the terminal sends SIGINT to the whole foreground process group,
so every kfp.local task process gets it too, not only `batchscale run`. Each task ends with
exit 130 and one line (errors.task_refusals), not a KeyboardInterrupt traceback; the run says
what it keeps and exits 130, and no process of it is left. The pipeline is real (kfp.local, a
real SeaweedFS, real torchrun); the signal is sent as a terminal would, to the process group."""

from __future__ import annotations

import os
import re
import signal
import subprocess

import pytest
from test_stopping import alive, descendants, wait_for

from helpers import BATCHSCALE, TINY_CONFIG, cli_env, store_env

pytestmark = pytest.mark.slow
STOP_BOUND_S = 30.0


def test_ctrl_c_mid_convergence_ends_every_task_without_a_traceback(tmp_path, object_store):
    config = tmp_path / "tiny.yaml"
    config.write_text(TINY_CONFIG)
    proc = subprocess.Popen(BATCHSCALE + ["run", "--config", str(config)], cwd=tmp_path,
                            env=cli_env(store_env(object_store)), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        trials = tmp_path / ".batchscale" / "work"
        wait_for(lambda: any(trials.glob("*/**/trials/*.run.parquet")), 600,
                 "the convergence stage's first finished trial")
        started = descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        output = proc.communicate(timeout=STOP_BOUND_S)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 130, output[-3000:]
    assert "KeyboardInterrupt" not in output and "Traceback" not in output, output[-5000:]
    assert "batchscale: interrupted; results written so far are kept" in output
    run_id = re.search(r"batchscale run ([^\s:]+)", output).group(1)
    assert f"to resume, rerun the same command with --run-id {run_id}" in output
    wait_for(lambda: not alive(started), STOP_BOUND_S, "the run's processes to stop")
    assert any(trials.glob("*/**/trials/*.run.parquet"))  # the finished trial is kept
