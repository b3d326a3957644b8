"""The planner's wiring to a run's tables (batchscale/planner/inputs.py, table.py):
the inputs read back with known answers (tests/plan_tables.py), the plan table through its
suite, the prediction check, and a clear BadInput for each missing measurement."""

from __future__ import annotations

import math

import pandas as pd
import plan_tables as pt
import pytest

from batchscale.checks import validate_table
from batchscale.errors import BadInput
from batchscale.planner.comm import comm_model
from batchscale.planner.inputs import gradient_bytes, read_plan_inputs
from batchscale.planner.model import (
    ASSUMED,
    CHEAPEST_WITHIN_DEADLINE,
    EFFECTIVE,
    Objective,
)
from batchscale.planner.table import (
    check_lines,
    check_rows,
    make_plan,
    parse_duration,
    table_rows,
)
from batchscale.schemas import make_table


def inputs_of(frames: dict, **kwargs):
    return read_plan_inputs(frames.get("sweep"), frames.get("runs"), frames.get("analysis"),
                            pt.GRADIENT_BYTES, **kwargs)


def test_inputs_read_back_with_known_answers():
    inputs = inputs_of(pt.frames())
    assert inputs.target == pt.TARGET and inputs.lr_rule == "linear"
    fit = inputs.steps_fit
    assert (fit.s_min, fit.e_min, fit.b_crit_low, fit.b_crit_high) == (100, 6400, 48, 96)
    assert inputs.step_line == pytest.approx((pt.ALPHA_S, pt.BETA_S), rel=1e-6)
    assert inputs.measured_step_s[64] == pytest.approx(pt.one_device_s(64))
    assert inputs.max_per_worker_batch == 128  # 256 ran out of memory
    assert inputs.per_worker_batches == list(pt.SINGLE_BATCHES)
    cell = inputs.data_parallel.iloc[0]
    assert (cell["batch_size"], cell["workers"]) == (128, 2)
    assert cell["comm_s"] == pytest.approx(pt.COMM_S, rel=1e-6)  # t_2(128) - t_1(64)


def test_workers_sharing_one_machines_cpus_have_the_whole_batchs_compute():
    """On CPUs the N torchrun processes share the cores one process had: the communication is
    what the step takes beyond one process's step at the whole batch."""
    frames = pt.frames()
    frames["runs"]["device_name"] = "cpu: Test CPU"
    inputs = inputs_of(frames)
    assert inputs.shared_host
    cell = inputs.data_parallel.iloc[0]
    # t_2(128) = t_1(64) + 2 ms; one process at 128 takes 0.64 ms longer than at 64
    assert cell["comm_s"] == pytest.approx(pt.COMM_S - 64 * pt.BETA_S, rel=1e-6)
    assert not inputs_of(pt.frames()).shared_host


def test_one_worker_count_fits_bandwidth_with_latency_assumed_zero():
    comm = comm_model(inputs_of(pt.frames()))
    # 2·(2−1)/2·1e6 bytes in 2 ms: 5e8 bytes/s
    assert comm.bandwidth_Bps == pytest.approx(5e8, rel=1e-6)
    assert comm.latency_s == 0.0
    assert (comm.source.bandwidth, comm.source.latency) == (EFFECTIVE, ASSUMED)
    assert "cannot separate latency" in comm.note


def test_stated_link_replaces_the_measured_one_and_is_assumed():
    comm = comm_model(inputs_of(pt.frames()), link_gbps=100, latency_us=5)
    assert comm.bandwidth_Bps == pytest.approx(12.5e9)
    assert comm.source.unmeasured_names() == (
        "link bandwidth (assumed), latency (assumed), hidden share (assumed)")
    with pytest.raises(BadInput, match="needs --latency-us"):
        comm_model(inputs_of(pt.frames()), link_gbps=100)


