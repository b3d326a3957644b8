"""Known-answer tests of the regimes along the fitted S(B) curve, time to target and B*
(batchscale.analysis.critical.regimes, timetotarget), and of how the analysis reads the
critical batch of a stopped adaptive search. The fit itself: tests/test_analysis_critical.py."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from test_analyze import BATCHES, E_MIN, S_MIN, make_runs, make_sweep, run_row

from batchscale.analysis.analyze import analyze
from batchscale.analysis.critical import (
    DIMINISHING_RETURNS,
    MAXIMAL_DATA_PARALLELISM,
    PERFECT_SCALING,
    CriticalBatchFit,
    fit_critical_batch,
    regimes,
)
from batchscale.analysis.timetotarget import (
    optimal_batch,
    optimal_batch_text,
    step_times,
    time_to_target,
)
from batchscale.config import AnalysisConfig

# --------------------------------------------------------------------------- regimes, time


def test_regimes_perfect_scaling_and_maximal_parallelism():
    batch = np.array([8, 16, 32, 64, 128], dtype=float)
    steps = 6400 / batch
    perfect = regimes(batch, steps, fit_critical_batch(batch, steps))
    assert list(perfect.columns) == ["batch_size", "fit_slope", "measured_slope", "regime"]
    assert perfect["fit_slope"].to_numpy() == pytest.approx(-1.0)  # bound "above"
    assert perfect["measured_slope"].to_numpy() == pytest.approx(-1.0)
    assert set(perfect["regime"]) == {PERFECT_SCALING}
    flat_steps = np.full(batch.size, 40.0)
    flat = regimes(batch, flat_steps, fit_critical_batch(batch, flat_steps))
    assert flat["fit_slope"].to_numpy() == pytest.approx(0.0)  # bound "below"
    assert set(flat["regime"]) == {MAXIMAL_DATA_PARALLELISM}


def test_regimes_along_a_critical_batch_curve_follow_b_crit():
    """Slope −B_crit/(B + B_crit): perfect scaling up to B_crit/4, maximal from 4·B_crit."""
    batch = np.array(BATCHES, dtype=float)
    steps = S_MIN + E_MIN / batch
    table = regimes(batch, steps, fit_critical_batch(batch, steps))
    assert table["fit_slope"].to_numpy() == pytest.approx(-64 / (batch + 64))
    labels = dict(zip(table["batch_size"], table["regime"], strict=True))
    assert [labels[b] for b in (4, 8)] == [PERFECT_SCALING] * 2
    assert [labels[b] for b in (32, 64, 128)] == [DIMINISHING_RETURNS] * 3
    assert [labels[b] for b in (512, 1024)] == [MAXIMAL_DATA_PARALLELISM] * 2


@pytest.mark.parametrize("rng_seed", range(4))
def test_regimes_from_the_fit_do_not_flip_with_noise(rng_seed):
    """With 15 % noise the finite differences jump around; the fitted curve's labels go
    perfect → diminishing → maximal in order, as B_crit says."""
    batch = np.array(BATCHES, dtype=float)
    noise = np.exp(np.random.default_rng(rng_seed).normal(0, 0.15, batch.size))
    steps = (S_MIN + E_MIN / batch) * noise
    fit = fit_critical_batch(batch, steps)
    table = regimes(batch, steps, fit)
    order = [PERFECT_SCALING, DIMINISHING_RETURNS, MAXIMAL_DATA_PARALLELISM]
    ranks = [order.index(label) for label in table["regime"]]
    assert ranks == sorted(ranks)
    assert table["regime"].iloc[0] == PERFECT_SCALING  # B = 4 ≪ B_crit
    assert table["regime"].iloc[-1] == MAXIMAL_DATA_PARALLELISM  # B = 1024 ≫ B_crit
    assert np.isfinite(table["measured_slope"]).all()


def test_regimes_without_a_fit_use_the_measured_slope():
    batch = np.array(BATCHES, dtype=float)
    table = regimes(batch, S_MIN + E_MIN / batch)
    assert table["fit_slope"].isna().all()
    assert table["regime"].iloc[0] == PERFECT_SCALING
    assert table["regime"].iloc[-1] == MAXIMAL_DATA_PARALLELISM
    too_few = fit_critical_batch([4, 8], [100, 60])
    assert regimes([4, 8], [100, 60], too_few)["fit_slope"].isna().all()


def test_regimes_with_missing_steps_are_unknown():
    table = regimes([4, 8, 16], [100, math.nan, 30])
    assert table["regime"].iloc[1] is None
    assert table["regime"].iloc[0] is not None
    fit = CriticalBatchFit(100.0, 6400.0, 64.0, 1.0)
    with_fit = regimes([4, 8, 16], [100, math.nan, 30], fit)
    assert with_fit["regime"].iloc[1] is None and math.isnan(with_fit["fit_slope"].iloc[1])


def test_time_to_target_and_optimal_batch():
    assert time_to_target(200, 0.5) == 100
    assert optimal_batch(alpha=1.0, beta=0.01, b_crit=100) == pytest.approx(100)
    assert optimal_batch(alpha=1.0, beta=0.01, b_crit=100, b_max=50) == 50
    assert math.isnan(optimal_batch(1.0, 0.01, math.nan))
    assert math.isnan(optimal_batch(-1.0, 0.01, 100))


def test_a_capped_end_of_b_stars_interval_is_said_as_a_bound():
    assert optimal_batch_text(106, (80, 140)) == "≈ 106 [80, 140] (90%)"
    assert optimal_batch_text(300, (200, 512), cap=512) == "≈ 300 [200, ≥ 512, capped] (90%)"
    assert optimal_batch_text(512, (512, 512), cap=512).startswith("at or above 512, the "
                                                                   "largest batch")


def test_step_times_use_measurements_and_the_line_elsewhere():
    sweep = make_sweep(alpha=1e-3, beta=1e-5, batches=(16, 64, 256))
    times, fit, source = step_times(sweep, pd.DataFrame(), [16, 32, 1024])
    assert "synthetic" in source
    assert times == pytest.approx([1e-3 + 16e-5, 1e-3 + 32e-5, 1e-3 + 1024e-5])
    assert fit.beta_s == pytest.approx(1e-5)




def test_a_configured_range_factor_reaches_the_interval_too():
    """B_crit ≈ 200 measured up to batch 64: a number with b_crit_range_factor 4 (within 4×),
    so its interval and note must use 4 too, not the default 2 (which made the interval say
    "the data only show a bound" beside the number)."""
    batches = (4, 8, 16, 32, 64)
    noise = (1.02, 0.98, 1.01, 0.99, 1.0)
    runs = pd.DataFrame([
        run_row(b, "linear", 0.1, seed, round((100 + 20_000 / b) * f * (1 + seed / 100)))
        for b, f in zip(batches, noise, strict=True) for seed in (0, 1)])
    settings = AnalysisConfig(bootstrap_samples=50, b_crit_range_factor=4.0)
    fit = analyze(None, runs, None, settings).summary.critical_batch["linear"]
    assert 128 < fit.b_crit < 256
    assert math.isfinite(fit.b_crit_low) and math.isfinite(fit.b_crit_high)
    assert "only show" not in fit.interval_note


def test_a_bound_sentence_speaks_of_the_fit_not_of_the_table():
    """Seen: "B_crit below 16 — the steps to target hardly change" beside a table whose steps
    fell 110 → 60: the sentence now says what the fit can and cannot tell."""
    from batchscale.analysis.narrative import _bound_text
    from batchscale.analysis.summary import CriticalBatchSummary

    fields = {f.name: math.nan for f in dataclasses.fields(CriticalBatchSummary)}
    below = CriticalBatchSummary(**{**fields, "reason": "no batch size saved steps",
                                    "bound": "below", "bound_batch": 16.0, "interval_note": "",
                                    "regimes": (), "batch_range": (16.0, 64.0)})
    text = _bound_text(below)
    assert "hardly change" not in text and "cannot tell E_min from zero" in text


def test_an_adaptive_searchs_trials_are_read_at_the_level_its_stop_needs():
    """Trials an adaptive search chose are read at critical.ADAPTIVE_READ_LEVEL (a search that
    stops once its interval is narrow over-claims at 90 %): a wider interval holding the 90 %
    one, and the narrative says at which level and why; a grid's stays at 90 %, and
    analysis.b_crit_read_level sets the level for either."""
    from batchscale.analysis.critical import ADAPTIVE_READ_LEVEL
    from batchscale.analysis.stage import settings_for

    runs = make_runs(noise=0.1)
    grid = analyze(None, runs, None, settings_for(AnalysisConfig(), adaptive=False))
    searched = analyze(None, runs, None, settings_for(AnalysisConfig(), adaptive=True))
    for rule, fit in grid.summary.critical_batch.items():
        wide = searched.summary.critical_batch[rule]
        assert (fit.interval_level, wide.interval_level) == (0.90, ADAPTIVE_READ_LEVEL)
        assert wide.b_crit == fit.b_crit
        assert wide.b_crit_low <= fit.b_crit_low and wide.b_crit_high >= fit.b_crit_high
        assert wide.b_crit_high / wide.b_crit_low > fit.b_crit_high / fit.b_crit_low
    assert "read at the 98% level: an adaptive search chose these trials" in searched.markdown
    assert "read at the" not in grid.markdown
    chosen = settings_for(AnalysisConfig(b_crit_read_level=0.95), adaptive=True)
    assert chosen.b_crit_read_level == 0.95

