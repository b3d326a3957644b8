"""`batchscale history`'s text tables and plot on constructed histories, no lake: the verdict
marks, the next-run line (or why there is none), unstable figures, B_crit per target, and the
run-id column's width."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from test_history import PNG_SIGNATURE
from test_publish import WORKLOAD

from batchscale.lake.history import History, _critical, critical_lines, throughput_lines
from batchscale.lake.history_chart import _plot_verdicts, history_figure, plot_history

# ------------------------------------------ verdicts in the history view
STEP_RUNS = [f"20261201T00000{i}Z-step{i}" for i in range(6)]
STEP_RATES = [9000.0, 9100.0, 8900.0, 6000.0, 6100.0, 9000.0]
STEP_VERDICTS = ["insufficient_history", "insufficient_history", "insufficient_history",
                 "suspected", "confirmed", "ok"]
CELL = {"device_name": "cpu", "precision": "fp32", "input_mode": "synthetic", "batch_size": 64}


def step_history() -> History:
    """A cell that stepped down at run 3 (confirmed at run 4) and recovered at run 5."""
    published = pd.Timestamp("2026-12-01 00:00", tz="UTC")
    throughput = pd.DataFrame([{"published_at": published, "date": "2026-12-01", "run_id": r,
                                **CELL, "samples_per_s": rate}
                               for r, rate in zip(STEP_RUNS, STEP_RATES, strict=True)])
    verdicts = pd.DataFrame([
        {"run_id": r, **CELL, "verdict": v,
         "history_median": 9000.0 if v != "insufficient_history" else float("nan"),
         "allowed_drop": 720.0 if v != "insufficient_history" else float("nan"),
         "first_bad_run_id": STEP_RUNS[3] if v == "confirmed" else None}
        for r, v in zip(STEP_RUNS, STEP_VERDICTS, strict=True)])
    return History(WORKLOAD, throughput, _critical(None), verdicts)


def test_history_table_marks_suspected_and_confirmed_runs():
    lines = throughput_lines(step_history())
    marked = {run: line for run in STEP_RUNS for line in lines
              if run in line and "next run" not in line}
    assert marked[STEP_RUNS[3]].rstrip().endswith("6,000?")
    assert marked[STEP_RUNS[4]].rstrip().endswith("6,100!")
    assert marked[STEP_RUNS[5]].rstrip().endswith("9,000")
    assert lines[-1].strip().startswith("? suspected")


def test_history_table_says_where_the_next_run_should_land():
    """The latest run's next-run range (its regression row) closes the series' table; a run
    whose rows have none says why: an older table, or a run measured too badly to judge."""
    history = step_history()
    [older] = [line for line in throughput_lines(history) if "next run" in line]
    assert older == (f"  next run: no range: the regression check of run {STEP_RUNS[-1]} gave "
                     "none (a table published before it did)")
    disturbed = history.verdicts.assign(
        verdict=np.where(history.verdicts["run_id"].eq(STEP_RUNS[-1]), "not_judged",
                         history.verdicts["verdict"]),
        reason="measurement disturbed: other processes kept the CPUs busy")
    [badly] = [line for line in throughput_lines(
        History(WORKLOAD, history.throughput, history.critical, disturbed)) if "next run" in line]
    assert badly == (f"  next run: no range: the latest run, {STEP_RUNS[-1]}, was measured too "
                     "badly to give one (measurement disturbed: other processes kept the CPUs "
                     "busy); a range needs a run the check could judge")
    latest = history.verdicts["run_id"].eq(STEP_RUNS[-1])
    verdicts = history.verdicts.assign(next_run_low=np.where(latest, 7000.0, np.nan),
                                       next_run_high=np.where(latest, 11500.0, np.nan))
    lines = throughput_lines(History(WORKLOAD, history.throughput, history.critical, verdicts))
    [line] = [x for x in lines if "next run" in x]
    assert line == "  next run should land in (90 %, docs/lake.md): B=64 7,000–11,500"
    assert STEP_RUNS[-1] in lines[lines.index(line) - 1]  # right under the latest run

    # A range from this run's rounds alone (too little history) is marked, and why it may be
    # left is said under it.
    from batchscale.lake.next_run import ROUNDS_ALONE

    alone = verdicts.assign(next_run_basis=np.where(latest, ROUNDS_ALONE, None))
    lines = throughput_lines(History(WORKLOAD, history.throughput, history.critical, alone))
    [line] = [x for x in lines if "next run" in x]
    assert line.startswith("  next run should land in (90 %, docs/lake.md): B=64* 7,000–11,500\n"
                           f"  * {ROUNDS_ALONE}: the range of this run's rounds")
    assert line.endswith("the next run may land outside it")


def test_history_table_marks_figures_measured_unstably():
    """An unstable figure is marked (and explained), unless its verdict mark says more."""
    history = step_history()
    flags = [run in (STEP_RUNS[1], STEP_RUNS[3]) for run in history.throughput["run_id"]]
    history = History(WORKLOAD, history.throughput.assign(unstable=flags), history.critical,
                      history.verdicts)
    lines = throughput_lines(history)
    marked = {run: line for run in STEP_RUNS for line in lines if run in line}
    assert marked[STEP_RUNS[1]].rstrip().endswith("9,100~")
    assert marked[STEP_RUNS[3]].rstrip().endswith("6,000?")  # the verdict's mark wins
    assert marked[STEP_RUNS[2]].rstrip().endswith("8,900")
    assert lines[-1].strip().startswith("~ measured unstably")
    # the plot draws them hollow, as the report's sweep plot does
    figure = history_figure(history, critical=False)
    hollow = [line for line in figure.axes[0].lines
              if line.get_marker() == "o" and line.get_markerfacecolor() == "white"]
    assert [list(line.get_xdata()) for line in hollow] == [[1, 3]]


def test_history_plot_draws_the_band_the_marked_runs_and_the_change_point(tmp_path):
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure

    history = step_history()
    axis = Figure().subplots()
    x = {run: i for i, run in enumerate(STEP_RUNS)}
    _plot_verdicts(axis, history, tuple(CELL.values()), x, "C0")
    [band] = [c for c in axis.collections if isinstance(c, PolyCollection)]
    low, high = band.get_paths()[0].vertices[:, 1].min(), band.get_paths()[0].vertices[:, 1].max()
    assert (low, high) == (9000.0 - 720.0, 9000.0 + 720.0)
    vertical = [line for line in axis.lines if line.get_linestyle() == "--"]
    assert [line.get_xdata()[0] for line in vertical] == [2.5]  # between last good and first bad
    squares = [line for line in axis.lines if line.get_marker() == "s"]
    assert [list(line.get_xdata()) for line in squares] == [[3], [4]]  # suspected, confirmed
    assert [line.get_markerfacecolor() for line in squares][0] == "none"
    assert plot_history(history, tmp_path / "h.png").read_bytes().startswith(PNG_SIGNATURE)


def test_a_study_variants_long_run_id_widens_its_column_instead_of_shifting_the_rows():
    from types import SimpleNamespace

    when = pd.Timestamp("2026-12-06T19:37:40Z")
    rows = [{"run_id": run_id, "published_at": when, "lr_rule": "sqrt", "b_crit": 23.0,
             "b_crit_low": 8.0, "b_crit_high": 74.0, "b_crit_bound": None,
             "b_crit_bound_batch": math.nan}
            for run_id in ("20261206T193740Z-9c8d5b", "20261206T193740Z-9c8d5b-myreg_workload")]
    header, *lines = critical_lines(SimpleNamespace(critical=pd.DataFrame(rows)))[1:]
    assert len({line.index("sqrt") for line in lines}) == 1  # every row's rule in one column
    assert header.index("LR rule") == lines[0].index("sqrt")


def test_b_crit_is_listed_with_the_target_each_run_was_analysed_for():
    """Runs for two targets in one table: each row names its target, and a note says not to
    compare across them; a plot whose runs have no B_crit says so in its empty panel."""
    from types import SimpleNamespace

    when = pd.Timestamp("2026-12-06T22:21:00Z")
    rows = [{"run_id": run_id, "published_at": when, "lr_rule": "sqrt", "b_crit": b_crit,
             "b_crit_low": b_crit * 0.9, "b_crit_high": b_crit * 1.1, "b_crit_bound": None,
             "b_crit_bound_batch": math.nan, "target_metric": "val_accuracy",
             "target_value": target}
            for run_id, b_crit, target in (("20261206T220928Z-367eba", 79.3, 0.85),
                                           ("20261206T221456Z-1c0e13", math.nan, 0.995))]
    lines = critical_lines(SimpleNamespace(critical=pd.DataFrame(rows)))
    assert "val_accuracy >= 0.85 " in lines[2] and "val_accuracy >= 0.995" in lines[3]
    assert lines[3].rstrip().endswith("not estimated")  # no reason recorded: still said
    rows[1]["b_crit_reason"] = "only 2 of 4 batch sizes reached the target"
    lines = critical_lines(SimpleNamespace(critical=pd.DataFrame(rows)))
    assert "not estimated: only 2 of 4 batch sizes reached the target" in lines[3]
    assert lines[-1].startswith("  the runs were analysed for different targets")
    none = step_history()
    critical = _critical(pd.DataFrame([{**rows[1], "date": "2026-12-06"}]))
    figure = history_figure(History(WORKLOAD, none.throughput, critical, none.verdicts))
    texts = [t.get_text() for t in figure.axes[1].texts]
    assert texts == ["no run here has a B_crit or a bound on it (each run's b_crit_reason in "
                     "the analysis table says why)"]


def test_each_runs_throughput_carries_its_rerun_interval_as_a_bar_where_it_has_one():
    """Rows with a 90 % rerun interval get an error bar at their run; older rows without one
    (published before intervals) get none, and the text table is unchanged."""
    from matplotlib.collections import LineCollection

    history = step_history()
    rates = history.throughput["samples_per_s"]
    with_ranges = history.throughput.assign(
        samples_per_s_low=(rates * 0.9).where(rates.index >= 2),
        samples_per_s_high=(rates * 1.05).where(rates.index >= 2))
    figure = history_figure(History(WORKLOAD, with_ranges, history.critical,
                                    history.verdicts))
    [bars] = [c for c in figure.axes[0].collections if isinstance(c, LineCollection)]
    segments = bars.get_segments()
    assert [float(s[0][0]) for s in segments] == [2.0, 3.0, 4.0, 5.0]
    assert [(float(s[0][1]), float(s[1][1])) for s in segments][0] == (8900 * 0.9, 8900 * 1.05)
    plain = history_figure(step_history())
    assert not [c for c in plain.axes[0].collections if isinstance(c, LineCollection)]
