"""Several targets per run: the runs table has a row per (trial, target). This module splits
it by target, chooses the target the recommendation is made for, fits B_crit per target and
LR rule (the same fit as the single-target analysis, `critical_summary.critical_by_rule`), and
says whether B_crit moves as the target gets harder (McCandlish et al. 2018 predict it grows).

Version 1 rows (written before several targets) have no `target_metric`: their target is
`val_accuracy >= target_val_accuracy`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from batchscale.analysis.critical import steps_to_result
from batchscale.analysis.critical_reasons import MIN_CRITICAL_FIT_BATCHES
from batchscale.analysis.critical_summary import critical_by_rule
from batchscale.analysis.summary import CriticalBatchSummary, TargetCriticalBatch
from batchscale.config import AnalysisConfig
from batchscale.fits import StepTimeFit, numeric_column
from batchscale.metrics import METRICS, target_label

Target = tuple[str, float]
"""(metric, value); the value is NaN where a version 1 row recorded none."""
VERSION_1_METRIC = "val_accuracy"


@dataclass(frozen=True)
class TargetChoice:
    """The target the analysis table and the recommendation are for, and why."""

    target: Target | None
    """None: the runs table is empty."""
    label: str
    reason: str


UNNAMED_TARGET = "the target of your runs (not named: give target_metric and target_value columns)"

# --------------------------------------------------------------------------- splitting


def row_targets(runs: pd.DataFrame) -> list[Target]:
    """Each row's target; a version 1 row (no target_metric) is val_accuracy >= its
    target_val_accuracy."""
    metrics = runs["target_metric"].to_numpy(dtype=object) if len(runs) else []
    values = numeric_column(runs, "target_value")
    legacy = numeric_column(runs, "target_val_accuracy")
    return [
        (str(m), float(v)) if isinstance(m, str) and m else (VERSION_1_METRIC, float(old))
        for m, v, old in zip(metrics, values, legacy, strict=True)
    ]


def split_by_target(runs: pd.DataFrame) -> dict[Target, pd.DataFrame]:
    """The runs of each target, ordered by metric (first seen first), easiest value first.

    One target only (every version 1 table): the whole table, untouched, so old tables
    analyse exactly as before."""
    keys = row_targets(runs)
    distinct: list[Target] = []
    for key in keys:
        if not any(same_target(key, seen) for seen in distinct):
            distinct.append(key)
    if len(distinct) <= 1:
        return {distinct[0]: runs} if distinct else {}
    ordered = sorted(distinct, key=_order_key(distinct))
    return {
        target: runs[np.array([same_target(key, target) for key in keys], dtype=bool)]
        for target in ordered
    }


def same_target(a: Target, b: Target) -> bool:
    if a[0] != b[0]:
        return False
    both_missing = math.isnan(a[1]) and math.isnan(b[1])
    return both_missing or math.isclose(a[1], b[1], rel_tol=1e-9, abs_tol=1e-12)


def _order_key(targets: list[Target]):
    first_seen = {metric: i for i, (metric, _) in reversed(list(enumerate(targets)))}

    def key(target: Target) -> tuple[int, int, float]:
        metric, value = target
        higher = METRICS[metric].higher_is_better if metric in METRICS else True
        easiness = value if higher else -value  # ascending: easiest first
        return first_seen[metric], int(math.isnan(value)), 0.0 if math.isnan(value) else easiness

    return key


def label_of(target: Target) -> str:
    metric, value = target
    if metric == VERSION_1_METRIC and math.isnan(value):
        # No target_metric and no target_val_accuracy: a table brought without its target.
        return UNNAMED_TARGET
    if math.isnan(value):
        return f"{metric} (target value not recorded)"
    return target_label(metric, value) if metric in METRICS else f"{metric} {value:g}"


# --------------------------------------------------------------------------- choosing


def reached_batches(table: pd.DataFrame) -> dict[str, tuple[int, ...]]:
    """Per LR rule of a `steps_to_result` table: the batch sizes whose S(B) is finite."""
    steps = numeric_column(table, "steps_to_target")
    reached = table[np.isfinite(steps)]
    return {
        str(rule): tuple(sorted(int(b) for b in cells["batch_size"]))
        for rule, cells in reached.groupby("lr_rule", sort=True)
    }


def fittable(table: pd.DataFrame) -> bool:
    """Reached (median over seeds) at MIN_CRITICAL_FIT_BATCHES batch sizes for some rule."""
    return any(len(b) >= MIN_CRITICAL_FIT_BATCHES for b in reached_batches(table).values())


def choose_target(
    tables: dict[Target, pd.DataFrame], primary: Target | None = None
) -> TargetChoice:
    """The target the recommendation is made for.

    1. The primary target (the config's `primary: true`), when the runs have it.
    2. Else the hardest eligible target: eligible = reached (median over seeds) at
       MIN_CRITICAL_FIT_BATCHES or more batch sizes for some LR rule; hardest = most steps to
       target at the smallest batch size that every eligible target reached (same LR rule, the
       first in sorted order); where no batch size was reached by all of them, the hardest
       value of the first eligible target's metric.
    3. Else (no target eligible) the first target: the first metric's easiest value.

    `tables`: `steps_to_result` of each target's runs, in `split_by_target`'s order."""
    if not tables:
        return TargetChoice(None, "", "no convergence trials")
    note = ""
    if primary is not None:
        found = [t for t in tables if same_target(t, primary)]
        if found:
            return TargetChoice(found[0], label_of(found[0]), "marked primary in the config")
        note = f"the primary target {label_of(primary)} has no trials; "
    if len(tables) == 1:
        only = next(iter(tables))
        return TargetChoice(only, label_of(only), note + "the only target of the trials")
    eligible = [t for t, table in tables.items() if fittable(table)]
    need = f"reached at {MIN_CRITICAL_FIT_BATCHES} or more batch sizes"
    if not eligible:
        first = next(iter(tables))
        return TargetChoice(first, label_of(first), note + f"no target was {need} for any LR"
                            " rule, so the first target")
    if len(eligible) == 1:
        return TargetChoice(eligible[0], label_of(eligible[0]),
                            note + f"the only target {need}")
    hardest, why = _hardest(eligible, tables)
    return TargetChoice(hardest, label_of(hardest), note + f"the hardest target {need}: {why}")


def _hardest(eligible: list[Target], tables: dict[Target, pd.DataFrame]) -> tuple[Target, str]:
    cells = [_reached_cells(tables[t]) for t in eligible]
    common = sorted(set.intersection(*(set(c) for c in cells)), key=lambda rc: (rc[1], rc[0]))
    if common:
        rule, batch = common[0]
        steps = [c[(rule, batch)] for c in cells]
        # Ties go to the later target: within a metric, the harder value.
        best = max(range(len(eligible)), key=lambda i: (steps[i], i))
        return eligible[best], (f"most steps to target at batch {batch} ({rule} rule),"
                                f" {steps[best]:,.0f}")
    metric = eligible[0][0]
    same_metric = [t for t in eligible if t[0] == metric]
    return same_metric[-1], (f"no batch size reached every such target, so the hardest value"
                             f" of {metric}")


def _reached_cells(table: pd.DataFrame) -> dict[tuple[str, int], float]:
    steps = numeric_column(table, "steps_to_target")
    return {
        (str(rule), int(batch)): float(s)
        for rule, batch, s in zip(table["lr_rule"], table["batch_size"], steps, strict=True)
        if math.isfinite(s)
    }


# --------------------------------------------------------------------------- B_crit vs target


def target_fits(
    groups: dict[Target, pd.DataFrame],
    tables: dict[Target, pd.DataFrame],
    settings: AnalysisConfig,
    step_fit: StepTimeFit,
    b_cap: float,
    known: dict[Target, dict[str, CriticalBatchSummary]] | None = None,
) -> tuple[TargetCriticalBatch, ...]:
    """B_crit per target and LR rule, by `critical_by_rule` on each target's runs (`known`:
    fits already made, reused rather than bootstrapped again)."""
    rows = []
    for target, runs in groups.items():
        table = tables[target]
        fits = next((v for k, v in (known or {}).items() if same_target(k, target)), None)
        if fits is None:
            fits, _ = critical_by_rule(runs, table, settings, step_fit, b_cap)
        batches = reached_batches(table)
        for rule, fit in fits.items():
            rows.append(TargetCriticalBatch(
                metric=target[0], value=target[1], label=label_of(target), rule=rule,
                b_crit=fit.b_crit, b_crit_low=fit.b_crit_low, b_crit_high=fit.b_crit_high,
                bound=fit.bound, bound_batch=fit.bound_batch, s_min=fit.s_min, e_min=fit.e_min,
                s_min_se=fit.s_min_se, e_min_se=fit.e_min_se,
                reached_batches=batches.get(rule, ()), reason=fit.reason,
                optimal_batch=fit.optimal_batch,
                optimal_batch_interval=fit.optimal_batch_interval,
            ))
    return tuple(rows)


def target_tables(groups: dict[Target, pd.DataFrame]) -> dict[Target, pd.DataFrame]:
    """`steps_to_result` of each target's runs."""
    return {target: steps_to_result(runs) for target, runs in groups.items()}


