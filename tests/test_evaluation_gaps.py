"""Steps to target are counted at evaluations (analysis/evaluations.py): where the gap between
evaluations is a large share of a batch size's count, the B_crit interval says so. Known
answers on hand-made runs of S = 40 + 6,400/B."""

from __future__ import annotations

import math

import pandas as pd
from plan_tables import ENV
from test_analyze import run_row

from batchscale.analysis.critical import bootstrap_critical_batch, interval_note
from batchscale.analysis.evaluations import coarse_evaluations
from batchscale.checks import validate_table
from batchscale.schemas import make_table

BATCHES = (16, 64, 256, 1024)


def runs_at(every: int) -> pd.DataFrame:
    """Two seeds per batch size, each count rounded up to an evaluation every `every` steps,
    with the evaluation before it recorded."""
    rows = []
    for batch in BATCHES:
        for seed, noise in enumerate((0.97, 1.04)):
            steps = every * math.ceil(noise * (40 + 6400 / batch) / every)
            rows.append({**run_row(batch, "sqrt", 0.1, seed, steps),
                         "steps_before_target": steps - every})
    return pd.DataFrame(rows)


def test_a_coarse_count_at_the_large_batches_is_said_beside_the_interval():
    runs = runs_at(every=20)  # batch 1,024: 46 steps -> counted at 60, evaluated 20 apart
    note = coarse_evaluations(runs, "sqrt")
    assert note.startswith("steps to target are counted at evaluations: at batch 1,024 the "
                           "runs met the target by step 60 with evaluations 20 steps apart "
                           "(and at 1 more batch size), so up to 33% fewer steps")
    assert "convergence.eval_every_steps" in note
    interval = bootstrap_critical_batch(runs, "sqrt", n=200)
    assert note in interval_note(runs, "sqrt", interval)


def test_the_run_summary_says_it_beside_b_crit():
    """`batchscale run`'s console line for B_crit carries the same note as the report."""
    from batchscale.lake.summary import convergence_lines

    runs = runs_at(every=20)
    cells = [{"lr_rule": "sqrt", "batch_size": b, "steps_to_target": s, "b_crit": 160.0,
              "b_crit_low": 100.0, "b_crit_high": 250.0, "s_min": 40.0, "e_min": 6400.0}
             for b, s in runs.groupby("batch_size")["steps_to_target"].median().items()]
    lines = convergence_lines(make_table("analysis", cells, ENV),
                              make_table("runs", runs.to_dict("records"), ENV))
    assert lines[-1].startswith("  B_crit (sqrt): 160.0 [100.0, 250.0] (S_min 40.0, E_min "
                                "6400); steps to target are counted at evaluations: at batch "
                                "1,024")


def test_fine_evaluations_and_rows_that_do_not_say_add_nothing():
    assert coarse_evaluations(runs_at(every=1), "sqrt") == ""
    assert coarse_evaluations(runs_at(every=20).drop(columns="steps_before_target"),
                              "sqrt") == ""


def test_the_runs_suite_refuses_an_evaluation_before_that_is_not_before():
    good = {**run_row(64, "sqrt", 0.1, 0, 140), "steps_before_target": 130}
    assert validate_table("runs", make_table("runs", [good], ENV)).success
    bad = {**good, "steps_before_target": 140}
    report = validate_table("runs", make_table("runs", [bad], ENV))
    assert not report.success and "steps_before_target" in report.failure_message()
