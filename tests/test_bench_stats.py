"""The benchmarks' statistics helper (benchmarks/stats.py): intervals and verdicts are pure
functions, pinned here against closed forms. No benchmark is run (speed goals are measured in
`make bench`, never asserted in unit tests)."""

from __future__ import annotations

import importlib.util
import math
import statistics
import sys
from pathlib import Path

import pytest

# benchmarks/ is not an installed package: load the module from its file.
_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "stats.py"
_SPEC = importlib.util.spec_from_file_location("bench_stats_under_test", _PATH)
stats = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = stats  # dataclasses look their module up while building the class
_SPEC.loader.exec_module(stats)

AT_LEAST = stats.Goal(0.97)
AT_MOST = stats.Goal(0.05, at_least=False)


@pytest.mark.parametrize(("low", "high", "goal", "expected"), [
    (0.98, 1.02, AT_LEAST, stats.MET),
    (0.97, 1.02, AT_LEAST, stats.MET),  # the goal itself is on the good side
    (0.90, 0.96, AT_LEAST, stats.MISSED),
    (0.95, 1.01, AT_LEAST, stats.NOT_ESTABLISHED),
    (0.01, 0.04, AT_MOST, stats.MET),
    (0.06, 0.20, AT_MOST, stats.MISSED),
    (0.01, 0.06, AT_MOST, stats.NOT_ESTABLISHED),
    (0.01, 0.06, None, stats.REPORT),
])
def test_verdict_reads_where_the_interval_lies(low, high, goal, expected):
    assert stats.verdict(low, high, goal) == expected


def test_combined_verdict_needs_every_figure_met_and_fails_on_any_miss():
    assert stats.combined_verdict([stats.MET, stats.MET]) == stats.MET
    assert stats.combined_verdict([stats.MET, stats.NOT_ESTABLISHED]) == stats.NOT_ESTABLISHED
    assert stats.combined_verdict([stats.NOT_ESTABLISHED, stats.MISSED]) == stats.MISSED
    assert stats.combined_verdict([]) == stats.NOT_ESTABLISHED


def test_interleaved_alternates_which_side_goes_first():
    calls: list[str] = []

    def measure(side: str):
        def run() -> float:
            calls.append(side)
            return float(len(calls))
        return run

    a, b = stats.interleaved(measure("A"), measure("B"), rounds=4)
    assert "".join(calls) == "ABBAABBA"
    assert a == [1.0, 4.0, 5.0, 8.0] and b == [2.0, 3.0, 6.0, 7.0]


def test_bootstrap_interval_is_deterministic_and_brackets_the_median():
    values = [0.91, 1.02, 0.97, 1.05, 0.99, 1.00, 0.95, 1.08]
    first = stats.bootstrap_interval(values)
    assert first == stats.bootstrap_interval(values)
    low, high = first
    assert min(values) <= low < sorted(values)[4] and sorted(values)[3] < high <= max(values)
    assert stats.bootstrap_interval([2.0, 2.0, 2.0]) == (2.0, 2.0)
    assert stats.bootstrap_interval([1.5]) == (1.5, 1.5)
    with pytest.raises(ValueError, match="no values"):
        stats.bootstrap_interval([])


def test_ratio_figure_is_the_median_of_paired_ratios():
    fig = stats.ratio_figure([2.0, 3.0, 4.4, 5.0, 6.0], [2.0, 2.0, 4.0, 5.0, 6.0], AT_LEAST)
    assert fig.value == pytest.approx(1.0)  # ratios 1.0, 1.5, 1.1, 1.0, 1.0
    assert fig.n == 5 and fig.low <= fig.value <= fig.high
    assert "paired rounds" in fig.how and fig.verdict == stats.verdict(fig.low, fig.high,
                                                                      AT_LEAST)


def test_too_few_rounds_get_no_verdict():
    clearly_above = [1.2, 1.3, 1.25]
    fig = stats.median_figure(clearly_above, AT_LEAST)
    assert fig.low > AT_LEAST.threshold and fig.verdict == stats.NOT_ESTABLISHED
    assert "no verdict" in fig.how
    assert stats.median_figure(clearly_above * 2, AT_LEAST).verdict == stats.MET
    assert stats.median_figure(clearly_above).verdict == stats.REPORT
    with pytest.raises(ValueError, match="as many"):
        stats.ratio_figure([1.0], [1.0, 2.0])


@pytest.mark.parametrize("n", [5, 20, 60])
def test_clopper_pearson_matches_its_closed_forms_at_the_edges(n):
    tail = (1 - stats.LEVEL) / 2
    assert stats.clopper_pearson(0, n) == pytest.approx((0.0, 1 - tail ** (1 / n)))
    assert stats.clopper_pearson(n, n) == pytest.approx((tail ** (1 / n), 1.0))


def test_clopper_pearson_interior_and_bad_counts():
    low, high = stats.clopper_pearson(1, 20)  # reference values: scipy's beta quantiles
    assert (low, high) == pytest.approx((0.0025614, 0.2161062), abs=1e-6)
    with pytest.raises(ValueError):
        stats.clopper_pearson(3, 2)


@pytest.mark.parametrize("q", [0.05, 0.5, 0.95])
def test_chi2_quantile_with_two_degrees_of_freedom_is_exponential(q):
    assert stats.chi2_quantile(q, 2) == pytest.approx(-2 * math.log(1 - q), rel=1e-9)


def test_chi2_quantile_one_degree_of_freedom_is_the_squared_normal():
    assert stats.chi2_quantile(0.95, 1) == pytest.approx(1.959963985**2, rel=1e-8)


