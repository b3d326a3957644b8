"""Known-answer tests of `analyze` on tiny inline tables: the analysis rows, the typed summary,
the metrics and the Markdown. The table builders here are shared by the other analysis tests."""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pandas as pd
import pytest

from batchscale import schemas
from batchscale.analysis.analyze import analyze
from batchscale.config import AnalysisConfig

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


def run_row(
    batch, rule, lr, seed, steps, *, status="reached", workers=1, time=None, b_simple=None,
    step_time=1e-3,
):
    """One convergence trial; `step_time`: its train seconds per step."""
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
        "time_to_target_s": (time if time is not None else steps * step_time) if reached else None,
        "b_simple": b_simple,
        "train_time_s": steps * step_time,
    }


def sweep_line(alpha: float = 1e-3, beta: float = 2e-6):
    """Seconds per step t(B) = α + βB (make_sweep's default line)."""
    return lambda batch: alpha + beta * batch


DEFAULT_LINE = sweep_line()


def make_runs(
    rules=("linear", "sqrt"), seeds=(0, 1, 2), noise=0.03, rng_seed=0, step_time=DEFAULT_LINE
):
    """Trials following S = k·(S_min + E_min/B) with multiplicative noise, two LRs per batch;
    each trains at `step_time(B)` seconds per step (by default make_sweep's own line, so the
    convergence runs and the sweep agree)."""
    rng = np.random.default_rng(rng_seed)
    rows = []
    for k, rule in zip((1.0, 1.3), rules, strict=False):
        for batch in BATCHES:
            for lr, penalty in ((0.1, 1.0), (0.05, 1.25)):
                for seed in seeds:
                    jitter = 1 + rng.uniform(-noise, noise)
                    steps = round(k * penalty * (S_MIN + E_MIN / batch) * jitter)
                    rows.append(
                        run_row(
                            batch, rule, lr, seed, steps, b_simple=50.0 + seed,
                            step_time=step_time(batch),
                        )
                    )
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


# --------------------------------------------------------------------------- analyze


def test_analyze_recommends_on_a_hand_made_experiment():
    """Fixed step overhead 10 ms + 0.1 ms/sample and B_crit = 64: B* = sqrt(0.01·64/1e-4) = 80."""
    sweep = make_sweep(alpha=1e-2, beta=1e-4, batches=(4, 16, 64, 256, 1024))
    runs = make_runs(noise=0.0, step_time=sweep_line(1e-2, 1e-4))
    result = analyze(sweep, runs, make_curves(runs), AnalysisConfig(bootstrap_samples=20))
    summary = result.summary
    assert summary.recommendation.batch_size == 64  # among 4 … 1024, the closest to B* = 80
    assert summary.recommendation.lr_rule == "linear"
    assert summary.recommendation.workers == 1
    assert summary.critical_batch["linear"].b_crit == pytest.approx(64, rel=0.02)
    assert summary.critical_batch["linear"].optimal_batch == pytest.approx(80, rel=0.02)
    assert summary.step_time.alpha_s == pytest.approx(1e-2)
    assert "Batch size: 64" in result.markdown


def test_a_b_star_held_at_the_largest_batch_is_a_bound_not_a_degenerate_interval():
    """A nearly flat step time (β tiny against α) puts sqrt(α·B_crit/β) far past the largest
    batch measured: B* is held there, and that is said and stored as a bound, never as
    "1,024 [1,024, 1,024]"; an uncapped B* keeps its interval in the metrics."""
    sweep = make_sweep(alpha=1e-3, beta=1e-9, batches=(4, 16, 64, 256, 1024))
    runs = make_runs(noise=0.0, step_time=sweep_line(1e-3, 1e-9))
    result = analyze(sweep, runs, make_curves(runs), AnalysisConfig(bootstrap_samples=20))
    summary = result.summary
    cap = summary.optimal_batch_cap
    assert summary.critical_batch["linear"].optimal_batch == cap
    assert "the model optimum sqrt(α·B_crit/β) is at or above 1,024, the largest batch it may " \
           "take here" in result.markdown
    assert f"[{cap:,.0f}, {cap:,.0f}]" not in result.markdown
    metrics = summary.metrics()
    assert metrics["optimal_batch_linear_above"] == cap and "optimal_batch_linear" not in metrics

    sweep = make_sweep(alpha=1e-2, beta=1e-4, batches=(4, 16, 64, 256, 1024))
    runs = make_runs(noise=0.03, step_time=sweep_line(1e-2, 1e-4))
    metrics = analyze(sweep, runs, make_curves(runs),
                      AnalysisConfig(bootstrap_samples=50)).summary.metrics()
    assert metrics["optimal_batch_low_linear"] < metrics["optimal_batch_linear"] \
        < metrics["optimal_batch_high_linear"]
    assert "optimal_batch_linear_above" not in metrics

    # A line through two timed batches leaves the interval open: no end is stored as 0.
    runs = make_runs(noise=0.03)
    result = analyze(make_sweep(batches=(4, 1024)), runs, make_curves(runs),
                     AnalysisConfig(bootstrap_samples=50))
    metrics = result.summary.metrics()
    assert metrics["optimal_batch_linear"] > 0
    assert "optimal_batch_low_linear" not in metrics
    # and the text says which of the two is open, and what would close it
    assert ("(interval open: the step-time line through two batch sizes does not pin α/β: "
            "time a third batch size)") in result.markdown


