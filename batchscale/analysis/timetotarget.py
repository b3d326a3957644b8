"""Time to target T(B) = S(B)·t(B): seconds per step at each batch size, where they came from,
and the model optimum B* = sqrt(α·B_crit/β) under the step-time line t = α + βB.

Two measurements of t(B) exist. The convergence runs time the very steps that reach the target
(real input, the trainer's own loop), so T(B) uses them when they are there (`cell_step_times`).
The throughput sweep times steps on a quiet, synchronized window with synthetic input; its
line α + βB is what B* uses (the convergence runs time only the batches they trained) and is
shown beside T's step time, with a flag where the two disagree by more than
`analysis.step_time_disagreement_factor` (a convergence step lies between the device's own time,
synthetic input, and the sweep's real-input time, which reads the data in the step as a trial
without loader workers does: `timing_flag`), or where the convergence trials' threads waited for a
CPU for at least `analysis.max_cpu_wait_share` of their runnable time (a busy machine slowed
them: docs/architecture.md, "Measurement rules").
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from enum import StrEnum
from typing import NamedTuple

import numpy as np
import pandas as pd

from batchscale import schemas
from batchscale.analysis.critical import BOOTSTRAP_CONFIDENCE
from batchscale.conditions import shares_apart
from batchscale.fits import (
    StepTimeFit,
    as_floats,
    ensure_columns,
    fit_step_time,
    numeric_column,
    throughput_curve,
    timing_mode,
)
from batchscale.tdist import t_quantile

B_STAR_LEVEL = BOOTSTRAP_CONFIDENCE
"""The level of B*'s interval: that of B_crit's interval it is built from."""


class StepTimeSource(StrEnum):
    """`step_time_source` of an analysis row: where the step time of T(B) came from."""

    CONVERGENCE = "convergence"
    """Median train time per step of the convergence trials at that batch."""
    SWEEP = "sweep"
    """The sweep's median step time at that batch (a row not flagged unstable)."""
    SWEEP_FIT = "sweep_fit"
    """The sweep's line α + βB at a batch it did not time (or timed only unstably)."""


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


def closed_interval(interval: tuple[float, float]) -> tuple[float, float]:
    """B*'s interval where both ends are finite and positive; (NaN, NaN) where it is open (a
    step-time line through two batch sizes pins nothing about α/β: `optimal_batch_interval`
    then gives 0 and no upper end), so a table stores no ends rather than a 0 that reads as a
    bound."""
    low, high = interval
    return (low, high) if 0 < low and math.isfinite(high) else (math.nan, math.nan)


def optimal_batch_interval(step_fit: StepTimeFit, b_crit: float, low: float, high: float,
                           b_max: float = math.inf,
                           level: float = B_STAR_LEVEL) -> tuple[float, float]:
    """B*'s `level` interval from B_crit's (low, high) and the step-time line's uncertainty
    about α/β: log B* = (log B_crit + log α/β)/2, so each side's half-width on the log scale is
    half the quadrature sum of B_crit's (that side) and α/β's (Student-t from the line's
    covariance, StepTimeFit.log_ratio_se); the two come from different measurements (steps to
    target, step times). A line through two batch sizes pins nothing about α/β, so the
    interval stays open until a third is timed. (NaN, NaN) without B*; ends capped at b_max."""
    b_star = optimal_batch(step_fit.alpha_s, step_fit.beta_s, b_crit)
    if not math.isfinite(b_star):
        return math.nan, math.nan
    ratio_half = (t_quantile(0.5 + level / 2, step_fit.dof) * step_fit.log_ratio_se
                  if step_fit.dof >= 1 and math.isfinite(step_fit.log_ratio_se) else math.inf)
    below = _log_ratio(b_crit, low)
    above = _log_ratio(high, b_crit)
    return (min(b_star * math.exp(-0.5 * math.hypot(below, ratio_half)), b_max),
            min(b_star * math.exp(0.5 * math.hypot(above, ratio_half)), b_max))


def _log_ratio(upper: float, lower: float) -> float:
    """log(upper/lower): +inf for an interval end at 0 or +inf, NaN for a missing one."""
    if lower == 0 or upper == math.inf:
        return math.inf
    return math.log(upper / lower) if upper > 0 and lower > 0 else math.nan


class BStar(NamedTuple):
    """B* of one LR rule as the recommendation quotes it: the value, its interval, the cap
    they are held under (optimal_batch_cap), the step-time line in words ("": the device's)
    and why the interval is open (open_reason)."""

    value: float
    low: float
    high: float
    cap: float = math.inf
    line: str = ""
    why_open: str = ""


