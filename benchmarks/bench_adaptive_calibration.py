"""Coverage of the adaptive search's interval where it stops: the search's own decision loop
(`adaptive.driver.run_adaptive`: probe, predict, place, refine, stop) on simulated cells.

Only the training is simulated: `run_convergence`, which trains one (batch size, seed) cell, is
replaced by a draw from a known truth. Steps to target S(B) = S_min·(1 + B_crit/B) with
log-normal seed noise σ, rounded up to the evaluation interval; the probe's gradient noise scale
B_simple near the target scattered log-normally about the true B_crit (McCandlish et al.: it
predicts B_crit); each step takes t(B) = 1 ms + 10 µs·B, the line the search prices its next
cell with (in device-seconds). Everything else — the prediction, the placement, the choice of
the next cell, the bootstrap ∪ Fieller interval, the stop rule — is the search's real code. A
setting's figure is how often the stopped search's interval — its claim of 90 %, read at the
level the search reports it at (critical.ADAPTIVE_READ_LEVEL) — holds the true B_crit, with its
exact binomial interval; beside it, the same final trials read at 90 % and 95 %, and the cells
and examples the search spent. Settings: true B_crit 8 to 512 within the allowed 4…1,024, σ 0.05
to 0.45, three seeds or two; 200 searches each.

The futility stop (adaptive/futility.py): after each search a grid of every batch size × every
seed is drawn on the same truth; how often the search stopped as futile where that grid pinned
B_crit to ×2 (a false call) and where it did not, and, replaying the two noisiest settings'
searches with the stop off, what it saved. Three settings' searches are replayed ranking
their next cell per example, as the search did before it priced cells in device-seconds; the
σ 0.2 searches are replayed both ways once more with steps whose fixed cost is 10× larger
(t(B) = 10 ms + 10 µs·B: α/β = 1,000, as on an accelerator at small batches).

Run: `python -m benchmarks.run bench_adaptive_calibration` (BENCH_QUICK=1 for a short look).
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import time
from collections import Counter
from dataclasses import dataclass
from unittest import mock

import numpy as np
import pandas as pd
import pyarrow as pa

from batchscale.adaptive import driver
from batchscale.adaptive.futility import STOP_FUTILE
from batchscale.analysis.critical import ADAPTIVE_READ_LEVEL, bootstrap_critical_batch
from batchscale.config import parse_config
from benchmarks import scaled
from benchmarks.stats import Goal, share_figure

SEARCHES = scaled(200, 12)
WORKERS = 2
"""Processes the searches are spread over (each search is seeded on its own, so the figures do
not depend on how many)."""
COVERAGE_GOAL = Goal(0.85)
S_MIN = 100.0
EVAL_EVERY = 10
OTHER_LEVELS = (0.90, 0.95)
"""Nominal levels at which the stopped search's final trials are also read, beside the level
the search reports (critical.ADAPTIVE_READ_LEVEL): what a plain 90 % reading gives."""
STEP_ALPHA_S, STEP_BETA_S = 1e-3, 1e-5
"""The simulated step time t(B) = α + βB: 1 ms fixed, 10 µs per example (α/β = 100)."""
B_SIMPLE_SCATTER = 0.3
"""Log-normal scatter of B_simple about B_crit at the probe's evaluations near the target."""


@dataclass(frozen=True)
class Setting:
    name: str
    b_crit: float
    sigma: float
    seeds: tuple[int, ...] = (0, 1, 2)
    futile_chance: float | None = 0.10
    """convergence.adaptive_futile_chance of the searches (None: no futility stop)."""
    priced: bool = True
    """Whether the search prices its next cell in device-seconds (what it does) or ranks it per
    example (what it did before; replayed on another setting's draws to compare the two)."""
    alpha_s: float = 1e-3
    """The simulated step's fixed cost: t(B) = alpha_s + STEP_BETA_S·B."""
    draws: int | None = None
    """Which setting's searches (by position) this one replays; None: its own. A setting that
    replays another's with the futility stop off shows what the stop saved, search by search."""


SETTINGS = (Setting("B_crit 8, σ 0.1", 8.0, 0.1), Setting("B_crit 32, σ 0.05", 32.0, 0.05),
            Setting("B_crit 32, σ 0.1", 32.0, 0.1), Setting("B_crit 32, σ 0.2", 32.0, 0.2),
            Setting("B_crit 32, σ 0.1, 2 seeds", 32.0, 0.1, (0, 1)),
            Setting("B_crit 128, σ 0.1", 128.0, 0.1), Setting("B_crit 512, σ 0.1", 512.0, 0.1),
            Setting("B_crit 32, σ 0.3", 32.0, 0.3), Setting("B_crit 32, σ 0.45", 32.0, 0.45),
            Setting("B_crit 512, σ 0.3", 512.0, 0.3),
            Setting("B_crit 32, σ 0.3, no futility stop", 32.0, 0.3, futile_chance=None, draws=7),
            Setting("B_crit 32, σ 0.45, no futility stop", 32.0, 0.45, futile_chance=None,
                    draws=8),
            Setting("B_crit 32, σ 0.1, ranked per example", 32.0, 0.1, priced=False, draws=2),
            Setting("B_crit 128, σ 0.1, ranked per example", 128.0, 0.1, priced=False, draws=5),
            Setting("B_crit 32, σ 0.2, ranked per example", 32.0, 0.2, priced=False, draws=3),
            Setting("B_crit 32, σ 0.2, fixed-cost steps", 32.0, 0.2, alpha_s=1e-2, draws=3),
            Setting("B_crit 32, σ 0.2, fixed-cost steps, ranked per example", 32.0, 0.2,
                    priced=False, alpha_s=1e-2, draws=3))
