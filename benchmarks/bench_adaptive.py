"""Does the adaptive search give the grid's answer for a fraction of its cost? Per case and
repeat, the full grid (every batch size × seed of the config, one torchrun) and the adaptive
search (`convergence.strategy: adaptive`), with the same seeds, the same batch sizes to choose
from and separate work directories: every trial of both is trained here. Each repeat draws other
seeds (repeat r trains seeds 3r, 3r+1, 3r+2), so the figures over repeats carry the spread a user
would see from one run to the next.

Cases: digits-mlp on digits, and on the teacher–student task at two label-noise levels (more
noise: noisier gradients, a larger critical batch; there the steps to target scatter ±50–70 %
between seeds, the "scattered" case).

Figures per case, each the median of the paired per-repeat ratios with its bootstrap 90 %
interval over the repeats:
- cost, search ÷ grid, in examples (steps × batch, probes included), in device-seconds of
  training (training seconds × workers) and in device-seconds held (each launch's wall time ×
  workers: process start-up, data loading and evaluation included; the grid is one launch);
  goal ≤ 1/3 of the held device-seconds; beside it, the device-seconds the search's first
  launch held (process start-up and its first probe) ÷ the grid's: a floor under the held ratio
  that no choice of cells lowers;
- B_crit, search ÷ grid, goal within ±20 %, with how many repeats met it (exact interval), and
  how often the grid's B_crit lay inside the search's interval;
- the grid's own interval (high/low): where it is wider than ×2 the grid cannot pin B_crit, and
  the B_crit goal is not judged; how often the search stopped saying so itself
  ("even the full grid … is not expected to pin B_crit"), where the grid did and did not.

Each repeat also runs two other searches against the same grid:
- the search as it chose cells before it priced them in device-seconds (per example; prefix
  `ranked_by_examples_`; the paired ratios `…_device_priced_over_example_ranked` compare the
  two);
- the search with budgeted probes (`adaptive_probe_budget_examples` = PROBE_BUDGET_EXAMPLES:
  each probe stops at its first evaluation past that many examples and only measures B_simple;
  prefix `probe_budget_`).

Run: `python -m benchmarks.run bench_adaptive` (about 3 minutes per case and repeat on 2 CPU
cores; BENCH_QUICK=1: one repeat, two seeds). Device-seconds depend on machine load, examples
and B_crit do not.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import pyarrow as pa

from batchscale.adaptive.choice import interval_state
from batchscale.adaptive.driver import Search, run_adaptive
from batchscale.adaptive.futility import STOP_FUTILE
from batchscale.config import parse_config
from batchscale.convergence.runner import run_convergence
from batchscale.data.prep import prepare
from benchmarks import scaled
from benchmarks.stats import Goal, ratio_figure, share_figure

BATCH_SIZES = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
SEEDS_PER_REPEAT = scaled(3, 2)
REPEATS = scaled(5, 1)
COST_GOAL = Goal(1 / 3, at_least=False)
AGREEMENT = 0.20
GRID_PINS = 2.0
"""The grid's own B_crit interval (high/low) within which the B_crit goal is judged."""
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
PROBE_BUDGET_EXAMPLES = 2048
"""Examples per budgeted probe: 512 steps at batch 4, 256 at batch 8 (the default probes)."""
BY_EXAMPLES = "ranked_by_examples_"
"""The search as it chose cells before it priced them in device-seconds: the narrowing per
example (`choose_next` without a cost)."""
ARMS = (("", {}), ("probe_budget_", {"adaptive_probe_budget_examples": PROBE_BUDGET_EXAMPLES}),
        (BY_EXAMPLES, {}))
"""The searches run against each repeat's grid: probes to target and cells priced in
device-seconds (what a user runs), budgeted probes, and cells ranked per example."""


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _config(workload: str, dataset: dict, target: dict, strategy: str, seeds: list[int],
            **search):
    return parse_config({
        "name": "bench-adaptive", "workload": workload, "dataset": dataset,
        "convergence": {"batch_sizes": BATCH_SIZES, "lr_rules": ["sqrt"], "seeds": seeds,
                        "targets": [target], "max_steps": 3000, "strategy": strategy,
                        **search}})


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


def run_case(name: str, workload: str, dataset: dict, target: dict, root: Path,
             repeat: int) -> dict:
    """One repeat of a case: the grid and the search on the same seeds; raw figures."""
    seeds = list(range(SEEDS_PER_REPEAT * repeat, SEEDS_PER_REPEAT * (repeat + 1)))
    data_dir = root / "data"
    if workload == STUDENT:
        _importable_student(root)
    grid_cfg = _config(workload, dataset, target, "grid", seeds)
    if not data_dir.exists():
        prepare(grid_cfg.dataset, data_dir)
    _log(f"   {name}, repeat {repeat}: grid of {len(BATCH_SIZES)} batch sizes × seeds {seeds}")
    started = time.monotonic()
    _, grid_runs = run_convergence(grid_cfg, BATCH_SIZES, data_dir=str(data_dir),
                                   out_dir=str(root / f"grid-{repeat}"), run_id="bench-grid")
    grid_held = time.monotonic() - started  # one launch, one worker
    outcome = {}
    for prefix, search in ARMS:
        _log(f"   {name}, repeat {repeat}: adaptive search {prefix or 'probes to target'}")
        pricing = (mock.patch.object(Search, "cell_cost", lambda self: None)
                   if prefix == BY_EXAMPLES else contextlib.nullcontext())
        with pricing:
            _, search_runs, decisions = run_adaptive(
                _config(workload, dataset, target, "adaptive", seeds, **search),
                data_dir=str(data_dir), run_id="bench-adaptive",
                work_root=root / f"adaptive-{prefix}{repeat}", echo=_log)
        found = _compare(grid_runs, grid_held, search_runs, decisions, target)
        outcome.update({f"{prefix}{k}": v for k, v in found.items()})
    _log(f"   {name}, repeat {repeat}: {outcome}")
    return outcome