def open_reason(b_crit_low: float, b_crit_high: float) -> str:
    """Why B*'s interval is open, given B_crit's ends: B_crit's own interval, or else the
    step-time line (optimal_batch_interval: a line through two batch sizes pins no α/β)."""
    if 0 < b_crit_low and math.isfinite(b_crit_high):
        return ("the step-time line through two batch sizes does not pin α/β: time a third "
                "batch size")
    return "B_crit's interval is unbounded"


REAL_INPUT_LINE = ("with real input's step time (the input pipeline is a bottleneck, and a "
                   "trial reads its data in the step)")
"""How B* says it used the sweep's real-input line rather than the device's own."""


def optimal_batch_text(value: float, interval: tuple[float, float],
                       cap: float = math.inf, line: str = "", why_open: str = "") -> str:
    """"≈ 106 [80, 140] (90%)", or the point with why its interval is open; `line`, when
    given, says which step-time line it is on. B* and its interval are capped at `cap`
    (optimal_batch_cap): a capped end is a bound, said as one, never "512 [512, 512]"."""
    low, high = interval
    on = f" {line}" if line else ""
    if value >= cap:
        return (f"at or above {cap:,.0f}, the largest batch it may take here (the model's "
                f"time to target still falls there{', ' + line if line else ''})")
    if not (math.isfinite(low) and math.isfinite(high) and low > 0):
        why = why_open or "B_crit's or the step-time line's is unbounded"
        return f"≈ {value:,.0f}{on} (interval open: {why})"
    upper = f"≥ {cap:,.0f}, capped" if high >= cap else f"{high:,.0f}"
    return f"≈ {value:,.0f} [{low:,.0f}, {upper}] ({B_STAR_LEVEL:.0%}){on}"


def step_times(
    sweep: pd.DataFrame,
    runs: pd.DataFrame,
    batches: Iterable,
    max_cpu_wait_share: float | None = None,
) -> tuple[np.ndarray, StepTimeFit, str]:
    """Seconds per step at each of `batches`, the α + βB fit, and where the times came from.

    The sweep's synthetic-input timing is the clean measurement (warm-up excluded, device
    synchronized); the batch sizes it timed use their median, the others the fitted line.
    Without a stable sweep row, the convergence runs' wall time per step stands in, except
    trials whose threads waited for a CPU at least `max_cpu_wait_share` of their runnable time
    (a line through times a busy machine slowed would put B* anywhere).
    """
    mode = timing_mode(sweep)
    if mode is not None:
        curve = throughput_curve(sweep, mode)
        measured = dict(zip(curve["batch_size"], curve["step_time_median_s"], strict=True))
        source = f"throughput sweep ({mode} input)"
    else:
        runs = ensure_columns(runs, schemas.RUNS)
        per_step = numeric_column(runs, "train_time_s") / numeric_column(runs, "steps_run")
        frame = pd.DataFrame({"batch_size": numeric_column(runs, "batch_size"), "t": per_step,
                              "wait": numeric_column(runs, "cpu_wait_share")})
        frame = frame[np.isfinite(frame["t"]) & (frame["t"] > 0)]
        timed = len(frame)
        if max_cpu_wait_share is not None:
            frame = frame[~(frame["wait"] >= max_cpu_wait_share)]  # NaN (unknown) is kept
        measured = frame.groupby("batch_size")["t"].median().to_dict()
        source = "convergence runs (train time per step)"
        if timed and frame.empty:
            return (np.full(len(as_floats(batches)), math.nan),
                    StepTimeFit(math.nan, math.nan, math.nan, STARVED_REASON),
                    "none: " + STARVED_REASON)
    fit = fit_step_time(list(measured), list(measured.values()))
    times = []
    for batch in as_floats(batches):
        value = measured.get(batch, math.nan)
        times.append(value if math.isfinite(value) and value > 0 else fit.predict(batch))
    if not measured:
        source = "none: no timed batch"
    return np.array(times, dtype=float), fit, source


STARVED_REASON = ("no stable sweep row, and every convergence trial waited for a CPU beyond "
                  "analysis.max_cpu_wait_share (a busy machine)")


def convergence_step_times(runs: pd.DataFrame) -> dict[float, float]:
    """Seconds per step measured in the convergence runs, per batch size.

    train_time_s / steps_run of each trial (the trainer's own clock, evaluation excluded;
    the wall clock is the maximum over ranks), then the median over the trials at that batch:
    all LR rules and seeds together, because a step's work (forward, backward, update) does
    not depend on the learning rate, and pooling gives the median more trials than one
    (rule, batch) cell has. Only the trials with the fewest workers at that batch count (one
    worker where it was run), like the single-process sweep they are compared with. Diverged
    trials count too: their steps took as long as anyone's.
    """
    return _trial_step_times(runs).groupby("batch_size")["t"].median().to_dict()