def test_where_the_input_pipeline_is_a_bottleneck_b_star_is_on_real_inputs_line():
    """Reading costs 4 µs per example against the device's 0.1 µs: on the device's line
    sqrt(α·B_crit/β) is 800, on real input's (what a trial without loader workers pays) 126.
    B* takes the real-input line and says so; where reading costs 20 % (make_sweep's real rows
    at 1.2×) it stays on the device's."""
    batches = (4, 16, 64, 256, 1024)
    sweep = pd.DataFrame(
        [sweep_row(b, 1e-3 + 1e-7 * b, memory=int(5e7 + 1e5 * b)) for b in batches]
        + [sweep_row(b, 1e-3 + 4e-6 * b, mode="real") for b in batches])
    runs = make_runs(noise=0.0, step_time=sweep_line(1e-3, 4e-6))
    result = analyze(sweep, runs, make_curves(runs), AnalysisConfig(bootstrap_samples=20))
    summary = result.summary
    assert summary.throughput.input_bottleneck
    assert summary.critical_batch["linear"].optimal_batch == pytest.approx(126, rel=0.03)
    assert summary.step_time.beta_s == pytest.approx(1e-7)  # t(B) is still the device's
    # the line B* sits on, which a study's B* per target reads too
    assert summary.optimal_batch_step_time == pytest.approx((1e-3, 4e-6))
    assert "With real input's step time (the input pipeline is a bottleneck" in result.markdown
    assert "with real input's step time" in summary.recommendation.batch_reason

    plain = analyze(make_sweep(), runs, make_curves(runs), AnalysisConfig(bootstrap_samples=20))
    assert not plain.summary.throughput.input_bottleneck
    assert plain.summary.optimal_batch_line == ""
    assert "real input's step time" not in plain.markdown


def test_analyze_rows_match_the_analysis_schema():
    runs = make_runs()
    result = analyze(make_sweep(), runs, make_curves(runs), AnalysisConfig(bootstrap_samples=20))
    assert len(result.rows) == 2 * len(BATCHES)
    assert all(list(row) == schemas.ANALYSIS.names for row in result.rows)
    env = {field.name: "x" if field.type == "string" else 1 for field in schemas.ENV_FIELDS}
    table = schemas.make_table("analysis", result.rows, env)
    assert table.num_rows == len(result.rows)
    assert all(math.isfinite(v) for v in result.metrics.values())
    assert result.metrics["b_crit_linear"] == pytest.approx(64, rel=0.1)
    assert result.summary.throughput.saturation_batch == result.rows[0]["saturation_batch"]
    json.dumps(dataclasses.asdict(result.summary))  # plain Python values only


def test_analyze_says_plainly_when_the_device_is_saturated_at_small_batch():
    sweep = pd.DataFrame([sweep_row(b, b * 1e-4) for b in (8, 16, 32, 64)])  # samples/s flat
    result = analyze(sweep, make_runs(seeds=(0,)), None, AnalysisConfig(bootstrap_samples=10))
    assert result.summary.throughput.saturation_batch == 8
    assert result.summary.throughput.saturated_at_smallest_batch
    assert "already saturated at batch 8" in result.markdown


