"""What does running a multi-worker search's cells in one process group save? The adaptive
search of two-worker cells on digits (digits-mlp to val_accuracy 0.9, the batch sizes and seeds
of bench_adaptive's first repeat), trained twice per round: its cells in one long-lived torchrun
group of two ranks (`convergence/cell_server.py`, what the search does) and each cell in a
torchrun launch of its own (what it did before). Beside them the grid of the same batch sizes
and seeds at two workers (one launch), the cost a search is measured against.

Figures, over the rounds (the three runs of a round interleaved, order rotating, so load falls
on each alike): device-seconds held (each launch's wall time × 2 workers, start-up included) of
the search in one group ÷ one torchrun per cell, paired per round, median with its bootstrap
90 % interval; each search's held device-seconds ÷ the grid's of its round; and in how many
rounds both ways trained the same cells (they should: same seeds, same decisions).

Run: `python -m benchmarks.run bench_cell_server` (about 1 minute per round on 2 CPU cores;
BENCH_QUICK=1: two rounds).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

from batchscale.adaptive import driver
from batchscale.adaptive.driver import run_adaptive
from batchscale.config import parse_config
from batchscale.convergence.cell_server import CellServer
from batchscale.convergence.runner import run_convergence
from batchscale.data.prep import prepare
from benchmarks import scaled
from benchmarks.stats import Goal, ratio_figure, share_figure

WORKERS = 2
ROUNDS = scaled(5, 2)
BATCH_SIZES = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
SEEDS = [0, 1, 2]
TARGET = {"metric": "val_accuracy", "value": 0.9}
COST_GOAL = Goal(1 / 3, at_least=False)


class TorchrunPerCell(CellServer):
    """The search as it ran before: every cell hands itself back to its own torchrun."""

    def run(self, spec_path: Path, timeout_s: float) -> bool:
        return False


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _config(strategy: str):
    return parse_config({
        "name": "bench-cell-server", "workload": "digits-mlp", "dataset": {"name": "digits"},
        "convergence": {"batch_sizes": BATCH_SIZES, "lr_rules": ["sqrt"], "seeds": SEEDS,
                        "targets": [TARGET], "max_steps": 3000, "strategy": strategy,
                        "workers": WORKERS}})


def _grid(root: Path, data_dir: Path, index: int) -> float:
    started = time.monotonic()
    run_convergence(_config("grid"), BATCH_SIZES, data_dir=str(data_dir),
                    out_dir=str(root / f"grid-{index}"), run_id="bench-grid")
    return (time.monotonic() - started) * WORKERS


def _search(root: Path, data_dir: Path, index: int, per_cell: bool) -> tuple[float, list]:
    """(held device-seconds, the cells trained) of one search."""
    server = TorchrunPerCell if per_cell else CellServer
    with mock.patch.object(driver, "CellServer", server):
        _, _, decisions = run_adaptive(
            _config("adaptive"), data_dir=str(data_dir), run_id="bench-search",
            work_root=root / f"search-{'per-cell' if per_cell else 'group'}-{index}",
            echo=lambda line: None)
    frame = decisions.to_pandas()
    cells = frame.dropna(subset=["batch_size"])[["batch_size", "seed"]]
    return float(frame["device_s_held"].iloc[-1]), sorted(map(tuple, cells.values.tolist()))


def _round(root: Path, data_dir: Path, index: int) -> dict:
    runs = {"grid": lambda: _grid(root, data_dir, index),
            "group": lambda: _search(root, data_dir, index, per_cell=False),
            "per_cell": lambda: _search(root, data_dir, index, per_cell=True)}
    order = list(runs)[index % 3:] + list(runs)[:index % 3]
    found = {name: runs[name]() for name in order}
    outcome = {"grid_held_s": found["grid"], "group_held_s": found["group"][0],
               "per_cell_held_s": found["per_cell"][0],
               "same_cells": found["group"][1] == found["per_cell"][1],
               "cells": len(found["group"][1])}
    _log(f"   round {index} ({', '.join(order)}): {outcome}")
    return outcome


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data_dir = root / "data"
        prepare(_config("grid").dataset, data_dir)
        rounds = [_round(root, data_dir, index) for index in range(ROUNDS)]
    column = {key: [r[key] for r in rounds] for key in rounds[0]}
    return {
        "held, one group ÷ one torchrun per cell": ratio_figure(
            column["group_held_s"], column["per_cell_held_s"]),
        "held, search in one group ÷ grid (goal ≤ 1/3)": ratio_figure(
            column["group_held_s"], column["grid_held_s"], COST_GOAL),
        "held, search with one torchrun per cell ÷ grid": ratio_figure(
            column["per_cell_held_s"], column["grid_held_s"]),
        "rounds where both trained the same cells": share_figure(
            sum(column["same_cells"]), ROUNDS),
        "per_round": rounds}


if __name__ == "__main__":
    print(run())
