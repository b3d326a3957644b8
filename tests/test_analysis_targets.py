"""Several targets per run (runs schema version 2): B_crit per target, the target the
recommendation is for, the "B_crit vs target" sentence, metrics and report section; and
version 1 tables analysed as before."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from target_tables import multi_target_runs
from test_analyze import make_runs, make_sweep

from batchscale.analysis.analyze import analyze
from batchscale.config import AnalysisConfig
from batchscale.report.render import render_html

SETTINGS = AnalysisConfig(bootstrap_samples=200)


def by_value(result, rule="linear"):
    return {fit.value: fit for fit in result.summary.targets if fit.rule == rule}


@pytest.fixture(scope="module")
def three_targets():
    return analyze(make_sweep(), multi_target_runs(), None, SETTINGS)


def test_b_crit_is_fitted_per_target(three_targets):
    fits = by_value(three_targets)
    assert sorted(fits) == [0.90, 0.93, 0.95]
    for value, expected in ((0.90, 20.0), (0.93, 40.0), (0.95, 80.0)):
        fit = fits[value]
        assert fit.b_crit == pytest.approx(expected, rel=0.15), (value, fit)
        assert fit.b_crit_low < fit.b_crit < fit.b_crit_high
        assert not fit.bound
        assert fit.reached_batches == (4, 8, 16, 32, 64, 128, 256, 512)
        assert fit.label == f"val_accuracy >= {value:g}"


def test_the_hardest_target_is_chosen_and_named(three_targets):
    summary = three_targets.summary
    assert summary.target == "val_accuracy >= 0.95"
    assert "hardest target" in summary.target_reason
    assert summary.critical_batch["linear"].b_crit == pytest.approx(80.0, rel=0.15)
    assert {(r["target_metric"], r["target_value"]) for r in three_targets.rows} == {
        ("val_accuracy", 0.95)
    }
    # One analysis row per batch size: the trials' other targets' rows are not mixed in.
    assert len(three_targets.rows) == 8
    assert "for val_accuracy >= 0.95" in three_targets.markdown
    assert "**For the target val_accuracy >= 0.95**" in three_targets.markdown


def test_b_crit_growth_is_stated_when_intervals_do_not_overlap(three_targets):
    text = three_targets.markdown
    assert "B_crit vs target (val_accuracy)" in text
    assert "B_crit grows as the target gets harder" in text
    assert "no detectable change" not in text


def test_per_target_metrics_keep_todays_names_for_the_chosen_target(three_targets):
    metrics = three_targets.metrics
    assert metrics["b_crit_linear"] == pytest.approx(80.0, rel=0.15)
    assert metrics["b_crit_linear__val_accuracy_0p9"] == pytest.approx(20.0, rel=0.15)
    assert metrics["b_crit_linear__val_accuracy_0p93"] == pytest.approx(40.0, rel=0.15)
    assert metrics["b_crit_low_linear__val_accuracy_0p95"] < metrics["b_crit_linear"]


def test_a_primary_target_overrides_the_hardest():
    result = analyze(make_sweep(), multi_target_runs(), None, SETTINGS,
                     primary_target=("val_accuracy", 0.90))
    assert result.summary.target == "val_accuracy >= 0.9"
    assert result.summary.target_reason == "marked primary in the config"
    assert result.summary.critical_batch["linear"].b_crit == pytest.approx(20.0, rel=0.15)
    missing = analyze(make_sweep(), multi_target_runs(), None, SETTINGS,
                      primary_target=("val_accuracy", 0.99))
    assert missing.summary.target == "val_accuracy >= 0.95"
    assert missing.summary.target_reason.startswith(
        "the primary target val_accuracy >= 0.99 has no trials")


def test_a_target_reached_at_too_few_batches_is_not_chosen():
    targets = {0.90: (100.0, 2000.0), 0.99: (400.0, 80000.0)}
    runs = multi_target_runs(targets)
    hard = (runs["target_value"] == 0.99) & (runs["batch_size"] > 8)
    runs.loc[hard, ["steps_to_target", "examples_to_target", "time_to_target_s"]] = None
    runs.loc[hard, "status"] = "not_reached"
    result = analyze(make_sweep(), runs, None, SETTINGS)
    assert result.summary.target == "val_accuracy >= 0.9"
    assert "the only target reached at 3 or more batch sizes" in result.summary.target_reason
    hardest = by_value(result)[0.99]
    assert not math.isfinite(hardest.b_crit) and "only 2 of 8" in hardest.reason
    assert "cannot tell" in result.markdown


def test_equal_b_crit_reads_as_no_detectable_change():
    runs = multi_target_runs({0.90: (100.0, 4000.0), 0.95: (200.0, 8000.0)}, noise=0.05)
    result = analyze(make_sweep(), runs, None, SETTINGS)
    fits = by_value(result)
    assert fits[0.90].b_crit == pytest.approx(40.0, rel=0.3)
    assert fits[0.95].b_crit == pytest.approx(40.0, rel=0.3)
    assert "no detectable change (intervals overlap)" in result.markdown
    assert "B_crit grows" not in result.markdown


def test_a_bound_is_reported_as_a_bound():
    # The hardest target's steps still halve with each doubling up to 512: B_crit above 512.
    runs = multi_target_runs({0.90: (100.0, 2000.0), 0.95: (0.5, 400000.0)})
    result = analyze(make_sweep(), runs, None, SETTINGS)
    hardest = by_value(result)[0.95]
    assert hardest.bound == "above" and hardest.bound_batch == 512
    assert not math.isfinite(hardest.b_crit)
    assert result.metrics["b_crit_linear__val_accuracy_0p95_above"] == 512
    assert "B_crit above 512: steps still fall like 1/B at val_accuracy >= 0.95" in (
        result.markdown)
    assert "B_crit grows as the target gets harder" in result.markdown


def test_loss_targets_of_two_metrics():
    val = multi_target_runs({0.5: (100.0, 2000.0), 0.3: (150.0, 6000.0)}, metric="val_loss")
    train = multi_target_runs({0.2: (120.0, 3000.0)}, metric="train_loss")
    result = analyze(make_sweep(), pd.concat([val, train], ignore_index=True), None, SETTINGS)
    labels = [fit.label for fit in result.summary.targets]
    assert labels == ["val_loss <= 0.5", "val_loss <= 0.3", "train_loss <= 0.2"]
    # Most steps at batch 4: val_loss <= 0.3 (1650) over train_loss (870) and val_loss <= 0.5.
    assert result.summary.target == "val_loss <= 0.3"
    assert "B_crit vs target (val_loss)" in result.markdown
    assert "B_crit vs target (train_loss)" not in result.markdown


def test_report_has_the_b_crit_vs_target_table_and_plot(three_targets):
    runs = multi_target_runs()
    page = render_html(three_targets, make_sweep(), runs, None)
    section = page.split("<h2>B_crit vs target</h2>", 1)[1].split("</section>", 1)[0]
    assert "<th>B_crit (90% interval) or bound</th>" in section
    assert section.count("<tr>") == 1 + 3  # heading and one row per target
    assert "val_accuracy &gt;= 0.93" in section
    assert '<img src="data:image/png;base64,' in section
    assert "Results by LR rule and batch size (val_accuracy &gt;= 0.95)" in page


def test_version_1_tables_analyse_as_before():
    """A runs table from before several targets (no target columns) gives the same fits,
    rows and recommendation as the same trials written with their one target."""
    old = make_runs(seeds=(0, 1)).assign(target_val_accuracy=0.9)
    assert "target_metric" not in old.columns
    new = old.assign(target_metric="val_accuracy", target_value=0.9, schema_version=2)
    before = analyze(make_sweep(), old, None, SETTINGS)
    after = analyze(make_sweep(), new, None, SETTINGS)
    assert before.summary.target == "val_accuracy >= 0.9"
    assert before.summary.target_reason == "the only target of the trials"
    assert before.summary.critical_batch == after.summary.critical_batch
    assert before.rows == after.rows
    assert before.summary.recommendation == after.summary.recommendation
    assert [(f.rule, f.b_crit) for f in before.summary.targets] == [
        (rule, fit.b_crit) for rule, fit in before.summary.critical_batch.items()]
    # One target: no per-target metric names beside today's.
    assert not any("__" in name for name in before.metrics)
    assert before.summary.gap is not None and not before.summary.gap.measured
    page = render_html(before, make_sweep(), old, None)
    assert "set convergence.gap_epochs" in page
    assert "<h2>B_crit vs target</h2>" in page
    # One target value: no one-point plot, a line saying what the plot needs instead.
    section = page.split("<h2>B_crit vs target</h2>", 1)[1].split("</section>", 1)[0]
    assert "<img " not in section
    assert "one target value per metric: B_crit against the target needs two" in section


def test_the_stage_passes_the_configs_primary_target():
    from batchscale.analysis.stage import primary_target
    from batchscale.config.models import ConvergenceConfig, ExperimentConfig

    marked = ConvergenceConfig(targets=[{"metric": "val_accuracy", "value": 0.9},
                                        {"metric": "val_loss", "value": 0.3, "primary": True}])
    assert primary_target(ExperimentConfig(convergence=marked)) == ("val_loss", 0.3)
    assert primary_target(ExperimentConfig()) is None


def test_an_interval_end_at_the_fit_range_cut_reads_as_open():
    """The LM example's interval "4–17.8" had its low end at the fit range's cut (half the
    smallest batch, 8): not an estimate, so the table and the prose say "below 8"."""
    from dataclasses import replace

    from batchscale.analysis.narrative import interval_words, target_interval_text
    from batchscale.report.render import _target_cells

    assert interval_words(4.0, 17.8, 8, 128) == "below 8, the smallest batch measured, to 17.8"
    assert interval_words(24.0, 300.0, 8, 128) == "24 to above 128, the largest batch measured"
    assert interval_words(4.0, 300.0, 8, 128) == "spanning the whole measured range 8–128"
    assert interval_words(12.1, 62.0, 4, 32) == "12.1 to above 32, the largest batch measured"
    assert interval_words(12.1, 30.0, 4, 32) == "12.1–30"
    # an interval wholly under the smallest batch must not read "below 8 ... to 7.53"
    assert interval_words(7.52, 7.53, 8, 128) == "entirely below 8, the smallest batch measured"
    fit = by_value(analyze(make_sweep(), multi_target_runs(), None, SETTINGS))
    some = next(f for f in fit.values() if math.isfinite(f.b_crit))
    floored = replace(some, b_crit=9.1, b_crit_low=4.0, b_crit_high=17.8,
                      reached_batches=(8, 16, 32, 64, 128))
    assert target_interval_text(floored) == "below 8, the smallest batch measured, to 17.8"
    cell = _target_cells(floored)[2][0]
    assert cell.endswith("(below 8, the smallest batch measured, to 17.8)") and "4–" not in cell
    # S_min and E_min carry their standard errors, or say they have none
    errors = replace(floored, s_min=93.64, s_min_se=4.1, e_min=7427.0, e_min_se=math.nan)
    assert [c for c, _ in _target_cells(errors)[3:5]] == ["93.64 ± 4.1", "7,427 (no error)"]


def test_run_summary_states_a_cut_interval_end_in_words():
    from batchscale.lake.summary import _b_crit_line

    rows = [{"lr_rule": "sqrt", "batch_size": b, "steps_to_target": 100 + 900 / b}
            for b in (8, 16, 32, 64, 128)]
    fit = {"b_crit": 9.1, "b_crit_low": 4.0, "b_crit_high": 17.8, "s_min": 100.0,
           "e_min": 910.0}
    line = _b_crit_line(fit, "sqrt", rows, None)
    assert line.startswith("9.1 (below 8, the smallest batch measured, to 17.8)"), line
    inside = _b_crit_line({**fit, "b_crit_low": 8.5}, "sqrt", rows, None)
    assert inside.startswith("9.1 [8.5, 17.8]"), inside


def test_run_summary_says_why_a_b_crit_has_no_interval():
    """Seen with the one-seed segmentation example: 'B_crit (sqrt): 21.9 [-, -]'."""
    import pyarrow as pa

    from batchscale.lake.summary import _b_crit_line

    rows = [{"lr_rule": "sqrt", "batch_size": b, "steps_to_target": 180 + 4000 / b}
            for b in (4, 8, 16, 32)]
    fit = {"b_crit": 21.9, "b_crit_low": float("nan"), "b_crit_high": float("nan"),
           "s_min": 182.9, "e_min": 4006.0}
    one_seed = pa.table({"lr_rule": ["sqrt"] * 4, "batch_size": [4, 8, 16, 32], "seed": [0] * 4})
    line = _b_crit_line(fit, "sqrt", rows, one_seed)
    assert line.startswith("21.9 (no interval: one seed per batch size: nothing to resample)")
    assert "[-, -]" not in _b_crit_line(fit, "sqrt", rows, None)


def test_a_table_that_names_no_target_value_says_what_the_plot_needs_not_that_b_crit_is_missing():
    """A user's runs table with no target columns: its one target has no value, but it has a
    B_crit; the plot's note must not say it has none."""
    import dataclasses

    from batchscale.analysis.plots_targets import target_plot

    result = analyze(make_sweep(), make_runs(), None, SETTINGS)
    unnamed = tuple(dataclasses.replace(f, value=math.nan) for f in result.summary.targets)
    assert any(math.isfinite(f.b_crit) for f in unnamed)
    plot = target_plot(dataclasses.replace(result.summary, targets=unnamed))
    assert plot.image_uri is None
    assert plot.missing.startswith("one target value per metric")