def convergence_step_time_ranges(runs: pd.DataFrame) -> dict[float, tuple[float, float, int]]:
    """Per batch size, the lowest and highest seconds per step of the trials behind
    `convergence_step_times`' median, and how many trials there are."""
    grouped = _trial_step_times(runs).groupby("batch_size")["t"]
    return {batch: (float(t.min()), float(t.max()), int(t.size)) for batch, t in grouped}


def _trial_step_times(runs: pd.DataFrame) -> pd.DataFrame:
    """Each trial's seconds per step (columns batch_size, workers, t), the trials with the
    fewest workers at their batch only."""
    runs = ensure_columns(runs, schemas.RUNS)
    frame = pd.DataFrame(
        {
            "batch_size": numeric_column(runs, "batch_size"),
            "workers": numeric_column(runs, "workers"),
            "t": numeric_column(runs, "train_time_s") / numeric_column(runs, "steps_run"),
        }
    )
    return _fewest_workers(frame)


def convergence_cpu_waits(runs: pd.DataFrame) -> dict[float, float]:
    """Per batch size, the longest share of runnable time the threads of the trials that
    `convergence_step_times` uses waited for a CPU (batches where no trial could tell are
    left out)."""
    runs = ensure_columns(runs, schemas.RUNS)
    frame = pd.DataFrame(
        {
            "batch_size": numeric_column(runs, "batch_size"),
            "workers": numeric_column(runs, "workers"),
            "t": numeric_column(runs, "train_time_s") / numeric_column(runs, "steps_run"),
            "wait": numeric_column(runs, "cpu_wait_share"),
        }
    )
    frame = _fewest_workers(frame)
    frame = frame[np.isfinite(frame["wait"])]
    return frame.groupby("batch_size")["wait"].max().to_dict()


def _fewest_workers(frame: pd.DataFrame) -> pd.DataFrame:
    """Timed trials (finite, positive seconds per step `t`) with the fewest workers at their
    batch size."""
    frame = frame[np.isfinite(frame["t"]) & (frame["t"] > 0) & np.isfinite(frame["batch_size"])]
    fewest = frame.groupby("batch_size")["workers"].transform("min")
    return frame[frame["workers"].eq(fewest) | fewest.isna()]


def sweep_step_times(sweep: pd.DataFrame, batches: Iterable,
                     mode: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The sweep's seconds per step at each of `batches` and which (`StepTimeSource`): the
    stable measured median, else its line α + βB; NaN and None when the sweep timed nothing.
    `mode`: the input mode (None: `timing_mode`'s, the device's own where timed)."""
    mode = mode or timing_mode(sweep)
    batches = as_floats(batches)
    if mode is None:
        return np.full(batches.size, math.nan), np.full(batches.size, None, dtype=object)
    curve = throughput_curve(sweep, mode)
    measured = dict(zip(curve["batch_size"], curve["step_time_median_s"], strict=True))
    fit = fit_step_time(list(measured), list(measured.values()))
    times, sources = [], []
    for batch in batches:
        value = measured.get(batch, math.nan)
        if math.isfinite(value) and value > 0:
            times.append(value)
            sources.append(StepTimeSource.SWEEP.value)
        else:
            predicted = fit.predict(batch)
            times.append(predicted)
            sources.append(StepTimeSource.SWEEP_FIT.value if math.isfinite(predicted) else None)
    return np.array(times, dtype=float), np.array(sources, dtype=object)


def cell_step_times(
    sweep: pd.DataFrame,
    runs: pd.DataFrame,
    batches: Iterable,
    disagreement_factor: float,
    max_cpu_wait_share: float | None = None,
) -> pd.DataFrame:
    """Per batch: the step time T(B) uses, its source, the sweep's figure and a timing flag.

    Columns: step_time_s, step_time_source, sweep_step_time_s, sweep_step_time_source (the
    sweep's own row or its line: `sweep_step_times`), timing_flag (None, or why the
    two measurements cannot both be right: they differ by more than `disagreement_factor`
    either way), or their threads waited for a CPU for at least `max_cpu_wait_share` of their
    runnable time (None: not checked). The convergence runs' time wins where it exists (it is
    the time the steps to target actually took); otherwise the sweep's.
    """
    batches = as_floats(batches)
    converged = convergence_step_times(runs)
    waits = convergence_cpu_waits(runs) if max_cpu_wait_share is not None else {}
    swept, swept_source = sweep_step_times(sweep, batches)
    reading, reading_source = _reading_step_times(sweep, batches)
    device_mode = timing_mode(sweep)
    threads = threads_note(sweep, runs)
    columns: dict[str, list] = {
        "step_time_s": [], "step_time_source": [], "sweep_step_time_s": [],
        "sweep_step_time_source": [], "timing_flag": [],
    }
    for batch, sweep_time, sweep_source, read_time, read_source in zip(
            batches, swept, swept_source, reading, reading_source, strict=True):
        own = converged.get(batch, math.nan)
        if math.isfinite(own):
            time, source = own, StepTimeSource.CONVERGENCE.value
        else:
            time, source = sweep_time, sweep_source
        columns["step_time_s"].append(time)
        columns["step_time_source"].append(source)
        columns["sweep_step_time_s"].append(sweep_time)
        columns["sweep_step_time_source"].append(sweep_source)
        disagree = timing_flag(own, SweepTime(sweep_time, sweep_source, device_mode),
                               SweepTime(read_time, read_source, "real"), disagreement_factor)
        flags = [
            starved_flag(waits.get(batch), max_cpu_wait_share) if math.isfinite(own) else None,
            disagree and disagree + threads,
        ]
        columns["timing_flag"].append("; ".join(f for f in flags if f) or None)
    # object Series keep None as None (a text column of the analysis table: null, not NaN)
    return pd.DataFrame(
        {
            name: pd.Series(values, dtype=float if name.endswith("_s") else object)
            for name, values in columns.items()
        }
    )


def starved_flag(wait_share: float | None, max_share: float | None) -> str | None:
    """Plain words when the convergence trials waited for a CPU at least `max_share` of their
    runnable time, else None."""
    if wait_share is None or max_share is None or wait_share < max_share:
        return None
    wait_text, limit_text = shares_apart(wait_share, max_share)
    return (
        f"the convergence runs' threads waited for a CPU up to {wait_text} of their"
        f" runnable time (at least {limit_text}: other processes held the CPUs), so their step"
        " time is slower than this machine can do"
    )


class SweepTime(NamedTuple):
    """One of the sweep's step times at a batch: seconds, `StepTimeSource`, input mode."""

    seconds: float
    source: str | None
    mode: str | None


