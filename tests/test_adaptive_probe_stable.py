"""When a probe has measured enough (batchscale/convergence/probe.py): B_simple stable near the
target, on synthetic curves with a known answer, and the same reading as the prediction the
search makes from them (adaptive/choice.py, `predict_b_crit`)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from batchscale.adaptive.choice import predict_b_crit
from batchscale.convergence.probe import (
    MIN_NEAR_EVALUATIONS,
    NEAR_TARGET_PROGRESS,
    STABLE_FACTOR,
    b_simple_stable,
    probe_done,
)
from batchscale.convergence.spec import ProbeSpec


def rows(points: list[tuple[float, float | None]], metric: str = "val_accuracy",
         start: float = 0.1, target: float = 0.9) -> list[dict]:
    """Curve rows, one per (progress, B_simple): the metric `progress` of the way from `start`
    to `target`; the first row is step 0, where the trainer has no noise scale yet."""
    out = [{"step": 0, metric: start, "b_simple": None}]
    for i, (progress, gns) in enumerate(points, start=1):
        out.append({"step": 10 * i, metric: start + progress * (target - start),
                    "b_simple": gns})
    return out


EARLY = [(0.1, 2.0), (0.3, 5.0), (0.5, 9.0)]


def test_three_agreeing_evaluations_near_the_target_are_stable():
    curve = rows([*EARLY, (0.8, 30.0), (0.85, 33.0), (0.9, 36.0)])
    assert b_simple_stable(curve, "val_accuracy", 0.9)


def test_a_noise_scale_still_growing_or_jumping_is_not_stable():
    growing = rows([*EARLY, (0.8, 20.0), (0.85, 30.0), (0.9, 45.0)])
    assert not b_simple_stable(growing, "val_accuracy", 0.9)
    jumping = rows([*EARLY, (0.8, 30.0), (0.85, 90.0), (0.9, 32.0)])
    assert not b_simple_stable(jumping, "val_accuracy", 0.9)


def test_only_the_last_evaluations_near_the_target_are_compared():
    """An early wobble near the target does not hold the probe back once it has settled."""
    curve = rows([*EARLY, (0.76, 80.0), (0.8, 30.0), (0.85, 31.0), (0.9, 32.0)])
    assert b_simple_stable(curve, "val_accuracy", 0.9)


def test_the_factor_is_the_edge():
    at_edge = rows([*EARLY, (0.8, 20.0), (0.85, 25.0), (0.9, 20.0 * STABLE_FACTOR)])
    assert b_simple_stable(at_edge, "val_accuracy", 0.9)
    past = rows([*EARLY, (0.8, 20.0), (0.85, 25.0), (0.9, 20.0 * STABLE_FACTOR * 1.01)])
    assert not b_simple_stable(past, "val_accuracy", 0.9)


def test_a_steady_noise_scale_far_from_the_target_is_not_enough():
    """Flat B_simple early in training says nothing about the target: it grows as the loss
    falls, so the probe trains on until it is near."""
    far = rows([(0.1, 10.0), (0.2, 10.0), (0.3, 10.0), (0.5, 10.0), (0.7, 10.0)])
    assert not b_simple_stable(far, "val_accuracy", 0.9)


def test_fewer_than_the_needed_evaluations_near_the_target_are_not_enough():
    near = [(0.8, 30.0), (0.9, 30.0), (0.95, 30.0)][:MIN_NEAR_EVALUATIONS - 1]
    assert not b_simple_stable(rows([*EARLY, *near]), "val_accuracy", 0.9)


def test_missing_noise_scales_are_skipped_not_counted():
    curve = rows([*EARLY, (0.8, 30.0), (0.82, None), (0.85, math.nan), (0.9, 31.0)])
    assert not b_simple_stable(curve, "val_accuracy", 0.9)  # two measured near the target
    curve += rows([(0.95, 32.0)])[1:]
    assert b_simple_stable(curve, "val_accuracy", 0.9)


def test_a_loss_target_counts_progress_downwards():
    curve = rows([(0.2, 2.0), (0.5, 8.0), (0.8, 30.0), (0.9, 32.0), (0.95, 34.0)],
                 metric="val_loss", start=2.5, target=0.3)
    assert b_simple_stable(curve, "val_loss", 0.3)


def test_a_metric_moving_the_wrong_way_is_never_near_its_target():
    """A loss that rises (or an accuracy that falls) moves away from the target: its
    evaluations have negative progress, however steady B_simple reads."""
    rising = [{"step": 10 * i, "val_loss": 1.0 + 0.2 * i, "b_simple": 30.0} for i in range(8)]
    assert not b_simple_stable(rising, "val_loss", 0.3)
    falling = [{"step": 10 * i, "val_accuracy": 0.8 - 0.05 * i, "b_simple": 30.0}
               for i in range(8)]
    assert not b_simple_stable(falling, "val_accuracy", 0.9)


def test_an_unknown_metric_is_refused():
    with pytest.raises(KeyError, match="val_bleu"):
        b_simple_stable(rows(EARLY), "val_bleu", 0.9)


def test_a_stable_probe_gives_the_prediction_near_the_target():
    """Where the probe would stop, the search's prediction reads the same evaluations."""
    curve = rows([*EARLY, (0.8, 30.0), (0.85, 33.0), (0.9, 36.0)])
    assert b_simple_stable(curve, "val_accuracy", 0.9)
    table = pd.DataFrame([{**r, "trial_id": "b8-sqrt-s0-w1-probe"} for r in curve])
    p = predict_b_crit(table, "val_accuracy", 0.9)
    assert p.method == "near target" and p.evaluations == MIN_NEAR_EVALUATIONS
    assert p.b_crit == pytest.approx(33.0)
    assert NEAR_TARGET_PROGRESS <= 0.8


def test_a_probe_is_done_at_its_budget_or_when_stable_whichever_first():
    probe = ProbeSpec(budget_examples=1000, metric="val_accuracy", value=0.9)
    unsettled = rows([*EARLY, (0.8, 20.0)])
    assert not probe_done(probe, unsettled, examples_seen=999)
    assert probe_done(probe, unsettled, examples_seen=1000)
    settled = rows([*EARLY, (0.8, 30.0), (0.85, 33.0), (0.9, 36.0)])
    assert probe_done(probe, settled, examples_seen=10)
