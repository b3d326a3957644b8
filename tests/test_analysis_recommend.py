"""Known-answer tests of B_simple, data-parallel efficiency and the recommendation
(batchscale.analysis.parallel, batchscale.analysis.recommend)."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from test_analyze import make_curves, run_row

from batchscale.analysis.parallel import data_parallel_efficiency, final_b_simple
from batchscale.analysis.recommend import recommend
from batchscale.analysis.timetotarget import open_reason


def test_final_b_simple_reads_the_runs_and_the_curves_only_where_the_runs_record_none():
    runs = pd.DataFrame([run_row(8, "linear", 0.1, 0, 40, b_simple=33.0)])
    runs = pd.concat([runs, pd.DataFrame([run_row(16, "linear", 0.1, 0, 32)])])
    curves = make_curves(runs)
    final = final_b_simple(runs, curves).set_index("trial_id")["b_simple"]
    assert final["linear-8-0.1-0-1"] == 33.0
    # its final estimate failed: an earlier curve value is not taken in its place, so the
    # pipeline (with curves) and `batchscale analyze` (without) agree
    assert "linear-16-0.1-0-1" not in final
    assert final_b_simple(runs, pd.DataFrame()).set_index("trial_id")["b_simple"].to_dict() \
        == final.to_dict()
    # every final estimate failed: still none is taken from the curves
    assert final_b_simple(runs.assign(b_simple=math.nan), curves).empty
    elsewhere = runs.drop(columns="b_simple")  # a table without the column: the curves say it
    final = final_b_simple(elsewhere, curves).set_index("trial_id")["b_simple"]
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
    choice = recommend(obvious_table(), runs, {"linear": (80.0, math.nan, math.nan)})
    assert (choice.batch_size, choice.lr_rule, choice.workers) == (64, "linear", 1)
    assert "1.44 s" in choice.batch_reason and "≈ 80" in choice.batch_reason
    assert "linear 120, sqrt 200" in choice.lr_rule_reason
    assert "only 1 worker" in choice.workers_reason
    assert choice.learning_rate == 0.1
    assert choice.learning_rate_reason == "what the linear rule gave at batch 64 in 1 reached run"


def test_the_learning_rate_comes_with_the_runs_warm_up():
    """The card's learning rate says how the runs reached it (convergence.warmup_steps); runs
    of batchscale's trainer whose warm-up is not given say it is not recorded; a table from
    elsewhere (no optimizer: not batchscale's schedule) says nothing of one."""
    runs = pd.DataFrame([run_row(64, "linear", 0.1, 0, 120), run_row(64, "linear", 0.1, 1, 124)])
    runs["optimizer"] = "sgd"  # batchscale's trainer ran them (see the last test)
    warmed = recommend(obvious_table(), runs, warmup_steps=20).learning_rate_reason
    assert warmed.endswith("reached by a linear warm-up over the first 20 steps, as the runs "
                           "had (convergence.warmup_steps)")
    none = recommend(obvious_table(), runs, warmup_steps=0).learning_rate_reason
    assert "with no warm-up" in none
    assert recommend(obvious_table(), runs).learning_rate_reason.endswith(
        "with the warm-up the runs had, which the runs table does not record "
        "(convergence.warmup_steps: give the config they ran with)")
    elsewhere = runs.drop(columns="optimizer")
    assert "warm-up" not in recommend(obvious_table(), elsewhere, warmup_steps=20
                                      ).learning_rate_reason


def test_the_learning_rate_is_the_one_the_chosen_cell_ran_with():
    """A rule's LR at the chosen batch, not its base LR; the grid's best LR there; none where
    the runs record none (a table a user brought without an lr column)."""
    runs = pd.DataFrame([run_row(16, "linear", 0.025, 0, 400), run_row(64, "linear", 0.1, 0, 120),
                         run_row(64, "linear", 0.1, 1, 124),
                         run_row(64, "linear", 0.1, 2, 500, status="not_reached")])
    choice = recommend(obvious_table(), runs)
    assert (choice.learning_rate, choice.learning_rate_reason) == (
        0.1, "what the linear rule gave at batch 64 in all 2 reached runs")
    grid = obvious_table().assign(lr_rule="tuned").drop_duplicates("batch_size")
    tried = pd.DataFrame([run_row(64, "tuned", lr, 0, steps)
                          for lr, steps in ((0.05, 150), (0.2, 120), (0.8, 300))])
    choice = recommend(grid, tried)
    assert choice.learning_rate == 0.2 and "among 3 tried" in choice.learning_rate_reason
    one = recommend(grid, tried[tried["lr"] == 0.2])
    assert one.learning_rate_reason == ("the one learning rate the runs at batch 64 used (none "
                                        "other was tried there)")
    no_lr = recommend(obvious_table(), runs.drop(columns="lr"))
    assert no_lr.learning_rate is None
    assert no_lr.learning_rate_reason == "the runs do not record their learning rate"


def test_runs_without_step_times_are_told_what_a_batch_choice_needs():
    """Steps to target alone (a CSV without a sweep or times): no batch is chosen, and the
    reason says the runs did reach it and what to add, instead of reading as a failure."""
    runs = pd.DataFrame([run_row(16, "linear", 0.1, 0, 400), run_row(64, "linear", 0.1, 0, 120)])
    untimed = obvious_table().assign(time_to_target_s=math.nan)
    choice = recommend(untimed, runs)
    assert choice.batch_size is None
    assert choice.batch_reason == (
        "2 runs reached the target (fewest steps: 120 at batch 64), but choosing a batch size "
        "needs the time per step: give a sweep table (`--sweep FILE`) or a time_to_target_s or "
        "train_time_s column with the runs")
    assert choice.learning_rate is None
    assert choice.learning_rate_reason.startswith("it goes with the batch size")  # not blank


@pytest.mark.parametrize(("time_with_two", "expected"), [(0.5, 2), (3.0, 1)])
def test_recommend_more_workers_only_when_faster(time_with_two, expected):
    runs = pd.DataFrame(
        [
            run_row(64, "linear", 0.1, 0, 120, workers=1, time=1.0),
            run_row(64, "linear", 0.1, 0, 120, workers=2, time=time_with_two),
        ]
    )
    assert recommend(obvious_table(), runs).workers == expected




# --------------------------------------------------------------------------- the worker sentence


def two_worker_runs(one: float, two: float) -> pd.DataFrame:
    """Batch 64, linear rule (the obvious table's choice), with 1 and with 2 workers."""
    return pd.DataFrame(
        [
            run_row(64, "linear", 0.1, seed, 120, workers=workers, time=time * (1 + 0.01 * seed))
            for workers, time in ((1, one), (2, two))
            for seed in (0, 1, 2)
        ]
    )


def test_the_worker_reason_states_both_times_and_why_more_workers_won():
    choice = recommend(obvious_table(), two_worker_runs(0.086, 0.055))
    assert choice.workers == 2
    reason = choice.workers_reason
    assert reason.startswith("at batch 64 (linear): 1 worker: 0.0869 s [0.086, 0.0877] over 3 "
                             "seeds to target;")
    assert "2 workers: 0.0556 s [0.055, 0.0561] over 3 seeds to target" in reason
    assert "2 workers reached the target 1.56× sooner than 1, for 2× the workers" in reason
    assert "(78% data-parallel efficiency)" in reason


def test_an_efficiency_beyond_physics_recommends_no_worker_count():
    """2 workers 4.3× sooner than 1 (432 % efficiency, seen on a busy machine): the figure is
    named not physical and no worker count comes from it; up to 120 % still counts."""
    choice = recommend(obvious_table(), two_worker_runs(0.2376, 0.0275))
    assert choice.workers is None
    assert "a data-parallel efficiency of 432%: not physical (above 120%" in choice.workers_reason
    assert "no worker count is recommended from it" in choice.workers_reason
    faster = recommend(obvious_table(), two_worker_runs(0.125, 0.055))  # 114 %: still counts
    assert faster.workers == 2
    assert ("(114% data-parallel efficiency — NOT TRUSTED as an efficiency: above the ideal "
            "100%") in faster.workers_reason


def test_the_worker_reason_states_both_times_when_one_worker_wins():
    choice = recommend(obvious_table(), two_worker_runs(0.055, 0.086))
    assert choice.workers == 1
    assert choice.workers_reason == (
        "at batch 64 (linear): 1 worker: 0.0556 s [0.055, 0.0561] over 3 seeds to target; 2 "
        "workers: 0.0869 s [0.086, 0.0877] over 3 seeds to target (medians of the trials' "
        "measured times, with their range over seeds) — more workers did not reach the target"
        " sooner than 1"
    )


def test_the_worker_reason_names_each_cell_when_the_choice_was_not_run_with_both():
    runs = pd.DataFrame(
        [
            run_row(64, "linear", 0.1, 0, 120, workers=1, time=0.086),
            run_row(256, "linear", 0.1, 0, 110, workers=2, time=0.055),
        ]
    )
    choice = recommend(obvious_table(), runs)
    assert choice.workers == 2
    assert "1 worker: 0.086 s (one seed) to target (linear, batch 64)" in choice.workers_reason
    assert "2 workers: 0.055 s (one seed) to target (linear, batch 256)" in \
        choice.workers_reason
    # a speed-up between different cells is no data-parallel efficiency, and is not called one
    assert "no cell ran with both, so no data-parallel efficiency is given" in \
        choice.workers_reason
    assert "% data-parallel efficiency" not in choice.workers_reason


def test_workers_are_compared_where_both_ran_and_a_half_failing_cell_does_not_count():
    """The recommended cell ran with one worker only; batch 256 ran with both. At linear 256 one
    seed of two missed the target (so, as for S(B), the cell did not reach it: the seed that
    did is not a time to quote); sqrt 256 is compared. Figures from a real `make local-run`."""
    trials = [  # (rule, workers, seed, time to target or None)
        ("linear", 1, 0, None), ("linear", 1, 1, 0.0412), ("linear", 2, 0, None),
        ("linear", 2, 1, 0.1106), ("sqrt", 1, 0, 0.0653), ("sqrt", 1, 1, 0.0508),
        ("sqrt", 2, 0, 0.1961), ("sqrt", 2, 1, 0.1365),
    ]
    runs = pd.DataFrame(
        [run_row(256, rule, 0.1, seed, 60, workers=workers, time=time,
                 status="reached" if time else "not_reached")
         for rule, workers, seed, time in trials]
        + [run_row(64, "linear", 0.1, 0, 120, workers=1, time=0.07)]
    )
    choice = recommend(obvious_table(), runs)
    assert choice.workers == 1
    assert choice.workers_reason == (
        "at batch 256 (sqrt), the cell run with one worker and more (the recommended batch 64 "
        "(linear) ran with one only): 1 worker: 0.058 s [0.0508, 0.0653] over 2 seeds to "
        "target; 2 "
        "workers: 0.166 s [0.137, 0.196] over 2 seeds to target (medians of the trials' "
        "measured times, with their range over seeds) — more workers did not reach the target"
        " sooner than 1"
    )


def test_the_model_optimum_is_quoted_with_its_interval_or_why_it_is_open():
    runs = pd.DataFrame([run_row(64, "linear", 0.1, 0, 120)])
    with_interval = recommend(obvious_table(), runs, {"linear": (80.0, 60.0, 110.0)})
    assert "sqrt(α·B_crit/β) is ≈ 80 [60, 110] (90%)" in with_interval.batch_reason
    open_ended = recommend(obvious_table(), runs, {"linear": (80.0, 60.0, math.inf)})
    assert "≈ 80 (interval open" in open_ended.batch_reason
    why = open_reason(20.0, math.inf)
    said = recommend(obvious_table(), runs, {"linear": (80.0, 60.0, math.inf, math.inf, "",
                                                        why)})
    assert "≈ 80 (interval open: B_crit's interval is unbounded)" in said.batch_reason
    assert open_reason(0.0, 40.0) == why
    assert open_reason(20.0, 40.0).startswith("the step-time line through two batch sizes")


def test_the_warm_up_is_said_only_where_batchscale_ran_the_schedule():
    """A Workload's trials record the optimizer batchscale built, and had the config's warm-up;
    a TrainingLoop's record none (a Hugging Face Trainer decays its LR linearly from the start):
    the card names no warm-up it cannot see."""
    runs = two_worker_runs(0.086, 0.055)
    ours = recommend(obvious_table(), runs.assign(optimizer="sgd"), warmup_steps=20)
    assert "reached by a linear warm-up over the first 20 steps" in ours.learning_rate_reason
    loops = recommend(obvious_table(), runs.assign(optimizer=None), warmup_steps=20)
    assert "warm-up" not in loops.learning_rate_reason
    assert loops.learning_rate == ours.learning_rate


def test_the_rule_line_says_when_the_seeds_cannot_tell_the_rules_apart():
    """Medians 75 against 100 read as a clear win until the seeds are shown: 60 and 90 against
    90 and 110 overlap, and the line says so."""
    from batchscale.analysis.recommend import fewest_steps_reason

    runs = pd.DataFrame([run_row(128, "linear", 0.2, 0, 60), run_row(128, "linear", 0.2, 1, 90),
                         run_row(128, "sqrt", 0.1, 0, 110), run_row(128, "sqrt", 0.1, 1, 90)])
    at_batch = pd.DataFrame({"lr_rule": ["linear", "sqrt"], "steps_to_target": [75.0, 100.0]})
    assert fewest_steps_reason(runs, at_batch, "linear", 128, 1) == (
        "fewest steps to target at batch 128 (linear 75 [60, 90], sqrt 100 [90, 110]); sqrt "
        "within its range: the seeds cannot tell the rules apart at this batch")
    apart = runs.assign(steps_to_target=[60, 70, 110, 100])
    assert fewest_steps_reason(apart, at_batch, "linear", 128, 1) == (
        "fewest steps to target at batch 128 (linear 75 [60, 70], sqrt 100 [100, 110])")


def test_the_fastest_time_carries_its_seeds_measured_spread():
    from batchscale.analysis.expected import Spread
    from batchscale.analysis.recommend import fastest_text

    best = pd.Series({"time_to_target_s": 0.054, "steps_to_target": 72.5,
                      "step_time_s": 7.2e-4, "step_time_source": "convergence"})
    text = fastest_text(best, Spread(0.054, 0.0435, 0.0643, 2, on_table=True))
    assert text.startswith("fastest time to target: 0.054 s [0.0435, 0.0643] over 2 seeds "
                           "(72.5 steps × 0.72 ms per step")
    assert text.endswith("; the band is its seeds' measured times to target, as shares of their "
                         "median)")
    assert "band" not in fastest_text(best, Spread(0.054, 0.054, 0.054, 1, on_table=True))
    # seeds timed on another basis (more workers than the table's step time): their own
    # clocks, said as such, never as the figure's band
    text = fastest_text(best, Spread(1.12, 1.08, 1.17, 2))
    assert text.startswith("fastest time to target: 0.054 s (72.5 steps")
    assert text.endswith("; its 2 seeds took 1.08–1.17 s)")


def test_a_fastest_batch_at_an_end_of_those_trained_says_to_look_past_it():
    """A user's GRU: batch 128, the largest trained, was fastest and nothing said to try larger;
    likewise the smallest. Past the largest that fits there is nothing to add."""
    from batchscale.analysis.recommend import edge_of_grid_text

    timed = pd.DataFrame({"batch_size": [8, 32, 128, 8, 32, 128]})
    assert edge_of_grid_text(128, timed, math.inf) == (
        "; 128 is the largest batch trained, so a larger one may be faster still: add larger "
        "sizes to convergence.batch_sizes to find where the time turns")
    assert edge_of_grid_text(128, timed, 512.0).endswith(
        "add larger sizes to convergence.batch_sizes (up to 512, the largest one device was "
        "measured to hold) to find where the time turns")
    assert edge_of_grid_text(128, timed, 128.0) == ""  # the memory wall: accumulation's line
    assert edge_of_grid_text(8, timed, math.inf).startswith(
        "; 8 is the smallest batch trained, so a smaller one may be faster still")
    assert edge_of_grid_text(32, timed, math.inf) == ""
    # A published table: fastest at 1024, the largest, but B* ≈ 495 [420, 585] lies below it.
    from batchscale.analysis.timetotarget import BStar

    wide = pd.DataFrame({"batch_size": [16, 64, 256, 1024]})
    text = edge_of_grid_text(1024, wide, math.inf, BStar(495.0, 420.0, 585.0))
    assert ("so a larger one may be faster still, though the model optimum's interval [420, "
            "585] lies wholly below it: the measured times and the step-time model disagree "
            "here") in text
    assert "disagree" not in edge_of_grid_text(1024, wide, math.inf, BStar(900.0, 700.0, 1500.0))
    assert "lies wholly above it" in edge_of_grid_text(16, wide, math.inf,
                                                       BStar(60.0, 40.0, 90.0))
