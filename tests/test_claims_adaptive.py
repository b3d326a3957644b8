"""The adaptive search's report section checked against the search it describes, over a corpus of
searches run by the search's own decision loop (`adaptive.driver.run_adaptive`) on simulated cells:
true B_crit at both edges of the allowed batch sizes and between, seed noise from 5 % to 50 %,
probes with and without a gradient noise scale, and a search whose every trial misses the target.
Only the training is simulated (`run_convergence` is replaced by a draw from a known curve); the
decisions, the runs and the sentences are the real code's. The checks are claims: the B_crit,
interval and high/low ratio quoted are the last decision's (read at the level a stopped search
needs, and said so), "narrow enough" only when the interval it narrowed was, the interval holds
its centre, the
batch sizes named are the ones probed and placed, the examples and device-seconds are what the
trials trained, the share of the grid is spent ÷ the grid's estimate, and no value is unfilled.
"""

from __future__ import annotations

import math
import re
from unittest import mock

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from test_claims import UNFILLED

from batchscale.adaptive import driver
from batchscale.adaptive.section import adaptive_section, grid_examples_estimate
from batchscale.config import parse_config

S_MIN = 100.0
EVAL_EVERY = 10
BATCHES = [2**k for k in range(2, 11)]
SEEDS = [0, 1, 2]
RANGE_FACTOR = 2.0  # analysis.b_crit_range_factor's default
CASES = {  # name: (true B_crit, seed noise σ, B_simple recorded, trials reach the target)
    "b_crit_8": (8.0, 0.1, True, True),
    "b_crit_32": (32.0, 0.1, True, True),
    "b_crit_128": (128.0, 0.1, True, True),
    "b_crit_512": (512.0, 0.1, True, True),
    "b_crit_4096_beyond": (4096.0, 0.1, True, True),
    "quiet": (32.0, 0.05, True, True),
    "noisy": (32.0, 0.2, True, True),
    "scattered": (64.0, 0.5, True, True),
    "no_noise_scale": (32.0, 0.1, False, True),
    "no_noise_scale_noisy": (128.0, 0.2, False, True),
    "never_reached": (32.0, 0.1, True, False),
    "never_reached_no_scale": (32.0, 0.1, False, False),
}


def simulated_cell(b_crit: float, sigma: float, noise_scale: bool, reaches: bool,
                   rng: np.random.Generator):
    """A stand-in for run_convergence: one trial per call on S(B) = S_min·(1 + B_crit/B)."""

    def run(cfg, batch_sizes, prune_at_step=None, **_):
        (batch,), seed = batch_sizes, cfg.convergence.seeds[0]
        target = cfg.convergence.resolved_targets()[0]
        steps = S_MIN * (1 + b_crit / batch) * math.exp(rng.normal(0, sigma))
        steps = int(math.ceil(steps / EVAL_EVERY) * EVAL_EVERY)
        ran = steps if reaches else cfg.convergence.max_steps
        status = "reached" if reaches else "not_reached"
        if prune_at_step is not None and ran > prune_at_step:
            ran, status = prune_at_step, "pruned"
        trial = f"b{batch}-s{seed}"
        row = {"trial_id": trial, "batch_size": batch, "seed": seed, "workers": 1,
               "lr_rule": cfg.convergence.lr_rules[0], "lr": 0.1, "status": status,
               "steps_to_target": steps if status == "reached" else None, "steps_run": ran,
               "train_time_s": ran * (1e-3 + 1e-5 * batch), "target_metric": target.metric,
               "target_value": target.value, "device_name": "simulated"}
        evals = [{"trial_id": trial, "step": s, "val_accuracy": target.value * s / steps,
                  "b_simple": b_crit * math.exp(rng.normal(0, 0.3)) if noise_scale else None}
                 for s in range(EVAL_EVERY, ran + 1, EVAL_EVERY)]
        return pa.Table.from_pylist(evals), pa.Table.from_pylist([row])

    return run


