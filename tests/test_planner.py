"""Known-answer tests of the what-if planner's pure core (batchscale.planner.model):
ring all-reduce times, the communication fit, plan rows and their limits, the Pareto front and
the recommendation. Every expected number is computed by hand in the comment beside it."""

from __future__ import annotations

import dataclasses
import math

import pytest

from batchscale.planner.model import (
    ASSUMED,
    BACKWARD_SHARE,
    CHEAPEST_WITHIN_DEADLINE,
    FASTEST_WITHIN_BUDGET,
    LIMIT_COMMUNICATION,
    LIMIT_MEMORY,
    LIMIT_PAST_B_CRIT,
    MEASURED,
    Band,
    CommModel,
    CommSource,
    Objective,
    StepsFit,
    accumulation,
    describe,
    fit_comm_model,
    format_duration,
    pareto_front,
    plan_rows,
    recommend,
)

GIGABYTE = 1e9
# A 100 Gbit/s link (12.5e9 bytes/s) with 5 µs per hop.
FAST_LINK = CommModel.from_link(gbps=100, latency_us=5)
# S(B) = 1000 + 256000/B: B_crit = 256, interval 200-300.
STEPS = StepsFit(s_min=1000, e_min=256_000, b_crit_low=200, b_crit_high=300)
STEP_LINE = (0.01, 1e-4)  # t = 10 ms + 0.1 ms per sample


# --------------------------------------------------------------------------- communication


@pytest.mark.parametrize(
    ("workers", "expected_s"),
    [
        (1, 0.0),  # no all-reduce
        (2, 0.08 + 2 * 5e-6),  # 2·1/2·1e9 / 12.5e9 = 0.08 s; 2 hops
        (4, 0.12 + 6 * 5e-6),  # 2·3/4·1e9 / 12.5e9 = 0.12 s; 6 hops
        (8, 0.14 + 14 * 5e-6),  # 2·7/8·1e9 / 12.5e9 = 0.14 s; 14 hops
    ],
)
def test_ring_all_reduce_time(workers, expected_s):
    assert FAST_LINK.comm_time_s(workers, GIGABYTE) == pytest.approx(expected_s, rel=1e-12)


def test_a_given_link_is_marked_assumed():
    assert FAST_LINK.bandwidth_Bps == pytest.approx(12.5e9)
    assert FAST_LINK.latency_s == pytest.approx(5e-6)
    assert FAST_LINK.source == CommSource(ASSUMED, ASSUMED, ASSUMED)
    assert FAST_LINK.source.unmeasured_names() == (
        "link bandwidth (assumed), latency (assumed), hidden share (assumed)")


@pytest.mark.parametrize("hidden_share", [-0.1, 1.5])
def test_hidden_share_outside_zero_one_is_refused(hidden_share):
    with pytest.raises(ValueError, match="hidden_share"):
        CommModel.from_link(gbps=100, latency_us=5, hidden_share=hidden_share)


def synthetic_points(bandwidth_Bps, latency_s, workers, sizes_bytes):
    truth = CommModel(bandwidth_Bps, latency_s, 0.0, CommSource(MEASURED, MEASURED, MEASURED))
    return [(n, g, truth.comm_time_s(n, g)) for n in workers for g in sizes_bytes]


def test_fit_recovers_bandwidth_and_latency():
    points = synthetic_points(5e9, 2e-5, workers=[1, 2, 4, 8], sizes_bytes=[1e8, 4e8])
    model = fit_comm_model(points, hidden_share=0.3, hidden_share_source=MEASURED)
    assert model.bandwidth_Bps == pytest.approx(5e9, rel=1e-6)
    assert model.latency_s == pytest.approx(2e-5, rel=1e-6)
    assert model.source == CommSource(MEASURED, MEASURED, MEASURED)
    assert model.source.unmeasured_names() == ""
    assert model.hidden_share == 0.3


