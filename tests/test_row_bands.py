"""The results table's spread over seeds (analysis layout 9): each row's steps and time to
target with the lowest and highest of the seeds behind its median, how many ran and reached,
and each batch's B_simple with its range over trials. Hand-made runs, the arithmetic written
out."""

from __future__ import annotations

import math

import pandas as pd
from test_analyze import make_sweep, run_row

from batchscale.analysis.analyze import analyze
from batchscale.analysis.expected import row_bands
from batchscale.config import AnalysisConfig


def _rows(result) -> dict:
    return {(r["lr_rule"], r["batch_size"]): r for r in result.rows}


def _runs() -> pd.DataFrame:
    """linear at batch 32: lr 0.1 reaches in 90, 100, 120 steps (times 0.10, 0.11, 0.15 s);
    lr 0.05 is slower (200 steps on every seed), so the row is lr 0.1's. At batch 64 one of
    three seeds does not reach. Batches 128 and 256 fill the fit."""
    rows = [run_row(32, "linear", 0.1, seed, steps, time=time, b_simple=b)
            for seed, steps, time, b in [(0, 90, 0.10, 20.0), (1, 100, 0.11, 30.0),
                                         (2, 120, 0.15, 40.0)]]
    rows += [run_row(32, "linear", 0.05, seed, 200, b_simple=None) for seed in (0, 1, 2)]
    rows += [run_row(64, "linear", 0.2, 0, 60, time=0.08, b_simple=-5.0),
             run_row(64, "linear", 0.2, 1, 70, time=0.09, b_simple=60.0),
             run_row(64, "linear", 0.2, 2, 500, status="not_reached", b_simple=80.0)]
    rows += [run_row(b, "linear", 0.1 * b / 32, seed, steps, b_simple=None)
             for b, steps in [(128, 40), (256, 35)] for seed in (0, 1)]
    return pd.DataFrame(rows)


def _table() -> pd.DataFrame:
    """The results table's row of linear at 32: 100 steps × 1 ms."""
    return pd.DataFrame([{"lr_rule": "linear", "batch_size": 32, "steps_to_target": 100.0,
                          "step_time_s": 1e-3, "time_to_target_s": 0.1}])


def test_a_rows_steps_carry_the_range_of_the_seeds_at_its_learning_rate():
    result = analyze(make_sweep(), _runs(), None, AnalysisConfig(bootstrap_samples=20))
    row = _rows(result)[("linear", 32)]
    assert row["steps_to_target"] == 100.0  # median of 90, 100, 120 at lr 0.1
    assert (row["trials_at_lr"], row["reached_at_lr"]) == (3, 3)
    assert (row["steps_low"], row["steps_high"]) == (90.0, 120.0)
    # Measured times 0.10, 0.11, 0.15 are 0.909, 1, 1.364 of their median, placed around the
    # row's time (100 steps × its step time).
    time = row["time_to_target_s"]
    assert math.isclose(row["time_to_target_s_low"], time * 0.10 / 0.11)
    assert math.isclose(row["time_to_target_s_high"], time * 0.15 / 0.11)


def test_a_row_where_a_seed_did_not_reach_counts_it_and_ranges_over_those_that_did():
    result = analyze(make_sweep(), _runs(), None, AnalysisConfig(bootstrap_samples=20))
    row = _rows(result)[("linear", 64)]
    assert (row["trials_at_lr"], row["reached_at_lr"]) == (3, 2)
    assert (row["steps_low"], row["steps_high"]) == (60.0, 70.0)
    assert row["steps_to_target"] == 70.0  # the median counts the unreached seed as +inf


