"""A sweep row's rerun interval (sweep/rounds.py, rerun_interval): the range of samples/s a
rerun of the row would report. Pure functions on known and simulated step times; how well it
predicts real reruns is measured in `make bench` (bench_sweep), not here."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from batchscale.sweep.cells import SweepCell, measured_columns, rerun_columns, sweep_floor
from batchscale.sweep.rounds import (
    MAX_RERUN_FACTOR,
    RERUN_LEVEL,
    combine,
    pooled_log_sd,
    rerun_interval,
)
from batchscale.sweep.summary import summary_lines
from batchscale.sweep.sweep import progress_line
from batchscale.timing import StepTimes


def trial(median_s: float, n: int = 9) -> StepTimes:
    """A trial whose steps all take `median_s` (its median, whatever n)."""
    return StepTimes((median_s,) * n)


def test_the_interval_holds_the_rows_median_and_widens_with_disagreement():
    close = combine([trial(0.010), trial(0.0102)])
    apart = combine([trial(0.010), trial(0.012)])
    for c in (close, apart):
        assert c.rerun_low_s < c.median_s < c.rerun_high_s
    assert apart.rerun_high_s / apart.rerun_low_s > close.rerun_high_s / close.rerun_low_s


def test_trials_that_agree_exactly_give_a_zero_width_interval():
    c = combine([trial(0.02), trial(0.02), trial(0.02)])
    assert c.rerun_low_s == c.rerun_high_s == pytest.approx(0.02)


def test_it_scales_with_the_step_time():
    base = rerun_interval([trial(0.010), trial(0.013)], 0.0115)
    scaled = rerun_interval([trial(0.030), trial(0.039)], 0.0345)
    assert scaled[0] == pytest.approx(3 * base[0])
    assert scaled[1] == pytest.approx(3 * base[1])


def test_more_trials_that_scatter_alike_narrow_it():
    """Four trials with the same spread as two: a smaller t quantile and more units averaged."""
    two = rerun_interval([trial(0.010), trial(0.012)], 0.011)
    four = rerun_interval([trial(0.010), trial(0.012), trial(0.010), trial(0.012)], 0.011)
    assert four[1] / four[0] < two[1] / two[0]


def test_a_lone_trial_is_split_into_its_halves():
    steps = StepTimes((0.010,) * 5 + (0.011,) * 5)
    low, high = rerun_interval([steps], steps.median_s)
    assert low < 0.010 and high > 0.011
    assert rerun_interval([StepTimes((0.01, 0.01, 0.01))], 0.01) is None


@pytest.mark.parametrize("units", [2, 3])
def test_it_covers_a_simulated_rerun_at_its_level(units):
    """Trial medians drawn log-normally; the rerun is `units` fresh trials combined as the row
    combines them (their median). With two units the median is the mean and the t interval is
    exact, so coverage must be the level; with three it is the median of three, close to it."""
    rng = random.Random(7)
    sims, covered = 4000, 0
    for _ in range(sims):
        draws = [math.exp(rng.gauss(math.log(0.01), 0.05)) for _ in range(2 * units)]
        row, rerun = draws[:units], statistics.median(draws[units:])
        low, high = rerun_interval([trial(m) for m in row], statistics.median(row))
        covered += low <= rerun <= high
    assert covered / sims == pytest.approx(RERUN_LEVEL, abs=0.03)


def _drifting_coverage(between_sweep_cv: float, drift_sd: float, sims: int = 4000) -> float:
    """Share of simulated next sweeps inside a row's interval when each sweep carries its own
    log-normal shift `drift_sd` (shared by its two trials) beside the trials' own 0.01."""
    rng = random.Random(11)
    covered = 0
    for _ in range(sims):
        sweeps = []
        for _ in range(2):
            shift = rng.gauss(0.0, drift_sd)
            sweeps.append([math.exp(math.log(0.01) + shift + rng.gauss(0.0, 0.01))
                           for _ in range(2)])
        row, rerun = sweeps[0], statistics.median(sweeps[1])
        low, high = rerun_interval([trial(m) for m in row], statistics.median(row),
                                   between_sweep_cv=between_sweep_cv)
        covered += low <= rerun <= high
    return covered / sims


def test_drift_between_sweeps_that_the_rounds_cannot_see_is_covered_once_it_is_known():
    """Trials of one sweep share its shift, so their spread misses it and the rounds alone
    under-cover the next sweep; with the drift given (sweep.between_sweep_cv) coverage is back
    at the level or above (the half-widths add in quadrature: the wider choice)."""
    assert _drifting_coverage(0.0, drift_sd=0.03) < RERUN_LEVEL - 0.1
    assert _drifting_coverage(0.03, drift_sd=0.03) >= RERUN_LEVEL - 0.01


