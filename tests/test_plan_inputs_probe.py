"""The planner's link from the trials' all-reduce probes (planner.inputs.probed_model), with known
answers: a ring over 2 workers with latency 50 µs per hop and 1e9 bytes/s takes
2·50 µs + 1024 B / 1e9 B/s for the small message and 2·50 µs + 1e6 B / 1e9 B/s = 1.1 ms for the
1 MB gradient (2(N−1)/N = 1 at N = 2)."""

from __future__ import annotations

import plan_tables as pt
import pytest

from batchscale.checks import validate_table
from batchscale.errors import BadInput
from batchscale.planner.comm import comm_model
from batchscale.planner.inputs import read_plan_inputs
from batchscale.planner.model import BACKWARD_SHARE, EFFECTIVE, MEASURED, SET_TO_ZERO
from batchscale.planner.table import check_rows, make_plan
from batchscale.schemas import make_table

LATENCY_S, BANDWIDTH_BPS, SMALL_BYTES = 50e-6, 1e9, 1024


def ring_s(n_bytes: float) -> float:
    return 2 * LATENCY_S + n_bytes / BANDWIDTH_BPS


def probed_frames(comm_s: float = pt.COMM_S, parallel_batches=(128,),
                  gradient_bytes: float = pt.GRADIENT_BYTES) -> dict:
    """The known-answer run, its two-worker trials carrying the probe's columns."""
    frames = pt.frames(parallel_batches=parallel_batches, comm_s=comm_s)
    runs = frames["runs"]
    two = runs["workers"] == 2
    runs["gradient_bytes"] = int(gradient_bytes)
    runs.loc[two, "allreduce_backend"] = "gloo"
    runs.loc[two, "allreduce_small_bytes"] = SMALL_BYTES
    runs.loc[two, "allreduce_small_s"] = ring_s(SMALL_BYTES)
    runs.loc[two, "allreduce_gradient_s"] = ring_s(gradient_bytes)
    runs.loc[two, "allreduce_cv"] = 0.1
    return frames


def inputs_of(frames: dict, grad_bytes: float | None = pt.GRADIENT_BYTES):
    return read_plan_inputs(frames["sweep"], frames["runs"], frames["analysis"], grad_bytes)


def test_two_message_sizes_separate_latency_from_bandwidth_at_one_worker_count():
    """The exposed 2 ms per step is more than the bare 1.1 ms all-reduce: nothing hidden, and
    the excess is an effective bandwidth over the probe's (measured) latency."""
    comm = comm_model(inputs_of(probed_frames()))
    assert comm.latency_s == pytest.approx(LATENCY_S, rel=1e-6)
    # 2 ms exposed − 2·50 µs latency = 1.9 ms for 1e6 bytes
    assert comm.bandwidth_Bps == pytest.approx(1e6 / 1.9e-3, rel=1e-6)
    assert comm.hidden_share == 0
    assert (comm.source.bandwidth, comm.source.latency, comm.source.hidden_share) == (
        EFFECTIVE, MEASURED, SET_TO_ZERO)
    assert comm.source.unmeasured_names() == "link bandwidth (effective), hidden share (set to 0)"
    assert "1.8× the bare all-reduce" in comm.note and "contend" in comm.note
    assert "latency 50 µs per hop, 8 Gbit/s" in comm.note and "probe CV 10%" in comm.note