def test_plan_reproduces_the_measured_two_worker_cell():
    inputs = inputs_of(pt.frames())
    plan = make_plan(inputs, comm_model(inputs), [1, 2, 8])
    row = next(r for r in plan.rows if (r.workers, r.per_worker_batch) == (2, 64))
    assert row.step_time_s == pytest.approx(pt.one_device_s(64) + pt.COMM_S, rel=1e-6)
    assert row.steps.value == pytest.approx(pt.steps(128))
    assert row.compute_source == "measured"
    # 256 ran out of memory: two accumulated micro-batches of 128, which fit
    memory = next(r for r in plan.rows if r.per_worker_batch == 256)
    assert memory.accumulation_steps == 2 and memory.feasible


def test_plan_table_passes_its_suite_and_marks_extrapolation():
    inputs = inputs_of(pt.frames())
    plan = make_plan(inputs, comm_model(inputs), [1, 2, 8],
                     Objective(CHEAPEST_WITHIN_DEADLINE, 3600))
    rows = table_rows(plan)
    report = validate_table("plan", make_table("plan", rows, pt.ENV))
    assert report.success, report.failure_message()
    assert {r["workers"] for r in rows if r["extrapolated"]} == {8}
    assert sum(r["recommended"] for r in rows) == 1
    assert {r["latency_source"] for r in rows} == {ASSUMED}
    assert any(r["on_pareto_front"] for r in rows)


def reached_below(data: dict, cut: int, reached_seeds: tuple[int, ...] = ()) -> dict:
    """The run's tables where the linear rule's one-worker trials at `cut` and above did not
    reach the target (but those of `reached_seeds`), and its analysis cells there have no S."""
    analysis, runs = data["analysis"], data["runs"]
    failed = (runs["batch_size"] >= cut) & ~runs["seed"].isin(reached_seeds)
    return {**data, "analysis": analysis.assign(steps_to_target=analysis["steps_to_target"].where(
        analysis["batch_size"] < cut)),
        "runs": runs.assign(status=runs["status"].where(~failed, "not_reached"),
                            steps_to_target=runs["steps_to_target"].where(~failed))}


def test_rows_past_the_largest_batch_the_rule_reached_are_marked():
    """The rule's trials at 256 did not reach the target: the plan's S(B) there is the fit's
    extrapolation, which those trials contradict; its rows are marked and said so in its
    report, and are neither on the front nor recommended."""
    from batchscale.planner.section import what_if_markdown
    from batchscale.planner.table import plan_lines

    inputs = inputs_of(reached_below(pt.frames(), 256))
    assert (inputs.reached_batches, inputs.unreached_batches) == ((16, 32, 64, 128), (256,))
    assert inputs.unreached_trials == ((256, 0, 2),)
    plan = make_plan(inputs, comm_model(inputs), [1, 2],
                     Objective(CHEAPEST_WITHIN_DEADLINE, 3600))
    lines = plan_lines(plan)
    note = ("past batch 128, the largest at which the linear rule reached the target (its "
            "trials at 256 did not reach the target): S(B) there is the fit's extrapolation, "
            "which those trials contradict from batch 256 on, so rows there are neither on the "
            "front nor recommended")
    assert f"  † {note}" in lines
    marked = [line for line in lines if "†" in line and not line.startswith("  †")]
    assert marked and all(" 256†" in line or " 512†" in line for line in marked), marked
    assert f"Global batches 256, 512 lie {note}." in what_if_markdown(plan)
    assert note not in plan.recommendation  # it chose a row the runs reached
    assert all(row.global_batch <= 128 for row in plan.front)
    # where the rule reached only up to 32, the fastest row the runs support is at B = 32
    short = inputs_of(reached_below(pt.frames(), 64))
    fastest = make_plan(short, comm_model(short), [1, 2], None)
    assert all(row.global_batch <= 32 for row in fastest.front)
    assert "B = 64)" not in fastest.recommendation and "B = 32)" in fastest.recommendation
    # every batch reached up to 256: two workers' 512 is still past what the runs measured,
    # an extrapolation no trial contradicts, so it may be on the front
    reached = inputs_of(pt.frames())
    assert ("  † past batch 256, the largest at which the linear rule reached the target: S(B) "
            "there is the fit's extrapolation") in plan_lines(make_plan(
                reached, comm_model(reached), [1, 2], None))


