"""What the recommendation promises, with its spread: the steps and time to target expected at
the recommended (LR rule, batch), and the saving against the batch size and learning rate the
user trains with today (`analysis.current_batch_size`, `analysis.current_lr`).

The band is the range over the seeds that reached the target at that cell (with one seed there
is no spread, and the text says so instead of inventing one); time is steps × the cell's step
time (its source named in the batch's reason). A ratio against today's batch takes its band from
the extremes of both ranges (the slowest recommended seed against the fastest current one, and
the other way round), so it holds whatever pairing of seeds is the fair one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from batchscale.fits import ensure_columns, matches, numeric_column
from batchscale.schemas import RUNS, RunStatus


@dataclass(frozen=True)
class Spread:
    """Median over the seeds that reached the target, with their lowest and highest."""

    median: float
    low: float
    high: float
    seeds: int

    def scaled(self, factor: float) -> Spread:
        return Spread(self.median * factor, self.low * factor, self.high * factor, self.seeds)

    def text(self, unit: str = "", digits: int = 3) -> str:
        """"110 [100, 120] steps over 3 seeds", or "110 steps (one seed: no spread)"."""
        value = _g(self.median, digits)
        if self.seeds < 2:
            return f"{value}{unit} (one seed: no spread)"
        return (f"{value}{unit} [{_g(self.low, digits)}, {_g(self.high, digits)}] over "
                f"{self.seeds} seeds")


def _g(value: float, digits: int) -> str:
    return f"{value:,.0f}" if abs(value) >= 10 ** digits else f"{value:.{digits}g}"


def steps_spread(runs: pd.DataFrame, rule: str, batch: int) -> Spread | None:
    """Steps to target over the reached seeds of (rule, batch); None when none reached."""
    runs = ensure_columns(runs, RUNS)
    cell = runs[matches(runs, "lr_rule", rule) & (numeric_column(runs, "batch_size") == batch)
                & matches(runs, "status", RunStatus.REACHED)]
    steps = numeric_column(cell, "steps_to_target")
    steps = steps[np.isfinite(steps)]
    if not steps.size:
        return None
    return Spread(float(np.median(steps)), float(steps.min()), float(steps.max()), steps.size)


def step_time_at(table: pd.DataFrame, rule: str, batch: int) -> float:
    """The cell's step time from the analysis's cell table; NaN where it has none."""
    times = numeric_column(_cell(table, rule, batch), "step_time_s")
    return float(times[0]) if times.size and np.isfinite(times[0]) else math.nan


def untrusted_time(table: pd.DataFrame, rule: str, batch: int) -> str:
    """" (step time NOT TRUSTED: …)" where the cell's step time carries a timing flag, else ""."""
    row = _cell(table, rule, batch)
    flag = row["timing_flag"].iloc[0] if "timing_flag" in row and len(row) else None
    return f" (step time NOT TRUSTED: {flag})" if isinstance(flag, str) else ""


def _cell(table: pd.DataFrame, rule: str, batch: int) -> pd.DataFrame:
    return table[matches(table, "lr_rule", rule) & (numeric_column(table, "batch_size") == batch)]


def expected_text(runs: pd.DataFrame, table: pd.DataFrame, rule: str, batch: int) -> str:
    """"110 [100, 120] steps over 3 seeds, 2.3 [2.1, 2.5] s of training" at the cell."""
    steps = steps_spread(runs, rule, batch)
    if steps is None:
        return f"no run of the {rule} rule at batch {batch} reached the target"
    text = f"{steps.text(' steps')}"
    step_s = step_time_at(table, rule, batch)
    if math.isfinite(step_s):
        text += (f"; {steps.scaled(step_s).text(' s of training')}"
                 f"{untrusted_time(table, rule, batch)}")
    return text


def versus_current(runs: pd.DataFrame, table: pd.DataFrame, rule: str, batch: int,
                   current_batch: int | None) -> str:
    """The expected saving against `current_batch` (same LR rule), or why it cannot be given."""
    if current_batch is None:
        return ("give the batch size you train with today (analysis.current_batch_size, "
                "--current-batch-size) to see the saving against it")
    if current_batch == batch:
        return f"you already train at batch {batch}: keep it"
    rec, cur = steps_spread(runs, rule, batch), steps_spread(runs, rule, current_batch)
    if rec is None:
        return f"no run of the {rule} rule at batch {batch} reached the target"
    if cur is None:
        measured = sorted({int(b) for b in numeric_column(ensure_columns(runs, RUNS),
                                                          "batch_size") if np.isfinite(b)})
        return (f"your batch {current_batch} did not reach the target with the {rule} rule "
                f"among the measured batch sizes ({', '.join(map(str, measured))}): add it to "
                "convergence.batch_sizes to quote a saving")
    parts = [f"{_ratio(rec, cur)} the steps"]
    rec_s, cur_s = step_time_at(table, rule, batch), step_time_at(table, rule, current_batch)
    if math.isfinite(rec_s) and math.isfinite(cur_s):
        flags = untrusted_time(table, rule, batch) or untrusted_time(table, rule, current_batch)
        parts.append(f"{_ratio(rec.scaled(rec_s), cur.scaled(cur_s))} the training time{flags}")
    return (f"at your batch {current_batch} ({cur.text(' steps')}), the recommendation needs "
            + " and ".join(parts))


def _ratio(new: Spread, old: Spread) -> str:
    """"0.55× [0.45, 0.66]" (extremes of both ranges), or without a band for single seeds."""
    value = new.median / old.median
    if new.seeds < 2 and old.seeds < 2:
        return f"{value:.2f}× (one seed each: no spread)"
    return f"{value:.2f}× [{new.low / old.high:.2f}, {new.high / old.low:.2f}]"


def lr_versus_current(learning_rate: float | None, current_lr: float | None) -> str:
    """How the recommended learning rate compares with today's; "" when either is unknown."""
    if learning_rate is None or current_lr is None:
        return ""
    return f"; {learning_rate / current_lr:.3g}× your current {current_lr:.4g}"


def accumulation_text(batch: int, largest_fitting: float, workers: int | None) -> str:
    """How to run `batch` where one device holds less: "" when it fits (or the wall is
    unknown), else the accumulation steps that bring each device's micro-batch under the
    largest batch the sweep measured to fit."""
    per_device = batch / max(workers or 1, 1)
    known = math.isfinite(largest_fitting) and largest_fitting > 0
    if not known or per_device <= largest_fitting:
        return ""
    steps = math.ceil(per_device / largest_fitting)
    return (f"; each device holds at most batch {largest_fitting:.0f} (the sweep's memory wall): "
            f"run it as {steps} accumulation steps of {math.ceil(per_device / steps)} "
            "(convergence.accumulation_steps)")

