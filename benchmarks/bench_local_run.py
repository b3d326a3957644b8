"""How much of `make local-run` is useful work? One `batchscale run` of the embedded
default in a temporary directory (its own local SeaweedFS), then, from its pipeline log and
tables: the wall time, each task's time, and the useful share = (the sweep's timed steps + the
convergence trials' training seconds) ÷ wall time. The rest is process start-up (executor,
imports, torchrun), evaluation, validation, analysis and publishing.

Goal: useful work ≥ 60 % of the wall time on a quiet 2-core machine. One run: a
single draw, no interval over repeats (the per-task times show where the rest goes).

Run: `python -m benchmarks.run bench_local_run` (about 3 minutes on 2 CPU cores).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import pyarrow.parquet as pq

from batchscale import localstore
from benchmarks.stats import Goal

USEFUL_GOAL = Goal(0.60)
TASK_LINE = re.compile(r"^(\d\d:\d\d:\d\d\.\d+) - INFO - (?:Executing task '([^']+)'|"
                       r"Task '([^']+)' finished)")
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def task_seconds(log: str) -> list[tuple[str, float]]:
    """(task, seconds) in the order the tasks ran, from kfp.local's log lines."""
    started: dict[str, datetime] = {}
    done = []
    for line in ANSI.sub("", log).splitlines():
        match = TASK_LINE.match(line.strip())
        if not match:
            continue
        stamp = datetime.strptime(match[1], "%H:%M:%S.%f")
        if match[2]:
            started[match[2]] = stamp
        elif match[3] in started:
            done.append((match[3], (stamp - started.pop(match[3])).total_seconds()))
    return done


def useful_seconds(pipeline_root: Path) -> tuple[float, float]:
    """(sweep timed seconds, training seconds) from the run's own artifacts."""
    sweep = pq.read_table(next(pipeline_root.rglob("throughput-sweep/sweep"))).to_pandas()
    runs = pq.read_table(next(pipeline_root.rglob("validate-runs/merged_runs"))).to_pandas()
    timed = float((sweep["timed_steps"].fillna(0) * sweep["step_time_median_s"].fillna(0)).sum())
    training = float(runs.drop_duplicates("trial_id")["train_time_s"].sum())
    return timed, training


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        try:
            started = time.perf_counter()
            result = subprocess.run([sys.executable, "-m", "batchscale.cli", "run"],
                                    cwd=workdir, capture_output=True, text=True, timeout=1800)
            wall = time.perf_counter() - started
        finally:
            localstore.down(workdir)
        if result.returncode != 0:
            raise RuntimeError(f"batchscale run failed:\n{result.stderr[-3000:]}")
        log = next((workdir / ".batchscale" / "runs").rglob("pipeline.log")).read_text()
        tasks = task_seconds(log)
        timed, training = useful_seconds(workdir / ".batchscale" / "pipeline_root")
    share = (timed + training) / wall
    figures = {
        "wall_s": round(wall, 1),
        "tasks": len(tasks),
        "sweep_timed_s": round(timed, 1),
        "training_s": round(training, 1),
        "useful_share": round(share, 3),
        "useful_goal": f"{'met' if USEFUL_GOAL.is_good(share) else 'missed'} ({USEFUL_GOAL})",
        "task_s": [(name, round(seconds, 1)) for name, seconds in tasks],
        "uncertainty": "one run: a single draw, no interval over repeats",
    }
    for name, value in figures.items():
        print(f"   {name}: {value}", flush=True)
    return figures


if __name__ == "__main__":
    run()
