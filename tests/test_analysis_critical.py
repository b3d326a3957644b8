"""Known-answer tests of steps to result, the critical batch and its bootstrap interval, the
regimes and time to target (batchscale.analysis.critical)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from test_analyze import BATCHES, E_MIN, S_MIN, make_runs, make_sweep, run_row

from batchscale.analysis.analyze import analyze
from batchscale.analysis.critical import (
    DIMINISHING_RETURNS,
    MAXIMAL_DATA_PARALLELISM,
    PERFECT_SCALING,
    bootstrap_critical_batch,
    fit_critical_batch,
    regimes,
    steps_to_result,
)
from batchscale.analysis.timetotarget import optimal_batch, step_times, time_to_target
from batchscale.config import AnalysisConfig

# --------------------------------------------------------------------------- critical batch


@pytest.mark.parametrize("rng_seed", range(5))
def test_critical_batch_recovers_known_b_crit_under_noise(rng_seed):
    batch = np.array(BATCHES, dtype=float)
    noise = np.random.default_rng(rng_seed).uniform(-0.03, 0.03, batch.size)
    fit = fit_critical_batch(batch, (S_MIN + E_MIN / batch) * (1 + noise))
    assert fit.reason == ""
    assert fit.b_crit == pytest.approx(64, rel=0.05)
    assert fit.s_min == pytest.approx(S_MIN, rel=0.05)


def test_critical_batch_of_mlperf_resnet50_is_tens_of_thousands():
    epochs = {1632: 35.0, 3264: 35.2, 8192: 42.0, 32768: 56.0, 65536: 84.5}
    batch = np.array(list(epochs), dtype=float)
    steps = np.array(list(epochs.values())) * 1_281_167 / batch
    fit = fit_critical_batch(batch, steps)
    assert 10_000 <= fit.b_crit < 100_000


def test_critical_batch_guards_against_meaningless_fits():
    batch = np.array([2.0, 4.0, 8.0, 16.0])
    still_falling = fit_critical_batch(batch, 1000 / batch - 10)
    assert math.isnan(still_falling.b_crit) and "above 16" in still_falling.reason
    flat = fit_critical_batch(batch, [50, 52, 55, 60])
    assert math.isnan(flat.b_crit) and "below 2" in flat.reason
    too_few = fit_critical_batch([4, 8, 16], [100, math.nan, -3])
    assert math.isnan(too_few.b_crit) and "fewer than" in too_few.reason


def test_bootstrap_interval_contains_point_estimate():
    runs = make_runs(seeds=(0, 1, 2), noise=0.08)
    table = steps_to_result(runs)
    linear = table[table["lr_rule"] == "linear"]
    point = fit_critical_batch(linear["batch_size"], linear["steps_to_target"]).b_crit
    low, high = bootstrap_critical_batch(runs, "linear", n=100, seed=1)
    assert low <= point <= high
    assert low < high


def test_bootstrap_interval_past_the_measured_range_is_finite_and_flagged():
    """B_crit = 640 measured at B ≤ 64 with 10 % noise: many refits put it above the range."""
    rng = np.random.default_rng(3)
    rows = [
        run_row(b, "linear", 0.1, seed, round((10 + 6400 / b) * (1 + rng.uniform(-0.1, 0.1))))
        for b in (4, 8, 16, 32, 64)
        for seed in range(4)
    ]
    runs = pd.DataFrame(rows)
    low, high = bootstrap_critical_batch(runs, "linear", n=100)
    assert 0 < low <= high < math.inf
    result = analyze(None, runs, None, AnalysisConfig(bootstrap_samples=100))
    fit = result.summary.critical_batch["linear"]
    assert "past the largest batch" in fit.interval_note
    assert all(row["b_crit_high"] >= row["b_crit_low"] > 0 for row in result.rows)


def test_bootstrap_of_perfect_scaling_stays_finite_above_the_range():
    """S ∝ 1/B: most refits put B_crit at +inf; the interval holds finite values past 64."""
    rng = np.random.default_rng(0)
    rows = [
        run_row(b, "linear", 0.1, seed, round(6400 / b * (1 + rng.uniform(-0.05, 0.05))))
        for b in (4, 8, 16, 32, 64)
        for seed in range(4)
    ]
    low, high = bootstrap_critical_batch(pd.DataFrame(rows), "linear", n=100)
    assert 0 < low <= high < math.inf
    assert high >= 64


def test_bootstrap_interval_never_leaves_the_measured_range():
    """Near-perfect scaling: many refits give S_min ≈ 0 and B_crit in the millions; the
    interval stops at the largest batch and the text says it is open-ended."""
    rng = np.random.default_rng(5)
    rows = [
        run_row(b, "linear", 0.1, seed, round((0.5 + 6400 / b) * (1 + rng.uniform(-0.1, 0.1))))
        for b in (4, 8, 16, 32, 64)
        for seed in range(4)
    ]
    runs = pd.DataFrame(rows)
    low, high = bootstrap_critical_batch(runs, "linear", n=100)
    assert 4 <= low <= high <= 64
    result = analyze(None, runs, None, AnalysisConfig(bootstrap_samples=100))
    assert all(row["b_crit_high"] <= 64 for row in result.rows)
    assert "above 64, the largest batch measured" in result.markdown


def test_bootstrap_with_one_seed_is_nan():
    low, high = bootstrap_critical_batch(make_runs(seeds=(0,)), "linear", n=20)
    assert math.isnan(low) and math.isnan(high)


# --------------------------------------------------------------------------- steps to result


def test_steps_to_result_ignores_diverged_and_takes_min_over_lr():
    runs = pd.DataFrame(
        [
            run_row(32, "linear", 0.4, 0, 10, status="diverged"),  # fewest steps, but diverged
            run_row(32, "linear", 0.2, 0, 120),
            run_row(32, "linear", 0.1, 0, 90),
            run_row(32, "linear", 0.05, 0, 200, status="not_reached"),
            run_row(64, "linear", 0.2, 0, 80, status="diverged"),
        ]
    )
    table = steps_to_result(runs).set_index("batch_size")
    assert table.loc[32, "steps_to_target"] == 90
    assert table.loc[32, "best_lr"] == 0.1
    assert table.loc[32, "examples_to_target"] == 32 * 90
    assert (table.loc[32, "trials"], table.loc[32, "reached"]) == (4, 2)
    assert math.isnan(table.loc[64, "steps_to_target"]) and table.loc[64, "reached"] == 0


def test_steps_to_result_median_over_seeds_then_min_over_lr():
    runs = pd.DataFrame(
        [
            run_row(16, "linear", 0.2, 0, 100),  # lucky seed of a noisy LR
            run_row(16, "linear", 0.2, 1, 300),
            run_row(16, "linear", 0.2, 2, 320),
            run_row(16, "linear", 0.1, 0, 150),
            run_row(16, "linear", 0.1, 1, 160),
            run_row(16, "linear", 0.1, 2, 170),
        ]
    )
    assert steps_to_result(runs)["steps_to_target"].item() == 160
    assert steps_to_result(runs, reduce="min")["steps_to_target"].item() == 100


def test_steps_to_result_lr_failing_on_most_seeds_is_infeasible():
    runs = pd.DataFrame(
        [
            run_row(16, "linear", 0.4, 0, 50),
            run_row(16, "linear", 0.4, 1, 50, status="diverged"),
            run_row(16, "linear", 0.4, 2, 50, status="diverged"),
            run_row(16, "linear", 0.1, 0, 150),
        ]
    )
    assert steps_to_result(runs)["steps_to_target"].item() == 150


def test_steps_to_result_by_batch_only_and_by_workers():
    runs = pd.DataFrame(
        [run_row(16, "linear", 0.1, 0, 150), run_row(16, "sqrt", 0.2, 0, 120, workers=2)]
    )
    assert steps_to_result(runs, by=())["steps_to_target"].tolist() == [120]
    by_workers = steps_to_result(runs, by=("workers",))
    assert by_workers["workers"].tolist() == [1, 2]


def test_steps_to_result_of_empty_runs_is_empty():
    assert steps_to_result(pd.DataFrame()).empty


# --------------------------------------------------------------------------- regimes, time


def test_regimes_perfect_scaling_and_maximal_parallelism():
    batch = np.array([8, 16, 32, 64, 128], dtype=float)
    perfect = regimes(batch, 6400 / batch)
    assert perfect["slope"].to_numpy() == pytest.approx(-1.0)
    assert set(perfect["regime"]) == {PERFECT_SCALING}
    flat = regimes(batch, np.full(batch.size, 40.0))
    assert set(flat["regime"]) == {MAXIMAL_DATA_PARALLELISM}


def test_regimes_along_a_critical_batch_curve():
    batch = np.array(BATCHES, dtype=float)
    labels = regimes(batch, S_MIN + E_MIN / batch)["regime"].tolist()
    assert labels[0] == PERFECT_SCALING
    assert labels[4] == DIMINISHING_RETURNS  # B = B_crit: slope -1/2
    assert labels[-1] == MAXIMAL_DATA_PARALLELISM


def test_regimes_with_missing_steps_are_unknown():
    table = regimes([4, 8, 16], [100, math.nan, 30])
    assert table["regime"].iloc[1] is None
    assert table["regime"].iloc[0] is not None


def test_time_to_target_and_optimal_batch():
    assert time_to_target(200, 0.5) == 100
    assert optimal_batch(alpha=1.0, beta=0.01, b_crit=100) == pytest.approx(100)
    assert optimal_batch(alpha=1.0, beta=0.01, b_crit=100, b_max=50) == 50
    assert math.isnan(optimal_batch(1.0, 0.01, math.nan))
    assert math.isnan(optimal_batch(-1.0, 0.01, 100))


def test_step_times_use_measurements_and_the_line_elsewhere():
    sweep = make_sweep(alpha=1e-3, beta=1e-5, batches=(16, 64, 256))
    times, fit, source = step_times(sweep, pd.DataFrame(), [16, 32, 1024])
    assert "synthetic" in source
    assert times == pytest.approx([1e-3 + 16e-5, 1e-3 + 32e-5, 1e-3 + 1024e-5])
    assert fit.beta_s == pytest.approx(1e-5)