def b_crit_range(fit: TargetCriticalBatch) -> tuple[float, float] | None:
    """What the data say about B_crit as an interval: the bootstrap interval, (bound, ∞) for
    "above", (0, bound) for "below"; None when they say nothing comparable."""
    if fit.bound == "above" and math.isfinite(fit.bound_batch):
        return fit.bound_batch, math.inf
    if fit.bound == "below" and math.isfinite(fit.bound_batch):
        return 0.0, fit.bound_batch
    if math.isfinite(fit.b_crit_low) and math.isfinite(fit.b_crit_high):
        return fit.b_crit_low, fit.b_crit_high
    return None


def trend_pairs(
    fits: tuple[TargetCriticalBatch, ...],
) -> list[tuple[str, str, TargetCriticalBatch, TargetCriticalBatch]]:
    """(metric, rule, easiest, hardest) for every metric and rule with two or more targets."""
    pairs = []
    for metric in dict.fromkeys(f.metric for f in fits):
        for rule in dict.fromkeys(f.rule for f in fits if f.metric == metric):
            chain = [f for f in fits if f.metric == metric and f.rule == rule
                     and math.isfinite(f.value)]
            if len({f.value for f in chain}) >= 2:
                pairs.append((metric, rule, chain[0], chain[-1]))
    return pairs


def trend(easiest: TargetCriticalBatch, hardest: TargetCriticalBatch) -> str:
    """"grows" / "falls" when the two ranges do not overlap, "overlap" when they do,
    "unknown" when either has no range."""
    low_range, high_range = b_crit_range(easiest), b_crit_range(hardest)
    if low_range is None or high_range is None:
        return "unknown"
    if high_range[0] > low_range[1]:
        return "grows"
    if high_range[1] < low_range[0]:
        return "falls"
    return "overlap"