def test_the_drift_gives_agreeing_trials_a_width_and_the_sweep_passes_its_setting_on():
    c = combine([trial(0.02), trial(0.02)], between_sweep_cv=0.02)
    assert c.rerun_high_s / c.rerun_low_s == pytest.approx(
        math.exp(2 * statistics.NormalDist().inv_cdf(0.95) * math.sqrt(2) * 0.02))
    cell = SweepCell("synthetic", 64, "listed", trials=[trial(0.02), trial(0.02)],
                     between_sweep_cv=0.02)
    assert (cell.combined().rerun_low_s, cell.combined().rerun_high_s) == (
        c.rerun_low_s, c.rerun_high_s)


def test_the_pooled_disagreement_is_the_rows_deviations_over_their_degrees_of_freedom():
    rows = [[trial(0.010), trial(0.011)], [trial(0.020), trial(0.020), trial(0.023)],
            [trial(0.5)]]  # a lone trial says nothing about disagreement
    logs = [[math.log(m) for m in (0.010, 0.011)], [math.log(m) for m in (0.020, 0.020, 0.023)]]
    squares = sum((x - statistics.fmean(r)) ** 2 for r in logs for x in r)
    assert pooled_log_sd(rows) == pytest.approx(math.sqrt(squares / 3))
    assert pooled_log_sd([[trial(0.01)]]) == 0.0


def test_trials_that_agree_by_luck_get_the_sweeps_disagreement_and_wider_ones_keep_theirs():
    floor = pooled_log_sd([[trial(0.010), trial(0.011)], [trial(0.020), trial(0.022)]])
    lucky = rerun_interval([trial(0.03), trial(0.03)], 0.03, floor_log_sd=floor)
    shifted = rerun_interval([trial(0.03), trial(0.03 * 1.1)], 0.03, floor_log_sd=0.0)
    assert lucky[1] / lucky[0] == pytest.approx(shifted[1] / shifted[0], rel=1e-3)
    wide = [trial(0.010), trial(0.014)]
    assert rerun_interval(wide, 0.012, floor_log_sd=floor) == rerun_interval(wide, 0.012)


def _sweep_coverage(floor: bool, sims: int = 1500) -> tuple[float, float]:
    """Coverage of the next sweep and the median interval ratio when a sweep's four rows share
    their trials' noise (log-normal, 0.05) and each row has two trials."""
    rng = random.Random(5)
    covered, ratios = 0, []
    for _ in range(sims):
        rows = [[math.exp(rng.gauss(0.0, 0.05)) for _ in range(2)] for _ in range(4)]
        pooled = pooled_log_sd([[trial(m) for m in r] for r in rows]) if floor else 0.0
        for r in rows:
            low, high = rerun_interval([trial(m) for m in r], statistics.median(r),
                                       floor_log_sd=pooled)
            rerun = statistics.median(math.exp(rng.gauss(0.0, 0.05)) for _ in range(2))
            covered += low <= rerun <= high
            ratios.append(high / low)
    return covered / (4 * sims), statistics.median(ratios)


def test_the_floor_only_widens_so_rows_sharing_their_noise_stay_covered_at_the_level():
    """With one degree of freedom per row the t interval is exact on average but narrow for the
    rows whose trials agreed by chance; the floor widens exactly those."""
    alone, floored = _sweep_coverage(False), _sweep_coverage(True)
    assert alone[0] == pytest.approx(RERUN_LEVEL, abs=0.02)
    assert floored[0] > alone[0] and floored[0] >= RERUN_LEVEL
    assert floored[1] > alone[1]


def test_the_sweeps_floor_pools_its_input_modes_stable_rows_only():
    quiet = [SweepCell("synthetic", b, "listed", trials=[trial(0.01), trial(0.011)])
             for b in (8, 16)]
    disturbed = SweepCell("synthetic", 32, "listed", trials=[trial(0.01), trial(0.03)])
    other_mode = SweepCell("real", 8, "listed", trials=[trial(0.01), trial(0.02)])
    floor = sweep_floor([*quiet, disturbed, other_mode], "synthetic", max_round_spread=0.15,
                        max_cv=0.5)
    assert floor == pytest.approx(pooled_log_sd(c.trials for c in quiet))
    assert disturbed.quality(0.15, 0.5)[0] == "unstable"


def test_the_row_reports_it_as_samples_per_s_slow_end_low():
    c = combine([trial(0.010), trial(0.012)])
    columns = rerun_columns(32, c)
    assert columns["samples_per_s_low"] == pytest.approx(32 / c.rerun_high_s)
    assert columns["samples_per_s_high"] == pytest.approx(32 / c.rerun_low_s)
    assert columns["samples_per_s_low"] < 32 / c.median_s < columns["samples_per_s_high"]


def test_a_row_without_one_says_why_in_its_progress_line():
    row = {"input_mode": "synthetic", "batch_size": 8, "status": "ok", "samples_per_s": 100.0,
           "samples_per_s_low": None, "samples_per_s_high": None, "peak_memory_bytes": None,
           "round_spread": None, "quality": "ok", "step_time_median_s": 0.08,
           "step_time_cv": 0.01, "rounds": 1, "retries": 0}
    assert "no rerun interval: too few steps" in progress_line(1, 2, "round 1", row)
    row |= {"samples_per_s_low": 90.0, "samples_per_s_high": 111.0}
    assert "100.0 samples/s [90.0, 111.0]" in progress_line(1, 2, "round 1", row)


