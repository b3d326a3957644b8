"""The critical batch of each LR rule as the summary carries it: the fit (a number only when the
data support one, otherwise a bound), its bootstrap interval, the edge cases in plain words
(one batch size, fewer than three reached the target, every trial diverged), the regimes from
the fitted curve and B*. The fits themselves are in `critical`; this module decides what is
reported."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from batchscale.analysis.critical import (
    BOOTSTRAP_CONFIDENCE,
    CriticalBatchFit,
    bootstrap_critical_batch,
    fit_critical_batch,
    interval_note,
    regimes,
)
from batchscale.analysis.critical_reasons import MIN_CRITICAL_FIT_BATCHES
from batchscale.analysis.summary import CriticalBatchSummary, RegimeRange
from batchscale.analysis.timetotarget import optimal_batch, optimal_batch_interval
from batchscale.config import AnalysisConfig
from batchscale.fits import StepTimeFit, matches, numeric_column
from batchscale.schemas import RunStatus, StopKind, stop_kind


def critical_by_rule(
    runs: pd.DataFrame,
    table: pd.DataFrame,
    settings: AnalysisConfig,
    step_fit: StepTimeFit,
    b_cap: float,
) -> tuple[dict[str, CriticalBatchSummary], dict[str, pd.DataFrame]]:
    """Per LR rule (sorted): the summary and the `regimes` table (batch_size, fit_slope,
    measured_slope, regime)."""
    summaries, labels = {}, {}
    for rule, cells in table.groupby("lr_rule", sort=True):
        rule_runs = runs[matches(runs, "lr_rule", rule)]
        fit = _fit(rule_runs, cells, settings.b_crit_range_factor)
        labels[rule] = regimes(cells["batch_size"], cells["steps_to_target"], fit)
        summaries[rule] = _summary(rule_runs, rule, fit, labels[rule], settings, step_fit, b_cap)
    return summaries, labels


def edge_case_reason(rule_runs: pd.DataFrame, cells: pd.DataFrame) -> str:
    """Why no fit is possible for one rule's trials, in words a user can act on ("" if it is)."""
    status = rule_runs["status"]
    run_batches = sorted({int(b) for b in numeric_column(rule_runs, "batch_size") if b > 0})
    if len(rule_runs) and status.eq(RunStatus.DIVERGED).all():
        return (
            f"every trial diverged ({_count(len(rule_runs), 'trial')} at"
            f" {_count(len(run_batches), 'batch size')}): nothing reached the target, so there"
            " are no steps to fit; a lower learning rate or a longer warm-up may converge"
        )
    if len(run_batches) == 1:
        return (
            f"one batch size measured ({run_batches[0]}): B_crit needs steps to target at"
            f" {MIN_CRITICAL_FIT_BATCHES} or more batch sizes"
        )
    steps = numeric_column(cells, "steps_to_target")
    reached = sorted(int(b) for b, s in zip(cells["batch_size"], steps, strict=True)
                     if math.isfinite(s))
    if not reached:
        return (f"no batch size reached the target (of {_count(len(run_batches), 'batch size')}"
                f" run){_stopped_short(rule_runs)}")
    if len(reached) < MIN_CRITICAL_FIT_BATCHES:
        return (
            f"only {len(reached)} of {len(run_batches)} batch sizes reached the target"
            f" ({', '.join(map(str, reached))}): B_crit needs {MIN_CRITICAL_FIT_BATCHES} or more"
            + _partly_reached(rule_runs, reached) + _stopped_short(rule_runs)
        )
    return ""


STOP_WORDS = {StopKind.STALLED: "stalled (convergence.patience_evals)",
              StopKind.OUT_OF_STEPS: "ran out of steps (convergence.max_steps)"}


def _stopped_short(rule_runs: pd.DataFrame) -> str:
    """How the trials that did not reach the target ended, counted by kind ("" when the
    table records no stop_reason: rows from before it, or from elsewhere)."""
    if "stop_reason" not in rule_runs:
        return ""
    kinds = [stop_kind(reason) for reason in rule_runs["stop_reason"]]
    counts = [(kinds.count(kind), words) for kind, words in STOP_WORDS.items()]
    counts.append((int(matches(rule_runs, "status", RunStatus.DIVERGED).sum()), "diverged"))
    listed = [f"{count} {words}" for count, words in counts if count]
    return f"; of the trials that stopped short, {', '.join(listed)}" if listed else ""


def _partly_reached(rule_runs: pd.DataFrame, reached: list[int]) -> str:
    """The batch sizes some trials reached the target at, though too few to count: S(B) is the
    median over seeds, so a batch reached in half its seeds or fewer is not reached."""
    hit = matches(rule_runs, "status", RunStatus.REACHED)
    counts = pd.DataFrame({"batch_size": numeric_column(rule_runs, "batch_size"), "hit": hit})
    by_batch = counts.groupby("batch_size")["hit"].agg(["sum", "size"])
    partly = by_batch[(by_batch["sum"] > 0) & ~by_batch.index.isin(reached)]
    if partly.empty:
        return ""
    listed = [f"{int(b)} in {int(row['sum'])} of {int(row['size'])} trials"
              for b, row in partly.iterrows()]
    return (f"; some trials reached it at {_in_words(listed)}, too few to count: S(B) is the"
            " median over the seeds at a learning rate, so a batch size counts once more than"
            " half of its seeds at one learning rate reach the target")