def test_a_batch_where_only_some_seeds_reached_is_counted_as_such():
    """One of the two seeds reached at 256: its median did not, so the rule's S(B) there is
    not measured, and the note says how many did rather than that none did."""
    from batchscale.planner.table import reach_note

    inputs = inputs_of(reached_below(pt.frames(), 256, reached_seeds=(0,)))
    assert inputs.unreached_trials == ((256, 1, 2),)
    assert reach_note(inputs).startswith(
        "past batch 128, the largest at which the linear rule reached the target (its median "
        "over the seeds did not reach the target: at 256 only 1 of 2 did)")
    # another rule that reached further is named, with how to plan it
    data = reached_below(pt.frames(), 256)
    sqrt = pt.frames()["analysis"].assign(lr_rule="sqrt", s_min=pt.S_MIN * 1.5)
    data["analysis"] = pd.concat([data["analysis"], sqrt], ignore_index=True)
    assert reach_note(inputs_of(data)).endswith(
        " (--lr-rule sqrt reached up to batch 256)")


def test_open_b_crit_interval_is_stored_as_null_not_inf():
    frames = pt.frames()
    frames["analysis"]["b_crit_high"] = math.inf
    inputs = inputs_of(frames)
    rows = table_rows(make_plan(inputs, comm_model(inputs), [1, 2]))
    assert all(r["b_crit_high"] is None and r["time_to_target_s_high"] is None for r in rows)
    assert validate_table("plan", make_table("plan", rows, pt.ENV)).success


def test_check_is_exact_on_exact_data_and_out_of_sample_with_two_cells():
    frames = pt.frames(parallel_batches=(64, 128))
    inputs = inputs_of(frames)
    plan = make_plan(inputs, comm_model(inputs), [1, 2])
    checks = check_rows(plan.inputs, frames["runs"])
    assert {(c["workers"], c["batch_size"]) for c in checks} == {(1, 64), (1, 128), (2, 64),
                                                                  (2, 128)}
    for c in checks:
        assert c["error"] == pytest.approx(0, abs=0.02), c  # steps_run is rounded
    assert all(c["how"] == "communication fitted without this cell"
               for c in checks if c["workers"] == 2)
    assert "goal ±25% met" in check_lines(checks)[-1]


def test_check_says_in_sample_with_one_cell_and_catches_a_wrong_model():
    frames = pt.frames()
    inputs = inputs_of(frames)
    plan = make_plan(inputs, comm_model(inputs), [1, 2])
    checks = check_rows(plan.inputs, frames["runs"])
    (two,) = [c for c in checks if c["workers"] == 2]
    assert two["how"].startswith("in sample")
    # within the goal, but only on the cell the model was fitted to: not called a test passed
    assert "goal ±25% met in sample only: the communication model was fitted to every " \
           "multi-worker cell judged here, so it is not tested" in check_lines(checks)[-1]
    # A stated link 100x faster than the measured one predicts the 2-worker cell too fast.
    fast = check_rows(plan.inputs, frames["runs"], link_gbps=400, latency_us=0)
    (fast_two,) = [c for c in fast if c["workers"] == 2]
    assert fast_two["error"] < -0.25
    assert "missed" in check_lines(fast)[-1]


def test_disturbed_cells_are_named_and_judged_apart():
    frames = pt.frames(parallel_batches=(64, 128))
    runs = frames["runs"]
    busy = (runs["workers"] == 2) & (runs["batch_size"] == 64)
    runs.loc[busy, "cpu_wait_share"] = 0.4
    runs.loc[busy, "time_to_target_s"] *= 3  # a busy machine, not the model
    inputs = inputs_of(frames)
    checks = check_rows(inputs, runs)
    (slowed,) = [c for c in checks if "disturbed" in c["how"]]
    assert (slowed["workers"], slowed["batch_size"]) == (2, 64)
    assert "threads waited for a CPU up to 40%" in slowed["how"]
    lines = check_lines(checks)
    assert "goal ±25% missed" in lines[-2]
    assert lines[-1].startswith("1 of 4 cells disturbed") and "the others 0%" in lines[-1]