def test_the_sweep_summary_quotes_the_best_rows_interval():
    summary = {"timed": True, "best_samples_per_s": 100.0, "best_samples_per_s_low": 90.0,
               "best_samples_per_s_high": 111.0, "best_batch": 64, "best_mfu": math.nan,
               "saturation_batch": 32, "saturation_tolerance": 0.05, "input_mode": "synthetic",
               "memory_fixed_bytes": math.nan, "memory_per_sample_bytes": math.nan,
               "predicted_reason": "one batch size", "largest_fitting_batch": math.inf,
               "largest_fitting_reason": "no cap", "timed_rows": 0}
    assert "100.0 samples/s (this sweep's rounds give 90.0-111.0, 90 %; another sweep may land " \
        "outside it" in summary_lines(summary)[0]
    summary |= {"rounds": [3]}
    assert "with 3+ rounds this interval misses the drift between sweeps" in summary_lines(
        summary)[0]
    summary |= {"between_sweep_cv": 0.02}
    assert ("this sweep's rounds and a drift between sweeps of 2 % (sweep.between_sweep_cv) "
            "give 90.0-111.0, 90 %") in summary_lines(summary)[0]
    assert "3+ rounds it rests mostly on sweep.between_sweep_cv" in summary_lines(summary)[0]
    assert "about half the time" not in summary_lines(summary)[0]
    summary |= {"between_sweep_cv": None}
    summary |= {"best_samples_per_s_low": math.nan}
    assert "(no rerun interval: too few steps)" in summary_lines(summary)[0]



def test_trials_far_apart_give_no_interval_rather_than_an_absurd_one():
    """Two trials 40x apart (a neighbour came and went, seen in a pipeline run beside one):
    the t interval would be [x/10^12, 10^12 x]; past MAX_RERUN_FACTOR either side there is none,
    so the row's samples/s carries no bound a table check would refuse as impossible."""
    assert rerun_interval([trial(0.001), trial(0.040)], 0.0205) is None
    columns = rerun_columns(32, combine([trial(0.001), trial(0.040)]))
    assert columns == {"samples_per_s_low": None, "samples_per_s_high": None}
    low, high = rerun_interval([trial(0.010), trial(0.012)], 0.011)  # close trials still get one
    assert high / 0.011 <= MAX_RERUN_FACTOR


def test_the_summary_names_rows_of_sub_millisecond_steps_and_only_stable_ones():
    """Such rows' sweeps disagree more (the timer and dispatch weigh on each step): the summary
    names their batch sizes, warns that their rerun intervals under-cover on a noisy host (as
    measured: docs/benchmarks.md) and points to the lake's next-run interval; a row of 2 ms
    steps, an unstable row and a row that did not time are not named."""
    from batchscale.sweep.summary import SHORT_STEP_S, quality_lines, quality_summary

    def row(batch, step_s, quality="ok", status="ok"):
        return {"status": status, "batch_size": batch, "input_mode": "synthetic",
                "quality": quality, "quality_reason": None if quality == "ok" else "spread",
                "step_time_median_s": step_s, "rounds": 2}

    rows = [row(16, 0.3e-3), row(64, 0.9e-3), row(256, 2e-3), row(4, 0.1e-3, "unstable"),
            row(1024, None, "ok", "oom")]
    summary = quality_summary(rows)
    assert summary["short_step_batches"] == [16, 64]
    lines = quality_lines(summary)
    named = [line for line in lines if line.startswith("sub-millisecond steps")]
    assert named == [next(line for line in lines if "batch 16, 64:" in line)]
    assert "outside their rerun intervals more often" in named[0]
    assert "next-run interval" in named[0]
    assert "on one thread" not in named[0]  # no thread count known: nothing to switch from
    on_two = quality_lines({**summary, "cpu_threads": 2})
    assert "or time them longer or on one thread" in next(
        line for line in on_two if line.startswith("sub-millisecond steps"))
    assert not [line for line in quality_lines(quality_summary([row(256, 2 * SHORT_STEP_S)]))
                if "sub-millisecond" in line]


def test_a_row_records_its_trials_log_sd_unfloored_for_comparisons_within_its_sweep():
    """`trial_log_sd` is the trials' own disagreement, every trial counted, whatever floor the
    rerun interval gets; one trial has none."""
    combined = combine([trial(1e-3), trial(1.2e-3), trial(0.9e-3)], floor_log_sd=0.5)
    logs = [math.log(x) for x in (1e-3, 1.2e-3, 0.9e-3)]
    assert combined.trial_log_sd == pytest.approx(statistics.stdev(logs))
    assert combine([trial(1e-3)]).trial_log_sd is None
    cell = SweepCell("real", 8, "listed", trials=[trial(1e-3), trial(1.1e-3)], rounds=2)
    row = measured_columns(cell, max_round_spread=0.15, max_cv=0.5, peak_flops=1e12,
                           floor_log_sd=0.3)
    assert row["trial_log_sd"] == pytest.approx(abs(math.log(1.1)) / math.sqrt(2))
