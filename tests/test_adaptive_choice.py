"""The adaptive search's decisions on known answers: the noise-scale prediction, the placement of
the first batch sizes, the candidates and the choice of the next cell (batchscale.adaptive.choice).
Synthetic tables with a known S(B) = S_min + E_min/B; the trials themselves run for real in
tests/test_adaptive_driver.py."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from batchscale.adaptive.choice import (
    STOP_EXHAUSTED,
    STOP_NO_GAIN,
    Cell,
    CellCost,
    IntervalState,
    candidate_cells,
    choose_next,
    edge_stop,
    interval_state,
    place_batch_sizes,
    powers_of_two_between,
    predict_b_crit,
    prune_step,
)
from batchscale.errors import BadInput
from batchscale.fits import StepTimeFit, fit_step_time
from batchscale.tdist import t_quantile

ALLOWED = powers_of_two_between(4, 1024)
S_MIN, E_MIN = 100.0, 3200.0  # B_crit = 32


def curves(b_simple_at: dict[float, float], trial: str = "t0", target: float = 0.9,
           start: float = 0.1) -> pd.DataFrame:
    """Evaluations of one trial: accuracy from `start` towards `target`, with B_simple given
    per progress (0: first evaluation, 1: the target)."""
    rows = []
    for step, (progress, gns) in enumerate(sorted(b_simple_at.items())):
        rows.append({"trial_id": trial, "step": 10 * step, "b_simple": gns,
                     "val_accuracy": start + progress * (target - start)})
    return pd.DataFrame(rows)


def runs(cells: dict[tuple[int, int], float], rule: str = "sqrt") -> pd.DataFrame:
    """A runs table with one reached trial per (batch, seed) and its steps to target."""
    return pd.DataFrame([{"trial_id": f"b{b}-s{s}", "batch_size": b, "seed": s, "lr": 0.1,
                          "lr_rule": rule, "status": "reached", "steps_to_target": steps,
                          "steps_run": steps, "workers": 1}
                         for (b, s), steps in cells.items()])


def on_curve(batches, seeds=(0,), wobble=0.0) -> dict[tuple[int, int], float]:
    """Steps on S(B) = S_MIN + E_MIN/B, each seed off by ±wobble (relative), alternating."""
    return {(b, s): round((S_MIN + E_MIN / b) * (1 + wobble * (-1) ** (i + s)))
            for i, b in enumerate(batches) for s in seeds}


# ------------------------------------------------------------------------------ prediction


def test_the_prediction_is_the_median_noise_scale_near_the_target():
    table = curves({0.0: 2, 0.3: 5, 0.5: 8, 0.8: 30, 0.9: 34, 1.0: 38})
    p = predict_b_crit(table, "val_accuracy", 0.9)
    assert p.method == "near target" and p.evaluations == 3
    assert p.b_crit == pytest.approx(34) and p.low == pytest.approx(32)
    assert p.high == pytest.approx(36)


def test_trials_are_pooled_each_from_its_own_start():
    """A second trial that starts higher still counts its evaluations near the target."""
    a = curves({0.0: 2, 0.8: 30, 1.0: 40}, trial="a")
    b = curves({0.0: 3, 0.9: 20}, trial="b", start=0.5)
    p = predict_b_crit(pd.concat([a, b]), "val_accuracy", 0.9)
    assert p.method == "near target" and p.evaluations == 3 and p.b_crit == pytest.approx(30)


def test_a_probe_that_stops_short_is_extrapolated_and_says_so():
    """B_simple doubling every quarter of the way: log-linear, so the line gives 2**4·2 = 32
    at the target; the reason says how far the probe got."""
    table = curves({0.0: 2, 0.25: 4, 0.5: 8})
    p = predict_b_crit(table, "val_accuracy", 0.9)
    assert p.method == "extrapolated" and p.b_crit == pytest.approx(32, rel=1e-6)
    assert "50% of the way" in p.reason


def test_too_few_evaluations_give_no_prediction_and_a_reason():
    p = predict_b_crit(curves({0.0: 2, 0.2: 3}), "val_accuracy", 0.9)
    assert math.isnan(p.b_crit) and p.method == "none" and "fewer than 3" in p.reason
    # No noise scale at all (a one-process TrainingLoop): the reason says why and what helps.
    silent = curves({0.0: 2, 0.5: 3, 0.9: 4, 1.0: 5}).assign(b_simple=float("nan"))
    p = predict_b_crit(silent, "val_accuracy", 0.9)
    assert p.method == "none" and "no gradient noise scale" in p.reason
    assert "two or more workers" in p.reason


def test_a_loss_target_counts_progress_downwards():
    table = pd.DataFrame({"trial_id": "t", "step": [0, 10, 20, 30, 40],
                          "b_simple": [1.0, 2.0, 50.0, 60.0, 70.0],
                          "val_loss": [2.0, 1.5, 0.6, 0.55, 0.5]})
    p = predict_b_crit(table, "val_loss", 0.5)
    assert p.method == "near target" and p.b_crit == pytest.approx(60)


def test_an_unknown_metric_is_refused_with_the_allowed_names():
    with pytest.raises(BadInput, match="val_accuracy"):
        predict_b_crit(curves({0.0: 1, 1.0: 2}), "val_nonsense", 0.9)


# ------------------------------------------------------------------------------- placement


def test_first_points_span_an_eighth_to_eight_times_the_prediction():
    assert place_batch_sizes(32, ALLOWED) == [4, 16, 64, 256]


def test_the_span_slides_inside_the_allowed_range():
    assert place_batch_sizes(1000, ALLOWED) == [16, 64, 256, 1024]
    assert place_batch_sizes(1.5, ALLOWED) == [4, 16, 64, 256]


def test_without_a_prediction_the_smallest_allowed_are_placed():
    assert place_batch_sizes(math.nan, ALLOWED, points=3) == [4, 8, 16]


def test_powers_of_two_between():
    assert powers_of_two_between(3, 40) == [4, 8, 16, 32]
    assert powers_of_two_between(8, 4) == []


# ----------------------------------------------------------------------- candidates, choice


def test_candidates_are_new_batch_sizes_and_the_next_seed_where_run():
    done = [Cell(8, 0), Cell(32, 0), Cell(32, 1)]
    found = candidate_cells(done, [8, 16, 32], seeds=[0, 1, 2])
    assert found == [Cell(16, 0), Cell(8, 1), Cell(32, 2)]


def test_one_seed_everywhere_asks_for_a_second_seed_near_b_crit():
    """The interval resamples seeds: with one seed per batch there is none, so the search adds
    a seed at the batch size nearest the fitted B_crit (32)."""
    table = runs(on_curve([4, 16, 64, 256], wobble=0.03))
    done = [Cell(b, 0) for b in (4, 16, 64, 256)]
    cell, why, expected = choose_next(table, "sqrt", done,
                                      candidate_cells(done, ALLOWED, [0, 1]), 20, 50)
    assert cell in (Cell(16, 1), Cell(64, 1)) and "second seed" in why
    assert math.isinf(expected)


def test_steps_still_falling_like_one_over_b_ask_for_a_larger_batch():
    table = runs({(b, 0): 10000 / b for b in (4, 8, 16)})  # S_min = 0: B_crit above 16
    done = [Cell(b, 0) for b in (4, 8, 16)]
    assert interval_state(table, "sqrt", 50).bound == "above"
    cell, why, _ = choose_next(table, "sqrt", done, candidate_cells(done, ALLOWED, [0]), 10, 50)
    assert cell == Cell(1024, 0) and "larger batch" in why


def test_with_an_interval_the_choice_is_expected_to_narrow_it():
    data = on_curve([4, 16, 64, 256], seeds=(0, 1), wobble=0.05)
    table = runs(data)
    done = [Cell(b, s) for b, s in data]
    before = interval_state(table, "sqrt", 100)
    assert math.isfinite(before.ratio)
    cell, why, expected = choose_next(table, "sqrt", done,
                                      candidate_cells(done, ALLOWED, [0, 1, 2]), 32, 100)
    assert cell is not None and cell not in done
    assert expected < before.ratio and "per example" in why


def test_a_cell_is_priced_in_device_seconds_where_the_step_time_line_allows():
    """Held device-seconds: the launch's own share plus steps × t(B) for every rule and
    worker; no price without a line that is positive at that batch."""
    cost = CellCost(StepTimeFit(1e-3, 1e-5, 1.0), overhead_s=0.5, rules=2, workers=2)
    assert cost.device_s(100, 50) == pytest.approx(0.5 + 2 * 2 * 50 * (1e-3 + 1e-5 * 100))
    assert CellCost(StepTimeFit(1e-3, 1e-5, 1.0), math.nan).device_s(100, 50) == \
        pytest.approx(50 * 2e-3)
    assert math.isnan(CellCost(StepTimeFit(math.nan, math.nan, math.nan), 0.5).device_s(8, 50))
    assert math.isnan(CellCost(StepTimeFit(-1.0, 1e-5, 1.0), 0.5).device_s(8, 50))


def test_the_cheapest_narrowing_is_counted_in_device_seconds_not_examples():
    """Where a step costs the same at every batch (α dominates, as on a small model), a
    small batch is cheap in examples but dear in device time: per example the search picks
    batch 8, per device-second the largest batch; where a step's cost is all per example the
    two agree. Without a line the search falls back to examples and says so."""
    data = on_curve([4, 16, 64, 256], seeds=(0, 1), wobble=0.05)
    table, done = runs(data), [Cell(b, s) for b, s in data]
    candidates = candidate_cells(done, ALLOWED, [0, 1, 2])
    by_examples, why, _ = choose_next(table, "sqrt", done, candidates, 32, 100)
    assert by_examples.batch_size == 8 and "per example" in why
    fixed_step = CellCost(StepTimeFit(1e-2, 1e-6, 1.0), overhead_s=0.0)
    cell, why, _ = choose_next(table, "sqrt", done, candidates, 32, 100, cost=fixed_step)
    assert cell.batch_size == 1024 and "per device-second" in why and "forecast to hold" in why
    per_example = CellCost(StepTimeFit(1e-6, 1e-3, 1.0), overhead_s=0.0)
    assert choose_next(table, "sqrt", done, candidates, 32, 100, cost=per_example)[0] \
        == by_examples
    no_line = CellCost(StepTimeFit(math.nan, math.nan, math.nan), overhead_s=0.0)
    cell, why, _ = choose_next(table, "sqrt", done, candidates, 32, 100, cost=no_line)
    assert cell == by_examples and "per example" in why


def test_when_no_cell_is_expected_to_narrow_the_interval_the_search_stops():
    """Steps that scatter ±40 % around their fit (interval ×15 wide): a third seed at the
    smallest batch is not expected to narrow it, so the search stops spending, says why and
    keeps the interval as it is; a point at the knee (64) is expected to help and is run."""
    rng = np.random.default_rng(0)
    data = {(b, s): round((S_MIN + E_MIN / b) * math.exp(rng.normal(0, 0.4)))
            for b in (4, 16, 64, 256) for s in (0, 1)}
    table = runs(data)
    done = [Cell(b, s) for b, s in data]
    state = interval_state(table, "sqrt", 100)
    assert 10 < state.ratio < 20
    cell, why, expected = choose_next(table, "sqrt", done, [Cell(4, 2)], 32, 100)
    assert cell is None and why == STOP_NO_GAIN and expected == state.ratio
    cell, _, expected = choose_next(table, "sqrt", done, [Cell(4, 2), Cell(64, 2)], 32, 100)
    assert cell == Cell(64, 2) and expected < state.ratio / 2


def test_nothing_left_to_run_stops_the_search():
    data = on_curve([4, 16, 64], seeds=(0, 1), wobble=0.05)
    table = runs(data)
    cell, why, _ = choose_next(table, "sqrt", [Cell(b, s) for b, s in data], [], 32, 50)
    assert cell is None and why == STOP_EXHAUSTED


def test_the_interval_narrows_as_cells_are_added_on_a_known_curve():
    """The loop's premise on noisy data from a known S(B): refining towards the chosen cells
    brings the interval around the true B_crit (32) and narrows it."""
    rng = np.random.default_rng(3)
    truth = {(b, s): round((S_MIN + E_MIN / b) * math.exp(rng.normal(0, 0.08)))
             for b in ALLOWED for s in (0, 1, 2)}
    done = [Cell(4, 0), Cell(16, 0), Cell(64, 0), Cell(256, 0), Cell(16, 1)]
    ratios = []
    for _ in range(5):
        table = runs({(c.batch_size, c.seed): truth[(c.batch_size, c.seed)] for c in done})
        ratios.append(interval_state(table, "sqrt", 100).ratio)
        cell, _, _ = choose_next(table, "sqrt", done, candidate_cells(done, ALLOWED, [0, 1, 2]),
                                 32, 100)
        done.append(cell)
    final = interval_state(runs({(c.batch_size, c.seed): truth[(c.batch_size, c.seed)]
                                 for c in done}), "sqrt", 100)
    assert final.low <= 32 <= final.high
    assert final.ratio < ratios[0]


# ------------------------------------------------------------------------------- pruning
def test_the_prune_bound_is_a_factor_past_the_fits_steps_at_the_intervals_far_end():
    state = IntervalState(b_crit=32.0, low=16.0, high=64.0, bound="", reason="", s_min=100.0)
    # S at batch 32 with B_crit 64: 100·(1 + 64/32) = 300 steps; three times that
    assert prune_step(state, 32, 3.0, max_steps=3000) == 900
    assert prune_step(state, 128, 2.0, max_steps=3000) == 300  # 2·100·1.5
    assert prune_step(state, 32, 3.0, max_steps=900) is None  # the step budget comes first
    assert prune_step(state, 32, None, max_steps=3000) is None  # pruning off
    open_above = IntervalState(32.0, 16.0, math.inf, "", "", 100.0)
    no_fit = IntervalState(math.nan, math.nan, math.nan, "", "")
    assert prune_step(open_above, 32, 3.0, 3000) is None
    assert prune_step(no_fit, 32, 3.0, 3000) is None


def test_interval_state_carries_the_fits_s_min():
    state = interval_state(runs(on_curve(ALLOWED[:6], seeds=(0, 1), wobble=0.05)), "sqrt", 50)
    assert state.s_min == pytest.approx(S_MIN, rel=0.2)


def test_pruned_trials_are_left_out_of_the_fit():
    from batchscale.analysis.analyze import without_pruned
    from batchscale.analysis.critical import steps_to_result

    table = runs(on_curve([8, 32, 128]))
    pruned = table.iloc[[0]].assign(trial_id="b8-s1", seed=1, status="pruned",
                                    steps_to_target=np.nan, steps_run=2000)
    with_pruned = pd.concat([table, pruned], ignore_index=True)
    kept = steps_to_result(without_pruned(with_pruned), by=())
    assert kept["steps_to_target"].tolist() == steps_to_result(table, by=())[
        "steps_to_target"].tolist()
    # counted, it would have been a seed that never reached: the median at batch 8 moves to inf
    counted = steps_to_result(with_pruned, by=())
    assert not np.isfinite(counted["steps_to_target"].iloc[0])


# --------------------------------------------------------------------- the B* objective
def test_b_star_with_an_exact_line_is_b_crits_interval_through_the_square_root():
    from batchscale.adaptive.choice import optimum

    state = IntervalState(b_crit=32.0, low=16.0, high=64.0, bound="", reason="")
    exact = StepTimeFit(1e-3, 1e-5, 1.0, log_ratio_se=0.0, dof=3)  # α/β = 100 samples
    best = optimum(state, exact)
    assert (best.b_star, best.low, best.high) == pytest.approx((math.sqrt(3200), 40.0, 80.0))
    assert best.ratio == pytest.approx(2.0)  # sqrt of B_crit's ratio 4
    assert math.isinf(optimum(state, StepTimeFit(math.nan, math.nan, math.nan)).ratio)
    open_above = IntervalState(32.0, 16.0, math.inf, "", "")
    assert math.isinf(optimum(open_above, exact).ratio)


def test_the_step_time_lines_uncertainty_widens_b_star_and_two_points_leave_it_open():
    from batchscale.adaptive.choice import optimum

    state = IntervalState(b_crit=32.0, low=16.0, high=64.0, bound="", reason="")
    scattered = StepTimeFit(1e-3, 1e-5, 0.99, log_ratio_se=0.3, dof=3)
    best = optimum(state, scattered)
    t = t_quantile(0.95, 3)
    assert best.high / best.b_star == pytest.approx(math.exp(0.5 * math.hypot(math.log(2),
                                                                              t * 0.3)))
    assert best.ratio > 2.0
    two_points = StepTimeFit(1e-3, 1e-5, 1.0, dof=0)
    assert math.isinf(optimum(state, two_points).ratio)


def test_b_stars_interval_covers_the_truth_on_simulated_searches():
    """The interval the search stops on, from its own code (interval_state, fit_step_time,
    optimum) on simulated data: steps to target S(B) = S_min·(1 + B_crit/B) with 10 %
    log-normal seed noise (2 seeds), step times t(B) = α + βB with 5 % noise. Coverage of the
    true B* must hold at the 90 % it claims (≥ 0.85 over 200 searches); B_crit's interval alone
    through the square root is the narrower, overconfident one this replaced."""
    from batchscale.adaptive.choice import interval_state, optimum

    rng = np.random.default_rng(11)
    alpha, beta, b_crit, s_min = 2e-3, 1e-5, 64.0, 200.0
    truth = math.sqrt(alpha * b_crit / beta)
    batches = [8, 16, 32, 64, 128, 256, 512]
    covered = 0
    searches = 200
    for _ in range(searches):
        cells = {(b, seed): round(s_min * (1 + b_crit / b) * math.exp(rng.normal(0, 0.1)))
                 for b in batches for seed in (0, 1)}
        state = interval_state(runs(cells, "linear"), "linear", 200)
        times = [(alpha + beta * b) * math.exp(rng.normal(0, 0.05)) for b in batches]
        best = optimum(state, fit_step_time(batches, times))
        covered += best.low <= truth <= best.high
    assert covered / searches >= 0.85


@pytest.mark.parametrize("workers", [1, 2])
def test_the_search_narrows_b_star_when_asked_and_reads_the_line_from_its_trials(workers):
    """At any worker count: a search of two-worker cells reads B* from their step times."""
    import pyarrow as pa

    from batchscale.adaptive.driver import Search
    from batchscale.config import parse_config

    def cell(batch: int) -> tuple[pa.Table, pa.Table]:
        steps = 100
        row = {"trial_id": f"b{batch}", "batch_size": batch, "workers": workers,
               "lr_rule": "sqrt",
               "steps_run": steps, "train_time_s": steps * (1e-3 + 1e-5 * batch)}
        return pa.table({"trial_id": [f"b{batch}"]}), pa.Table.from_pylist([row])

    state = IntervalState(b_crit=32.0, low=16.0, high=64.0, bound="", reason="")
    ratios = {}
    for objective in ("b_crit", "b_star"):
        cfg = parse_config({"convergence": {"strategy": "adaptive",
                                            "adaptive_objective": objective}})
        search = Search(cfg, "t", "data", workers, echo=lambda line: None)
        # Three batch sizes on an exact line: α/β pinned, B*'s interval is B_crit's through
        # the square root (two would leave α/β, and so B*, open).
        search.cells = {Cell(b, 0): cell(b) for b in (16, 64, 256)}
        line = search.step_line()
        assert (line.alpha_s, line.beta_s, line.dof) == pytest.approx((1e-3, 1e-5, 1))
        ratios[objective] = search.objective_ratio(state)
    assert ratios == pytest.approx({"b_crit": 4.0, "b_star": 2.0})


def test_the_pipelines_search_is_clipped_at_the_sweeps_memory_boundary(tmp_path):
    """The search stage reads the largest batch that fitted from the validated sweep table."""
    from batchscale.adaptive.stage import _read_sweep, largest_batch
    from batchscale.schemas import make_table
    from batchscale.storage import write_table_atomic

    rows = [{"input_mode": "synthetic", "batch_size": b, "status": s, "precision": "fp32",
             "timed_steps": 20 if s == "ok" else 0}
            for b, s in ((64, "ok"), (256, "ok"), (1024, "oom"))]
    env = {"run_id": "r", "config_hash": "c", "experiment": "e", "workload": "w",
           "git_commit": "g", "batchscale_version": "0", "torch_version": "2", "threads": 2,
           "python_version": "3", "device_name": "cpu", "world_size": 1}
    path = tmp_path / "sweep.parquet"
    write_table_atomic(path, make_table("sweep", rows, env))
    assert largest_batch(_read_sweep(str(path))) == 256
    write_table_atomic(path, make_table("sweep", rows[:2], env))
    assert largest_batch(_read_sweep(str(path))) is None  # nothing ran out: nothing to clip at
    assert largest_batch(_read_sweep(None)) is None


def test_without_an_interval_the_next_cell_is_named_for_what_it_is():
    """unsupported_next: past a bound while batch sizes beyond it are allowed; where none is,
    the cell it takes lies the other way and the reason says so, not "a smaller batch"."""
    from batchscale.adaptive.choice import IntervalState, candidate_cells, unsupported_next

    allowed, seeds = [4, 8, 16, 32, 64, 128], [0, 1]
    below = IntervalState(math.nan, math.nan, math.nan, "below", "no batch size saved steps")
    done = [Cell(b, 0) for b in (16, 32, 64)]
    cell, why = unsupported_next(below, done, candidate_cells(done, allowed, seeds), math.nan)
    assert cell == Cell(4, 0) and why == "no batch saved steps: a smaller batch"
    done = [Cell(b, 0) for b in (4, 8, 16, 32)]
    cell, why = unsupported_next(below, done, candidate_cells(done, allowed, seeds), math.nan)
    assert cell == Cell(64, 0)
    assert why == ("no batch saved steps: no smaller batch is allowed, so batch 64, to see "
                   "whether that holds over more batch sizes")
    above = IntervalState(math.nan, math.nan, math.nan, "above", "steps fall like 1/B")
    done = [Cell(b, 0) for b in (32, 64, 128)]
    cell, why = unsupported_next(above, done, candidate_cells(done, allowed, seeds), math.nan)
    assert cell == Cell(16, 0) and "no larger batch is allowed, so batch 16" in why
    unclear = IntervalState(math.nan, math.nan, math.nan, "", "the fall is not clear")
    done = [Cell(b, 0) for b in allowed]
    cell, why = unsupported_next(unclear, done, candidate_cells(done, allowed, seeds), math.nan)
    assert cell.seed == 1 and why == "no B_crit yet: another seed"


def test_a_search_cut_at_an_edge_it_has_run_says_the_interval_is_open_there():
    """An interval cut at the fit's range limit is a bound on that side, not a place B_crit
    lies: the stop says the interval runs to the edge and B_crit may lie beyond it, which
    agrees with a centre inside the allowed range (176 of 8…256, say)."""
    allowed = [8, 16, 32, 64, 128, 256]
    above = edge_stop((False, True), [8, 64, 256], allowed)
    assert above.startswith("B_crit's interval runs up to the largest allowed batch (256), which"
                            " has run: B_crit may lie beyond it")
    below = edge_stop((True, False), [8, 64], allowed)
    assert "smallest allowed batch (8)" in below and "may lie below it" in below
    assert edge_stop((False, True), [8, 64, 128], allowed) == ""  # 256 can still be run
    assert edge_stop((False, False), [8, 256], allowed) == ""


def test_a_search_with_too_few_reached_batch_sizes_says_what_the_analysis_says():
    """The search's reason is the analysis's: the batch sizes some trials reached, and how the
    trials that fell short stopped."""
    table = runs({(16, 0): 300, (64, 0): 120, (128, 0): 90})
    table = pd.concat([table, table[table["batch_size"] == 128].assign(
        trial_id="b128-s1", seed=1, status="not_reached", steps_to_target=None,
        stop_reason="stalled: no target metric improved in 50 evaluations in a row")],
        ignore_index=True)
    state = interval_state(table, "sqrt", 20)
    assert math.isnan(state.b_crit)
    assert state.reason.startswith("only 2 of 3 batch sizes reached the target (16, 64)")
    assert "some trials reached it at 128 in 1 of 2 trials" in state.reason
    assert state.reason.endswith("of the trials that stopped short, 1 stalled"
                                 " (convergence.patience_evals)")


def test_an_open_b_star_interval_is_stored_as_none_not_zero():
    """A step-time line through two batch sizes leaves α/β unpinned: B* has a point but no
    interval, and the decision row stores no ends (0 would read as a bound)."""
    import pyarrow as pa

    from batchscale.adaptive.choice import NoisePrediction
    from batchscale.adaptive.driver import Search
    from batchscale.config import parse_config

    def cell(batch: int) -> tuple[pa.Table, pa.Table]:
        row = {"trial_id": f"b{batch}", "batch_size": batch, "workers": 1, "lr_rule": "sqrt",
               "steps_run": 100, "train_time_s": 100 * (1e-3 + 1e-5 * batch)}
        return pa.table({"trial_id": [f"b{batch}"]}), pa.Table.from_pylist([row])

    search = Search(parse_config({"convergence": {"strategy": "adaptive"}}), "t", "data", 1,
                    echo=lambda line: None)
    search.cells = {Cell(b, 0): cell(b) for b in (16, 64)}
    state = IntervalState(b_crit=32.0, low=16.0, high=64.0, bound="", reason="")
    search.record("refine", Cell(64, 0), "test", state,
                  NoisePrediction(math.nan, math.nan, math.nan, "none", 0))
    row = search.decisions[-1]
    assert row["b_star"] == pytest.approx(math.sqrt(1e-3 * 32 / 1e-5))
    assert row["b_star_low"] is None and row["b_star_high"] is None
    search.cells[Cell(256, 0)] = cell(256)
    search.record("refine", Cell(256, 0), "test", state,
                  NoisePrediction(math.nan, math.nan, math.nan, "none", 0))
    assert 0 < search.decisions[-1]["b_star_low"] < search.decisions[-1]["b_star_high"]
