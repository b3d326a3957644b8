"""The report's "Adaptive search" section from a decisions table (batchscale.adaptive
.section): the sentences, the table rows and the plot, and the grid's cost stated as an
estimate from the search's own fit."""

from __future__ import annotations

import math

import pandas as pd
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
    assert abs(estimate - expected) / expected < 0.01


def test_the_grid_is_also_costed_in_device_seconds_with_the_searchs_own_step_times():
    """Steps on S(B) = 100 + 3200/B, each taking 1 ms + 10 µs·B: the grid's device time is
    seeds × Σ S(B)·t(B), and the sentence quotes both currencies."""
    exact = runs(on_curve(BATCHES, seeds=(0, 1))).assign(target_metric="val_accuracy",
                                                        target_value=0.9)
    exact["train_time_s"] = exact["steps_run"] * (1e-3 + 1e-5 * exact["batch_size"])
    expected = sum((100 + 3200 / b) * (1e-3 + 1e-5 * b) for b in BATCHES) * 2
    estimate = grid_device_s_estimate(study_decisions(), exact, BATCHES, 2)
    assert abs(estimate - expected) / expected < 0.01
    text = " ".join(adaptive_section(study_decisions(), exact, BATCHES, 2).sentences)
    assert ", 1.5 device-seconds of training (training time × workers" in text
    assert f"and {1.5 / estimate:.0%} of its training device time" in text
    # Trials without training times (a table brought from elsewhere): no device-time estimate.
    assert math.isnan(grid_device_s_estimate(study_decisions(), study_runs(), BATCHES, 2))


def test_no_section_for_a_grid_and_no_plot_without_an_interval():
    assert adaptive_section(pd.DataFrame(), study_runs(), BATCHES, 2) is None
    no_interval = study_decisions().assign(b_crit_low=None, b_crit_high=None)
    section = adaptive_section(no_interval, None, BATCHES, 2)
    assert section.plot.image_uri is None
    assert any("without a B_crit interval" in s for s in section.sentences)
    assert any("cannot be estimated" in s for s in section.sentences)


def test_a_search_that_stopped_as_futile_says_what_would_narrow_b_crit():
    reason = ("even the full grid (8 cells) is not expected to pin B_crit to ×2: 4% of grids "
              "simulated from these trials would (their steps scatter ±45% about the fit)")
    decisions = study_decisions()
    decisions.loc[decisions.index[-1], "reason"] = reason
    text = " ".join(adaptive_section(decisions, study_runs(), BATCHES, 2).sentences)
    assert f"stopped ({reason}) with B_crit 29.2" in text
    assert "More seeds per batch size (`convergence.seeds`; the stop reason says how many" in text
    # A search that stopped for another reason gives no such advice.
    plain = " ".join(adaptive_section(study_decisions(), study_runs(), BATCHES, 2).sentences)
    assert "More seeds per batch size" not in plain
