"""The report's "Adaptive search" section from a decisions table (batchscale.adaptive
.section): the sentences, the table rows and the plot, and the grid's cost stated as an
estimate from the search's own fit."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from test_adaptive_choice import on_curve, runs
from test_adaptive_tables import decision

from batchscale.adaptive.section import (
    adaptive_section,
    grid_device_s_estimate,
    grid_examples_estimate,
)

BATCHES = [4, 16, 64, 256]


def study_runs() -> pd.DataFrame:
    table = runs(on_curve(BATCHES, seeds=(0, 1), wobble=0.05))
    return table.assign(target_metric="val_accuracy", target_value=0.9)


def study_decisions() -> pd.DataFrame:
    rows = [decision(0, action="probe", batch_size=4, seed=0, b_crit=None, b_crit_low=None,
                     b_crit_high=None, interval_ratio=None, predicted_b_crit=None,
                     predicted_low=None, predicted_high=None, prediction_method="none"),
            decision(1, action="predict", batch_size=None, seed=None, b_crit=None,
                     b_crit_low=None, b_crit_high=None, interval_ratio=None,
                     reason="B_simple near target predicts B_crit ≈ 20"),
            decision(2, action="place", batch_size=64, seed=0),
            decision(3, action="stop", batch_size=None, seed=None,
                     reason="interval narrow enough")]
    return pd.DataFrame(rows)


def test_the_section_tells_the_prediction_the_points_the_interval_and_the_cost():
    section = adaptive_section(study_decisions(), study_runs(), BATCHES, 2)
    text = " ".join(section.sentences)
    assert "predicted B_crit ≈ 12.5 (interquartile range 10.4–17.4)" in text
    assert "Probed and placed batch sizes: 4, 64." in text
    assert "stopped (interval narrow enough) with B_crit 29.2, 90 % interval 21.2–40.7" in text
    # the level the final interval was read at, and why (a stopped search's measured shortfall)
    assert "That interval is read at the 98% level: a search that stops once" in text
    assert section.rows[-1]["b_crit"] == "29.2 [21.2, 40.7] (read at 98%)"
    assert "an estimate: the grid was not run" in text and "4,000 examples" in text
    assert [r["action"] for r in section.rows] == ["probe", "predict", "place", "stop"]
    assert section.rows[2]["cell"] == "b=64, seed 0"
    assert section.rows[2]["b_crit"] == "29.2 [21.2, 40.7]"
    assert section.plot.image_uri.startswith("data:image/png;base64,")


def test_the_grid_estimate_is_the_final_fits_examples_times_the_seeds():
    """On S(B) = 100 + 3200/B exactly (no wobble), each batch costs 100·B + 3200 examples."""
    exact = runs(on_curve(BATCHES, seeds=(0, 1))).assign(target_metric="val_accuracy",
                                                        target_value=0.9)
    expected = sum(100 * b + 3200 for b in BATCHES) * 2
    estimate = grid_examples_estimate(study_decisions(), exact, BATCHES, 2)
    assert abs(estimate.value - expected) / expected < 0.01
    assert estimate.low < estimate.value < estimate.high


def test_the_grid_is_also_costed_in_device_seconds_with_the_searchs_own_step_times():
    """Steps on S(B) = 100 + 3200/B, each taking 1 ms + 10 µs·B: the grid's device time is
    seeds × Σ S(B)·t(B), and the sentence quotes both currencies."""
    exact = runs(on_curve(BATCHES, seeds=(0, 1))).assign(target_metric="val_accuracy",
                                                        target_value=0.9)
    exact["train_time_s"] = exact["steps_run"] * (1e-3 + 1e-5 * exact["batch_size"])
    expected = sum((100 + 3200 / b) * (1e-3 + 1e-5 * b) for b in BATCHES) * 2
    estimate = grid_device_s_estimate(study_decisions(), exact, BATCHES, 2)
    assert abs(estimate.value - expected) / expected < 0.01
    text = " ".join(adaptive_section(study_decisions(), exact, BATCHES, 2).sentences)
    assert ", 1.5 device-seconds of training (training time × workers" in text
    assert (f"and {1.5 / estimate.value:.0%} ({1.5 / estimate.high:.0%}–"
            f"{1.5 / estimate.low:.0%}) of its training device time") in text
    # Trials without training times (a table brought from elsewhere): no device-time estimate.
    assert math.isnan(grid_device_s_estimate(study_decisions(), study_runs(), BATCHES, 2).value)


def _noisy_study(rng: np.random.Generator, scatter: float, step_scatter: float = 0.0):
    """One seed per batch size on S(B) = 100 + 3200/B with lognormal `scatter`, each step
    taking (1 ms + 10 µs·B) × lognormal `step_scatter`."""
    table = runs({(b, 0): max(1, round((100 + 3200 / b) * math.exp(rng.normal(0, scatter))))
                  for b in GRID}).assign(target_metric="val_accuracy", target_value=0.9)
    jitter = np.exp(rng.normal(0, step_scatter, len(table)))
    table["train_time_s"] = table["steps_run"] * (1e-3 + 1e-5 * table["batch_size"]) * jitter
    return table


GRID = [4, 8, 16, 32, 64, 128, 256]


def test_the_grid_cost_interval_holds_the_cost_the_true_curve_gives():
    """On 200 simulated searches with steps scattering ±10 % and step times ±5 %, the 90 %
    intervals of the grid's examples and device time hold the true curve's cost at least 0.82
    of the time (the binomial 1 % floor under 0.90 for 200 draws) and at most 0.98 (not an
    interval too wide to say anything)."""
    rng = np.random.default_rng(3)
    true_examples = sum(100 * b + 3200 for b in GRID)
    true_device_s = sum((100 + 3200 / b) * (1e-3 + 1e-5 * b) for b in GRID)
    held = {"examples": 0, "device": 0}
    draws = 200
    for _ in range(draws):
        table = _noisy_study(rng, 0.1, 0.05)
        examples = grid_examples_estimate(study_decisions(), table, GRID, 1)
        device = grid_device_s_estimate(study_decisions(), table, GRID, 1)
        held["examples"] += examples.low <= true_examples <= examples.high
        held["device"] += device.low <= true_device_s <= device.high
    assert all(0.82 <= count / draws <= 0.98 for count in held.values()), held


def test_an_estimate_not_bounded_away_from_zero_is_given_as_an_upper_end_only():
    """A B_crit number needs S_min and E_min clearly positive, so the grid's cost (a positive
    combination of them) is nearly always bounded away from zero; where its interval would
    reach zero, the text gives its upper end only and the share as a lower bound, and without
    degrees of freedom it says there is no interval."""
    from batchscale.adaptive.section import _estimate_interval, _linear_estimate, _share

    wide = _linear_estimate(100.0, [(np.array([1.0]), np.array([[10000.0]]))], dof=5)
    assert math.isnan(wide.low) and wide.high > 100
    assert _estimate_interval(wide, str) == (f"at most {wide.high} at 90%; the fit does not "
                                             "bound it from below")
    assert _share(50.0, wide) == f"50% (at least {50 / wide.high:.0%})"
    narrow = _linear_estimate(100.0, [(np.array([1.0]), np.array([[1.0]]))], dof=5)
    assert narrow.low == pytest.approx(100 - 2.015, abs=0.01)  # t(0.95, 5) × 1
    assert _share(50.0, narrow) == "50% (49%–51%)"
    none = _linear_estimate(100.0, [(np.array([1.0]), np.array([[1.0]]))], dof=0)
    assert _estimate_interval(none, str) == "no interval: the fit has no degrees of freedom left"
