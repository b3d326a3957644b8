"""Does successive halving keep the tuned rule's answer for fewer steps? The tuned rule on
digits-mlp, every learning rate of `lr_candidates` at every batch size and seed, trained twice:
to the target (the full set), and with `lr_halving_eta: 2` (the learning rates of a batch
size and seed run to a rung, the worse half stop as pruned, the rest go on to the next rung).

Figures:
- examples trained (steps × batch, summed over trials), halving ÷ full set, and the trials
  pruned;
- B_crit of the tuned rule (the per-batch best learning rate) with its 90 % interval in both,
  their ratio, and whether the full set's B_crit lies in the halving run's interval;
- whether each batch size's best learning rate is the same in both.

One draw of each (the steps to target do not depend on machine load, so no timing enters).
Run: `make bench BENCH=bench_halving` (about a minute on 2 CPU cores);
BENCH_HALVING_FIRST_RUNG_STEPS sets the first rung (default 80 steps).
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from pathlib import Path

import pandas as pd

from batchscale.adaptive.choice import interval_state
from batchscale.analysis.critical import steps_to_result
from batchscale.config import parse_config
from batchscale.convergence.runner import run_convergence
from batchscale.data.prep import prepare
from benchmarks import scaled

BATCH_SIZES = [8, 32, 128, 512]
LR_CANDIDATES = [0.005, 0.02, 0.08, 0.32]
SEEDS = scaled([0, 1, 2], [0, 1])
FIRST_RUNG_STEPS = int(os.environ.get("BENCH_HALVING_FIRST_RUNG_STEPS", "80"))
BOOTSTRAP_SAMPLES = 200


def _config(halving: bool):
    convergence = {"batch_sizes": BATCH_SIZES, "lr_rules": ["tuned"],
                   "lr_candidates": LR_CANDIDATES, "seeds": SEEDS, "target_val_accuracy": 0.9,
                   "max_steps": 3000, "eval_every_steps": 10}
    if halving:
        convergence |= {"lr_halving_eta": 2, "lr_halving_first_rung_steps": FIRST_RUNG_STEPS}
    return parse_config({"name": "bench-halving", "workload": "digits-mlp",
                         "convergence": convergence})


def _trained(root: Path, data_dir: Path, halving: bool) -> pd.DataFrame:
    name = "halving" if halving else "full"
    print(f"   {name}: {len(BATCH_SIZES)} batch sizes × {len(LR_CANDIDATES)} LRs × "
          f"{len(SEEDS)} seeds", file=sys.stderr, flush=True)
    _, runs = run_convergence(_config(halving), BATCH_SIZES, data_dir=str(data_dir),
                              out_dir=str(root / name), run_id=f"bench-{name}")
    return runs.to_pandas()


def _fitted(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["status"] != "pruned"]


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prepare(_config(False).dataset, root / "data")
        full, halved = (_trained(root, root / "data", h) for h in (False, True))
    examples = {name: float((r["steps_run"] * r["batch_size"]).sum())
                for name, r in (("full", full), ("halving", halved))}
    every = interval_state(full, "tuned", BOOTSTRAP_SAMPLES)
    kept = interval_state(_fitted(halved), "tuned", BOOTSTRAP_SAMPLES)
    tables = {name: steps_to_result(_fitted(r), by=()).set_index("batch_size")
              for name, r in (("full", full), ("halving", halved))}
    best = {name: table["best_lr"] for name, table in tables.items()}
    figures = {
        "examples_halving_over_full": examples["halving"] / examples["full"],
        "trials_pruned": f"{int((halved['status'] == 'pruned').sum())} of {len(halved)}",
        "full_b_crit": [every.b_crit, every.low, every.high],
        "halving_b_crit": [kept.b_crit, kept.low, kept.high],
        "first_rung_steps": FIRST_RUNG_STEPS,
        "same_best_lr_per_batch": {int(b): bool(best["full"][b] == best["halving"].get(b))
                                   for b in best["full"].index},
        "steps_to_target_full_vs_halving": {
            int(b): [float(tables["full"]["steps_to_target"][b]),
                     float(tables["halving"]["steps_to_target"].get(b, math.nan))]
            for b in tables["full"].index},
        "uncertainty": "one draw of each: no interval over repeats (steps do not depend on load)",
    }
    if math.isfinite(every.b_crit) and math.isfinite(kept.b_crit):
        figures["b_crit_halving_over_full"] = kept.b_crit / every.b_crit
        figures["full_inside_halving_interval"] = bool(kept.low <= every.b_crit <= kept.high)
    print(f"   {figures}", file=sys.stderr, flush=True)
    return figures


if __name__ == "__main__":
    print(run())