def test_b_simple_per_batch_carries_its_range_and_leaves_failed_estimates_out():
    result = analyze(make_sweep(), _runs(), None, AnalysisConfig(bootstrap_samples=20))
    rows = _rows(result)
    assert [rows[("linear", 32)][k] for k in
            ("b_simple", "b_simple_low", "b_simple_high", "b_simple_trials")] == [30.0, 20.0,
                                                                                  40.0, 3]
    # At 64 the estimate −5 failed: the other two (60, 80) remain, the unreached seed's too.
    assert [rows[("linear", 64)][k] for k in
            ("b_simple", "b_simple_low", "b_simple_high", "b_simple_trials")] == [70.0, 60.0,
                                                                                  80.0, 2]
    none = rows[("linear", 128)]
    assert math.isnan(none["b_simple"]) and none["b_simple_trials"] == 0


def test_the_evaluation_gap_widens_the_low_end_as_the_card_says_it():
    """A seed counted at its first evaluation that met the target, 10 steps after the one
    before: its steps could be as few as that one's step + 1."""
    runs = _runs()
    runs["steps_before_target"] = runs["steps_to_target"] - 10
    bands = row_bands(runs, _table(), "linear", 32, 0.1)
    assert (bands.steps.low, bands.steps.high, bands.steps.evaluation_gap) == (81.0, 120.0, 10)


def test_no_time_recorded_gives_no_time_band():
    runs = _runs().assign(time_to_target_s=None)
    bands = row_bands(runs, _table(), "linear", 32, 0.1)
    assert bands.time is None and bands.steps is not None


def test_the_report_and_the_run_summary_show_each_figure_with_its_range():
    from batchscale.lake.summary import convergence_lines
    from batchscale.report.render import _ranged
    from batchscale.schemas import make_table

    result = analyze(make_sweep(), _runs(), None, AnalysisConfig(bootstrap_samples=20))
    rows = _rows(result)
    assert _ranged(rows[("linear", 32)], "steps_to_target") == "100 [90, 120]"
    assert _ranged(rows[("linear", 64)], "steps_to_target") == "70 [60, 70], 2 of 3 reached"
    assert _ranged(rows[("linear", 32)], "b_simple") == "30 [20, 40]"
    assert _ranged(rows[("linear", 128)], "b_simple") == ""
    one = dict(rows[("linear", 32)], steps_low=90.0, steps_high=90.0, reached_at_lr=1,
               trials_at_lr=1, steps_to_target=90.0)
    assert _ranged(one, "steps_to_target") == "90 (one trial)"
    gap = dict(one, steps_low=81.0)
    assert _ranged(gap, "steps_to_target") == ("90 [81, 90] (one trial: the gap between "
                                               "evaluations)")
    layout_8 = {k: v for k, v in rows[("linear", 32)].items()
                if k not in ("steps_low", "steps_high", "trials_at_lr", "reached_at_lr")}
    assert _ranged(layout_8, "steps_to_target") == "100"
    lines = convergence_lines(make_table("analysis", result.rows, {}))
    row_32 = next(line for line in lines if line.split()[0] == "32")
    row_64 = next(line for line in lines if line.split()[0] == "64")
    assert row_32.split()[1:] == ["100", "[90,", "120]"]
    assert row_64.split()[1:] == ["70", "[60,", "70]", "2/3"]


def test_a_row_whose_median_did_not_reach_counts_the_seeds_that_did():
    """Batch 512: one of two seeds reached, so the median (+inf for the other) did not; the row
    says how many did instead of a bare dash."""
    from batchscale.lake.summary import _steps_cell
    from batchscale.report.render import _ranged

    runs = pd.concat([_runs(), pd.DataFrame([
        run_row(512, "linear", 1.6, 0, 30), run_row(512, "linear", 1.6, 1, 500,
                                                    status="not_reached")])])
    result = analyze(make_sweep(), runs, None, AnalysisConfig(bootstrap_samples=20))
    row = _rows(result)[("linear", 512)]
    assert math.isnan(row["steps_to_target"])
    assert (row["trials_at_lr"], row["reached_at_lr"]) == (2, 1)
    assert _ranged(row, "steps_to_target") == "not reached (1 of 2 did)"
    none = dict(row, reached_at_lr=0)
    assert (_ranged(none, "steps_to_target"), _steps_cell(none)) == ("not reached (0 of 2 did)",
                                                                      "-")
    from batchscale.analysis.expected import steps_spread

    # The card's figure for that cell is the seed that did, and says so.
    assert steps_spread(runs, "linear", 512).text(" steps") == (
        "30 steps (one seed: no spread); 1 more did not reach the target, and the figure is of "
        "those that did")
    assert _steps_cell(row) == "- 1/2"