def test_fit_from_one_worker_count_needs_two_gradient_sizes():
    points = synthetic_points(5e9, 2e-5, workers=[2], sizes_bytes=[1e8, 4e8])
    model = fit_comm_model(points)
    assert model.bandwidth_Bps == pytest.approx(5e9, rel=1e-6)
    assert model.latency_s == pytest.approx(2e-5, rel=1e-6)


def test_fit_refuses_one_worker_count_and_one_size_without_latency():
    points = synthetic_points(5e9, 2e-5, workers=[2], sizes_bytes=[1e8]) * 3
    with pytest.raises(ValueError, match=r"2\+ worker counts .* give latency_s"):
        fit_comm_model(points)


def test_fit_with_a_given_latency_fits_the_bandwidth_alone():
    points = synthetic_points(5e9, 2e-5, workers=[2], sizes_bytes=[1e8])
    model = fit_comm_model(points, latency_s=2e-5)
    assert model.bandwidth_Bps == pytest.approx(5e9, rel=1e-6)
    assert model.source == CommSource(MEASURED, ASSUMED, ASSUMED)


def test_fit_refuses_points_without_an_all_reduce():
    with pytest.raises(ValueError, match=r"2\+ workers"):
        fit_comm_model([(1, 1e8, 0.0), (1, 4e8, 0.0)])


def test_fit_refuses_comm_that_does_not_grow_with_bytes():
    with pytest.raises(ValueError, match="does not grow"):
        fit_comm_model([(2, 1e8, 0.0)], latency_s=0.0)


def test_negative_fitted_latency_is_set_to_zero_with_a_note():
    points = synthetic_points(5e9, 0.0, workers=[2, 4], sizes_bytes=[1e8])
    # Take 1 ms per hop off: the exact fit would say latency = -1e-3 s.
    points = [(n, g, s - 2 * (n - 1) * 1e-3) for n, g, s in points]
    model = fit_comm_model(points)
    assert model.latency_s == 0.0
    assert "negative" in model.note


# --------------------------------------------------------------------------- plan rows


def test_plan_row_known_answer():
    comm = CommModel.from_link(gbps=100, latency_us=5, hidden_share=0.5)
    rows = plan_rows(STEP_LINE, STEPS, comm, 1e8, workers=[1, 8], per_worker_batches=[128])
    single, eight = rows
    # N = 1, b = 128: t = 0.01 + 0.0128 s; S = 1000 + 256000/128 = 3000, band from
    # E_min = 1000·200 and 1000·300: 2562.5-3343.75.
    assert single.step_time_s == pytest.approx(0.0228)
    assert (single.steps.value, single.steps.low, single.steps.high) == pytest.approx(
        (3000, 2562.5, 3343.75)
    )
    assert single.time_to_target_s.value == pytest.approx(3000 * 0.0228)
    assert single.time_to_target_s.high == pytest.approx(3343.75 * 0.0228)
    assert single.device_hours.value == pytest.approx(3000 * 0.0228 / 3600)
    assert single.limit == "" and single.feasible
    # N = 8: B = 1024 > 300; exposed comm 0.5·(2·7/8·1e8/12.5e9 + 14·5e-6) = 0.007035 s.
    assert eight.global_batch == 1024
    assert eight.comm_s == pytest.approx(0.007035)
    assert eight.step_time_s == pytest.approx(0.0228 + 0.007035)
    assert eight.steps.value == pytest.approx(1000 + 256_000 / 1024)
    assert eight.device_hours.value == pytest.approx(8 * 1250 * (0.0228 + 0.007035) / 3600)
    assert eight.limit == LIMIT_PAST_B_CRIT
    assert eight.b_crit == Band(256, 200, 300)
    # said of this row's own batch, with the interval it is past
    assert ("adding workers stops helping here: past B_crit (the global batch 1024 is above "
            "B_crit's interval, 200–300, so more workers would grow the batch, not cut the "
            "steps)") in describe(eight)
    assert eight.unmeasured == (
        "link bandwidth (assumed), latency (assumed), hidden share (assumed)")


