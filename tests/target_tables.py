"""Runs and curves tables with several targets and a generalization-gap budget, built by hand
with known answers: S(B) = S_min + E_min/B per target (B_crit = E_min/S_min), and metrics at
the budget that fall (or stay flat) with the batch."""

from __future__ import annotations

import numpy as np
import pandas as pd
from test_analyze import run_row

TARGET_BATCHES = (4, 8, 16, 32, 64, 128, 256, 512)
ACCURACY_TARGETS = {0.90: (100.0, 2000.0), 0.93: (150.0, 6000.0), 0.95: (200.0, 16000.0)}
"""Target value → (S_min, E_min): B_crit 20, 40 and 80, steps growing with the target."""


def multi_target_runs(
    targets: dict[float, tuple[float, float]] = ACCURACY_TARGETS,
    metric: str = "val_accuracy",
    batches=TARGET_BATCHES,
    seeds=(0, 1, 2),
    noise: float = 0.02,
    rule: str = "linear",
) -> pd.DataFrame:
    """A row per (trial, target), as the trainer writes them (schema version 2): one trial per
    (batch, seed) with its steps to each target, multiplicative noise shared by its targets."""
    rng = np.random.default_rng(0)
    rows = []
    for batch in batches:
        for seed in seeds:
            jitter = 1 + rng.uniform(-noise, noise)
            for value, (s_min, e_min) in targets.items():
                steps = round((s_min + e_min / batch) * jitter)
                row = run_row(batch, rule, 0.1, seed, steps, step_time=1e-3 + 2e-6 * batch)
                row.update(target_metric=metric, target_value=value, schema_version=2,
                           trial_id=f"{rule}-{batch}-{seed}")
                if metric == "val_accuracy":
                    row["target_val_accuracy"] = value
                rows.append(row)
    return pd.DataFrame(rows)


def gap_curves(drop_per_doubling: float, seeds=(0, 1, 2), noise: float = 0.002,
               batches=TARGET_BATCHES, rules=("linear",)) -> pd.DataFrame:
    """Curves with two evaluations per trial, the second at the gap budget (4096 examples):
    val_accuracy there = 0.95 − drop_per_doubling·log2(B/4) + seeded noise; val_loss rises
    to match; train_loss falls with the data as usual."""
    rng = np.random.default_rng(1)
    rows = []
    for rule in rules:
        for batch in batches:
            for seed in seeds:
                accuracy = 0.95 - drop_per_doubling * np.log2(batch / 4) + rng.normal(0, noise)
                trial = {"trial_id": f"{rule}-{batch}-{seed}", "batch_size": batch,
                         "lr_rule": rule, "seed": seed, "lr": 0.1}
                for step, at_budget in ((1, False), (4096 // batch, True)):
                    rows.append({**trial, "step": step, "examples_seen": step * batch,
                                 "train_time_s": 1e-3 * step, "train_loss": 0.2,
                                 "val_accuracy": accuracy if at_budget else 0.1,
                                 "val_loss": (1.2 - accuracy) if at_budget else 2.3,
                                 "at_gap_budget": at_budget})
    return pd.DataFrame(rows)