"""True B_crit inside and near both edges of the allowed batch sizes 4…1,024, seed noise 5 % to
20 % (where the grid of 9 batch sizes × 3 seeds pins B_crit to ×2 most of the time) and 30 % to
45 % (where it mostly cannot: the search should say so early), three seeds or two."""
BATCHES = [2**k for k in range(2, 11)]
TARGET_RATIO = 2.0


def drawn_steps(setting: Setting, batch: int, rng: np.random.Generator) -> int:
    steps = S_MIN * (1 + setting.b_crit / batch) * math.exp(rng.normal(0, setting.sigma))
    return int(math.ceil(steps / EVAL_EVERY) * EVAL_EVERY)


def trial_row(batch: int, seed: int, steps: int, rule: str = "sqrt",
              alpha_s: float = STEP_ALPHA_S) -> dict:
    return {"trial_id": f"b{batch}-s{seed}", "batch_size": batch, "seed": seed, "workers": 1,
            "lr_rule": rule, "lr": 0.1, "status": "reached", "steps_to_target": steps,
            "steps_run": steps, "train_time_s": steps * (alpha_s + STEP_BETA_S * batch),
            "target_metric": "val_accuracy", "target_value": 0.9, "device_name": "simulated"}


def simulated_cell(setting: Setting, rng: np.random.Generator, trials: list[dict]):
    """A stand-in for run_convergence: one trial per call, steps from the truth (each trial's
    row also appended to `trials`)."""

    def run(cfg, batch_sizes, **_):
        (batch,), seed = batch_sizes, cfg.convergence.seeds[0]
        target = cfg.convergence.resolved_targets()[0]
        steps = drawn_steps(setting, batch, rng)
        trial = f"b{batch}-s{seed}"
        row = trial_row(batch, seed, steps, cfg.convergence.lr_rules[0], setting.alpha_s)
        evals = [{"trial_id": trial, "step": s, "val_accuracy": target.value * s / steps,
                  "b_simple": setting.b_crit * math.exp(rng.normal(0, B_SIMPLE_SCATTER))}
                 for s in range(EVAL_EVERY, steps + 1, EVAL_EVERY)]
        trials.append(row)
        return pa.Table.from_pylist(evals), pa.Table.from_pylist([row])

    return run


