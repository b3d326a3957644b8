"""The critical batch over training, fitted and turned into a schedule (batchscale/batch_schedule/
fit, findings): the fit recovers a known B_crit(t) within its interval, the schedule follows it,
and the prediction and the check's ratios come with ordered intervals."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from batchscale.batch_schedule import fit, measure
from batchscale.batch_schedule.check import check_summary
from batchscale.batch_schedule.measure import Stage

BATCHES = [8, 16, 32, 64, 128]


def _branch_rows(b_crit: float, s_min: float, rng, sigma: float, step: int = 100) -> list[dict]:
    steps = s_min * (1 + b_crit / np.array(BATCHES)) * np.exp(rng.normal(0, sigma, len(BATCHES)))
    return [{"checkpoint_step": step, "batch_size": b, "lr": 0.1, "milestone_loss": 2.0,
             "steps_to_milestone": float(s), "reached": True}
            for b, s in zip(BATCHES, steps, strict=True)]


def _fit(rows: list[dict], loss: float = 2.5) -> fit.CheckpointFit:
    row = {"examples": 800, "val_loss": loss, "b_simple": 10.0}
    return fit.fit_checkpoint(rows[0]["checkpoint_step"], rows, row, "linear", 200, 2.0)


# ------------------------------------------------------------------------------ the fit


def test_a_known_rising_critical_batch_is_recovered_within_its_interval():
    """Simulated branches from B_crit(t) = 12, 30, 60 (5 % multiplicative noise per branch): the
    90 % interval holds the truth in most draws, and the estimates rise with t."""
    rng = np.random.default_rng(7)
    truth = [12.0, 30.0, 60.0]
    covered, draws, medians = 0, 60, []
    for b_crit in truth:
        estimates = []
        for _ in range(draws):
            f = _fit(_branch_rows(b_crit, 20.0, rng, 0.05))
            estimates.append(f.b_crit)
            covered += bool(f.b_crit_low <= b_crit <= f.b_crit_high)
        medians.append(float(np.nanmedian(estimates)))
    assert covered / (draws * len(truth)) >= 0.8
    assert medians[0] < medians[1] < medians[2]
    assert all(abs(m / t - 1) < 0.25 for m, t in zip(medians, truth, strict=True))


def test_a_branch_that_missed_its_milestone_drops_out_of_the_fit():
    rows = _branch_rows(30.0, 20.0, np.random.default_rng(0), 0.0)
    rows[-1] = {**rows[-1], "steps_to_milestone": math.nan, "reached": False}
    f = _fit(rows)
    assert f.batches_reached == 4 and f.b_crit == pytest.approx(30.0, rel=0.05)


# ------------------------------------------------------------------------ the schedule


def _checkpoint(step: int, loss: float, b_crit: float, low: float, high: float,
                bound: str = "", bound_batch: float = math.nan) -> fit.CheckpointFit:
    return fit.CheckpointFit(step, step * 8, loss, loss - 0.1, b_crit, low, high, bound,
                             bound_batch, "", 1.0, b_crit, 5.0, 5)


def test_the_batch_doubles_once_b_crit_passes_it_and_never_shrinks():
    fits = [_checkpoint(50, 3.0, 10.0, 8.0, 13.0), _checkpoint(100, 2.6, 40.0, 30.0, 55.0),
            _checkpoint(200, 2.3, 9.0, 5.0, 14.0),
            _checkpoint(400, 2.1, math.nan, math.nan, math.nan, "above", 128.0)]
    stages = fit.plan_schedule(fits, 8, BATCHES)
    assert stages == [Stage(2.6, 32), Stage(2.1, 128)]


def test_no_schedule_where_b_crit_never_passes_twice_the_base_batch():
    fits = [_checkpoint(50, 3.0, 12.0, 8.0, 20.0),
            _checkpoint(100, 2.6, math.nan, math.nan, math.nan, "below", 8.0)]
    assert fit.plan_schedule(fits, 8, BATCHES) == []


def test_the_prediction_follows_s_of_b_and_its_interval_is_ordered():
    fits = [_checkpoint(100, 2.6, 40.0, 30.0, 55.0)]
    p = fit.predicted(fits, [Stage(2.6, 32)], 8, 500.0)
    ratio = (1 + 40 / 32) / (1 + 40 / 8)
    assert p["steps"] == pytest.approx(100 + 400 * ratio)
    assert p["steps_low"] < p["steps"] < p["steps_high"]
    assert p["examples"] == pytest.approx(800 + 400 * ratio * 32)


def test_the_check_pairs_seeds_and_gives_ratios_with_intervals():
    rows = []
    for seed, (sched, const) in enumerate([(60, 100), (66, 110), (52, 95)]):
        for name, steps in (("scheduled", sched), ("constant", const)):
            rows.append({"schedule": name, "seed": seed, "reached": True, "diverged": False,
                         "steps_to_target": steps, "examples_to_target": steps * 8,
                         "train_time_s_to_target": steps * 0.01, "final_val_loss": 2.0})
    summary = check_summary(pd.DataFrame(rows))
    value, low, high = summary["steps_to_target"]
    assert summary["paired"] == 3 and low < value < high < 1
    assert value == pytest.approx(np.exp(np.mean(np.log([0.6, 0.6, 52 / 95]))))


def test_crossing_interpolates_between_evaluations():
    assert measure.crossing((10, 2.0), (15, 1.5), 1.8) == pytest.approx(12.0)
    assert measure.crossing((0, 0.5), (1, 0.9), 0.8) == pytest.approx(0.75)  # rising metric