def test_overlap_hides_no_more_than_the_backward_pass():
    """A fit that says all of the all-reduce was hidden (hidden_share 1, as a noisy run can)
    hides at most the backward pass (2/3 of the step): at 1,024 workers on a 100 Gb/s ring the
    all-reduce of 100 MB exceeds it, and the rest shows."""
    comm = CommModel.from_link(gbps=100, latency_us=5, hidden_share=1.0)
    one, many = plan_rows(STEP_LINE, STEPS, comm, 1e8, workers=[1, 1024],
                          per_worker_batches=[128])
    all_reduce = comm.comm_time_s(1024, 1e8)
    assert one.comm_s == 0.0
    assert many.comm_s == pytest.approx(all_reduce - BACKWARD_SHARE * 0.0228)
    assert many.comm_share > 0.3  # taken at its word, the fit made it 0
    # Where the backward pass is longer than the all-reduce, all of it can hide.
    small = plan_rows(STEP_LINE, STEPS, comm, 1e5, workers=[2], per_worker_batches=[128])[0]
    assert small.comm_s == 0.0


def test_measured_step_replaces_the_line_where_given():
    # measured 50 ms at b = 32 (the line says 10 + 3.2 = 13.2 ms); b = 128 keeps the line
    rows = plan_rows(STEP_LINE, STEPS, FAST_LINK, 1e8, [1], [32, 128], measured_step_s={32: 0.05})
    assert [r.compute_source for r in rows] == ["measured", "line"]
    assert rows[0].step_time_s == pytest.approx(0.05)
    assert rows[1].step_time_s == pytest.approx(0.01 + 1e-4 * 128)


def test_communication_dominated_plan_names_communication():
    slow_link = CommModel.from_link(gbps=1, latency_us=50)  # 1e9 bytes take 8 s per 2 workers
    steps = StepsFit(1000, 1e6, 500, math.inf)  # B_crit only bounded above: never "past"
    rows = plan_rows(STEP_LINE, steps, slow_link, GIGABYTE, [1, 2], [32])
    assert [row.limit for row in rows] == ["", LIMIT_COMMUNICATION]
    assert rows[1].comm_share > 0.99
    assert rows[1].time_to_target_s.high == math.inf  # the open bound is carried, not hidden
    assert "unbounded" in recommend(rows, Objective(FASTEST_WITHIN_BUDGET, 1e6))[1]


@pytest.mark.parametrize(
    ("b", "max_b", "expected"),
    [
        (64, 64, (1, 64)),  # fits as one batch
        (128, 64, (2, 64)),  # ceil(128/64) = 2 micro-batches of 64
        (129, 64, (3, 43)),  # ceil(129/64) = 3; ceil(129/3) = 43, 3·43 = 129
        (130, 64, (3, 44)),  # ceil(130/3) = 44: 3·44 = 132 > 130, the compute is an upper bound
        (128, None, (1, 128)),  # no limit measured: unchecked, as before
        (128, 0, (1, 128)),  # not even one example fits: no micro-batch helps
    ],
)
def test_accumulation_splits_a_batch_into_micro_batches_that_fit(b, max_b, expected):
    assert accumulation(b, max_b) == expected


def test_an_accumulated_row_pays_k_passes_and_one_all_reduce():
    """N = 2, b = 128 over a limit of 64: 2 micro-batches of 64. One pass 10 + 6.4 = 16.4 ms,
    two 32.8 ms; all-reduce 2·1/2·1e8 / 12.5e9 = 8 ms + 2 hops · 5 µs = 8.01 ms, once: step
    40.81 ms (per micro-batch it would be 2·(16.4 + 8.01) = 48.82 ms). B = 256: S = 1000 +
    256000/256 = 2000, time 2000 · 0.04081 = 81.62 s, 2 workers: 2·81.62/3600 device-hours."""
    rows = plan_rows(STEP_LINE, STEPS, FAST_LINK, 1e8, [2], [128], max_per_worker_batch=64)
    row = rows[0]
    assert (row.accumulation_steps, row.micro_batch, row.global_batch) == (2, 64, 256)
    assert row.comm_s == pytest.approx(0.00801)
    assert row.step_time_s == pytest.approx(0.04081)
    assert row.step_time_s != pytest.approx(2 * (0.0164 + 0.00801))
    assert row.comm_share == pytest.approx(0.00801 / 0.04081)
    assert row.steps.value == pytest.approx(2000)
    assert row.time_to_target_s.value == pytest.approx(81.62)
    assert row.device_hours.value == pytest.approx(2 * 81.62 / 3600)
    assert row.feasible and row.limit == ""  # B = 256 <= 300, comm 20 % of the step
    assert "b = 128 per worker as 2×64 accumulated" in describe(row)


