"""Time to target T(B) = S(B)·t(B): seconds per step at each batch size, where they came from,
and the model optimum B* = sqrt(α·B_crit/β) under the step-time line t = α + βB."""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import pandas as pd

from batchscale import schemas
from batchscale.fits import (
    StepTimeFit,
    as_floats,
    ensure_columns,
    fit_step_time,
    numeric_column,
    throughput_curve,
    timing_mode,
)


def time_to_target(steps: float | np.ndarray, step_time: float | np.ndarray) -> np.ndarray:
    """T(B) = S(B)·t(B): steps to the target times seconds per step (evaluation excluded)."""
    return np.asarray(steps, dtype=float) * np.asarray(step_time, dtype=float)


def optimal_batch(alpha: float, beta: float, b_crit: float, b_max: float = math.inf) -> float:
    """B* = sqrt(α·B_crit/β), capped at `b_max`: the minimum of T(B) under both models.

    With t = α + βB and S = S_min + E_min/B, dT/dB = S_min·β − E_min·α/B², zero at
    B² = α·B_crit/β. NaN unless α, β and B_crit are positive and finite.
    """
    values = (alpha, beta, b_crit)
    if not all(math.isfinite(v) and v > 0 for v in values):
        return math.nan
    best = math.sqrt(alpha * b_crit / beta)
    return best if math.isnan(b_max) else min(best, b_max)


def step_times(
    sweep: pd.DataFrame, runs: pd.DataFrame, batches: Iterable
) -> tuple[np.ndarray, StepTimeFit, str]:
    """Seconds per step at each of `batches`, the α + βB fit, and where the times came from.

    The sweep's synthetic-input timing is the clean measurement (warm-up excluded, device
    synchronized); the batch sizes it timed use their median, the others the fitted line.
    Without a sweep, the convergence runs' wall time per step stands in.
    """
    mode = timing_mode(sweep)
    if mode is not None:
        curve = throughput_curve(sweep, mode)
        measured = dict(zip(curve["batch_size"], curve["step_time_median_s"], strict=True))
        source = f"throughput sweep ({mode} input)"
    else:
        runs = ensure_columns(runs, schemas.RUNS)
        per_step = numeric_column(runs, "train_time_s") / numeric_column(runs, "steps_run")
        frame = pd.DataFrame({"batch_size": numeric_column(runs, "batch_size"), "t": per_step})
        frame = frame[np.isfinite(frame["t"]) & (frame["t"] > 0)]
        measured = frame.groupby("batch_size")["t"].median().to_dict()
        source = "convergence runs (train time per step)"
    fit = fit_step_time(list(measured), list(measured.values()))
    times = []
    for batch in as_floats(batches):
        value = measured.get(batch, math.nan)
        times.append(value if math.isfinite(value) and value > 0 else fit.predict(batch))
    if not measured:
        source = "none: no timed batch"
    return np.array(times, dtype=float), fit, source


def optimal_batch_cap(sweep: pd.DataFrame, table: pd.DataFrame, fitting: float) -> float:
    """The largest batch B* may take: the largest that fits, else the largest one measured.

    Without an OOM the models are extrapolations past the largest batch run; a B* beyond it
    (for example when step time barely grows with B) is not a measured answer.
    """
    if math.isfinite(fitting):
        return fitting
    measured = np.concatenate(
        [numeric_column(sweep, "batch_size"), numeric_column(table, "batch_size")]
    )
    measured = measured[np.isfinite(measured)]
    return float(measured.max()) if measured.size else math.nan
