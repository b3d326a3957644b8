"""S_min and E_min with their standard errors (analysis/critical.py, the run summary's B_crit
line in lake/summary.py, the report's text)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_analyze import BATCHES, E_MIN, S_MIN, make_runs, make_sweep

from batchscale.analysis.analyze import analyze
from batchscale.analysis.critical import fit_critical_batch
from batchscale.analysis.interval import fit_lines
from batchscale.config import AnalysisConfig


def test_s_min_and_e_min_carry_their_standard_errors_to_the_table_and_the_text():
    rng = np.random.default_rng(3)
    steps = [(S_MIN + E_MIN / b) * math.exp(0.05 * rng.standard_normal()) for b in BATCHES]
    fit = fit_critical_batch(BATCHES, steps)
    lines = fit_lines(np.asarray(BATCHES, float), np.asarray(steps))
    assert fit.s_min_se == pytest.approx(math.sqrt(float(lines.var_s)))
    assert fit.e_min_se == pytest.approx(math.sqrt(float(lines.var_e)))
    assert 0 < fit.s_min_se < fit.s_min and 0 < fit.e_min_se < fit.e_min
    result = analyze(make_sweep(), make_runs(), None, AnalysisConfig(bootstrap_samples=50))
    row = result.rows[0]
    assert math.isfinite(row["s_min_se"]) and math.isfinite(row["e_min_se"])
    assert "(± one standard error)" in result.markdown


def test_the_run_summary_states_s_min_and_e_min_with_their_errors_in_plain_numbers():
    from batchscale.lake.summary import convergence_lines
    from batchscale.schemas import make_table

    result = analyze(make_sweep(), make_runs(), None, AnalysisConfig(bootstrap_samples=50))
    rows = [{**r, "s_min_se": 11.2, "e_min_se": 320.4} for r in result.rows]
    lines = convergence_lines(make_table("analysis", rows, {}))
    line = next(x for x in lines if x.startswith("  B_crit ("))
    assert " ± 11, E_min " in line and " ± 320; ± one standard error)" in line, line
    old = [{**r, "s_min_se": None, "e_min_se": None} for r in result.rows]  # before layout 8
    line = next(x for x in convergence_lines(make_table("analysis", old, {}))
                if x.startswith("  B_crit ("))
    assert "±" not in line and "E_min" in line, line


def test_a_floor_the_fit_cannot_pin_gives_no_bound_where_the_steps_fell_slower_than_one_over_b():
    """From a user's own loop: 285, 145 and 65 steps at batch 16, 32 and 128. S_min is not
    clearly above zero with three batch sizes, but from 32 to 128 the steps fell 2.2× where 1/B
    would give 4×: "B_crit above 128" (grow the batch) would contradict the table. Even at
    S_min's upper bound B_crit lies inside the batches measured: no number and no bound."""
    fit = fit_critical_batch([16, 32, 128], [285, 145, 65])
    assert fit.bound == "" and math.isnan(fit.b_crit)
    assert "the floor they fall towards is not clear (S_min" in fit.reason
    assert "inside the batches measured; more batch sizes or seeds would tell" in fit.reason
    exact = fit_critical_batch([16, 32, 128], [400, 200, 50])  # exactly 1/B: the bound stands
    assert (exact.bound, exact.bound_batch) == ("above", 128)
