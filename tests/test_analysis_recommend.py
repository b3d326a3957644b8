"""Known-answer tests of B_simple, data-parallel efficiency and the recommendation
(batchscale.analysis.parallel, batchscale.analysis.recommend)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from test_analyze import make_curves, run_row

from batchscale.analysis.parallel import data_parallel_efficiency, final_b_simple
from batchscale.analysis.recommend import recommend


def test_final_b_simple_prefers_runs_then_curves():
    runs = pd.DataFrame([run_row(8, "linear", 0.1, 0, 40, b_simple=33.0)])
    runs = pd.concat([runs, pd.DataFrame([run_row(16, "linear", 0.1, 0, 32)])])
    curves = make_curves(runs)
    final = final_b_simple(runs, curves).set_index("trial_id")["b_simple"]
    assert final["linear-8-0.1-0-1"] == 33.0
    assert final["linear-16-0.1-0-1"] == 10.0 + 32  # the curve's last logged value


def test_data_parallel_efficiency():
    runs = pd.DataFrame(
        [
            run_row(64, "linear", 0.1, 0, 100, workers=1),
            {**run_row(64, "linear", 0.1, 0, 100, workers=2), "train_time_s": 0.1 / 1.5},
        ]
    )
    table = data_parallel_efficiency(runs).set_index("workers")
    assert table.loc[1, "efficiency"] == pytest.approx(1.0)
    assert table.loc[2, "efficiency"] == pytest.approx(0.75)



# --------------------------------------------------------------------------- recommendation


def obvious_table() -> pd.DataFrame:
    """Batch 64 with the linear rule is plainly fastest to the target."""
    cells = [
        ("linear", 16, 400, 0.01),
        ("linear", 64, 120, 0.012),
        ("linear", 256, 110, 0.03),
        ("sqrt", 16, 420, 0.01),
        ("sqrt", 64, 200, 0.012),
        ("sqrt", 256, math.nan, 0.03),
    ]
    table = pd.DataFrame(cells, columns=["lr_rule", "batch_size", "steps_to_target", "step_time_s"])
    return table.assign(time_to_target_s=table["steps_to_target"] * table["step_time_s"])


def test_recommend_picks_the_obvious_answer():
    runs = pd.DataFrame([run_row(64, "linear", 0.1, 0, 120)])
    choice = recommend(obvious_table(), runs, {"linear": 80.0})
    assert (choice.batch_size, choice.lr_rule, choice.workers) == (64, "linear", 1)
    assert "1.44 s" in choice.batch_reason and "≈ 80" in choice.batch_reason
    assert "linear 120, sqrt 200" in choice.lr_rule_reason
    assert "only 1 worker" in choice.workers_reason


@pytest.mark.parametrize(("time_with_two", "expected"), [(0.5, 2), (3.0, 1)])
def test_recommend_more_workers_only_when_faster(time_with_two, expected):
    runs = pd.DataFrame(
        [
            run_row(64, "linear", 0.1, 0, 120, workers=1, time=1.0),
            run_row(64, "linear", 0.1, 0, 120, workers=2, time=time_with_two),
        ]
    )
    assert recommend(obvious_table(), runs).workers == expected