def test_cv_interval_of_three_sweeps_is_wide():
    low, high = stats.cv_interval(0.014, 3)
    assert low == pytest.approx(0.014 * math.sqrt(2 / (-2 * math.log(0.05))), rel=1e-9)
    assert high == pytest.approx(0.014 * math.sqrt(2 / (-2 * math.log(0.95))), rel=1e-9)
    # 3 sweeps cannot establish a CV below 0.05 from an observed 0.014; 5 can.
    assert stats.cv_figure([100.0, 102.8, 101.4], AT_MOST).verdict == stats.NOT_ESTABLISHED
    with pytest.raises(ValueError, match="two"):
        stats.cv_interval(0.1, 1)


def test_share_figure_with_a_100_percent_goal_is_judged_on_every_case():
    every = stats.Goal(1.0)
    passed = stats.share_figure(10, 10, every)
    assert passed.verdict == stats.MET and passed.low == pytest.approx(0.05 ** 0.1)
    assert stats.share_figure(9, 10, every).verdict == stats.MISSED


def test_share_figure_with_an_interior_goal_uses_the_interval():
    assert stats.share_figure(0, 20, AT_MOST).verdict == stats.NOT_ESTABLISHED  # upper 0.139
    assert stats.share_figure(0, 60, AT_MOST).verdict == stats.MET  # upper 0.049
    assert stats.share_figure(8, 20, AT_MOST).verdict == stats.MISSED


def test_worst_figure_keeps_the_worst_value_and_the_combined_verdict():
    good = stats.Figure(1.01, 0.99, 1.03, 8, "x", AT_LEAST, stats.MET)
    unsure = stats.Figure(0.98, 0.96, 1.00, 8, "x", AT_LEAST, stats.NOT_ESTABLISHED)
    worst = stats.worst_figure([good, unsure])
    assert worst.value == 0.98 and worst.verdict == stats.NOT_ESTABLISHED
    assert worst.as_dict()["interval_90"] == [0.96, 1.00]
    assert "goal ≥ 0.97: not established" in worst.text()


def test_the_bench_counts_the_next_sweep_inside_the_previous_interval():
    """benchmarks/stats.rerun_coverage: sweep i+1 against sweep i's interval, only for
    batches both sweeps vouch for."""
    runs = [{16: 100.0, 64: 200.0}, {16: 104.0, 64: 260.0}, {16: 99.0}]
    intervals = [{16: (95.0, 105.0), 64: (190.0, 210.0)}, {16: (100.0, 108.0), 64: (250, 270)},
                 {16: (90.0, 110.0)}]
    covered, checked, widths = stats.rerun_coverage(runs, intervals)
    # 16: 104 in [95, 105] yes, 99 in [100, 108] no; 64: 260 in [190, 210] no; 64 absent after.
    assert (covered, checked) == (1, 3)
    assert widths == pytest.approx([5 / 100, 10 / 200, 4 / 104])


def test_the_history_interval_predicts_from_earlier_sweeps_only():
    """benchmarks/stats.history_coverage: a sweep is checked once 3 earlier sweeps vouch for its
    batch, against their t prediction interval on the log scale."""
    steady = [{16: v} for v in (100.0, 102.0, 98.0, 101.0, 99.0)]
    covered, checked, widths = stats.history_coverage(steady)
    assert (covered, checked) == (2, 2)  # sweeps 4 and 5, each from the ones before
    jump = steady[:3] + [{16: 150.0}]
    assert stats.history_coverage(jump)[:2] == (0, 1)
    # a batch with too few earlier sweeps is not checked
    assert stats.history_coverage([{16: 1.0}, {16: 1.0}, {64: 1.0}, {16: 1.0}])[1] == 0
    # half-width of 100, 102, 98 predicting the 4th: t(2, 0.95) 2.920 × sd 0.02 × sqrt(4/3)
    logs = [math.log(v) for v in (100.0, 102.0, 98.0)]
    half = 2.919986 * statistics.stdev(logs) * math.sqrt(4 / 3)
    assert widths[0] == pytest.approx(math.sinh(half), rel=1e-4)


def test_next_run_coverage_checks_the_lake_interval_against_the_following_sweep():
    """benchmarks/stats.next_run_coverage: from next_run.MIN_STEPS steps of history on, each
    sweep's next-run interval (history, or the wider rounds interval) against the next sweep."""
    steady = [{16: v} for v in (100.0, 102.0, 98.0, 101.0, 99.0, 100.0)]
    covered, checked, widths = stats.next_run_coverage(steady)
    assert (covered, checked) == (2, 2)  # sweeps 4 and 5 predict 5 and 6
    jump = steady[:5] + [{16: 160.0}]
    assert stats.next_run_coverage(jump)[:2] == (1, 2)
    wide = [{16: (50.0, 200.0)} for _ in jump]  # rounds wide enough to hold the jump
    assert stats.next_run_coverage(jump, wide)[:2] == (2, 2)
    assert widths[0] > 0


@pytest.mark.parametrize(("value", "low", "high", "expected"), [
    (0.983, 0.964, 0.998, stats.MET),  # interval above the floor, median at the goal or more
    (0.983, 0.947, 1.008, stats.NOT_ESTABLISHED),  # interval reaches below the floor
    (0.960, 0.955, 0.990, stats.NOT_ESTABLISHED),  # median under the goal
    (0.940, 0.920, 0.965, stats.MISSED),  # the whole interval under the goal
])
def test_a_goal_with_an_interval_floor(value, low, high, expected):
    figure = stats.Figure(value, low, high, 8, "paired rounds", AT_LEAST, stats.REPORT)
    assert stats.floor_verdict(figure, AT_LEAST, 0.95) == expected