def _fit(rule_runs: pd.DataFrame, cells: pd.DataFrame, range_factor: float) -> CriticalBatchFit:
    reason = edge_case_reason(rule_runs, cells)
    if reason:
        return CriticalBatchFit(math.nan, math.nan, math.nan, math.nan, reason)
    fit = fit_critical_batch(
        cells["batch_size"], cells["steps_to_target"], range_factor=range_factor
    )
    if fit.reason and not fit.bound:
        fit = dataclasses.replace(fit, reason=fit.reason + _unreached_note(rule_runs, cells))
    return fit


def _unreached_note(rule_runs: pd.DataFrame, cells: pd.DataFrame) -> str:
    """The batch sizes that ran but whose median did not reach the target, and how their trials
    ended: a fit that asks for "more batch sizes" must say when some were run and lost
    (diverged, stalled), since the remedy is then the learning rate or the budget, not more
    batches."""
    steps = numeric_column(cells, "steps_to_target")
    reached = {int(b) for b, v in zip(cells["batch_size"], steps, strict=True)
               if math.isfinite(v)}
    batches = numeric_column(rule_runs, "batch_size")
    lost = sorted({int(b) for b in batches if b > 0} - reached)
    if not lost:
        return ""
    lost_runs = rule_runs[np.isin(batches, lost)]
    noun = "batch sizes" if len(lost) > 1 else "batch size"
    return (f"; {noun} {_in_words(map(str, lost))} ran but their median did not reach the target"
            f"{_stopped_short(lost_runs)}")


def _summary(
    rule_runs: pd.DataFrame,
    rule: str,
    fit: CriticalBatchFit,
    labels: pd.DataFrame,
    settings: AnalysisConfig,
    step_fit: StepTimeFit,
    b_cap: float,
) -> CriticalBatchSummary:
    supported = math.isfinite(fit.b_crit) and not fit.bound
    low, high = math.nan, math.nan
    level = settings.b_crit_read_level or BOOTSTRAP_CONFIDENCE
    note = fit.reason
    if supported:
        factor = settings.b_crit_range_factor  # the fit's own: the three must agree
        low, high = bootstrap_critical_batch(rule_runs, rule, n=settings.bootstrap_samples,
                                             confidence=level, range_factor=factor)
        note = interval_note(rule_runs, rule, (low, high), range_factor=factor)
    batches = numeric_column(rule_runs, "batch_size")
    batch_range = (
        (float(np.nanmin(batches)), float(np.nanmax(batches)))
        if np.isfinite(batches).any()
        else (math.nan, math.nan)
    )
    # S_min and E_min are reported only beside a B_crit: where the data support a bound, one of
    # them is indistinguishable from zero and their ratio is round-off.
    return CriticalBatchSummary(
        s_min=fit.s_min if supported else math.nan,
        e_min=fit.e_min if supported else math.nan,
        s_min_se=fit.s_min_se if supported else math.nan,
        e_min_se=fit.e_min_se if supported else math.nan,
        b_crit=fit.b_crit if supported else math.nan,
        b_crit_low=low,
        b_crit_high=high,
        r2=fit.r2,
        reason=fit.reason if not supported else "",
        bound=fit.bound,
        bound_batch=float(fit.bound_batch) if fit.bound else math.nan,
        interval_note=note,
        interval_level=level,
        batch_range=batch_range,
        optimal_batch=(
            optimal_batch(step_fit.alpha_s, step_fit.beta_s, fit.b_crit, b_cap)
            if supported
            else math.nan
        ),
        regimes=regime_ranges(labels),
        optimal_batch_interval=(
            optimal_batch_interval(step_fit, fit.b_crit, low, high, b_cap)
            if supported
            else (math.nan, math.nan)
        ),
    )


def regime_ranges(labels: pd.DataFrame) -> tuple[RegimeRange, ...]:
    """Consecutive batches with the same regime (batches of unknown regime skipped)."""
    ranges: list[RegimeRange] = []
    for batch, regime in zip(labels["batch_size"], labels["regime"], strict=True):
        if not isinstance(regime, str):
            continue
        if ranges and ranges[-1].regime == regime:
            ranges[-1] = RegimeRange(regime, ranges[-1].first_batch, int(batch))
        else:
            ranges.append(RegimeRange(regime, int(batch), int(batch)))
    return tuple(ranges)


def _in_words(items) -> str:
    """"a", "a and b", "a, b and c"."""
    items = list(items)
    return ", ".join(items[:-1]) + " and " + items[-1] if len(items) > 1 else items[0]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