def test_a_step_exposing_less_than_the_all_reduce_hid_the_rest_behind_backward():
    # a slower link: the bare all-reduce takes 1 ms; the two-worker step exposes 0.5 ms of it
    # (the hidden 0.5 ms fits behind the backward pass: 2/3 of 1.64 ms of compute at b = 64)
    frames = probed_frames(comm_s=0.5e-3)
    runs, slow_bandwidth = frames["runs"], 1e6 / (1e-3 - 2 * LATENCY_S)
    runs.loc[runs["workers"] == 2, "allreduce_gradient_s"] = 1e-3
    runs.loc[runs["workers"] == 2, "allreduce_small_s"] = 2 * LATENCY_S + 1024 / slow_bandwidth
    inputs = inputs_of(frames)
    comm = comm_model(inputs)
    assert comm.hidden_share == pytest.approx(0.5, rel=1e-6)
    assert comm.latency_s == pytest.approx(LATENCY_S, rel=1e-6)
    assert comm.bandwidth_Bps == pytest.approx(slow_bandwidth, rel=1e-6)
    assert comm.source.unmeasured_names() == ""
    # the plan reproduces the measured two-worker step: compute + (1 − 0.5)·1 ms
    plan = make_plan(inputs, comm, [1, 2, 8])
    row = next(r for r in plan.rows if (r.workers, r.per_worker_batch) == (2, 64))
    assert row.step_time_s == pytest.approx(pt.one_device_s(64) + 0.5e-3, rel=1e-6)
    # 8 workers: 14 hops of 50 µs and 2·7/8 of the gradient over the link; half of it would
    # hide, but no more than the backward pass it overlaps
    eight = next(r for r in plan.rows if (r.workers, r.per_worker_batch) == (8, 64))
    bare_8 = 14 * LATENCY_S + 2 * 7 / 8 * 1e6 / comm.bandwidth_Bps
    hidden_8 = min(0.5 * bare_8, BACKWARD_SHARE * pt.one_device_s(64))
    assert hidden_8 < 0.5 * bare_8  # the cap binds here
    assert eight.comm_s == pytest.approx(bare_8 - hidden_8, rel=1e-6)


def test_check_with_probes_is_exact_on_exact_data():
    frames = probed_frames(parallel_batches=(64, 128))
    inputs = inputs_of(frames)
    checks = check_rows(inputs, frames["runs"])
    assert {(c["workers"], c["batch_size"]) for c in checks if c["workers"] == 2} == {
        (2, 64), (2, 128)}
    for c in checks:
        assert c["error"] == pytest.approx(0, abs=0.02), c  # steps_run is rounded


def test_the_gradient_bytes_the_trials_recorded_win_over_the_callers_count():
    frames = probed_frames(gradient_bytes=2e6)
    assert inputs_of(frames, grad_bytes=1e6).gradient_bytes == 2e6
    assert inputs_of(frames, grad_bytes=None).gradient_bytes == 2e6
    with pytest.raises(BadInput, match="did not record their gradient bytes"):
        inputs_of(pt.frames(), grad_bytes=None)


def probe_columns(row: dict, **changes) -> dict:
    if row["workers"] == 1:
        return {**row, "gradient_bytes": int(pt.GRADIENT_BYTES)}
    return {**row, "gradient_bytes": int(pt.GRADIENT_BYTES), "allreduce_backend": "gloo",
            "allreduce_small_bytes": SMALL_BYTES, "allreduce_small_s": ring_s(SMALL_BYTES),
            "allreduce_gradient_s": ring_s(pt.GRADIENT_BYTES), "allreduce_cv": 0.1, **changes}


def test_runs_with_probe_columns_pass_the_runs_suite_and_a_bad_probe_fails_it():
    good = [probe_columns(row) for row in pt.run_rows()]
    report = validate_table("runs", make_table("runs", good, pt.ENV))
    assert report.success, report.failure_message()
    bad = [probe_columns(row, allreduce_gradient_s=0.0, allreduce_backend="carrier-pigeon")
           for row in pt.run_rows()]
    message = validate_table("runs", make_table("runs", bad, pt.ENV)).failure_message()
    assert "expect_column_values_to_be_between(allreduce_gradient_s)" in message
    assert "expect_column_values_to_be_in_set(allreduce_backend)" in message