def test_an_accumulated_row_uses_the_measured_step_at_its_micro_batch():
    # measured 50 ms at 64: b = 128 over a limit of 64 is 2 · 50 ms (the line would say 32.8)
    rows = plan_rows(STEP_LINE, STEPS, FAST_LINK, 1e8, [1], [128], max_per_worker_batch=64,
                     measured_step_s={64: 0.05, 128: 0.02})
    assert rows[0].step_time_s == pytest.approx(0.1)
    assert rows[0].compute_source == "measured"


def test_accumulation_wins_where_the_all_reduce_dominates():
    """A slow link: 8 Gbit/s = 1e9 bytes/s, no latency: 2·1/2·1e8 / 1e9 = 0.1 s per all-reduce
    at N = 2; limit 64. b = 64: 16.4 + 100 = 116.4 ms, B = 128, S = 3000: 349.2 s and
    2·349.2/3600 = 0.194 device-hours. b = 128 as 2×64: 32.8 + 100 = 132.8 ms (the all-reduce
    once for two passes), B = 256, S = 2000: 265.6 s, 0.1476 device-hours: faster and cheaper,
    so it alone is on the front (its limit says why more is no better: communication 75 %)."""
    slow_link = CommModel.from_link(gbps=8, latency_us=0)
    plain, accumulated = plan_rows(STEP_LINE, STEPS, slow_link, 1e8, [2], [64, 128],
                                   max_per_worker_batch=64)
    assert plain.time_to_target_s.value == pytest.approx(349.2)
    assert plain.device_hours.value == pytest.approx(2 * 349.2 / 3600)
    assert accumulated.accumulation_steps == 2
    assert accumulated.time_to_target_s.value == pytest.approx(265.6)
    assert accumulated.device_hours.value == pytest.approx(2 * 265.6 / 3600)
    assert accumulated.limit == LIMIT_COMMUNICATION and accumulated.feasible
    assert pareto_front([plain, accumulated]) == [accumulated]


def test_a_fitting_batch_beats_accumulation_without_communication():
    """One worker, limit 64: b = 64 takes S(64)·16.4 ms = 5000 · 0.0164 = 82 s; b = 128 as 2×64
    takes S(128)·32.8 ms = 3000 · 0.0328 = 98.4 s (same compute per example, more examples to
    target): slower and dearer, kept but off the front."""
    fits, accumulated = plan_rows(STEP_LINE, STEPS, FAST_LINK, 1e8, [1], [64, 128],
                                  max_per_worker_batch=64)
    assert fits.time_to_target_s.value == pytest.approx(82)
    assert accumulated.time_to_target_s.value == pytest.approx(98.4)
    assert pareto_front([fits, accumulated]) == [fits]


def test_only_a_limit_below_one_example_marks_rows_infeasible():
    rows = plan_rows(STEP_LINE, STEPS, FAST_LINK, 1e8, [1, 2], [32, 128], max_per_worker_batch=0)
    assert all(not r.feasible and r.limit == LIMIT_MEMORY for r in rows)
    assert all(r.accumulation_steps == 1 for r in rows)
    assert pareto_front(rows) == []
    unchecked = plan_rows(STEP_LINE, STEPS, FAST_LINK, 1e8, [1], [128])
    assert unchecked[0].feasible and unchecked[0].accumulation_steps == 1
    assert unchecked[0].step_time_s == pytest.approx(0.01 + 1e-4 * 128)