# --------------------------------------------------------------------------- missing pieces


def test_analyze_with_nothing_gives_nan_and_reasons():
    result = analyze(None, None, None)
    assert result.rows == []
    assert result.summary.throughput.saturation_batch is None
    assert result.summary.recommendation.batch_size is None
    assert "no trial reached" in result.summary.recommendation.batch_reason
    assert math.isnan(result.summary.noise_scale.b_simple_median)
    assert "Not measured" in result.markdown


def test_analyze_with_unreached_rule_oom_sweep_and_single_seed():
    sweep = pd.DataFrame([sweep_row(b, None, status="oom") for b in (256, 1024)])
    runs = pd.concat(
        [
            make_runs(rules=("linear",), seeds=(0,)),
            pd.DataFrame([run_row(b, "sqrt", 0.1, 0, 3000, status="diverged") for b in BATCHES]),
        ]
    )
    result = analyze(sweep, runs, pd.DataFrame(), AnalysisConfig(bootstrap_samples=20))
    critical = result.summary.critical_batch
    assert math.isfinite(critical["linear"].b_crit)
    fit = critical["linear"]
    assert fit.b_crit_low <= fit.b_crit <= fit.b_crit_high
    assert fit.interval_note.startswith("one run per batch size")
    # The reader sees which kind of interval it is, beside it.
    assert f"; {fit.interval_note})" in result.markdown
    assert math.isnan(critical["sqrt"].b_crit) and critical["sqrt"].reason
    sqrt_rows = [row for row in result.rows if row["lr_rule"] == "sqrt"]
    assert all(math.isnan(row["steps_to_target"]) and row["regime"] is None for row in sqrt_rows)
    assert "convergence runs" in result.summary.step_time.source
    assert result.summary.recommendation.lr_rule == "linear"
    assert "ran out of memory" in result.markdown


# ---------------------------------------------------------------------- B_crit: number or bound


PAST_B_CRIT = "Past B_crit each doubling"
ENV = {field.name: "x" if field.type == "string" else 1 for field in schemas.ENV_FIELDS}


def runs_following(steps_of, *, batches=BATCHES, seeds=(0, 1), noise=0.0, status="reached"):
    """One LR rule (linear), steps_of(B) with multiplicative noise, trained at the sweep's line."""
    rng = np.random.default_rng(7)
    line = sweep_line()
    return pd.DataFrame(
        [
            run_row(
                b, "linear", 0.1, seed,
                max(1, round(steps_of(b) * (1 + rng.uniform(-noise, noise)))),
                status=status, step_time=line(b),
            )
            for b in batches
            for seed in seeds
        ]
    )


def analyze_runs(runs):
    return analyze(make_sweep(), runs, None, AnalysisConfig(bootstrap_samples=50))


def assert_bound_everywhere(result, bound: str, batch: int, words: str):
    """The bound in the summary, every table row, the metrics and the narrative; no number."""
    fit = result.summary.critical_batch["linear"]
    assert (fit.bound, fit.bound_batch) == (bound, batch)
    assert math.isnan(fit.b_crit) and math.isnan(fit.s_min) and math.isnan(fit.e_min)
    for row in result.rows:
        assert (row["b_crit_bound"], row["b_crit_bound_batch"]) == (bound, batch)
        assert math.isnan(row["b_crit"]) and math.isnan(row["s_min"])
    assert result.metrics[f"b_crit_linear_{bound}"] == batch
    assert not any(name.startswith(("b_crit_linear", "s_min", "e_min", "optimal_batch"))
                   and not name.endswith(bound) for name in result.metrics)
    assert f"B_crit {words}" in result.markdown
    assert PAST_B_CRIT not in result.markdown
    table = schemas.make_table("analysis", result.rows, ENV)
    assert table.column("b_crit_bound").to_pylist() == [bound] * len(result.rows)


def test_exact_perfect_scaling_reports_a_bound_above_the_largest_batch():
    """S = 65536/B exactly: S_min is round-off; B_crit is "above 1,024", never a number."""
    result = analyze_runs(runs_following(lambda b: 65536 / b))
    assert_bound_everywhere(result, "above", 1024, "above 1,024: steps still fall like 1/B")
    assert {row["regime"] for row in result.rows} == {"perfect_scaling"}


