"""Known-answer tests of steps to result, the critical batch (a number only where the data
support one, otherwise a bound or a reason) and its interval (batchscale.analysis.critical,
interval). The regimes along the fitted curve and time to target: tests/test_analysis_regimes.py;
the interval's coverage is measured in tests/test_calibration.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from test_analyze import BATCHES, E_MIN, S_MIN, make_runs, run_row

from batchscale.analysis.analyze import analyze
from batchscale.analysis.critical import (
    BOOTSTRAP_CONFIDENCE,
    bootstrap_critical_batch,
    fit_critical_batch,
    interval_note,
    steps_to_result,
)
from batchscale.analysis.interval import fieller_interval, fit_lines
from batchscale.config import AnalysisConfig
from batchscale.tdist import t_quantile

# --------------------------------------------------------------------------- critical batch


@pytest.mark.parametrize("rng_seed", range(5))
def test_critical_batch_recovers_known_b_crit_under_noise(rng_seed):
    batch = np.array(BATCHES, dtype=float)
    noise = np.random.default_rng(rng_seed).uniform(-0.03, 0.03, batch.size)
    fit = fit_critical_batch(batch, (S_MIN + E_MIN / batch) * (1 + noise))
    assert fit.reason == "" and fit.bound == ""
    assert fit.b_crit == pytest.approx(64, rel=0.05)
    assert fit.s_min == pytest.approx(S_MIN, rel=0.05)


def test_critical_batch_of_mlperf_resnet50_is_tens_of_thousands():
    epochs = {1632: 35.0, 3264: 35.2, 8192: 42.0, 32768: 56.0, 65536: 84.5}
    batch = np.array(list(epochs), dtype=float)
    steps = np.array(list(epochs.values())) * 1_281_167 / batch
    fit = fit_critical_batch(batch, steps)
    assert 10_000 <= fit.b_crit < 100_000


def test_steps_exactly_like_one_over_b_give_a_bound_above_not_a_round_off_number():
    """S ∝ 1/B: the intercept is round-off (|S_min| ~ 1e-14, once read as B_crit ≈ 5e18)."""
    batch = np.array(BATCHES, dtype=float)
    assert abs(float(fit_lines(batch, 6400 / batch).s_min)) < 1e-9  # what the guard is for
    fit = fit_critical_batch(batch, 6400 / batch)
    assert (fit.bound, fit.bound_batch) == ("above", 1024)
    assert fit.reason == "steps still fall like 1/B up to 1,024: B_crit is above 1,024"
    assert math.isnan(fit.b_crit) and math.isnan(fit.s_min) and math.isnan(fit.e_min)
    falling = fit_critical_batch([2, 4, 8, 16], 1000 / np.array([2, 4, 8, 16]) - 10)
    assert (falling.bound, falling.bound_batch) == ("above", 16)
    assert "above 16" in falling.reason


def test_exactly_flat_steps_give_a_bound_below():
    batch = np.array(BATCHES, dtype=float)
    fit = fit_critical_batch(batch, np.full(batch.size, 40.0))
    assert (fit.bound, fit.bound_batch) == ("below", 4)
    assert fit.reason == "no batch size saved steps: B_crit is below 4"
    assert math.isnan(fit.b_crit)
    rising = fit_critical_batch([2, 4, 8, 16], [50, 52, 55, 60])
    assert rising.bound == "below" and "below 2" in rising.reason


@pytest.mark.parametrize("rng_seed", range(8))
def test_flat_steps_with_three_percent_noise_are_below_never_a_tiny_number(rng_seed):
    """Once B_crit ≈ 0.026 (R² 0.03); the fit must say "below 4" instead."""
    batch = np.array(BATCHES, dtype=float)
    noise = np.random.default_rng(rng_seed).uniform(-0.03, 0.03, batch.size)
    fit = fit_critical_batch(batch, 40.0 * (1 + noise))
    assert (fit.bound, fit.bound_batch) == ("below", 4)
    assert math.isnan(fit.b_crit) and "B_crit is below 4" in fit.reason


def test_steps_that_fall_but_not_clearly_give_no_bound_at_all():
    """Medians of a real user's run (8, 32, 128 → 105, 60, 40 steps): E_min is 6.0 standard
    errors from zero, short of the 6.3 three points need. Saying "no batch size saved steps:
    below 8" would contradict the steps themselves; the fit gives neither number nor bound."""
    fit = fit_critical_batch([8, 32, 128], [105, 60, 40])
    assert fit.bound == "" and math.isnan(fit.b_crit)
    assert "fall from 108 at batch 8 to 42 at 128" in fit.reason
    assert "not clear" in fit.reason and "below" not in fit.reason