def _reading_step_times(sweep: pd.DataFrame | None,
                        batches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The sweep's real-input step times at `batches` where the device's own (synthetic) were
    timed too; NaN where there are none to add."""
    if timing_mode(sweep) != "synthetic":
        return np.full(batches.size, math.nan), np.full(batches.size, None, dtype=object)
    return sweep_step_times(sweep, batches, "real")


def timing_flag(convergence_s: float, device: SweepTime, reading: SweepTime,
                factor: float) -> str | None:
    """Plain words when the convergence runs' step time lies outside what the sweep allows,
    give or take `factor`, else None. At most `factor` × the real-input time `reading` (a trial
    reads its data in the step, as the sweep's real input does; loader workers can only hide
    that reading), or × the `device` time where real input was not timed; at least the device
    time ÷ `factor` (no input pipeline makes a step faster than the device's own)."""
    if not (math.isfinite(convergence_s) and math.isfinite(device.seconds)
            and device.seconds > 0):
        return None
    upper = reading if math.isfinite(reading.seconds) and reading.seconds > 0 else device
    if convergence_s > factor * upper.seconds:
        comparison = f"{convergence_s / upper.seconds:.3g}× the sweep's {_sweep_text(upper)}"
        cause = ("training was slowed (a busy machine)" if upper is reading else
                 "training was slowed (a busy machine, or the input pipeline)")
    elif convergence_s < device.seconds / factor:
        comparison = (f"{device.seconds / convergence_s:.3g}× less than the sweep's "
                      f"{_sweep_text(device)}")
        cause = "the sweep was slowed (a busy machine while it timed this batch)"
    else:
        return None
    return (
        f"the convergence runs took {_ms(convergence_s)} per step, {comparison}: more than the"
        f" {factor:g}× allowed, so one of them is off, most likely {cause}"
    )


def threads_note(sweep: pd.DataFrame | None, runs: pd.DataFrame) -> str:
    """"; the sweep timed on 1 thread and the convergence runs trained on 2, …" where the two
    tables' `threads` differ (a step time moves with them on a CPU), else ""."""
    def counts(frame) -> list[int]:
        if frame is None or "threads" not in frame:
            return []
        return sorted({int(t) for t in numeric_column(frame, "threads") if np.isfinite(t)})

    swept, trained = counts(sweep), counts(runs)
    if not swept or not trained or swept == trained:
        return ""
    return (f"; the sweep timed on {'/'.join(map(str, swept))} thread(s) and the convergence "
            f"runs trained on {'/'.join(map(str, trained))}, which alone moves a step time on a "
            "CPU (sweep.threads sets the sweep's only: docs/sweep.md)")


def _sweep_text(time: SweepTime) -> str:
    what = "line" if time.source == StepTimeSource.SWEEP_FIT else "measurement"
    return f"{_ms(time.seconds)} ({time.mode or 'synthetic'}-input {what})"


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:.3g} ms"


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