@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_flat_steps_report_a_bound_below_the_smallest_batch(noise):
    """S = 500 at every batch (exactly, or with 3 % noise): no batch size saved steps."""
    result = analyze_runs(runs_following(lambda b: 500, noise=noise))
    assert_bound_everywhere(result, "below", 4, "below 4: no batch size saved steps")


def test_a_supported_b_crit_is_a_number_with_no_bound():
    result = analyze_runs(runs_following(lambda b: S_MIN + E_MIN / b, seeds=(0, 1, 2), noise=0.03))
    fit = result.summary.critical_batch["linear"]
    assert fit.bound == "" and fit.b_crit == pytest.approx(64, rel=0.15)
    assert all(row["b_crit_bound"] is None and math.isnan(row["b_crit_bound_batch"])
               for row in result.rows)
    assert all(-1 <= row["fit_slope"] <= 0 for row in result.rows)
    assert result.metrics["b_crit_linear"] == pytest.approx(fit.b_crit)
    assert PAST_B_CRIT in result.markdown


@pytest.mark.parametrize(
    ("runs", "words"),
    [
        (runs_following(lambda b: 500, batches=[64]),
         "one batch size measured (64): B_crit needs steps to target at 3 or more batch sizes"),
        (pd.concat([runs_following(lambda b: 6400 / b, batches=[4, 8]),
                    runs_following(lambda b: 90, batches=[16, 32], status="not_reached")]),
         "only 2 of 4 batch sizes reached the target (4, 8): B_crit needs 3 or more"),
        (runs_following(lambda b: 100, status="diverged"),
         "every trial diverged (18 trials at 9 batch sizes)"),
        (pd.concat([runs_following(lambda b: 6400 / b, batches=[4, 8]),
                    runs_following(lambda b: 90, batches=[16, 32], seeds=(0,)),
                    runs_following(lambda b: 90, batches=[16, 32], seeds=(1,),
                                   status="not_reached").assign(
                        stop_reason=["stalled: no target metric improved …",
                                     "ran convergence.max_steps (90 steps) …"])]),
         "only 2 of 4 batch sizes reached the target (4, 8): B_crit needs 3 or more; some trials"
         " reached it at 16 in 1 of 2 trials and 32 in 1 of 2 trials, too few to count: S(B) is"
         " the median over the seeds at a learning rate, so a batch size counts once more than"
         " half of its seeds at one learning rate reach the target; of the trials that stopped"
         " short, 1 stalled (convergence.patience_evals), 1 ran out of steps"
         " (convergence.max_steps)"),
    ],
    ids=["one-batch-size", "two-reached", "all-diverged", "half-the-seeds-reached"],
)
def test_edge_cases_say_why_there_is_no_b_crit(runs, words):
    result = analyze_runs(runs)
    fit = result.summary.critical_batch["linear"]
    assert math.isnan(fit.b_crit) and fit.bound == ""
    assert words in fit.reason
    assert f"B_crit not estimated: {words}" in result.markdown
    assert PAST_B_CRIT not in result.markdown
    assert not any(name.startswith("b_crit") for name in result.metrics)
    assert all(math.isnan(row["b_crit"]) and row["b_crit_bound"] is None for row in result.rows)
    # the table says why, so a summary read from the lake can too
    assert all(words in row["b_crit_reason"] for row in result.rows)


def test_every_trial_diverged_is_named_in_the_recommendation():
    result = analyze_runs(runs_following(lambda b: 100, status="diverged"))
    assert result.summary.recommendation.batch_size is None
    assert "every convergence trial diverged (18 trials)" in result.markdown
    # no worker count is recommended for trainings that reach nothing
    assert result.summary.recommendation.workers is None
    assert "**Workers: not answered** — no trial reached the target (above)." in result.markdown


def test_bound_and_edge_case_tables_pass_the_analysis_suite():
    """The expectations accept a bound (null b_crit, NaN where the suite says what NaN means)
    and bound every new column."""
    from batchscale.checks.validate import validate_table

    for runs in (runs_following(lambda b: 65536 / b), runs_following(lambda b: 500, noise=0.03),
                 runs_following(lambda b: 500, batches=[64])):
        table = schemas.make_table("analysis", analyze_runs(runs).rows, ENV)
        report = validate_table("analysis", table)
        assert report.success, report.failure_message()
