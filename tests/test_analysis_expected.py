"""What the recommendation promises (analysis/expected.py): steps and time to target at the
recommended cell with the spread over seeds, and the saving against today's batch size and
learning rate. Known answers on hand-made tables."""

from __future__ import annotations

import pandas as pd
import pytest
from test_analysis_recommend import obvious_table
from test_analyze import run_row

from batchscale.analysis.analyze import analyze
from batchscale.analysis.expected import (
    as_fast,
    as_fast_text,
    expected_text,
    steps_spread,
    versus_current,
)
from batchscale.analysis.narrative import recommendation_list
from batchscale.analysis.recommend import recommend
from batchscale.config import AnalysisConfig


def seeds(batch: int, rule: str, lr: float, steps: list[int], step_time: float = 1e-3
          ) -> list[dict]:
    return [run_row(batch, rule, lr, seed, s, step_time=step_time)
            for seed, s in enumerate(steps)]


# The runs' measured times to target use obvious_table's step times (12 ms at 64, 10 ms at 16).
RUNS = pd.DataFrame(seeds(64, "linear", 0.2, [110, 120, 130], 0.012)
                    + seeds(16, "linear", 0.05, [380, 400, 440], 0.01))


def test_the_spread_is_the_range_over_the_reached_seeds():
    spread = steps_spread(RUNS, "linear", 64)
    assert (spread.median, spread.low, spread.high, spread.seeds) == (120, 110, 130, 3)
    assert steps_spread(RUNS, "sqrt", 64) is None


def test_expected_quotes_steps_and_training_time_with_their_spread():
    text = expected_text(RUNS, obvious_table(), "linear", 64)
    # obvious_table's step time at (linear, 64) is 12 ms.
    assert text == ("120 steps [110, 130] over 3 seeds; 1.44 s of training [1.32, 1.56] over "
                    "3 seeds")


def test_one_seed_says_there_is_no_spread_instead_of_inventing_one():
    runs = pd.DataFrame([run_row(64, "linear", 0.2, 0, 120)])
    assert "120 steps (one seed: no spread)" in expected_text(runs, obvious_table(), "linear", 64)


def test_the_saving_against_today_takes_its_band_from_both_ranges():
    text = versus_current(RUNS, obvious_table(), "linear", 64, 16)
    # steps 120/400 = 0.30, band 110/440 .. 130/380; time 1.44/4.0 = 0.36, band 1.32/4.4 .. 1.56/3.8
    assert text == ("at your batch 16 (400 steps [380, 440] over 3 seeds), the recommendation "
                    "needs 0.30× [0.25, 0.34] the steps and 0.36× [0.30, 0.41] the training time")


def test_the_saving_says_when_the_runs_at_your_batch_trained_at_another_learning_rate():
    """A user training batch 16 at 0.1: the linear rule's trials there ran at 0.05, so the
    saving is against the rule's rate, and the line says so; at their own rate, nothing."""
    text = versus_current(RUNS, obvious_table(), "linear", 64, 16, current_lr=0.1)
    assert text.startswith("at your batch 16 (400 steps [380, 440] over 3 seeds, trained at "
                           "learning rate 0.05 by the linear rule, not your 0.1: the saving "
                           "is against the rule's rate at your batch), the recommendation")
    same = versus_current(RUNS, obvious_table(), "linear", 64, 16, current_lr=0.05)
    assert "trained at learning rate" not in same


@pytest.mark.parametrize(("current", "expected"), [
    (None, "give the batch size you train with today"),
    (64, "you already train at batch 64: keep it"),
    (48, "your batch 48 was not trained (the trials ran at batch 16, 64): to quote a saving, "
         "train it beside them (in convergence.batch_sizes with strategy grid; an adaptive "
         "search trains only the batches it chooses among them)"),
])
def test_without_a_measured_current_batch_it_says_what_to_give(current, expected):
    assert expected in versus_current(RUNS, obvious_table(), "linear", 64, current)


def test_a_current_batch_trained_without_reaching_the_target_is_not_told_to_be_added():
    failed = pd.concat([RUNS[RUNS["batch_size"] == 64],
                        RUNS[RUNS["batch_size"] == 16].assign(status="not_reached",
                                                              steps_to_target=float("nan"))])
    text = versus_current(failed, obvious_table(), "linear", 64, 16)
    assert text == ("your batch 16 did not reach the target with the linear rule (the trials ran "
                    "at batch 16, 64), so there is no saving to quote against it")


def test_the_recommendation_lists_the_outcome_and_the_learning_rate_against_today():
    choice = recommend(obvious_table(), RUNS, current=(16, 0.05))
    listed = recommendation_list(choice)
    assert "- **Learning rate: 0.2** — " in listed and "; 4× your current 0.05." in listed
    assert "- **Expected to target:** 120 steps [110, 130] over 3 seeds" in listed
    assert "- **Against today:** at your batch 16" in listed


def test_the_config_fields_reach_the_recommendation_through_the_analysis():
    settings = AnalysisConfig(current_batch_size=16, current_lr=0.05)
    result = analyze(None, RUNS, None, settings)
    recommendation = result.summary.recommendation
    assert recommendation.batch_size == 64
    assert recommendation.versus_current.startswith("at your batch 16")
    assert "Against today" in result.markdown