def _compare(grid_runs: pa.Table, grid_held: float, search_runs: pa.Table,
             decisions: pa.Table, target: dict) -> dict:
    """One search against the grid of the same repeat: raw figures."""
    frame = decisions.to_pandas()
    last = frame.iloc[-1]
    held = frame["device_s_held"]
    grid = interval_state(_target_rows(grid_runs, target), "sqrt", BOOTSTRAP_SAMPLES)
    search = interval_state(_target_rows(search_runs, target), "sqrt", BOOTSTRAP_SAMPLES)
    (grid_examples, grid_s), (search_examples, search_s) = (_spent(grid_runs),
                                                            _spent(search_runs))
    outcome = {"examples": search_examples / grid_examples, "device_s": search_s / grid_s,
               "held_s": float(last["device_s_held"]) / grid_held,
               "first_launch_held_s": float(held[held > 0].iloc[0]) / grid_held,
               "grid_b_crit": [grid.b_crit, grid.low, grid.high],
               "search_b_crit": [search.b_crit, search.low, search.high],
               "grid_ratio": grid.ratio, "stop_reason": str(last["reason"]),
               "search_cells": int(decisions.to_pandas()["batch_size"].notna().sum())}
    if math.isfinite(grid.b_crit) and math.isfinite(search.b_crit):
        outcome["b_crit"] = search.b_crit / grid.b_crit
        outcome["grid_inside"] = bool(search.low <= grid.b_crit <= search.high)
    return outcome


def summarize(outcomes: list[dict], prefix: str = "") -> dict:
    """A case's figures over its repeats (paired ratios: each repeat's search ÷ its grid), for
    the search whose raw figures carry `prefix`."""
    outcomes = [{k[len(prefix):]: v for k, v in o.items() if k.startswith(prefix)}
                for o in outcomes]
    if not prefix:
        outcomes = [{k: v for k, v in o.items()
                     if not k.startswith(tuple(p for p, _ in ARMS if p))} for o in outcomes]
    ones = [1.0] * len(outcomes)
    compared = [o for o in outcomes if "b_crit" in o]
    pinned = [o for o in compared if o["grid_ratio"] <= GRID_PINS]
    figures = {
        "examples_search_over_grid": ratio_figure([o["examples"] for o in outcomes], ones),
        "training_device_s_search_over_grid": ratio_figure([o["device_s"] for o in outcomes],
                                                           ones),
        "held_device_s_search_over_grid": ratio_figure([o["held_s"] for o in outcomes], ones,
                                                       COST_GOAL),
        "first_launch_held_device_s_over_grid": ratio_figure(
            [o["first_launch_held_s"] for o in outcomes], ones),
        "grid_interval_ratio": [o["grid_ratio"] for o in outcomes],
        "repeats": len(outcomes),
        "stop_reasons": [o["stop_reason"] for o in outcomes],
    }
    if compared:
        figures["b_crit_search_over_grid"] = ratio_figure([o["b_crit"] for o in compared],
                                                          [1.0] * len(compared))
        figures["grid_inside_search_interval"] = share_figure(
            sum(o["grid_inside"] for o in compared), len(compared))
    figures.update(_futility(outcomes))
    if pinned:
        figures["b_crit_within_20pct_where_grid_pins_it"] = share_figure(
            sum(abs(o["b_crit"] - 1) <= AGREEMENT for o in pinned), len(pinned))
    return figures


def _pricing(outcomes: list[dict]) -> dict:
    """The search that prices cells in device-seconds ÷ the one that ranks them per example,
    paired per repeat (same seeds, same grid)."""
    return {f"{key}_device_priced_over_example_ranked": ratio_figure(
        [o[key] for o in outcomes], [o[BY_EXAMPLES + key] for o in outcomes])
        for key in ("held_s", "device_s", "examples")}


def _futility(outcomes: list[dict]) -> dict:
    """How often the search stopped saying the grid cannot pin B_crit (adaptive/futility.py),
    split by whether this repeat's grid did pin it (its interval within ×2)."""
    figures = {}
    for side, repeats in (("pins", [o for o in outcomes if o["grid_ratio"] <= GRID_PINS]),
                          ("cannot", [o for o in outcomes if o["grid_ratio"] > GRID_PINS])):
        if repeats:
            futile = sum(o["stop_reason"].startswith(STOP_FUTILE) for o in repeats)
            figures[f"futile_where_grid_{side}"] = share_figure(futile, len(repeats))
    return figures


def run() -> dict:
    results = {}
    for name, (workload, dataset, target) in CASES.items():
        with tempfile.TemporaryDirectory() as tmp:
            outcomes = [run_case(name, workload, dataset, target, Path(tmp), r)
                        for r in range(REPEATS)]
        others = {f"{prefix}{k}": v for prefix, _ in ARMS if prefix
                  for k, v in summarize(outcomes, prefix).items()}
        results[name] = {**summarize(outcomes), **others, **_pricing(outcomes),
                         "per_repeat": outcomes}
        _log(f"   {name}: " + "; ".join(f"{k} {v.text() if hasattr(v, 'text') else v}"
                                         for k, v in results[name].items()
                                         if k != "per_repeat"))
    return results


if __name__ == "__main__":
    print(run())
