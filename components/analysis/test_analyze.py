"""Known-answer tests of the analysis fits, regimes and recommendation on tiny inline tables."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from batchscale import schemas

from .analyze import (
    DIMINISHING_RETURNS,
    MAXIMAL_DATA_PARALLELISM,
    PERFECT_SCALING,
    analyze,
    bootstrap_critical_batch,
    data_parallel_efficiency,
    final_b_simple,
    fit_critical_batch,
    fit_memory,
    fit_step_time,
    optimal_batch,
    recommend,
    regimes,
    saturation_batch,
    step_times,
    steps_to_result,
    time_to_target,
)

S_MIN, E_MIN = 100.0, 6400.0  # B_crit = 64
BATCHES = [4, 8, 16, 32, 64, 128, 256, 512, 1024]


def sweep_row(batch: int, step_time: float | None, *, mode="synthetic", status="ok", memory=None):
    return {
        "input_mode": mode,
        "batch_size": batch,
        "status": status,
        "step_time_median_s": step_time,
        "samples_per_s": batch / step_time if step_time else None,
        "peak_memory_bytes": memory,
    }


def make_sweep(alpha: float = 1e-3, beta: float = 2e-6, batches=(1, 4, 16, 64, 256, 1024)):
    rows = [sweep_row(b, alpha + beta * b, memory=int(5e7 + 1e5 * b)) for b in batches] + [
        sweep_row(b, 1.2 * (alpha + beta * b), mode="real") for b in batches
    ]
    rows.append(sweep_row(2 * max(batches), None, status="oom"))
    return pd.DataFrame(rows)


def run_row(batch, rule, lr, seed, steps, *, status="reached", workers=1, time=None, b_simple=None):
    reached = status == "reached"
    return {
        "trial_id": f"{rule}-{batch}-{lr}-{seed}-{workers}",
        "batch_size": batch,
        "lr_rule": rule,
        "lr": lr,
        "seed": seed,
        "workers": workers,
        "status": status,
        "steps_run": steps,
        "steps_to_target": steps if reached else None,
        "examples_to_target": steps * batch if reached else None,
        "time_to_target_s": (time if time is not None else steps * 1e-3) if reached else None,
        "b_simple": b_simple,
        "train_time_s": steps * 1e-3,
    }


def make_runs(rules=("linear", "sqrt"), seeds=(0, 1, 2), noise=0.03, rng_seed=0):
    """Trials following S = k·(S_min + E_min/B) with multiplicative noise, two LRs per batch."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for k, rule in zip((1.0, 1.3), rules, strict=False):
        for batch in BATCHES:
            for lr, penalty in ((0.1, 1.0), (0.05, 1.25)):
                for seed in seeds:
                    jitter = 1 + rng.uniform(-noise, noise)
                    steps = round(k * penalty * (S_MIN + E_MIN / batch) * jitter)
                    rows.append(run_row(batch, rule, lr, seed, steps, b_simple=50.0 + seed))
    return pd.DataFrame(rows)