def simulated_search(name: str) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(decisions, runs, the terminal's lines) of one search on the case's simulated cells."""
    cfg = parse_config({"convergence": {
        "strategy": "adaptive", "lr_rules": ["sqrt"], "seeds": SEEDS, "batch_sizes": BATCHES,
        "target_interval_ratio": 2.0, "target_val_accuracy": 0.9, "max_steps": 2000,
        "eval_every_steps": EVAL_EVERY}})
    rng = np.random.default_rng(sum(map(ord, name)))
    lines: list[str] = []
    with mock.patch.object(driver, "run_convergence", simulated_cell(*CASES[name], rng)), \
            mock.patch.object(driver, "_environment", lambda search, runs: {}), \
            mock.patch.object(driver, "make_table", lambda kind, rows, env: rows):
        _, runs, decisions = driver.run_adaptive(cfg, data_dir="simulated", run_id="sim",
                                                 echo=lines.append)
    return pd.DataFrame(decisions), runs.to_pandas(), lines


def three_digits(value: float) -> str:
    return f"{value:.3g}"


@pytest.mark.parametrize("name", list(CASES))
def test_every_search_claim_agrees_with_its_decisions(name):
    decisions, runs, lines = simulated_search(name)
    section = adaptive_section(decisions, runs, BATCHES, len(SEEDS))
    text = " ".join(section.sentences)
    last = decisions.iloc[-1]

    for printed in [text, *lines, *(str(v) for row in section.rows for v in row.values())]:
        assert not UNFILLED.search(printed), f"{UNFILLED.search(printed).group(0)}: {printed}"
    assert len(section.rows) == len(decisions)

    stopped = re.search(r"with B_crit ([\d.e+]+), 90 % interval ([\d.e+]+)–([\d.e+]+) "
                        r"\(high/low ([\d.]+)\), after (\d+) decisions", text)
    if math.isfinite(last["b_crit_low"] if last["b_crit_low"] is not None else math.nan):
        assert stopped, text
        centre, low, high = (float(v) for v in stopped.groups()[:3])
        assert stopped.group(1) == three_digits(last["b_crit"]), text
        assert (stopped.group(2), stopped.group(3)) == (three_digits(last["b_crit_low"]),
                                                       three_digits(last["b_crit_high"])), text
        assert low <= centre <= high, text
        assert float(stopped.group(4)) == pytest.approx(
            last["b_crit_high"] / last["b_crit_low"], abs=0.006), text
        assert int(stopped.group(5)) == int(last["decision"]), text
        reached = runs[runs["status"] == "reached"]["batch_size"]
        cut = low <= reached.min() / RANGE_FACTOR or high >= reached.max() * RANGE_FACTOR
        assert ("is cut at" in text) == cut, text  # a cut interval is said to be a bound
        if cut:
            assert "interval narrow enough" not in text, text
        assert "read at the 98% level" in text, text  # the level its claim of 90 % needs
        if "narrow enough at 90 %" in text:  # the interval it narrowed, one decision earlier
            before = decisions.iloc[-2]
            assert before["interval_ratio"] <= 2.0 + 1e-9, (before.to_dict(), text)
    else:
        assert not stopped and "without a B_crit interval" in text, text

    b_star = re.search(r"is ([\d.e+]+), interval ([\d.e+]+)–([\d.e+]+)", text)
    if b_star:
        value, low, high = (float(v) for v in b_star.groups())
        assert low <= value <= high, text

    placed = decisions[decisions["action"].isin(("probe", "place"))]["batch_size"].dropna()
    named = re.search(r"Probed and placed batch sizes: ([\d, ]+)\.", text)
    assert sorted(int(b.replace(",", "")) for b in named.group(1).split(", ")) == \
        sorted(set(int(b) for b in placed)), text

    trials = runs.drop_duplicates("trial_id")
    examples = int((trials["steps_run"] * trials["batch_size"]).sum())
    assert f"It trained on {examples:,} examples" in text, text
    device_s = float((trials["train_time_s"] * trials["workers"]).sum())
    assert f", {device_s:,.1f} device-seconds of training" in text, text
    held_s = float(decisions["device_s_held"].max())
    held = re.search(r"held devices for ([\d,.]+) device-seconds in all \(([^)]*)\)", text)
    assert (held is not None) == (held_s > 0), text
    if held:  # the held time is the last decision's, and a share only where it can be one
        assert held.group(1) == f"{held_s:,.1f}", text
        outside = re.search(r"(\d+)% of it outside training", held.group(2))
        assert (outside is not None) == (held_s >= device_s), text
        if outside:
            assert int(outside.group(1)) == round(100 * (1 - device_s / held_s)), text

    share = re.search(r"so the search spent (\d+)% \(([^)]*)\) of its examples", text)
    grid = grid_examples_estimate(decisions, runs, BATCHES, len(SEEDS))
    if share:
        assert int(share.group(1)) == round(100 * examples / grid.value), text
        if math.isfinite(grid.low):  # the share's interval is the grid estimate's, inverted
            assert share.group(2) == (f"{examples / grid.high:.0%}–"
                                      f"{examples / grid.low:.0%}"), text
            assert grid.low < grid.value < grid.high
    else:
        assert not math.isfinite(grid.value) and "cannot be estimated" in text, text

    predicted = re.search(r"predicted B_crit ≈ ([\d.e+]+) \(interquartile range ([\d.e+]+)–"
                          r"([\d.e+]+)\)", text)
    if predicted:
        centre, low, high = (float(v) for v in predicted.groups())
        assert low <= centre <= high, text
    noise_scale = CASES[name][2]
    assert bool(predicted) == noise_scale or "gave no prediction" in text, text


def test_the_corpus_reaches_both_kinds_of_ending():
    """The corpus holds searches that stop with an interval and searches that stop without."""
    endings = {name: simulated_search(name)[0].iloc[-1]["b_crit_low"] is not None
               for name in ("b_crit_32", "never_reached")}
    assert endings == {"b_crit_32": True, "never_reached": False}
