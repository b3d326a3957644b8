"""batchscale/lake/next_run.py: the interval the next scheduled run of a cell is held to."""

from __future__ import annotations

import math

import numpy as np
import pytest

from batchscale.lake.next_run import (
    MIN_STEPS,
    ROUNDS_ALONE,
    next_run_interval,
    successive_half_width,
)
from batchscale.tdist import t_quantile


def test_the_half_width_is_t_times_the_rms_of_the_run_to_run_steps():
    values = [100.0, 110.0, 99.0, 105.0]  # 3 steps
    steps = np.diff(np.log(values))
    expected = t_quantile(0.95, 2) * math.sqrt(float(np.mean(steps**2)))
    assert successive_half_width(values) == pytest.approx(expected)


def test_too_few_runs_or_a_non_positive_value_give_no_history_width():
    assert successive_half_width([100.0] * MIN_STEPS) is None  # MIN_STEPS - 1 steps
    assert successive_half_width([100.0, 0.0, 100.0, 100.0]) is None
    assert next_run_interval([100.0, 101.0]) is None  # neither history nor rounds
    assert next_run_interval([]) is None
    # an own interval not recorded (null, NaN: a table before it) is no interval
    assert next_run_interval([100.0, 101.0], (None, 102.0)) is None
    assert next_run_interval([100.0, 101.0], (math.nan, 102.0)) is None


def test_a_slow_drift_costs_the_interval_nothing_unlike_a_spread_around_the_mean():
    """A series climbing 2 % a run: the steps are all alike, so the interval is about ±2 % x t
    around this run, whereas the series' own spread is three times wider."""
    drift = [100.0 * 1.02**i for i in range(10)]
    low, high, source = next_run_interval(drift)
    assert source == "history of 10 runs"
    assert low < drift[-1] < high
    assert math.log(high / drift[-1]) == pytest.approx(t_quantile(0.95, 8) * math.log(1.02))
    assert np.std(np.log(drift), ddof=1) > 2.5 * math.log(1.02)


def test_the_wider_of_the_rounds_and_the_history_sets_the_width():
    quiet_history = [100.0, 100.5, 99.8, 100.2, 100.0]
    wide_rounds = (80.0, 125.0)
    low, high, source = next_run_interval(quiet_history, wide_rounds)
    assert source == "this run's rounds, wider than its history of 5 runs"
    assert (low, high) == pytest.approx((80.0, 125.0))  # symmetric in log around 100
    noisy_history = [100.0, 130.0, 90.0, 120.0, 100.0]
    low, high, source = next_run_interval(noisy_history, (98.0, 102.0))
    assert source == "history of 5 runs"
    assert low < 98.0 and high > 102.0
    assert math.log(100.0 / low) == pytest.approx(math.log(high / 100.0))
    # too little history: the rounds alone, said as such
    low, high, source = next_run_interval([100.0, 101.0], (98.0, 102.0))
    assert source == ROUNDS_ALONE  # the wider side of the rounds, both ways in log
    assert (low, high) == pytest.approx((98.0, 101.0**2 / 98.0))


def test_coverage_is_near_its_level_on_a_stationary_series():
    """On iid lognormal runs (CV 10 %) the next run lands inside about 90 % of the time: the
    interval is a prediction interval, not decoration (2,000 checks, 8 runs of history)."""
    rng = np.random.default_rng(7)
    covered = 0
    trials = 2000
    for _ in range(trials):
        series = list(np.exp(rng.normal(0.0, 0.1, 9)))
        low, high, _ = next_run_interval(series[:8])
        covered += low <= series[8] <= high
    assert 0.86 <= covered / trials <= 0.95