def test_b_crit_far_outside_the_measured_range_is_a_bound():
    small = np.array([4, 8, 16, 32, 64], dtype=float)
    far_above = fit_critical_batch(small, 100 + 100 * 640 / small)  # B_crit 640, 10× past 64
    assert (far_above.bound, far_above.bound_batch) == ("above", 64)
    assert "near 640" in far_above.reason and "above 64" in far_above.reason
    large = np.array([16, 32, 64, 128, 256, 512, 1024], dtype=float)
    far_below = fit_critical_batch(large, 100 + 50 / large)  # B_crit 0.5, 1/32 of 16
    assert (far_below.bound, far_below.bound_batch) == ("below", 16)
    assert math.isnan(far_below.b_crit)


def test_range_factor_widens_the_range_a_number_may_lie_in():
    small = np.array([4, 8, 16, 32, 64], dtype=float)
    steps = 100 + 100 * 200 / small  # B_crit 200: past 2 × 64, within 4 × 64
    assert fit_critical_batch(small, steps, range_factor=2.0).bound == "above"
    wider = fit_critical_batch(small, steps, range_factor=4.0)
    assert wider.bound == "" and wider.b_crit == pytest.approx(200)


def test_critical_batch_edge_cases_say_why_in_words():
    one = fit_critical_batch([64, 64], [300, 320])
    assert math.isnan(one.b_crit) and one.bound == ""
    assert one.reason.startswith("one batch size measured (64)")
    two = fit_critical_batch([4, 8, 16, 32], [100, 60, math.nan, math.nan])
    assert two.reason == (
        "only 2 of 4 batch sizes reached the target (4, 8): B_crit needs 3 or more"
    )
    none = fit_critical_batch([4, 8, 16], [math.nan, -3, math.nan])
    assert none.reason == "no batch size reached the target (of 3 run): no steps to fit"


def test_steps_that_scatter_wildly_give_neither_number_nor_bound():
    fit = fit_critical_batch([4, 8, 16, 32, 64], [100, 20, 300, 30, 200])
    assert math.isnan(fit.b_crit) and fit.bound == ""
    assert fit.reason.startswith("the steps scatter too much (±86% about the fit)")


def test_steps_that_clearly_fall_over_three_batches_are_not_called_scatter():
    """130, 60, 30 steps at batch 8, 32, 128: neither S_min nor E_min clears the 6.3 standard
    errors three points need, but the steps fell fourfold, and the reason says so."""
    fit = fit_critical_batch([8, 32, 128], [130, 60, 30])
    assert math.isnan(fit.b_crit) and fit.bound == ""
    assert fit.reason.startswith("the fitted steps fall from 137 at batch 8 to 31 at 128, but "
                                 "with 3 batch sizes and ±14% scatter about the fit neither")
    assert "(6.3 needed); more batch sizes or seeds would tell" in fit.reason
    assert "scatter too much" not in fit.reason


def test_every_trial_diverged_says_so():
    runs = pd.DataFrame(
        [run_row(b, "linear", 0.1, s, 500, status="diverged") for b in BATCHES for s in (0, 1)]
    )
    table = steps_to_result(runs)
    fit = fit_critical_batch(table["batch_size"], table["steps_to_target"])
    assert math.isnan(fit.b_crit) and fit.reason.startswith("no batch size reached the target")
    summary = analyze(None, runs, None, AnalysisConfig(bootstrap_samples=20)).summary
    critical = summary.critical_batch["linear"]
    assert math.isnan(critical.b_crit) and "every trial diverged" in critical.reason