def make_curves(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for trial in runs.itertuples():
        for step in range(0, trial.steps_run + 1, max(1, trial.steps_run // 4)):
            rows.append(
                {
                    "trial_id": trial.trial_id,
                    "batch_size": trial.batch_size,
                    "lr_rule": trial.lr_rule,
                    "seed": trial.seed,
                    "step": step,
                    "examples_seen": step * trial.batch_size,
                    "train_time_s": step * 1e-3,
                    "train_loss": 1.0,
                    "val_accuracy": 0.5,
                    "lr": trial.lr,
                    "b_simple": 10.0 + step,
                }
            )
    return pd.DataFrame(rows)


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
    result = analyze(None, runs, None, bootstrap_samples=100)
    fit = result.summary["critical_batch"]["linear"]
    assert "past the largest batch" in fit["interval_note"]
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
    result = analyze(None, runs, None, bootstrap_samples=100)
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


# --------------------------------------------------------------------------- throughput


def test_saturation_batch_on_constructed_curve():
    throughput = {1: 100, 2: 190, 4: 350, 8: 600, 16: 905, 32: 980, 64: 1000, 128: 995}
    rows = [sweep_row(b, b / s) for b, s in throughput.items()]
    rows += [sweep_row(256, None, status="oom"), sweep_row(8, 8 / 5000, mode="real")]
    sweep = pd.DataFrame(rows)
    assert saturation_batch(sweep) == 16
    assert saturation_batch(sweep, tolerance=0.05) == 32
    assert saturation_batch(sweep, input_mode="real") == 8
    assert saturation_batch(pd.DataFrame([sweep_row(4, None, status="oom")])) is None


def test_fit_step_time_recovers_line():
    batch = np.array([1, 4, 16, 64, 256])
    fit = fit_step_time(batch, 0.002 + 1e-5 * batch)
    assert fit.alpha_s == pytest.approx(0.002)
    assert fit.beta_s == pytest.approx(1e-5)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.predict(128) == pytest.approx(0.002 + 1e-5 * 128)
    assert math.isnan(fit_step_time([4], [0.1]).alpha_s)


def test_fit_memory_predicts_largest_batch_under_budget():
    batch = np.array([1, 4, 16, 64])
    fit = fit_memory(batch, 1000 + 10 * batch, budget_bytes=2005)
    assert (fit.fixed_bytes, fit.per_sample_bytes) == pytest.approx((1000, 10))
    assert fit.b_max == 100
    assert "budget" in fit_memory(batch, 1000 + 10 * batch).reason
    assert math.isnan(fit_memory(batch, [5, 5, 5, 5], budget_bytes=10).b_max)


def test_step_times_use_measurements_and_the_line_elsewhere():
    sweep = make_sweep(alpha=1e-3, beta=1e-5, batches=(16, 64, 256))
    times, fit, source = step_times(sweep, pd.DataFrame(), [16, 32, 1024])
    assert "synthetic" in source
    assert times == pytest.approx([1e-3 + 16e-5, 1e-3 + 32e-5, 1e-3 + 1024e-5])
    assert fit.beta_s == pytest.approx(1e-5)


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


# --------------------------------------------------------------------------- noise scale, DP


def test_final_b_simple_prefers_runs_then_curves():
    runs = pd.DataFrame([run_row(8, "linear", 0.1, 0, 40, b_simple=33.0)])
    runs = pd.concat([runs, pd.DataFrame([run_row(16, "linear", 0.1, 0, 32)])])
    curves = make_curves(runs)
    final = final_b_simple(runs, curves).set_index("trial_id")["b_simple"]
    assert final["linear-8-0.1-0-1"] == 33.0
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
    choice = recommend(obvious_table(), runs, {"linear": 80.0})
    assert (choice.batch_size, choice.lr_rule, choice.workers) == (64, "linear", 1)
    assert "1.44 s" in choice.batch_reason and "≈ 80" in choice.batch_reason
    assert "linear 120, sqrt 200" in choice.lr_rule_reason
    assert "only 1 worker" in choice.workers_reason


@pytest.mark.parametrize(("time_with_two", "expected"), [(0.5, 2), (3.0, 1)])
def test_recommend_more_workers_only_when_faster(time_with_two, expected):
    runs = pd.DataFrame(
        [
            run_row(64, "linear", 0.1, 0, 120, workers=1, time=1.0),
            run_row(64, "linear", 0.1, 0, 120, workers=2, time=time_with_two),
        ]
    )
    assert recommend(obvious_table(), runs).workers == expected


def test_analyze_recommends_on_a_hand_made_experiment():
    """Fixed step overhead 10 ms + 0.1 ms/sample and B_crit = 64: B* = sqrt(0.01·64/1e-4) = 80."""
    sweep = make_sweep(alpha=1e-2, beta=1e-4, batches=(4, 16, 64, 256, 1024))
    runs = make_runs(noise=0.0)
    result = analyze(sweep, runs, make_curves(runs), bootstrap_samples=20)
    summary = result.summary
    assert summary["recommended_batch_size"] == 64  # among 4 … 1024, the closest to B* = 80
    assert summary["recommended_lr_rule"] == "linear"
    assert summary["recommended_workers"] == 1
    assert summary["critical_batch"]["linear"]["b_crit"] == pytest.approx(64, rel=0.02)
    assert summary["critical_batch"]["linear"]["optimal_batch"] == pytest.approx(80, rel=0.02)
    assert summary["step_time_alpha_s"] == pytest.approx(1e-2)
    assert "Batch size: 64" in result.markdown


def test_analyze_rows_match_the_analysis_schema():
    runs = make_runs()
    result = analyze(make_sweep(), runs, make_curves(runs), bootstrap_samples=20)
    assert len(result.rows) == 2 * len(BATCHES)
    assert all(list(row) == schemas.ANALYSIS.names for row in result.rows)
    env = {field.name: "x" if field.type == "string" else 1 for field in schemas.ENV_FIELDS}
    table = schemas.make_table("analysis", result.rows, env)
    assert table.num_rows == len(result.rows)
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert result.metrics["b_crit_linear"] == pytest.approx(64, rel=0.1)
    assert result.summary["saturation_batch"] == result.rows[0]["saturation_batch"]
    json.dumps(result.summary)  # plain Python values only, for the KFP component to write


def test_analyze_says_plainly_when_the_device_is_saturated_at_small_batch():
    sweep = pd.DataFrame([sweep_row(b, b * 1e-4) for b in (8, 16, 32, 64)])  # samples/s flat
    result = analyze(sweep, make_runs(seeds=(0,)), None, bootstrap_samples=10)
    assert result.summary["saturation_batch"] == 8
    assert result.summary["saturated_at_smallest_batch"]
    assert "already saturated at batch 8" in result.markdown


# --------------------------------------------------------------------------- missing pieces


def test_analyze_with_nothing_gives_nan_and_reasons():
    result = analyze(None, None, None)
    assert result.rows == []
    assert result.summary["saturation_batch"] is None
    assert result.summary["recommended_batch_size"] is None
    assert "no trial reached" in result.summary["recommended_batch_size_reason"]
    assert math.isnan(result.summary["b_simple_median"])
    assert "Not measured" in result.markdown


def test_analyze_with_unreached_rule_oom_sweep_and_single_seed():
    sweep = pd.DataFrame([sweep_row(b, None, status="oom") for b in (256, 1024)])
    runs = pd.concat(
        [
            make_runs(rules=("linear",), seeds=(0,)),
            pd.DataFrame([run_row(b, "sqrt", 0.1, 0, 3000, status="diverged") for b in BATCHES]),
        ]
    )
    result = analyze(sweep, runs, pd.DataFrame(), bootstrap_samples=20)
    critical = result.summary["critical_batch"]
    assert math.isfinite(critical["linear"]["b_crit"])
    assert math.isnan(critical["linear"]["b_crit_low"])
    assert "one seed" in critical["linear"]["interval_note"]
    assert math.isnan(critical["sqrt"]["b_crit"]) and critical["sqrt"]["reason"]
    sqrt_rows = [row for row in result.rows if row["lr_rule"] == "sqrt"]
    assert all(math.isnan(row["steps_to_target"]) and row["regime"] is None for row in sqrt_rows)
    assert "convergence runs" in result.summary["step_time_source"]
    assert result.summary["recommended_lr_rule"] == "linear"
    assert "ran out of memory" in result.markdown
