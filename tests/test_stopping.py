"""Stop means stop: SIGTERM to a long command stops it like Ctrl-C (exit 143, what was measured
is kept, a rerun with the same id resumes), and SIGKILL, which no handler sees, still leaves
no process of the run behind (batchscale/stopping.py). Checked from /proc: every process the
command started, found while it ran, is gone within STOP_BOUND_S."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from batchscale.stopping import Terminated, signals_held, sigterm_raises
from helpers import BATCHSCALE, cli_env

TESTS_DIR = Path(__file__).parent
STOP_BOUND_S = 15.0
RUN_ID = "20261202T000000Z-stop01"


def descendants(pid: int) -> set[int]:
    """Every live process below `pid` (from each process's parent in /proc/<pid>/stat)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of `pids` still running (a zombie has exited: it only waits to be reaped)."""
    running = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            running.add(pid)
    return running


def wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def start_converge(out: Path, hang: bool) -> subprocess.Popen:
    env = cli_env({"BATCHSCALE_TEST_HANG": "1"} if hang else None)
    return subprocess.Popen(BATCHSCALE + [
        "converge", "--workload", "loop_workloads:hanging", "--batch-sizes", "8", "16",
        "--seeds", "0", "--lr-rules", "sqrt", "--run-id", RUN_ID, "--out", str(out)],
        cwd=TESTS_DIR, env=env, stderr=subprocess.PIPE, text=True)


def trials_dir(out: Path) -> Path:
    return out / "work" / RUN_ID / "trials"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_mid_trial_leaves_no_process_and_keeps_finished_trials(tmp_path, sig):
    """Batch 8 finishes, batch 16 hangs; the signal arrives while it hangs (its torchrun agent
    and rank running). SIGTERM: exit 143 with a message; SIGKILL: the kernel ends the CLI, and
    the agent and the rank follow by the parent-death signal. Either way the finished trial's
    rows are readable and a rerun with the same run id skips it and finishes the other."""
    out = tmp_path / "out"
    proc = start_converge(out, hang=True)
    try:
        wait_for(lambda: (trials_dir(out) / "b8-sqrt-s0-w1.run.parquet").exists(), 120,
                 "the batch-8 trial to finish")
        wait_for(lambda: len(descendants(proc.pid)) >= 2, 30, "the batch-16 trial's processes")
        started = descendants(proc.pid)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=STOP_BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, stderr
        assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr
    else:
        assert proc.returncode == -signal.SIGKILL
    wait_for(lambda: not alive(started), STOP_BOUND_S, f"processes {alive(started)} to stop")
    kept = pq.read_table(trials_dir(out) / "b8-sqrt-s0-w1.run.parquet").to_pandas()
    assert kept["status"].eq("reached").all()

    rerun = start_converge(out, hang=False)
    _, stderr = rerun.communicate(timeout=300)
    assert rerun.returncode == 0, stderr
    assert "[b16-sqrt-s0-w1] reached" in stderr and "[b8-sqrt-s0-w1]" not in stderr
    runs = pq.read_table(out / "runs.parquet").to_pandas()
    assert sorted(runs["batch_size"]) == [8, 16] and runs["status"].eq("reached").all()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_signal_stops_a_sweep_keeping_its_rows_and_its_trial_processes(tmp_path, sig):
    """A real SIGTERM to a running `batchscale sweep`: exit 143, the rows measured so far are
    in the file, and its trial processes (forkserver children) are gone. SIGKILL, which no
    handler sees: the same, through the forkserver's end and the trials' parent-death signal."""
    out = tmp_path / "sweep.parquet"
    batches = ",".join(str(2**k) for k in range(12))
    proc = subprocess.Popen(BATCHSCALE + ["sweep", "--workload", "digits-mlp", "--batch-sizes",
                                          batches, "--time-budget-s", "0.5", "--out", str(out)],
                            cwd=tmp_path, env=cli_env(None), stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: out.exists() or proc.poll() is not None, 120, "the first sweep row")
        started = descendants(proc.pid)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=STOP_BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
    if sig == signal.SIGTERM:
        assert proc.returncode == 143, stderr
        assert "stopped by SIGTERM" in stderr and "Traceback" not in stderr
    else:
        assert proc.returncode == -signal.SIGKILL, stderr
    wait_for(lambda: not alive(started), STOP_BOUND_S, f"processes {alive(started)} to stop")
    rows = pq.read_table(out).to_pylist()
    assert 1 <= len(rows) < 12 and all(r["status"] == "ok" for r in rows)
    assert os.path.getsize(out) > 0


def test_a_signal_during_a_held_step_takes_effect_when_the_step_ends():
    """SIGTERM inside `signals_held` (as around a trial process's start) does not cut the step:
    it is raised as Terminated right after, through the handler that was in place."""
    finished = []
    with pytest.raises(Terminated), sigterm_raises():
        with signals_held():
            signal.raise_signal(signal.SIGTERM)
            finished.append("step")
        finished.append("after")
    assert finished == ["step"]
    assert signal.getsignal(signal.SIGTERM) is not None


def test_ctrl_c_as_torchrun_starts_still_stops_the_group(tmp_path, monkeypatch):
    """Ctrl-C arriving right as the torchrun group has been started (the Popen done, its
    handle not yet kept): the start is held, so the group is stopped on the way out instead of
    left running unseen."""
    from batchscale.config import parse_config
    from batchscale.convergence import runner

    monkeypatch.chdir(TESTS_DIR)  # the workers import contract_workloads from here
    cfg = parse_config({"workload": "contract_workloads:good", "convergence": {
        "batch_sizes": [16], "lr_rules": ["sqrt"], "seeds": [0], "max_steps": 100000,
        "targets": [{"metric": "val_accuracy", "value": 1.0}]}})
    spec = runner.build_spec(cfg, [16], data_dir="unused", out_dir=str(tmp_path / "out"),
                             run_id="ctrlc")
    started = []
    real_popen = subprocess.Popen

    def popen_then_ctrl_c(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        signal.raise_signal(signal.SIGINT)
        return started[-1]

    monkeypatch.setattr(runner.subprocess, "Popen", popen_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        runner.launch_local(spec, 300, max_restarts=0)
    assert len(started) == 1 and started[0].poll() is not None
    with pytest.raises(ProcessLookupError):
        os.killpg(started[0].pid, 0)  # nothing of its group is left