def test_a_batch_beyond_the_memory_wall_comes_with_its_accumulation_steps():
    choice = recommend(obvious_table(), RUNS, largest_fitting=24.0)
    assert choice.batch_size == 64
    assert choice.batch_reason.endswith(
        "; each device holds at most batch 24 (the sweep's memory wall): run it as 3 "
        "accumulation steps of 22 (convergence.accumulation_steps)")
    assert "accumulation" not in recommend(obvious_table(), RUNS).batch_reason  # no wall known
    assert "accumulation" not in recommend(obvious_table(), RUNS,
                                           largest_fitting=64.0).batch_reason  # it fits


def test_a_flagged_step_time_marks_the_expected_training_time_not_trusted():
    table = obvious_table().assign(timing_flag=None)
    table.loc[(table["lr_rule"] == "linear") & (table["batch_size"] == 64), "timing_flag"] = (
        "convergence trials waited for a CPU 40% of the time")
    expected = expected_text(RUNS, table, "linear", 64)
    assert expected.endswith("over 3 seeds (step time NOT TRUSTED: convergence trials waited "
                             "for a CPU 40% of the time)")
    against = versus_current(RUNS, table, "linear", 64, 16)
    assert "the training time (step time NOT TRUSTED" in against
    assert "NOT TRUSTED" not in expected_text(RUNS, obvious_table(), "linear", 64)


def test_cells_whose_seeds_overlap_the_fastest_are_named_as_just_as_fast():
    # times: batch 64 1.32-1.56 s; batch 32 1.40-1.50 s (overlaps); batch 16 3.8-4.4 s (not)
    runs = pd.DataFrame(seeds(64, "linear", 0.2, [110, 120, 130], 0.012)
                        + seeds(32, "linear", 0.1, [140, 150], 0.01)
                        + seeds(16, "linear", 0.05, [380, 400, 440], 0.01))
    cells = pd.DataFrame({"lr_rule": ["linear"] * 3, "batch_size": [64, 32, 16]})
    found = as_fast(runs, cells, "linear", 64)
    assert [(b, r) for b, r, _ in found] == [(32, "linear")]
    assert as_fast_text(found, rules=1) == (
        "; as fast within the seeds' spread: batch 32 (1.45 s [1.4, 1.5] over 2 seeds)")
    assert "batch 32 linear (" in as_fast_text(found, rules=2)
    # with the results table's times, each cell's band sits around the table's figure (the
    # basis the batch was chosen on): batch 32's 1.40-1.50 s around 1.6 s
    timed = cells.assign(time_to_target_s=[1.5, 1.6, 4.0])
    [(_, _, band)] = as_fast(runs, timed, "linear", 64)
    assert (band.median, band.low, band.high) == pytest.approx((1.6, 1.6 * 1.4 / 1.45,
                                                                1.6 * 1.5 / 1.45))
    # one seed has no spread to compare: nothing is claimed either way
    one = pd.DataFrame(seeds(64, "linear", 0.2, [120], 0.012) + seeds(32, "linear", 0.1, [140]))
    assert as_fast(one, cells, "linear", 64) == [] and as_fast_text([], rules=1) == ""


# ------------------------------------------------------- counts taken at evaluations


def at_evaluations(rows: list[dict], every: int) -> pd.DataFrame:
    """The rows as a trainer evaluating every `every` steps records them: the evaluation
    before the one that met the target is `every` steps earlier."""
    return pd.DataFrame([{**r, "steps_before_target": r["steps_to_target"] - every}
                         for r in rows])


def test_seeds_that_tie_at_an_evaluation_show_the_gap_they_were_counted_over():
    runs = at_evaluations(seeds(128, "sqrt", 0.1, [190, 190]), every=10)
    spread = steps_spread(runs, "sqrt", 128)
    assert (spread.median, spread.low, spread.high, spread.evaluation_gap) == (190, 181, 190, 10)
    assert spread.text(" steps") == (
        "190 steps [181, 190] over 2 seeds (read at evaluations 10 steps apart: the range "
        "includes the gap)")
    runs.loc[1, "steps_before_target"] = 185  # an extra evaluation, as at a gap budget
    assert "(read at evaluations up to 10 steps apart" in steps_spread(
        runs, "sqrt", 128).text(" steps")


def test_one_seed_counted_at_evaluations_has_the_gap_as_its_only_range():
    runs = at_evaluations(seeds(128, "sqrt", 0.1, [190]), every=10)
    assert steps_spread(runs, "sqrt", 128).text(" steps") == (
        "190 steps [181, 190] (one seed: the range is the gap between evaluations, 10 steps "
        "apart)")
    # and a saving against today's batch then carries a band from both gaps
    runs = pd.concat([runs, at_evaluations(seeds(16, "sqrt", 0.1, [800]), every=10)])
    text = versus_current(runs, obvious_table(), "sqrt", 128, 16)
    # 190/800 = 0.24, band 181/800 .. 190/791
    assert text.startswith("at your batch 16 (800 steps [791, 800] (one seed: the range is the "
                           "gap between evaluations, 10 steps apart)), the recommendation "
                           "needs 0.24× [0.23, 0.24] the steps")


def test_rows_that_do_not_record_the_evaluation_before_keep_the_seeds_range():
    runs = pd.DataFrame(seeds(128, "sqrt", 0.1, [190, 190]))
    assert steps_spread(runs, "sqrt", 128).text(" steps") == "190 steps [190, 190] over 2 seeds"
