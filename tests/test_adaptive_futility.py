"""The adaptive search's forecast of whether the full grid can pin B_crit
(`adaptive/futility.py`): trials that scatter far more than any grid can average away are
called futile, trials on a clean curve are not, and too few trials forecast nothing."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from batchscale.adaptive.futility import MIN_TRIALS, grid_pin_chance

FUTILE_CHANCE = 0.10  # the default of convergence.adaptive_futile_chance

ALLOWED = [2**k for k in range(2, 11)]


def trials(cells: list[tuple[int, int]], sigma: float, b_crit: float = 32.0,
           seed: int = 0) -> pd.DataFrame:
    """Trials at (batch size, seed) cells, steps 100·(1 + B_crit/B) scattered log-normally."""
    rng = np.random.default_rng(seed)
    rows = [{"trial_id": f"b{b}-s{s}", "batch_size": b, "seed": s, "lr_rule": "sqrt",
             "lr": 0.1, "status": "reached",
             "steps_to_target": float(round(100 * (1 + b_crit / b) * math.exp(
                 rng.normal(0, sigma))))}
            for b, s in cells]
    return pd.DataFrame(rows)


CELLS = [(8, 0), (16, 0), (32, 0), (64, 0), (128, 0), (32, 1), (16, 1)]


def forecast(runs: pd.DataFrame, interval=(16.0, 64.0)):
    return grid_pin_chance(runs, "sqrt", ALLOWED, 3, interval, 2.0, np.random.default_rng(0))


def test_trials_on_a_clean_curve_expect_the_grid_to_pin_b_crit():
    result = forecast(trials(CELLS, sigma=0.03))
    assert result.chance > 0.9 and not result.futile(FUTILE_CHANCE)
    assert result.cells == 27


def test_trials_that_scatter_widely_mostly_expect_no_grid_to_pin_b_crit():
    # Seven trials tell σ only roughly (some draws look tame, some give no fit at all), so
    # the claim is about most draws, and every draw of clean trials must stay clear of it.
    wide = [forecast(trials(CELLS, sigma=0.6, seed=s)) for s in range(10)]
    assert sum(r.futile(FUTILE_CHANCE) for r in wide) >= 5, wide
    assert not any(forecast(trials(CELLS, sigma=0.03, seed=s)).futile(FUTILE_CHANCE)
                   for s in range(10))
    result = wide[1]
    assert result.chance < FUTILE_CHANCE and result.scatter > 0.3
    assert not result.futile(None)  # adaptive_futile_chance: null never stops for it
    words = result.words(2.0)
    assert "even the full grid (27 cells)" in words and "×2" in words
    # σ̂ from seven trials is rough, and the words say how rough
    low, high = result.scatter_interval
    assert low < result.scatter < high
    assert f"90 % interval ±{low:.0%}–{high:.0%} from 7 trials" in words
    # what would pin it: more seeds, as many as the forecast needs, or a plain "not even"
    assert "seeds per batch size" in words


def test_the_forecast_names_how_many_seeds_would_pin_b_crit():
    """Trials scattering ±22 % about the fit: 3 seeds per batch pin B_crit to ×1.5 in under a
    tenth of the simulated grids; more seeds average the scatter down, and the forecast names
    how many pin it in half of them. Scatter beyond reach names none."""
    runs = trials(CELLS + [(64, 1), (128, 1)], sigma=0.25, seed=9)
    result = grid_pin_chance(runs, "sqrt", ALLOWED, 3, (16.0, 64.0), 1.5,
                             np.random.default_rng(0))
    assert result.chance < FUTILE_CHANCE and result.seeds_to_pin is not None, result
    assert 3 < result.seeds_to_pin <= 12
    assert f"with {result.seeds_to_pin} seeds per batch size half of them would" in \
        result.words(1.5)
    more = grid_pin_chance(runs, "sqrt", ALLOWED, result.seeds_to_pin, (16.0, 64.0), 1.5,
                           np.random.default_rng(0))
    assert more.chance >= 0.4  # the same forecast at that seed count (its own draws)
    hopeless = grid_pin_chance(trials(CELLS + [(64, 1), (128, 1)], sigma=0.3, seed=3), "sqrt",
                               ALLOWED, 3, (16.0, 64.0), 1.5, np.random.default_rng(0))
    assert hopeless.seeds_to_pin is None
    assert "even with 12 seeds per batch size fewer than half would" in hopeless.words(1.5)


def test_the_chance_falls_as_the_scatter_grows():
    chances = [forecast(trials(CELLS, sigma)).chance for sigma in (0.05, 0.2, 0.5)]
    assert chances[0] > chances[1] > chances[2]


def test_too_few_trials_or_no_interval_forecast_nothing():
    few = forecast(trials(CELLS[:MIN_TRIALS - 1], sigma=0.6))
    assert math.isnan(few.chance) and not few.futile(FUTILE_CHANCE)
    unbounded = forecast(trials(CELLS, sigma=0.6), interval=(16.0, math.inf))
    assert math.isnan(unbounded.chance) and not unbounded.futile(FUTILE_CHANCE)


def test_trials_that_did_not_reach_the_target_do_not_count_as_points():
    runs = trials(CELLS, sigma=0.03)
    runs.loc[len(runs)] = {"trial_id": "b4-s0", "batch_size": 4, "seed": 0, "lr_rule": "sqrt",
                           "lr": 0.1, "status": "not_reached", "steps_to_target": math.nan}
    assert forecast(runs).chance > 0.9


def test_trials_at_a_worse_learning_rate_are_not_read_as_scatter():
    """Each batch's point is read at its best learning rate; a second LR twice as slow at every
    batch is a worse LR, not noise between seeds, and must not make the grid look hopeless."""
    clean = trials(CELLS, sigma=0.03)
    slow = clean.assign(lr=0.4, steps_to_target=clean["steps_to_target"] * 2,
                        trial_id=clean["trial_id"] + "-slow")
    result = forecast(pd.concat([clean, slow], ignore_index=True))
    assert result.chance > 0.9 and result.scatter < 0.1, result


def test_a_simulated_grid_reports_the_interval_a_real_grid_would():
    """The forecast's grids form their interval as the analysis does (Fieller's ∪ the seed
    bootstrap's): on the same truth (B_crit 32, ±25 % scatter, 9 batch sizes × 3 seeds) the
    share they pin to ×2 matches the share of real grids, analysed by
    `bootstrap_critical_batch`, within sampling error; Fieller's interval alone pins far more
    often, which made the forecast slow to call futility where a grid only just fails. (Here:
    real grids 0.275, simulated 0.278, Fieller's alone 0.54; at ±15 % 0.97, 0.975, 0.99; at
    ±35 % 0.017, 0.018, 0.175.)"""
    from batchscale.adaptive.futility import _grid_ratios
    from batchscale.analysis.critical import bootstrap_critical_batch

    sigma, b_crit, grids = 0.25, 32.0, 120
    cells = [(b, s) for b in ALLOWED for s in range(3)]
    real = []
    for seed in range(grids):
        low, high = bootstrap_critical_batch(trials(cells, sigma, b_crit, seed=seed), "sqrt",
                                             200, range_factor=math.inf)
        real.append(low > 0 and high / low <= 2.0)
    rng = np.random.default_rng(1)
    simulated = _grid_ratios(np.asarray(ALLOWED, float), 3, np.full(400, b_crit),
                             np.full(400, sigma), rng) <= 2.0
    assert abs(np.mean(simulated) - np.mean(real)) < 0.12, (np.mean(simulated), np.mean(real))
