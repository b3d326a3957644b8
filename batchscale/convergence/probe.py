"""When a probe trial of the adaptive search has measured enough: its gradient noise scale
B_simple near the target, stable from one evaluation to the next. Pure and free of torch, so the
trainer (train.py, loop_runner.py) stops a probe on the same rule the search's prediction
(adaptive/choice.py, `predict_b_crit`) reads its evaluations with.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import numpy as np

from batchscale.metrics import METRICS

if TYPE_CHECKING:
    from batchscale.convergence.spec import ProbeSpec

NEAR_TARGET_PROGRESS = 0.75
"""Evaluations at least this far from the first evaluation's metric to the target (0: start,
1: target) count as "near the target": B_simple grows as the loss falls (McCandlish et al. 2018,
§3), so the noise scale that predicts B_crit for a target is the one measured near it."""
MIN_NEAR_EVALUATIONS = 3
"""Evaluations near the target the prediction needs to take their median (fewer: it
extrapolates), and the stability check compares."""
STABLE_FACTOR = 1.5
"""B_simple is stable when the last MIN_NEAR_EVALUATIONS evaluations near the target lie
within this factor of each other (largest ÷ smallest). Tolerant because B_simple is a ratio of
two noisy squared norms: even as an EMA it wobbles by tens of percent between evaluations. Tight
enough for the use: the search places batch sizes around the prediction on a grid of powers of
two (a factor 2 apart), so a prediction known to ×1.5 moves the placement by at most one
batch size."""


def progress(values: np.ndarray, target: float, metric: str) -> np.ndarray:
    """0 at the first evaluation's metric, 1 at the target, for either direction of "better"
    (`metric`'s, batchscale/metrics.py). All 1 when the first evaluation already meets the
    target: there is no way left to go."""
    start = values[0]
    if METRICS[metric].reached(start, target):
        return np.ones_like(values)
    return (values - start) / (target - start)


def noise_points(values: Iterable, b_simple: Iterable, target: float,
                 metric: str) -> tuple[np.ndarray, np.ndarray]:
    """(progress, B_simple) of one trial's evaluations in step order, those with a finite
    metric and a positive finite B_simple only, progress counted from the first of them
    (earlier evaluations have no noise scale yet). Empty below two such evaluations."""
    values = np.asarray([_number(v) for v in values], dtype=float)
    gns = np.asarray([_number(v) for v in b_simple], dtype=float)
    keep = np.isfinite(values) & np.isfinite(gns) & (gns > 0)
    if keep.sum() < 2:
        return np.array([]), np.array([])
    return progress(values[keep], target, metric), gns[keep]


def near_target(progress_values: np.ndarray, gns: np.ndarray) -> np.ndarray:
    """The B_simple values measured near the target (progress ≥ NEAR_TARGET_PROGRESS)."""
    return gns[progress_values >= NEAR_TARGET_PROGRESS]


def b_simple_stable(rows: list[Mapping], metric: str, target: float) -> bool:
    """Whether a trial's curve rows so far (each with `b_simple` and `metric`, in step order)
    hold at least MIN_NEAR_EVALUATIONS evaluations near the target whose last
    MIN_NEAR_EVALUATIONS B_simple values lie within STABLE_FACTOR of each other: the noise scale
    that predicts B_crit is measured, more training would not change the prediction much."""
    if metric not in METRICS:
        raise KeyError(f"unknown metric {metric!r}")
    points = noise_points((r.get(metric) for r in rows), (r.get("b_simple") for r in rows),
                          target, metric)
    near = near_target(*points)
    if near.size < MIN_NEAR_EVALUATIONS:
        return False
    last = near[-MIN_NEAR_EVALUATIONS:]
    return bool(last.max() <= STABLE_FACTOR * last.min())


def probe_done(probe: ProbeSpec, rows: list[Mapping], examples_seen: int) -> bool:
    """Whether a probe trial stops at this evaluation: at or past its budget of examples, or
    with B_simple stable near the primary target, whichever comes first."""
    return (examples_seen >= probe.budget_examples
            or b_simple_stable(rows, probe.metric, probe.value))


def _number(value) -> float:
    """A curve cell as a float: None (no measurement yet) and anything not a number is NaN."""
    try:
        return math.nan if value is None else float(value)
    except (TypeError, ValueError):
        return math.nan
