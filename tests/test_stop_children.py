"""A runner whose work runs in child processes started from a thread pool, as kfp.local runs a
pipeline's tasks (one `sh -ec` per task, a Python under it; the pool starts every queued task
before the stop reaches the caller): Ctrl-C to the whole process group, or SIGTERM to the
runner alone, stops the running task and every queued one within the bound, and the runner
exits as the CLI does (stopping.children_stop_with_this_process). Real processes and signals;
the runner is a small script standing in for kfp.local's pool (tests/test_run_interrupt.py
runs the real pipeline)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_stopping import alive, descendants, wait_for

STOP_BOUND_S = 15.0
"""The grace a Ctrl-C'd task gets (stopping.STOP_GRACE_S), the SIGTERM's, and slack."""
TASK_S = 60
"""How long each stand-in task would run if nothing stopped it: far beyond the bound."""

RUNNER = f"""
import concurrent.futures, subprocess, sys
from batchscale.stopping import children_stop_with_this_process, sigterm_raises

marks = sys.argv[1]
task = ("import os, pathlib, sys, time; d = pathlib.Path(sys.argv[1]); "
        "(d / ('started-' + sys.argv[2])).write_text(str(os.getpid())); time.sleep({TASK_S}); "
        "(d / ('finished-' + sys.argv[2])).touch()")

def run_task(i):
    # `; true`: the shell stays as the task's parent, as kfp.local's `sh -ec` wrapper does
    line = f'"{{sys.executable}}" -c "{{task}}" {{marks}} {{i}}; true'
    return subprocess.run(["/bin/sh", "-ec", line])

try:
    with sigterm_raises(), children_stop_with_this_process():
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
        try:
            futures = [pool.submit(run_task, i) for i in range(3)]
            for future in concurrent.futures.as_completed(futures):
                future.result()
        finally:
            pool.shutdown(wait=True)  # as kfp.local's pool: the queued tasks start here
except KeyboardInterrupt:
    sys.exit(130)
except BaseException as stop:
    sys.exit(143 if type(stop).__name__ == "Terminated" else 1)
"""


@pytest.mark.parametrize("how", ["ctrl-c to the group", "sigterm to the runner"])
def test_a_stopped_runner_ends_its_running_and_queued_tasks(tmp_path: Path, how: str):
    proc = subprocess.Popen([sys.executable, "-c", RUNNER, str(tmp_path)],
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        wait_for(lambda: (tmp_path / "started-0").exists(), 60, "the first task to start")
        started = descendants(proc.pid)
        began = time.monotonic()
        if how == "ctrl-c to the group":
            os.killpg(proc.pid, signal.SIGINT)
        else:
            proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=STOP_BOUND_S)
        stopped_s = time.monotonic() - began
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == (130 if how == "ctrl-c to the group" else 143), stderr
    assert stopped_s < STOP_BOUND_S
    # a task stopped as it started may have left its mark empty
    tasks = {int(pid) for mark in tmp_path.glob("started-*") if (pid := mark.read_text())}
    assert not alive(started | tasks), f"left running: {alive(started | tasks)}"
    assert not list(tmp_path.glob("finished-*")), "a task ran to its end after the stop"
