"""Does the adaptive search give the grid's answer for a fraction of its cost? Per case,
the full grid (every batch size × seed of the config, one torchrun) and the adaptive search
(`convergence.strategy: adaptive`), with the same seeds, the same batch sizes to choose from and
separate work directories: every trial of both is trained here.

Cases: digits-mlp on digits, and on the teacher–student task at two label-noise levels (more
noise: noisier gradients, a larger critical batch).

Figures per case:
- compute spent, adaptive ÷ grid, in examples (steps × batch, probes included) and in
  device-seconds (training seconds × workers); goal ≤ 1/3;
- B_crit, adaptive ÷ grid, goal within ±20 %, and whether the grid's B_crit lies inside the
  adaptive interval;
- B_simple's predicted B_crit ÷ the grid's B_crit.

Run: `python -m benchmarks.run bench_adaptive` (several minutes on 2 CPU cores).
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from pathlib import Path

import pyarrow as pa

from batchscale.adaptive.choice import interval_state
from batchscale.adaptive.driver import run_adaptive
from batchscale.config import parse_config
from batchscale.convergence.runner import run_convergence
from batchscale.data.prep import prepare
from benchmarks import scaled
from benchmarks.stats import Goal

BATCH_SIZES = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
SEEDS = scaled([0, 1, 2], [0, 1])
COST_GOAL = Goal(1 / 3, at_least=False)
AGREEMENT = 0.20
# The teacher–student rows are 32 features: a small MLP of this benchmark's own (a user model,
# as a user would bring one) takes them.
STUDENT = "bench_student:build"
STUDENT_MODULE = """
import torch.nn as nn


def build():
    return nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 10))
"""
CASES = {
    "digits": ("digits-mlp", {"name": "digits"}, {"metric": "val_accuracy", "value": 0.9}),
    "teacher-student noise 0.0": (
        STUDENT, {"name": "teacher-student", "synthetic_noise": 0.0, "synthetic_train_rows": 8000},
        {"metric": "val_accuracy", "value": 0.65}),
    "teacher-student noise 0.3": (
        STUDENT, {"name": "teacher-student", "synthetic_noise": 0.3, "synthetic_train_rows": 8000},
        {"metric": "val_accuracy", "value": 0.45}),
}
BOOTSTRAP_SAMPLES = 200


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _config(workload: str, dataset: dict, target: dict, strategy: str):
    return parse_config({
        "name": "bench-adaptive", "workload": workload, "dataset": dataset,
        "convergence": {"batch_sizes": BATCH_SIZES, "lr_rules": ["sqrt"], "seeds": SEEDS,
                        "targets": [target], "max_steps": 3000, "strategy": strategy}})


def _spent(runs: pa.Table) -> tuple[int, float]:
    trials = runs.to_pandas().drop_duplicates("trial_id")
    return (int((trials["steps_run"] * trials["batch_size"]).sum()),
            float((trials["train_time_s"] * trials["workers"]).sum()))


def _target_rows(runs: pa.Table, target: dict):
    frame = runs.to_pandas()
    return frame[(frame["target_metric"] == target["metric"])
                 & (frame["target_value"] == target["value"])]


def _importable_student(root: Path) -> None:
    """The student model's module on the import path of this process and of torchrun's."""
    (root / "bench_student.py").write_text(STUDENT_MODULE)
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)


def run_case(name: str, workload: str, dataset: dict, target: dict, root: Path) -> dict:
    data_dir = root / "data"
    if workload == STUDENT:
        _importable_student(root)
    grid_cfg = _config(workload, dataset, target, "grid")
    prepare(grid_cfg.dataset, data_dir)
    _log(f"   {name}: grid of {len(BATCH_SIZES)} batch sizes × {len(SEEDS)} seeds")
    _, grid_runs = run_convergence(grid_cfg, BATCH_SIZES, data_dir=str(data_dir),
                                   out_dir=str(root / "grid"), run_id="bench-grid")
    _log(f"   {name}: adaptive search")
    _, study_runs, decisions = run_adaptive(_config(workload, dataset, target, "adaptive"),
                                            data_dir=str(data_dir), run_id="bench-adaptive",
                                            work_root=root / "adaptive", echo=_log)
    grid = interval_state(_target_rows(grid_runs, target), "sqrt", BOOTSTRAP_SAMPLES)
    search = interval_state(_target_rows(study_runs, target), "sqrt", BOOTSTRAP_SAMPLES)
    (grid_examples, grid_s), (study_examples, study_s) = _spent(grid_runs), _spent(study_runs)
    predicted = decisions.to_pandas()["predicted_b_crit"].dropna()
    figures = {
        "grid_b_crit": [grid.b_crit, grid.low, grid.high],
        "adaptive_b_crit": [search.b_crit, search.low, search.high],
        "adaptive_cells": int(decisions.to_pandas()["batch_size"].notna().sum()),
        "grid_cells": len(BATCH_SIZES) * len(SEEDS),
        "examples_adaptive_over_grid": study_examples / grid_examples,
        "device_s_adaptive_over_grid": study_s / grid_s,
        "cost_goal": f"{'met' if COST_GOAL.is_good(study_examples / grid_examples) else 'missed'}"
                     f" ({COST_GOAL})",
        "uncertainty": "one search and one grid per case: single draws, no interval over repeats",
        "stop_reason": decisions.to_pandas()["reason"].iloc[-1],
    }
    if math.isfinite(grid.b_crit) and math.isfinite(search.b_crit):
        ratio = search.b_crit / grid.b_crit
        figures["b_crit_adaptive_over_grid"] = ratio
        figures["b_crit_goal"] = "met" if abs(ratio - 1) <= AGREEMENT else "missed"
        figures["grid_inside_adaptive_interval"] = bool(search.low <= grid.b_crit <= search.high)
    else:
        figures["b_crit_goal"] = (f"not comparable: grid {grid.reason or 'no interval'}; "
                                  f"adaptive {search.reason or 'no interval'}")
    if len(predicted) and math.isfinite(grid.b_crit):
        figures["predicted_over_grid_b_crit"] = float(predicted.iloc[-1]) / grid.b_crit
    _log(f"   {name}: {figures}")
    return figures


def run() -> dict:
    results = {}
    for name, (workload, dataset, target) in CASES.items():
        with tempfile.TemporaryDirectory() as tmp:
            results[name] = run_case(name, workload, dataset, target, Path(tmp))
    return results


if __name__ == "__main__":
    print(run())