def test_a_seed_that_did_not_reach_keeps_the_time_band_around_the_rows_own_figure():
    """Batch 64: seeds of 60 and 70 steps (0.08 s, 0.09 s) and one that did not reach. The
    row's median counts that one as never reaching: 70 steps, the second seed's. Its time band
    is the measured times as shares of that seed's, so it ends at the row's time, and the card
    says the same median with the seed that did not reach."""
    from batchscale.analysis.expected import expected_text

    runs = _runs()
    result = analyze(make_sweep(), runs, None, AnalysisConfig(bootstrap_samples=20))
    row = _rows(result)[("linear", 64)]
    time = row["time_to_target_s"]
    assert math.isclose(row["time_to_target_s_high"], time)
    assert math.isclose(row["time_to_target_s_low"], time * 0.08 / 0.09)
    table = pd.DataFrame(result.rows)
    text = expected_text(runs, table, "linear", 64)
    assert text.startswith("70 steps [60, 70] over 2 seeds; 1 more did not reach the target, "
                           "which the median counts as never reaching"), text


def test_with_two_worker_counts_the_row_is_the_fewest_workers_cell_the_card_also_gives():
    """Batch 32 also ran on 2 workers (seeds 0 and 1: 95 and 105 steps, their wall times half
    as long). The row is of the 3 one-worker trials, as its step time is: pooled, its median
    (100) and range would be of no one cell, and the card's expected steps for the cell (the
    one-worker seeds) would disagree with the table beside it. The 2-worker trials still
    answer the worker question."""
    from batchscale.analysis.expected import cell_time, steps_spread

    runs = pd.concat([_runs(), pd.DataFrame([
        run_row(32, "linear", 0.1, seed, steps, workers=2, time=time)
        for seed, steps, time in [(0, 95, 0.05), (1, 105, 0.06)]])])
    result = analyze(make_sweep(), runs, None, AnalysisConfig(bootstrap_samples=20))
    row = _rows(result)[("linear", 32)]
    assert (row["trials_at_lr"], row["reached_at_lr"]) == (3, 3)
    card = steps_spread(runs, "linear", 32, lr=0.1)
    assert (row["steps_low"], row["steps_high"]) == (card.low, card.high) == (90.0, 120.0)
    assert row["steps_to_target"] == card.median
    time = cell_time(runs, pd.DataFrame(result.rows), "linear", 32, lr=0.1)
    assert time.on_table and time.seeds == 3
    assert (row["time_to_target_s_low"], row["time_to_target_s_high"]) == (time.low, time.high)
    two = steps_spread(runs, "linear", 32, workers=2, lr=0.1)
    assert (two.low, two.high) == (95.0, 105.0)


def test_the_time_bands_low_end_reaches_back_over_the_evaluation_gap_as_the_steps_does():
    """Seeds met the target at 90, 100, 120 steps (0.10, 0.11, 0.15 s), each 10 steps after the
    evaluation before: the first could have taken 81 steps, so 0.10 × 81/90 = 0.09 s."""
    from batchscale.analysis.expected import time_spread

    runs = _runs()
    runs["steps_before_target"] = runs["steps_to_target"] - 10
    spread = time_spread(runs, "linear", 32, lr=0.1)
    assert math.isclose(spread.low, 0.09) and spread.high == 0.15
    assert spread.evaluation_gap == 10
    result = analyze(make_sweep(), runs, None, AnalysisConfig(bootstrap_samples=20))
    row = _rows(result)[("linear", 32)]
    assert math.isclose(row["time_to_target_s_low"], row["time_to_target_s"] * 0.09 / 0.11)
    assert row["steps_low"] == 81.0