def test_a_fit_that_asks_for_more_batch_sizes_names_those_that_ran_and_were_lost():
    """Three batch sizes reached with steps too few to pin a fit; three smaller ones ran and
    diverged or stalled. "More batch sizes would tell" alone would send the user to run more,
    where the lost ones need a lower learning rate or a longer budget: the reason names them
    and how their trials ended (a user's run of their own regression model, 2026-12-07)."""
    reached = [run_row(b, "sqrt", 0.1, s, n) for b, steps in ((64, (140, 220)),
               (128, (70, 100)), (256, (60, 60))) for s, n in enumerate(steps)]
    lost = [run_row(b, "sqrt", 0.02, s, 300, status="diverged") for b in (8, 16)
            for s in (0, 1)]
    stalled = [{**run_row(32, "sqrt", 0.05, s, 1000, status="not_reached"),
                "stop_reason": "stalled: no target metric improved in 50 evaluations in a row"}
               for s in (0, 1)]
    runs = pd.DataFrame(reached + lost + stalled)
    critical = analyze(None, runs, None, AnalysisConfig(bootstrap_samples=20)).summary
    reason = critical.critical_batch["sqrt"].reason
    assert math.isnan(critical.critical_batch["sqrt"].b_crit)
    assert "more batch sizes or seeds would tell" in reason
    assert reason.endswith("; batch sizes 8, 16 and 32 ran but their median did not reach the "
                           "target; of the trials that stopped short, 2 stalled "
                           "(convergence.patience_evals), 4 diverged")
    every_one_reached = pd.DataFrame(reached)
    alone = analyze(None, every_one_reached, None, AnalysisConfig(bootstrap_samples=20))
    assert "ran but their median" not in alone.summary.critical_batch["sqrt"].reason

# --------------------------------------------------------------------------- its interval


def test_bootstrap_interval_contains_point_estimate():
    runs = make_runs(seeds=(0, 1, 2), noise=0.08)
    table = steps_to_result(runs)
    linear = table[table["lr_rule"] == "linear"]
    point = fit_critical_batch(linear["batch_size"], linear["steps_to_target"]).b_crit
    low, high = bootstrap_critical_batch(runs, "linear", n=100, seed=1)
    assert low <= point <= high
    assert low < high
    assert interval_note(runs, "linear", (low, high)) == ""


def test_whole_epoch_steps_that_tie_across_seeds_still_give_a_real_interval():
    """Every seed has the same steps (whole epochs): resampling seeds changes nothing, so a
    seed-only bootstrap collapses to the point; the residuals of the fit still show scatter."""
    wobble = {4: 0.04, 8: -0.04, 16: 0.0, 32: 0.04, 64: -0.04, 128: 0.0, 256: 0.04, 512: -0.04,
              1024: 0.0}
    rows = [
        run_row(b, "linear", 0.1, seed, round((S_MIN + E_MIN / b) * (1 + wobble[b])))
        for b in BATCHES
        for seed in range(3)
    ]
    runs = pd.DataFrame(rows)
    table = steps_to_result(runs)
    point = fit_critical_batch(table["batch_size"], table["steps_to_target"]).b_crit
    low, high = bootstrap_critical_batch(runs, "linear", n=200)
    assert low < 0.97 * point and high > 1.03 * point
    assert 40 < low and high < 100  # and not absurdly wide: ±4 % scatter, nine batch sizes


def test_a_bound_has_no_interval_and_the_note_says_why():
    """B_crit = 640 measured at B ≤ 64 with 10 % noise: a bound, so no interval (the bound is
    the whole statement), in the summary and the rows too."""
    rng = np.random.default_rng(3)
    rows = [
        run_row(b, "linear", 0.1, seed, round((10 + 6400 / b) * (1 + rng.uniform(-0.1, 0.1))))
        for b in (4, 8, 16, 32, 64)
        for seed in range(4)
    ]
    runs = pd.DataFrame(rows)
    low, high = bootstrap_critical_batch(runs, "linear", n=100)
    assert math.isnan(low) and math.isnan(high)
    note = interval_note(runs, "linear", (low, high))
    assert note.startswith("no interval without a number") and "above 64" in note
    result = analyze(None, runs, None, AnalysisConfig(bootstrap_samples=100))
    fit = result.summary.critical_batch["linear"]
    assert (fit.bound, fit.bound_batch) == ("above", 64)
    assert all(math.isnan(row["b_crit"]) and row["b_crit_bound"] == "above" for row in result.rows)