def test_starved_one_worker_trials_are_left_out_of_the_step_time():
    frames = pt.frames()
    runs = frames["runs"]
    starved = (runs["workers"] == 1) & (runs["batch_size"] == 64)
    runs.loc[starved, "cpu_wait_share"] = 0.5
    runs.loc[starved, "train_time_s"] *= 10
    inputs = inputs_of(frames)
    assert 64 not in inputs.measured_step_s
    assert "2 trial(s) left out" in inputs.step_time_source
    assert inputs.compute_s(64) == pytest.approx(pt.one_device_s(64), rel=1e-6)  # the line


@pytest.mark.parametrize(("change", "message"), [
    (lambda f: f.pop("analysis"), "no analysis rows"),
    (lambda f: f.__setitem__("analysis", f["analysis"].assign(
        s_min=math.nan, b_crit_bound="above", b_crit_bound_batch=256.0)),
     "no S.B. = S_min \\+ E_min/B fit for any LR rule \\(B_crit above 256\\)"),
    (lambda f: f.__setitem__("runs", f["runs"][f["runs"]["batch_size"] == 16]),
     "no step-time line"),
])
def test_missing_measurements_are_named(change, message):
    frames = pt.frames()
    frames["sweep"] = None if "step-time" in message else frames["sweep"]
    change(frames)
    with pytest.raises(BadInput, match=message):
        inputs_of(frames)


def test_no_data_parallel_runs_and_no_link_is_named():
    frames = pt.frames(parallel_batches=())
    with pytest.raises(BadInput, match="no data-parallel runs .* --link-gbps"):
        comm_model(inputs_of(frames))
    frames = pt.frames(comm_s=-1e-4)  # two workers no slower: nothing to measure
    with pytest.raises(BadInput, match="no slower per step"):
        comm_model(inputs_of(frames))


def test_unknown_lr_rule_is_named():
    with pytest.raises(BadInput, match="no S.B. fit for LR rule 'sqrt'.*fitted: linear"):
        inputs_of(pt.frames(), lr_rule="sqrt")


def test_gradient_bytes_counts_the_workload_parameters():
    # 64·128+128 + 128·128+128 + 128·10+10 = 26122 fp32 values
    assert gradient_bytes("digits-mlp") == 4 * 26122


@pytest.mark.parametrize(("text", "seconds"), [("90", 90), ("90s", 90), ("30min", 1800),
                                                 ("2h", 7200), ("1.5d", 129600)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "-5min", "0", "2 weeks"])
def test_bad_durations_are_refused(text):
    with pytest.raises(BadInput, match="--deadline"):
        parse_duration(text)


def test_analyze_plans_from_a_users_own_runs_with_their_recorded_gradient_bytes():
    """`batchscale analyze` on tables of a user's workload plans from what the trials recorded
    (gradient bytes, data-parallel cells), with no workload name to build a model from; a table
    that did not record them gets the reason instead of a plan."""
    from batchscale.external.stage import what_if_plan

    frames = pt.frames()
    runs = frames["runs"].assign(gradient_bytes=pt.GRADIENT_BYTES)
    plan, missing = what_if_plan(frames["sweep"], runs, frames["analysis"].to_dict("records"))
    assert missing == "" and plan is not None
    assert {r.workers for r in plan.rows} == {1, 2, 4, 8}
    row = next(r for r in plan.rows if (r.workers, r.per_worker_batch) == (2, 64))
    assert row.step_time_s == pytest.approx(pt.one_device_s(64) + pt.COMM_S, rel=1e-6)
    plan, missing = what_if_plan(frames["sweep"], runs.drop(columns="gradient_bytes"),
                                 frames["analysis"].to_dict("records"))
    assert plan is None and "did not record their gradient bytes" in missing
