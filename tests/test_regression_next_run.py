"""Where the next comparable run should land (lake/next_run.py, the regressions table's
next_run_low/high) and a run that moved as a whole: the cells' intervals from their history or
their own rounds, and the summary's line for a shift every cell shares."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from test_regression import HISTORY, MEAN_RATE, noisy_history, sweep_frame

from batchscale.lake.regression import (
    CONFIRMED,
    NO_REGRESSION,
    SUSPECTED,
    check_regressions,
    regressions_markdown,
    regressions_table,
    verdict_lines,
)


def test_each_timed_cell_gets_the_interval_its_next_run_is_held_to():
    """next_run_low/high: centred on this run, from the cell's run-to-run steps when it has
    history, from the row's own rounds when those are wider or there is no history; said in
    the summary and the report; null for a cell that did not time."""
    from batchscale.lake.next_run import ROUNDS_ALONE, next_run_interval

    rng = np.random.default_rng(11)
    history = noisy_history(rng, batches=(4, 64, 256))
    now = sweep_frame("now", {4: MEAN_RATE, 64: MEAN_RATE, 256: MEAN_RATE})
    now.loc[now["batch_size"] == 64, ["samples_per_s_low", "samples_per_s_high"]] = (
        0.5 * MEAN_RATE, 2.0 * MEAN_RATE)  # rounds far apart: wider than any history step
    now.loc[now["batch_size"] == 256, ["status", "samples_per_s"]] = ("oom", None)
    table = check_regressions(now, history, HISTORY).set_index("batch_size")
    series = list(history[history["batch_size"] == 4]["samples_per_s"]) + [MEAN_RATE]
    low, high, basis = next_run_interval(series)
    assert (table.loc[4, "next_run_low"], table.loc[4, "next_run_high"]) == pytest.approx(
        (low, high))
    assert table.loc[4, "next_run_basis"] == basis == f"history of {HISTORY + 1} runs"
    assert low < MEAN_RATE < high and high / MEAN_RATE - 1 < 0.15  # 2 % noise: a few percent
    assert (table.loc[64, "next_run_low"], table.loc[64, "next_run_high"]) == pytest.approx(
        (0.5 * MEAN_RATE, 2.0 * MEAN_RATE))
    assert table.loc[64, "next_run_basis"] == (
        f"this run's rounds, wider than its history of {HISTORY + 1} runs")
    assert pd.isna(table.loc[256, "next_run_low"]) and pd.isna(table.loc[256, "next_run_basis"])
    regressions_table(table.reset_index())  # the schema takes it
    [line] = [x for x in verdict_lines(table.reset_index()) if x.startswith("  next run:")]
    # the median low and high ends, each in its own direction (a ratio's range is lopsided)
    assert re.search(r"within −\d+% to \+\d+% of this one's", line), line
    assert "median over 2 cells, 90 %" in line and "alone" not in line
    assert "Next run: the next comparable run" in regressions_markdown(table.reset_index())
    # no history yet: the rounds alone, and the summary does not promise the next run
    first = check_regressions(now.assign(run_id="first"), None, HISTORY)
    assert set(first["next_run_basis"].dropna()) == {ROUNDS_ALONE}
    [line] = [x for x in verdict_lines(first) if x.startswith("  next run:")]
    assert "should land" not in line
    assert re.search(r"1 cell with under 4 runs of history: only this run's rounds, −\d+% to "
                     r"\+\d+%, which", line), line
    assert "which the next run may leave" in line


def test_a_cell_timed_in_several_rows_of_a_run_spans_their_intervals():
    """per_run_cells: a run that timed one cell in several rows gets their median rate and
    the span of those rows' own rerun intervals (not the first row's alone); an unstable row
    is left out of both while a stable one exists."""
    from batchscale.lake.comparable import per_run_cells

    now = pd.concat([sweep_frame("now", {64: rate}) for rate in (1000.0, 1200.0, 400.0)],
                    ignore_index=True)
    now[["samples_per_s_low", "samples_per_s_high"]] = [(900.0, 1100.0), (1050.0, 1400.0),
                                                        (100.0, 2000.0)]
    now.loc[2, ["quality", "quality_reason"]] = ("unstable", "rounds disagree")
    [cell] = per_run_cells(now).to_dict("records")
    assert cell["samples_per_s"] == 1100.0 and cell["trusted"]
    assert (cell["samples_per_s_low"], cell["samples_per_s_high"]) == (900.0, 1400.0)
    only_unstable = per_run_cells(now.iloc[[2]]).to_dict("records")[0]
    assert not only_unstable["trusted"]
    assert (only_unstable["samples_per_s_low"], only_unstable["samples_per_s_high"]) == (
        100.0, 2000.0)


def test_a_run_that_moved_as_a_whole_is_said_before_its_cells():
    """Eleven of twelve cells below their baselines is the signature of something every cell
    shares (the machine's speed, a library), not of one slower kernel: the summary says so."""
    from batchscale.lake.verdicts import whole_run_shift

    changes = [-0.12, -0.13, -0.2, -0.25, -0.3, -0.16, -0.18, -0.22, -0.1, -0.28, -0.2, 0.05]
    frame = pd.DataFrame({"verdict": [CONFIRMED, CONFIRMED] + [SUSPECTED] * 5
                          + [NO_REGRESSION] * 5, "change": changes})
    assert whole_run_shift(frame) == (
        "11 of 12 judged cells ran below their baseline (median −20%), together: a shift of "
        "the whole run, which something every cell shares gives (the machine at another speed, "
        "or a change in the code, a library or a driver)")
    mixed = frame.assign(change=[-0.2, -0.15] + [0.02, -0.01] * 5)
    assert whole_run_shift(mixed) is None
    assert whole_run_shift(frame.iloc[:3]) is None  # too few cells to call it the whole run