def test_perfect_scaling_with_noise_is_a_bound_without_interval():
    rng = np.random.default_rng(0)
    rows = [
        run_row(b, "linear", 0.1, seed, round(6400 / b * (1 + rng.uniform(-0.05, 0.05))))
        for b in (4, 8, 16, 32, 64)
        for seed in range(4)
    ]
    low, high = bootstrap_critical_batch(pd.DataFrame(rows), "linear", n=100)
    assert math.isnan(low) and math.isnan(high)


def test_interval_near_the_top_may_pass_the_largest_batch_but_is_cut_at_the_factor():
    """B_crit = 60 measured at 4 … 64 with 10 % noise: the interval runs past 64 (an
    extrapolation, said in the note) and stops at 2 × 64."""
    rng = np.random.default_rng(0)
    rows = [
        run_row(b, "linear", 0.1, seed, round((100 + 6000 / b) * np.exp(rng.normal(0, 0.1))))
        for b in (4, 8, 16, 32, 64)
        for seed in range(3)
    ]
    runs = pd.DataFrame(rows)
    low, high = bootstrap_critical_batch(runs, "linear", n=200)
    assert 4 <= low < 60 < high == 128
    assert interval_note(runs, "linear", (low, high)) == (
        "its top is cut at 128, 2× the largest batch measured: B_crit may lie higher"
    )
    low, high = bootstrap_critical_batch(runs, "linear", n=200, range_factor=4.0)
    assert 128 < high <= 256


def test_interval_note_for_ends_past_the_measured_batches():
    runs = make_runs(seeds=(0, 1, 2))
    assert interval_note(runs, "linear", (3.0, 1500.0)) == (
        "its bottom (3) is below the smallest batch measured (4): an extrapolation; its top"
        " (1,500) is past the largest batch measured (1,024): an extrapolation"
    )
    assert "bottom is cut at 2" in interval_note(runs, "linear", (2.0, 100.0))


def test_one_seed_per_batch_gets_the_interval_of_the_fits_residuals():
    """No seeds to resample: Fieller's interval alone, and the note says which kind it is."""
    runs = make_runs(seeds=(0,))
    low, high = bootstrap_critical_batch(runs, "linear", n=20)
    table = steps_to_result(runs[runs["lr_rule"] == "linear"], by=())
    batch, steps = table["batch_size"].to_numpy(float), table["steps_to_target"].to_numpy(float)
    expected = fieller_interval(fit_lines(batch, steps), BOOTSTRAP_CONFIDENCE)
    assert (low, high) == pytest.approx(expected)
    assert low <= fit_critical_batch(batch, steps).b_crit <= high
    assert interval_note(runs, "linear", (low, high)).startswith(
        "one run per batch size: the interval is read from the fit's residuals")


def test_fieller_interval_is_where_the_ratio_test_accepts():
    """Inside: |E_min − B·S_min| ≤ t·se(E_min − B·S_min); at the ends, equality."""
    batch = np.array(BATCHES, dtype=float)
    noise = np.exp(np.random.default_rng(1).normal(0, 0.1, batch.size))
    fits = fit_lines(batch, (S_MIN + E_MIN / batch) * noise)
    low, high = fieller_interval(fits, 0.9)
    t = t_quantile(0.95, int(fits.dof))

    def statistic(b):
        spread = fits.var_e - 2 * b * fits.cov_se + b * b * fits.var_s
        return float(abs(fits.e_min - b * fits.s_min) / np.sqrt(spread))

    assert 0 < low < float(fits.e_min / fits.s_min) < high < math.inf
    assert statistic(low) == pytest.approx(t) and statistic(high) == pytest.approx(t)
    assert statistic(0.9 * low) > t and statistic(1.1 * high) > t
    unbounded = fieller_interval(fit_lines(batch, 6400 / batch * noise), 0.9)
    assert unbounded[1] == math.inf


def test_t_quantile_matches_student_t_tables():
    # Two-sided 90 % (one-sided 95 %) critical values of Student's t, from any table.
    for dof, table in ((1, 6.314), (2, 2.920), (3, 2.353), (5, 2.015), (7, 1.895), (30, 1.697)):
        assert t_quantile(0.95, dof) == pytest.approx(table, abs=2e-3)


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
