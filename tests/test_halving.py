"""Successive halving over the tuned rule's learning rates (batchscale/convergence/halving.py):
the rung arithmetic with known answers, and a real group of trials trained in-process (one
rank, no torchrun), interrupted and run again."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from batchscale.config import parse_config
from batchscale.convergence import halving, runner, train
from batchscale.data.prep import prepare
from batchscale.errors import BadInput
from batchscale.metrics import METRICS
from batchscale.schemas import RunStatus

ACCURACY, LOSS = METRICS["val_accuracy"], METRICS["val_loss"]
GRID = [0.002, 0.01, 0.05, 0.2]


def test_survivors_are_the_best_share_and_non_finite_values_rank_last():
    values = {"a": 0.5, "b": 0.9, "c": -math.inf, "d": 0.7}
    assert halving.survivors(values, ACCURACY, 2) == ["b", "d"]
    assert halving.survivors(values, ACCURACY, 3) == ["b", "d"]  # ceil(4/3) = 2
    assert halving.survivors({"a": 0.3, "b": 0.1, "c": math.inf}, LOSS, 2) == ["b", "a"]
    assert halving.survivors({"only": 0.2}, ACCURACY, 2) == ["only"]


def test_the_value_at_a_rung_is_the_first_evaluation_from_that_step():
    curve = [{"step": 0, "val_accuracy": 0.1}, {"step": 5, "val_accuracy": 0.4},
             {"step": 10, "val_accuracy": float("nan")}]
    assert halving.value_at(curve, 3, ACCURACY) == 0.4
    assert halving.value_at(curve, 10, ACCURACY) == -math.inf  # a diverged model ranks last
    assert halving.value_at(curve, 11, ACCURACY) is None  # finished before the rung


def test_tuned_trials_of_one_batch_and_seed_form_a_group():
    cfg = config(tmp=None)
    spec = runner.build_spec(cfg, [16, 64], data_dir="d", out_dir="o", run_id="t")
    groups = halving.trial_groups(spec)
    assert [[t.lr for t in g] for g in groups] == [GRID, GRID]
    assert [{t.batch_size for t in g} for g in groups] == [{16}, {64}]
    plain = runner.build_spec(config(tmp=None, lr_halving_eta=None), [16], data_dir="d",
                              out_dir="o", run_id="t")
    assert [len(g) for g in halving.trial_groups(plain)] == [1, 1, 1, 1]


@pytest.mark.parametrize("change, message", [
    ({"lr_rules": ["sqrt"]}, "lr_halving_eta: successive halving is over lr_candidates"),
    ({"lr_halving_first_rung_steps": 12}, "12 is not a multiple of eval_every_steps 5"),
    ({"lr_halving_eta": 1}, "lr_halving_eta"),
])
def test_halving_settings_that_cannot_work_are_refused(change, message):
    with pytest.raises(BadInput, match=message):
        config(tmp=None, **change)


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits")
    prepare(parse_config({}).dataset, out)
    return out


def config(tmp, **changes):
    convergence = {"lr_rules": ["tuned"], "lr_candidates": GRID, "lr_halving_eta": 2,
                   "lr_halving_first_rung_steps": 10, "target_val_accuracy": 0.9,
                   "max_steps": 300, "eval_every_steps": 5, "checkpoint_every_steps": 10,
                   "seeds": [0], "batch_sizes": [16, 64]}
    return parse_config({"convergence": {**convergence, **changes}})


def run_group(tmp_path: Path, digits_dir: Path) -> dict[str, dict]:
    spec = runner.build_spec(config(tmp_path), [64], data_dir=str(digits_dir),
                             out_dir=str(tmp_path / "out"), run_id="halving")
    train.run_spec(spec)
    curves, runs = runner.collect(spec)
    by_trial = {r["trial_id"]: r for r in runs.to_pylist()}
    for row in curves.to_pylist():
        by_trial[row["trial_id"]].setdefault("curve", []).append(row)
    return by_trial


def test_a_group_halves_at_each_rung_and_replays_the_same_decisions(tmp_path, digits_dir):
    first = run_group(tmp_path, digits_dir)
    status = {tid: r["status"] for tid, r in first.items()}
    pruned = [tid for tid, s in status.items() if s == RunStatus.PRUNED]
    # four learning rates: two pruned at step 10, one more at step 20 (unless it finished)
    assert 2 <= len(pruned) <= 3
    assert sorted(first[tid]["steps_run"] for tid in pruned)[:2] == [10, 10]
    at_10 = {tid: halving.value_at(r["curve"], 10, ACCURACY) for tid, r in first.items()}
    best_two = sorted(at_10, key=at_10.get, reverse=True)[:2]
    assert not set(best_two) & {tid for tid in pruned if first[tid]["steps_run"] == 10}
    assert any(s == RunStatus.REACHED for s in status.values())
    assert all(first[tid]["steps_to_target"] is None for tid in pruned)
    # run again after losing a pruned trial's and the winner's result files: their final
    # checkpoints are read back and every decision comes out the same
    winner = next(tid for tid, s in status.items() if s == RunStatus.REACHED)
    for tid in (pruned[0], winner):
        for name in train.trial_files(tid):
            (tmp_path / "out" / name).unlink()
    again = run_group(tmp_path, digits_dir)
    assert {tid: (r["status"], r["steps_run"]) for tid, r in again.items()} == \
        {tid: (r["status"], r["steps_run"]) for tid, r in first.items()}


def test_the_report_says_what_pruning_saved_with_known_steps():
    import pandas as pd

    from batchscale.analysis.pruning import pruning_text

    def trial(tid, rule, batch, seed, steps, status):
        return {"trial_id": tid, "lr_rule": rule, "batch_size": batch, "seed": seed,
                "steps_run": steps, "status": status}

    runs = pd.DataFrame([
        trial("a", "tuned", 64, 0, 10, "pruned"), trial("b", "tuned", 64, 0, 10, "pruned"),
        trial("c", "tuned", 64, 0, 20, "pruned"), trial("d", "tuned", 64, 0, 60, "reached"),
        trial("e", "sqrt", 16, 0, 300, "pruned"), trial("f", "sqrt", 32, 0, 90, "reached"),
    ])
    text = pruning_text(runs)
    # halving: (60 − 10) + (60 − 10) + (60 − 20) = 140 steps saved at least
    assert text.startswith("4 of 6 trials stopped as pruned after 340 steps in all")
    assert "3 by successive halving over the learning rates, which saved at least ~140 steps" \
        in text
    assert "1 by the adaptive search's bound" in text
    assert pruning_text(runs[runs["status"] != "pruned"]) == ""
