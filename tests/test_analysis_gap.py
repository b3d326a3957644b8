"""The generalization gap: metrics at a fixed budget of data (curves.at_gap_budget), their
median per (rule, batch), the slope against log2(batch) with its interval, and the report's
"At equal data seen" section."""

from __future__ import annotations

import numpy as np
import pytest
from target_tables import gap_curves, multi_target_runs
from test_analyze import make_sweep

from batchscale.analysis.analyze import analyze
from batchscale.analysis.gap import gap_summary, gap_table, slope_trend
from batchscale.config import AnalysisConfig
from batchscale.report.render import render_html

SETTINGS = AnalysisConfig(bootstrap_samples=50)


def test_gap_table_has_the_median_over_seeds_at_the_budget():
    curves = gap_curves(0.01)
    table = gap_table(curves)
    assert list(table.columns) == ["lr_rule", "batch_size", "seeds", "examples_seen",
                                   "val_accuracy", "val_loss", "train_loss"]
    assert table["batch_size"].tolist() == [4, 8, 16, 32, 64, 128, 256, 512]
    assert (table["seeds"] == 3).all() and (table["examples_seen"] == 4096).all()
    at_budget = curves[curves["at_gap_budget"]]
    expected = at_budget[at_budget["batch_size"] == 64]["val_accuracy"].median()
    assert table.set_index("batch_size").loc[64, "val_accuracy"] == pytest.approx(expected)


def test_a_gap_made_into_the_data_is_visible():
    gap = gap_summary(gap_curves(0.01), gap_epochs=2.0)
    (trend,) = gap.trends
    assert trend.metric == "val_accuracy" and trend.interval_source == "seed bootstrap"
    assert trend.slope_per_doubling == pytest.approx(-0.01, abs=0.002)
    assert trend.slope_high < 0 and trend.verdict == "worse"


def test_flat_data_show_no_gap():
    (trend,) = gap_summary(gap_curves(0.0)).trends
    assert trend.slope_low < 0 < trend.slope_high
    assert trend.verdict == "not visible"


def test_a_lower_is_better_metric_rising_is_worse():
    (trend,) = gap_summary(gap_curves(0.01), preferred="val_loss").trends
    assert trend.metric == "val_loss" and trend.slope_per_doubling > 0
    assert trend.verdict == "worse"


def test_one_seed_uses_the_least_squares_interval_and_two_points_give_none():
    batch = np.array([4.0, 16.0, 64.0, 256.0])
    trend = slope_trend("linear", "val_accuracy", batch, np.array([0.95, 0.93, 0.91, 0.90]),
                        np.zeros(4))
    assert trend.interval_source == "least squares" and trend.verdict == "worse"
    short = slope_trend("linear", "val_accuracy", batch[:2], np.array([0.95, 0.93]),
                        np.zeros(2))
    assert short.verdict == "not measurable"


def test_old_curves_without_the_budget_say_not_measured():
    curves = gap_curves(0.01).drop(columns="at_gap_budget")
    gap = gap_summary(curves)
    assert not gap.measured and "set convergence.gap_epochs" in gap.reason
    assert gap_table(curves).empty


def test_report_and_narrative_show_the_gap():
    runs = multi_target_runs(seeds=(0, 1, 2))
    curves = gap_curves(0.01)
    result = analyze(make_sweep(), runs, curves, SETTINGS, gap_epochs=2.0)
    assert "At equal data seen (2 epochs)" in result.markdown
    assert "the gap is visible" in result.markdown
    page = render_html(result, make_sweep(), runs, curves)
    section = page.split("<h2>At equal data seen (2 epochs)</h2>", 1)[1].split("</section>")[0]
    assert "<th>val_accuracy</th>" in section and "<th>train_loss</th>" in section
    assert section.count("<tr>") == 1 + 8
    assert section.count('<img src="data:image/png;base64,') == 2  # val_accuracy, val_loss
    flat = analyze(make_sweep(), runs, gap_curves(0.0), SETTINGS)
    assert "not visible at this noise" in flat.markdown
    assert "At equal data seen (the same examples seen)" in flat.markdown