# ------------------------------------------------- workers sharing one machine's cores
def shared_host_frames(factor: float, exposed_s: float = 1.5e-3,
                       batches=(32, 64, 128)) -> dict:
    """Two CPU processes on one machine: each two-worker step is `exposed_s` plus `factor` ×
    one process's step at the whole batch."""
    rows = [pt.trial(b, 1, seed, pt.one_device_s(b)) for b in pt.SINGLE_BATCHES
            for seed in (0, 1)]
    rows += [pt.trial(b, 2, seed, exposed_s + factor * pt.one_device_s(b)) for b in batches
             for seed in (0, 1)]
    frames = pt.frames()
    frames["runs"] = make_table("runs", rows, {**pt.ENV, "device_name": "cpu: Test CPU"}
                                ).to_pandas()
    return frames


def test_a_shared_hosts_compute_factor_is_fitted_and_left_out_with_its_cell():
    frames = shared_host_frames(factor=0.7)
    inputs = inputs_of(frames, grad_bytes=pt.GRADIENT_BYTES)
    assert inputs.shared_host
    assert inputs.shared_compute_factor == pytest.approx(0.7, rel=1e-6)
    assert "0.7 × one process's at the whole batch (fitted to 3 cells)" in \
        inputs.shared_compute_note
    assert inputs.data_parallel["comm_s"].to_numpy() == pytest.approx([1.5e-3] * 3, rel=1e-6)
    # each cell predicted from the other two: the factor and the exposed time refitted
    checks = check_rows(inputs, frames["runs"])
    assert sorted(c["batch_size"] for c in checks if c["workers"] == 2) == [32, 64, 128]
    for c in checks:
        assert c["error"] == pytest.approx(0, abs=0.02), c  # steps_run is rounded
    # the plan gives each worker a device: one device's step at b plus the exposed time
    row = next(r for r in make_plan(inputs, comm_model(inputs), [2]).rows
               if r.per_worker_batch == 64)
    assert row.step_time_s == pytest.approx(pt.one_device_s(64) + 1.5e-3, rel=1e-6)


def test_a_shared_hosts_factor_that_cannot_be_fitted_is_one_and_says_why():
    one_cell = inputs_of(shared_host_frames(factor=0.7, batches=(64,)))
    assert one_cell.shared_compute_factor == 1.0
    assert "one cell per worker count" in one_cell.shared_compute_note
    # steps that grow 5× faster than one process's: noise, not the host
    noisy = inputs_of(shared_host_frames(factor=5.0))
    assert noisy.shared_compute_factor == 1.0
    assert "fitted to 5, outside 0.25–2: noise" in noisy.shared_compute_note


def test_steps_no_slower_than_their_compute_hid_the_whole_all_reduce():
    """Noise can make a data-parallel step come out faster than its compute reference: the
    exposed time is negative, and the hidden share is 1, not above it."""
    frames = probed_frames(comm_s=-1e-4)
    comm = comm_model(inputs_of(frames))
    assert comm.hidden_share == 1.0
    assert comm.source.hidden_share == MEASURED


def test_the_link_says_the_range_each_probe_gives_alone():
    """One fitted link hides how far the probes disagree: with one trial's probe twice as slow
    on both messages, the note gives each probe's own latency and bandwidth as a range."""
    frames = probed_frames()
    runs = frames["runs"]
    slow = runs.index[runs["workers"] == 2][0]
    runs.loc[slow, ["allreduce_small_s", "allreduce_gradient_s"]] *= 2
    note = comm_model(inputs_of(frames)).note
    # the slow probe alone: twice the latency, half the bandwidth (both times doubled)
    assert "latency 50–100 µs, 4–8 Gbit/s)" in note, note
    assert "(each probe alone, " in note


def test_one_probe_gives_no_range():
    frames = probed_frames()
    runs = frames["runs"]
    keep = runs.index[runs["workers"] == 2][0]
    runs = runs[(runs["workers"] != 2) | (runs.index == keep)]
    frames["runs"] = runs
    assert "each probe alone" not in comm_model(inputs_of(frames)).note