def one_study(setting: Setting, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    cfg = parse_config({"convergence": {
        "strategy": "adaptive", "lr_rules": ["sqrt"], "seeds": list(setting.seeds),
        "batch_sizes": BATCHES, "target_interval_ratio": TARGET_RATIO,
        "target_val_accuracy": 0.9, "eval_every_steps": EVAL_EVERY,
        "adaptive_futile_chance": setting.futile_chance}})
    trials: list[dict] = []
    pricing = (contextlib.nullcontext() if setting.priced
               else mock.patch.object(driver.Search, "cell_cost", lambda self: None))
    with pricing, \
            mock.patch.object(driver, "run_convergence", simulated_cell(setting, rng, trials)), \
            mock.patch.object(driver, "_environment", lambda search, runs: {}), \
            mock.patch.object(driver, "make_table", lambda kind, rows, env: rows):
        _, _, decisions = driver.run_adaptive(cfg, data_dir="simulated", run_id="sim",
                                              echo=lambda line: None)
    last = decisions[-1]
    low, high = last.get("b_crit_low"), last.get("b_crit_high")
    bounded = low is not None and high is not None and math.isfinite(low) and math.isfinite(high)
    wider = {level: bootstrap_critical_batch(pd.DataFrame(trials), "sqrt",
                                             driver.SEARCH_BOOTSTRAP_SAMPLES,
                                             confidence=level, seeds_needed=True)
             for level in OTHER_LEVELS}
    grid = pd.DataFrame([trial_row(b, s, drawn_steps(setting, b, rng), alpha_s=setting.alpha_s)
                         for b in BATCHES for s in setting.seeds])
    grid_low, grid_high = bootstrap_critical_batch(grid, "sqrt", driver.SEARCH_BOOTSTRAP_SAMPLES)
    return {"covered": bounded and low <= setting.b_crit <= high, "bounded": bounded,
            "futile": last["reason"].startswith(STOP_FUTILE),
            "grid_pins": grid_low > 0 and grid_high / grid_low <= TARGET_RATIO,
            "share_of_grid": last["examples_spent"] / float(
                (grid["steps_to_target"] * grid["batch_size"]).sum()),
            "device_share_of_grid": float(pd.DataFrame(trials)["train_time_s"].sum()
                                          / grid["train_time_s"].sum()),
            **{f"covered_at_{level}": lo <= setting.b_crit <= hi
               for level, (lo, hi) in wider.items()},
            "cells": sum(d["action"] in ("probe", "place", "refine") for d in decisions),
            "examples": last["examples_spent"], "reason": last["reason"]}


def _one(job: tuple[Setting, int]) -> dict:
    return one_study(*job)


def run() -> dict:
    results = {}
    with multiprocessing.get_context("spawn").Pool(WORKERS) as pool:
        for k, setting in enumerate(SETTINGS):
            started = time.perf_counter()
            draws = k if setting.draws is None else setting.draws
            seeds = np.random.SeedSequence([20261204, draws]).generate_state(SEARCHES)
            outcomes = pool.map(_one, [(setting, int(seed)) for seed in seeds])
            results[setting.name] = _figures(outcomes, time.perf_counter() - started)
            print(_line(setting, results[setting.name], len(outcomes)), flush=True)
    return results


def _figures(outcomes: list[dict], wall_s: float) -> dict:
    figures = {"coverage": share_figure(sum(o["covered"] for o in outcomes), len(outcomes),
                                        COVERAGE_GOAL),
               "unbounded": sum(not o["bounded"] for o in outcomes),
               "median_cells": float(np.median([o["cells"] for o in outcomes])),
               "median_examples": float(np.median([o["examples"] for o in outcomes])),
               "wall_s": wall_s,
               **_futility_figures(outcomes)}
    for level in OTHER_LEVELS:
        figures[f"coverage_at_{level}"] = share_figure(
            sum(o[f"covered_at_{level}"] for o in outcomes), len(outcomes), COVERAGE_GOAL)
    return figures


def _share(k: int, n: int):
    return share_figure(k, n) if n else None


def _text(figure) -> str:
    return figure.text() if figure is not None else "no such search"


def _futility_figures(outcomes: list[dict]) -> dict:
    """How often a search stopped as futile where a grid on the same truth pinned B_crit (a
    false call) and where it did not, and the share of that grid's examples a futile stop
    spent. A fresh grid per search: the grid's own draws, not the search's."""
    pins = [o for o in outcomes if o["grid_pins"]]
    cannot = [o for o in outcomes if not o["grid_pins"]]
    futile = [o for o in outcomes if o["futile"]]
    return {"grid_pins": len(pins),
            "futile_where_grid_pins": _share(sum(o["futile"] for o in pins), len(pins)),
            "futile_where_grid_cannot": _share(sum(o["futile"] for o in cannot), len(cannot)),
            "futile_share_of_grid": (float(np.median([o["share_of_grid"] for o in futile]))
                                     if futile else math.nan),
            "share_of_grid": float(np.median([o["share_of_grid"] for o in outcomes])),
            "device_share_of_grid": float(np.median([o["device_share_of_grid"]
                                                     for o in outcomes])),
            "stops": dict(Counter(_stop_kind(o["reason"]) for o in outcomes).most_common())}


def _stop_kind(reason: str) -> str:
    """A stop reason without its figures: futile stops name their own."""
    return "futile (the grid cannot pin it)" if reason.startswith(STOP_FUTILE) else reason


def _line(setting: Setting, figures: dict, n: int) -> str:
    return (f"{setting.name}: stopped interval (read at {ADAPTIVE_READ_LEVEL:.0%}) covers the "
            f"true B_crit {figures['coverage'].text()}; {figures['unbounded']} of {n} stopped "
            f"without a bounded interval; median {figures['median_cells']:.0f} cells, "
            f"{figures['median_examples']:,.0f} examples; the same trials read at "
            + ", ".join(f"{level:.0%}: {figures[f'coverage_at_{level}'].text()}"
                        for level in OTHER_LEVELS)
            + f"; a grid on the same truth pinned B_crit in {figures['grid_pins']} of {n}; "
            f"stopped as futile where it did {_text(figures['futile_where_grid_pins'])}, "
            f"where it did not {_text(figures['futile_where_grid_cannot'])}, at a median "
            f"{figures['futile_share_of_grid']:.2f} of the grid's examples (all searches: "
            f"{figures['share_of_grid']:.2f}, and {figures['device_share_of_grid']:.2f} of its "
            "simulated training device-seconds); stops: "
            + ", ".join(f"{kind} {count}" for kind, count in figures["stops"].items()))