def test_steps_fit_as_a_tuple_and_bad_inputs():
    rows = plan_rows(STEP_LINE, (1000, 256_000, 200, 300), FAST_LINK, 1e8, [1], [64])
    assert rows[0].steps.value == pytest.approx(5000)
    with pytest.raises(ValueError, match="low <= high"):
        StepsFit(1000, 256_000, 300, 200)
    with pytest.raises(ValueError, match="each >= 1"):
        plan_rows(STEP_LINE, STEPS, FAST_LINK, 1e8, [0, 2], [64])


# --------------------------------------------------------------------------- choosing


def row_with(time_s: float, device_hours: float, feasible: bool = True):
    """A plan row with the given central time and device-hours, ±20 % bands."""
    base = plan_rows(STEP_LINE, STEPS, FAST_LINK, 1e8, [1], [64])[0]
    return dataclasses.replace(
        base,
        time_to_target_s=Band(time_s, 0.8 * time_s, 1.2 * time_s),
        device_hours=Band(device_hours, 0.8 * device_hours, 1.2 * device_hours),
        feasible=feasible,
    )


SLOW_CHEAP, MIDDLE, FAST_DEAR = row_with(100, 1), row_with(50, 2), row_with(30, 5)
DOMINATED = row_with(60, 3)  # slower and dearer than MIDDLE
OUT_OF_MEMORY = row_with(10, 0.5, feasible=False)  # would dominate all, but does not fit
ROWS = [SLOW_CHEAP, DOMINATED, OUT_OF_MEMORY, FAST_DEAR, MIDDLE]


def test_pareto_front_excludes_dominated_and_infeasible_rows():
    assert pareto_front(ROWS) == [FAST_DEAR, MIDDLE, SLOW_CHEAP]


def test_fastest_within_budget():
    best, why = recommend(ROWS, Objective(FASTEST_WITHIN_BUDGET, 3))
    assert best is MIDDLE
    assert "B_crit interval 200–300" in why and "band 1.6–2.4" in why
    assert why.endswith("At the band's high end it is within the budget of 3 device-hours.")
    best, why = recommend(ROWS, Objective(FASTEST_WITHIN_BUDGET, 2.2))
    assert best is MIDDLE and "outside the budget" in why  # 2.4 at the high end


def test_cheapest_within_deadline():
    assert recommend(ROWS, Objective(CHEAPEST_WITHIN_DEADLINE, 60))[0] is MIDDLE
    best, why = recommend(ROWS, Objective(CHEAPEST_WITHIN_DEADLINE, 200))
    assert best is SLOW_CHEAP
    assert why.startswith("Cheapest within the deadline of 3.33 min")


def test_nothing_fits_says_why():
    best, why = recommend(ROWS, Objective(FASTEST_WITHIN_BUDGET, 0.5))
    assert best is None and why.startswith("No plan fits the budget of 0.5 device-hours")
    assert "the cheapest is N = 1" in why
    best, why = recommend(ROWS, Objective(CHEAPEST_WITHIN_DEADLINE, 10))
    assert best is None and "the fastest is" in why and "30 s to target" in why
    best, why = recommend([OUT_OF_MEMORY], Objective(CHEAPEST_WITHIN_DEADLINE, 10))
    assert best is None and why.startswith("No feasible plan")


def test_objective_is_checked():
    with pytest.raises(ValueError, match="not one of"):
        Objective("fastest", 1)
    with pytest.raises(ValueError, match="positive"):
        Objective(CHEAPEST_WITHIN_DEADLINE, 0)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(30, "30 s"), (600, "10 min"), (36_000, "10 h"), (math.inf, "unbounded")],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_the_steps_band_contains_the_fits_own_figure_even_outside_the_interval():
    """A fit whose B_crit (E_min/S_min = 50) lies above the reported interval [20, 40] (cut at
    the measured range): the band still brackets the steps the plan prints, so no plot draws a
    negative error bar (a run's report failed on that)."""
    from batchscale.planner.model import StepsFit

    fit = StepsFit(s_min=100.0, e_min=5000.0, b_crit_low=20.0, b_crit_high=40.0)
    band = fit.steps(64)
    assert band.low <= band.value <= band.high and band.high == band.value
