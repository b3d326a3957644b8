"""The generalization gap: every metric after the same amount of training data.

Steps to target compare batch sizes at equal quality; this compares them at equal data seen
(`convergence.gap_epochs` epochs: the one evaluation per trial with `at_gap_budget` true), the
"large batches generalize worse at the same epochs" effect (Keskar et al. 2017; Golmant et al.
2018). Per (lr_rule, batch) the median over seeds of each metric; per rule and validation
metric the slope of the metric against log2(batch) with an interval, and a verdict that says
"visible" only when the interval excludes zero.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from batchscale.analysis.summary import GapSummary, GapTrend
from batchscale.fits import numeric_column
from batchscale.metrics import METRICS
from batchscale.tdist import t_quantile

GAP_CONFIDENCE = 0.90
"""Two-sided confidence of the slope's interval."""
GAP_BOOTSTRAP_SAMPLES = 2000
GAP_BOOTSTRAP_SEED = 0
VALIDATION_METRICS = ("val_accuracy", "val_miou", "val_pixel_accuracy", "val_perplexity",
                      "val_loss")
"""The validation metrics the gap table shows, in the order the sentence prefers them."""
TABLE_METRICS = (*VALIDATION_METRICS, "train_loss")
NOT_MEASURED = ("not measured: no trial recorded its metrics at a fixed budget of data"
                " (set convergence.gap_epochs)")


def budget_rows(curves: pd.DataFrame) -> pd.DataFrame:
    """The curves rows of the gap budget (none in tables from before `at_gap_budget`)."""
    if "at_gap_budget" not in curves.columns or curves.empty:
        return curves.iloc[0:0]
    flag = curves["at_gap_budget"].eq(True).to_numpy(dtype=bool, na_value=False)
    return curves[flag]


def present_metrics(rows: pd.DataFrame) -> list[str]:
    """The table's metrics that have at least one finite value at the budget."""
    return [m for m in TABLE_METRICS
            if m in rows.columns and np.isfinite(numeric_column(rows, m)).any()]


def gap_table(curves: pd.DataFrame) -> pd.DataFrame:
    """Per (lr_rule, batch_size): seeds, median examples seen and the median over seeds of
    every metric present at the budget. Empty when the gap was not measured."""
    rows = budget_rows(curves)
    metrics = present_metrics(rows)
    columns = ["lr_rule", "batch_size", "seeds", "examples_seen", *metrics]
    if rows.empty:
        return pd.DataFrame(columns=columns)
    values = rows.assign(**{m: numeric_column(rows, m)
                            for m in ["examples_seen", "batch_size", *metrics]})
    grouped = values.groupby(["lr_rule", "batch_size"], sort=True)
    table = grouped[["examples_seen", *metrics]].median().reset_index()
    table.insert(2, "seeds", grouped["seed"].nunique().to_numpy())
    return table[columns]


def gap_summary(
    curves: pd.DataFrame, gap_epochs: float | None = None, preferred: str | None = None
) -> GapSummary:
    """The gap's trends: for the `preferred` validation metric when present (the chosen
    target's), else the first of VALIDATION_METRICS present, per LR rule."""
    rows = budget_rows(curves)
    if rows.empty:
        return GapSummary(False, gap_epochs, (), NOT_MEASURED)
    present = [m for m in present_metrics(rows) if m in VALIDATION_METRICS]
    if not present:
        return GapSummary(True, gap_epochs, (), "no validation metric was recorded at the budget")
    metric = preferred if preferred in present else present[0]
    trends = tuple(
        slope_trend(str(rule), metric, numeric_column(cells, "batch_size"),
                    numeric_column(cells, metric), cells["seed"].to_numpy())
        for rule, cells in rows.groupby("lr_rule", sort=True)
    )
    return GapSummary(True, gap_epochs, trends, "")


def slope_trend(rule: str, metric: str, batch: np.ndarray, value: np.ndarray,
                seeds: np.ndarray) -> GapTrend:
    """The metric's change per doubling of the batch and whether it is distinguishable from 0.

    The interval: a bootstrap of the seeds within each batch size when every batch size has
    two or more; else the least-squares t interval of the slope (three or more points);
    else none."""
    keep = np.isfinite(batch) & (batch > 0) & np.isfinite(value)
    x, y = np.log2(batch[keep]), value[keep]
    if len(np.unique(x)) < 2:
        return GapTrend(rule, metric, math.nan, math.nan, math.nan, "", "not measurable",
                        "needs two or more batch sizes at the budget")
    slope = float(np.polyfit(x, y, 1)[0])
    cells = [np.flatnonzero(x == b) for b in np.unique(x)]
    if all(len(np.unique(seeds[keep][c])) >= 2 for c in cells):
        (low, high), source = _bootstrap_interval(x, y, cells), "seed bootstrap"
    elif len(x) >= 3:
        (low, high), source = _t_interval(x, y), "least squares"
    else:
        return GapTrend(rule, metric, slope, math.nan, math.nan, "", "not measurable",
                        "one seed at two batch sizes gives no interval")
    return GapTrend(rule, metric, slope, low, high, source, _verdict(metric, low, high), "")


def _verdict(metric: str, low: float, high: float) -> str:
    if not (math.isfinite(low) and math.isfinite(high)) or low <= 0.0 <= high:
        return "not visible"
    rises = low > 0.0
    higher_is_better = METRICS[metric].higher_is_better if metric in METRICS else True
    return "better" if rises == higher_is_better else "worse"


def _bootstrap_interval(x: np.ndarray, y: np.ndarray, cells: list[np.ndarray]
                        ) -> tuple[float, float]:
    """Percentile interval of the slope over resamplings of the seeds within each batch."""
    rng = np.random.default_rng(GAP_BOOTSTRAP_SEED)
    picks = np.concatenate(
        [rng.choice(c, size=(GAP_BOOTSTRAP_SAMPLES, len(c))) for c in cells], axis=1)
    xs, ys = x[picks], y[picks]
    dx = xs - xs.mean(axis=1, keepdims=True)
    slopes = (dx * (ys - ys.mean(axis=1, keepdims=True))).sum(axis=1) / (dx**2).sum(axis=1)
    tail = 100 * (1 - GAP_CONFIDENCE) / 2
    low, high = np.percentile(slopes, [tail, 100 - tail])
    return float(low), float(high)


def _t_interval(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The least-squares slope ± t·(its standard error), from the residuals."""
    dx = x - x.mean()
    slope = float((dx * (y - y.mean())).sum() / (dx**2).sum())
    residuals = y - y.mean() - slope * dx
    dof = len(x) - 2
    stderr = math.sqrt(float((residuals**2).sum()) / dof / float((dx**2).sum()))
    half = t_quantile(0.5 + GAP_CONFIDENCE / 2, dof) * stderr
    return slope - half, slope + half
