"""Measurements that notice they are disturbed: interleaved rounds, how a row's trials combine,
retry-then-flag, the conditions columns, and the sweep's validation of its quality share.

The pure parts (rounds.py, cells.py) are tested on known and generated step times; the rest on
real sweeps of digits-mlp with tiny budgets. Thresholds set to extremes (a CV limit no timing
can meet, limits nothing can exceed) make the outcome certain without asserting any speed."""

from __future__ import annotations

import json
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscale.checks.stage import validate_sweep
from batchscale.config import ExperimentConfig, SweepConfig
from batchscale.errors import ValidationFailed
from batchscale.schemacheck import check_schema
from batchscale.schemas import TrialStatus
from batchscale.storage import read_table_file
from batchscale.sweep.cells import SweepCell, measured_columns, worst_conditions
from batchscale.sweep.rounds import (
    Overload,
    combine,
    judge,
    majority_spread,
    trial_share,
    visit_order,
)
from batchscale.sweep.search import trial_budget
from batchscale.sweep.summary import summarize, summary_lines
from batchscale.sweep.sweep import sweep
from batchscale.sweep.trial import TrialResult
from batchscale.timing import StepTimes

# Measures time: run alone, not beside other tests (the Makefile's serial phase).
pytestmark = pytest.mark.serial

FAST = {"untimed_steps": 1, "min_timed_steps": 3, "max_timed_steps": 20, "time_budget_s": 0.05}
NO_NEIGHBOUR_CHECKS = {"overload_cpu_share": None, "max_cpu_wait_share": None}
"""Whether other processes load this machine is not up to the test: those signals are tested on
known conditions (test_*overloaded*, test_*starved*), the real sweeps here without them, so their
outcome depends only on their settings."""
NEVER_FLAG = {"max_round_spread": 1e6, "max_cv": 1e6, **NO_NEIGHBOUR_CHECKS}
ENV = {"run_id": "t", "config_hash": "h", "experiment": "test", "workload": "w",
       "git_commit": "c", "batchscale_version": "0", "torch_version": torch.__version__,
       "python_version": "3", "device_name": "cpu", "threads": 1, "world_size": 1}


def steps(*seconds: float, cpu_per_wall: float | None = None) -> StepTimes:
    wall = sum(seconds)
    return StepTimes(tuple(seconds), None if cpu_per_wall is None else cpu_per_wall * wall, wall)


class Log(list):
    """The sweep's log lines, kept to check what it reported and in which order."""

    def __call__(self, line: str) -> None:
        self.append(line)

    def trials(self) -> list[tuple[str, int]]:
        """(round or retry label, batch) of each trial line, in order."""
        out = []
        for line in self:
            if line.startswith("["):
                words = line.split()
                out.append((f"{words[1]} {words[2]}", int(words[5])))
        return out


# ---------------------------------------------------------------- rounds and combining
@given(st.lists(st.integers(), max_size=12), st.integers(0, 9))
def test_rounds_alternate_ascending_and_descending(cells, r):
    order = visit_order(cells, r)
    assert sorted(order) == sorted(cells)
    assert order == (cells if r % 2 == 0 else cells[::-1])


positive_seconds = st.floats(1e-6, 10.0, allow_nan=False)
trial_lists = st.lists(st.lists(positive_seconds, min_size=1, max_size=30), min_size=1,
                       max_size=5)


@settings(max_examples=200, deadline=None)
@given(trial_lists)
def test_combined_figures_keep_their_order_and_spread_bound(trials):
    """p10 <= median <= p90 holds for the combined figures as within each trial, the spread
    lies in [0, 2], and one trial has no spread."""
    combined = combine([StepTimes(tuple(t)) for t in trials])
    assert combined.p10_s <= combined.median_s <= combined.p90_s
    assert combined.timed_steps == sum(len(t) for t in trials)
    if len(trials) == 1:
        assert combined.round_spread is None
    else:
        assert 0 <= combined.round_spread <= 2


def test_each_trial_gets_one_vote_whatever_its_step_count():
    """A long disturbed trial (many slow steps) and a short quiet one: the median of medians,
    not the median of the pooled steps (which the long trial would decide)."""
    quiet, disturbed = steps(*[1.0] * 5), steps(*[3.0] * 500)
    combined = combine([quiet, disturbed])
    assert combined.median_s == 2.0
    assert combined.round_spread == pytest.approx(2.0 / 2.0)


def test_two_trials_spread_is_their_range_over_their_median():
    combined = combine([steps(1.00, 1.00, 1.00), steps(1.34, 1.34, 1.34)])
    assert combined.round_spread == pytest.approx(0.34 / 1.17)


def test_a_retry_can_outvote_one_disturbed_trial():
    assert majority_spread([1.0, 2.0]) == pytest.approx(1.0 / 1.5)
    assert majority_spread([1.0, 2.0, 1.02]) == pytest.approx(0.02 / 1.02)
    assert majority_spread([1.0, 2.0, 1.02, 2.5]) == pytest.approx(1.0 / 1.51)
    assert majority_spread([3.0]) is None


def test_lowest_cpu_per_wall_over_the_trials_is_kept():
    combined = combine([steps(1.0, 1.1, cpu_per_wall=1.9), steps(1.0, 1.1, cpu_per_wall=0.6)])
    assert combined.cpu_per_wall == pytest.approx(0.6)


def test_unstable_reasons_in_plain_words_with_the_figures():
    disagree = combine([steps(1.0, 1.0), steps(1.41, 1.41)])
    assert judge(disagree, max_round_spread=0.15, max_cv=0.5) == (
        "unstable", "rounds disagree by 34% (> 15%)")
    scatter = combine([steps(1.0, 0.01, 3.0, 0.5)])
    quality, reason = judge(scatter, max_round_spread=0.15, max_cv=0.5)
    assert quality == "unstable" and reason == f"step times scatter: CV {scatter.cv:.2f} (> 0.50)"
    both = combine([steps(1.0, 0.01, 3.0), steps(5.0, 0.05, 15.0)])
    assert judge(both, max_round_spread=0.15, max_cv=0.5)[1].count(";") == 1
    assert judge(combine([steps(1.0, 1.01), steps(1.02, 1.0)]), max_round_spread=0.15,
                 max_cv=0.5) == ("ok", None)


def test_most_trials_on_an_overloaded_machine_flag_a_row_whose_rounds_agree():
    """Steady, agreeing, and wrong: OpenMP threads stalled behind other processes."""
    steady = combine([steps(0.19, 0.19, 0.2), steps(0.19, 0.2, 0.19)])
    assert judge(steady, max_round_spread=0.15, max_cv=0.5) == ("ok", None)
    both = Overload(trials=2, others_load=3.94, usable_cpus=2)
    assert judge(steady, max_round_spread=0.15, max_cv=0.5, overload=both) == (
        "unstable", "other processes kept all 2 usable CPUs busy in 2 of 2 trials (load beyond "
        "this trial's own up to 3.9)")
    one = Overload(trials=1, others_load=3.94, usable_cpus=2)
    assert judge(steady, max_round_spread=0.15, max_cv=0.5, overload=one) == ("ok", None)


def test_a_cell_counts_its_trials_that_ran_overloaded():
    cell = SweepCell("synthetic", 64, "listed")
    busy = {"load_avg_1m": 4.59, "usable_cpus": 2}
    quiet = {"load_avg_1m": 0.9, "usable_cpus": 2}
    slow = TrialResult(TrialStatus.OK, (0.19, 0.2, 0.19), 1e6, 1000, "cpu", process_cpu_s=0.39,
                       wall_s=0.6)
    cell.add(slow, busy, "round 1/2", retry=False)
    cell.add(slow, busy, "round 2/2", retry=False)
    quality, reason = cell.quality(0.15, 0.5)
    assert quality == "unstable" and "in 2 of 2 trials (load beyond this trial's own up to " \
        "3.9)" in reason
    fast = TrialResult(TrialStatus.OK, (0.19, 0.2, 0.19), 1e6, 1000, "cpu", process_cpu_s=1.2,
                       wall_s=0.6)
    for label in ("retry 1/2", "retry 2/2"):
        cell.add(fast, quiet, label, retry=True)
    assert cell.overload.trials == 2 and cell.quality(0.15, 0.5) == ("ok", None)


def test_most_trials_starved_of_cpu_flag_a_row_whose_rounds_agree():
    """The trial's own account of a busy neighbour (run-queue wait), which the load average
    reports a minute late: steady steps, agreeing rounds, and still flagged."""
    steady = combine([steps(0.4, 0.41), steps(0.41, 0.4)])
    starved = Overload(starved_trials=2, cpu_wait_share=0.38)
    assert judge(steady, max_round_spread=0.15, max_cv=0.5, overload=starved) == (
        "unstable", "its threads waited for a CPU up to 38% of the time they were runnable, in "
        "2 of 2 trials (other processes held the CPUs)")
    once = Overload(starved_trials=1, cpu_wait_share=0.38)
    assert judge(steady, max_round_spread=0.15, max_cv=0.5, overload=once) == ("ok", None)


def test_a_cell_counts_its_starved_trials_and_keeps_the_longest_wait():
    cell = SweepCell("synthetic", 64, "listed")
    quiet = {"load_avg_1m": 0.4, "usable_cpus": 2}
    starved = TrialResult(TrialStatus.OK, (0.4, 0.41), 1e6, 1000, "cpu", process_cpu_s=1.0,
                          wall_s=0.81, cpu_wait_s=0.6)
    fed = TrialResult(TrialStatus.OK, (0.4, 0.41), 1e6, 1000, "cpu", process_cpu_s=1.6,
                      wall_s=0.81, cpu_wait_s=0.005)
    cell.add(starved, quiet, "round 1/2", retry=False)
    cell.add(fed, quiet, "round 2/2", retry=False)
    assert cell.overload.starved_trials == 1 and cell.quality(0.15, 0.5) == ("ok", None)
    cell.add(starved, quiet, "retry 1/2", retry=True)
    assert cell.overload.cpu_wait_share == pytest.approx(0.6 / 1.6)
    assert cell.quality(0.15, 0.5)[0] == "unstable"
    assert cell.combined().cpu_wait_share == pytest.approx(0.6 / 1.6)
    off = SweepCell("synthetic", 64, "listed", wait_share=math.inf)
    for label in ("round 1/2", "round 2/2"):
        off.add(starved, quiet, label, retry=False)
    assert off.overload.starved_trials == 0 and off.quality(0.15, 0.5) == ("ok", None)


def test_a_single_step_cannot_be_judged_for_scatter():
    combined = combine([steps(0.5)])
    assert math.isnan(combined.cv)
    assert judge(combined, max_round_spread=0.15, max_cv=1e-9) == ("ok", None)


def test_steps_paused_by_garbage_collection_alone_do_not_flag_a_row():
    """A full collection's pause is the loop's own, in every round: the scatter check looks
    past the steps it ran in, where the clock can tell them, and still sees a disturbance."""
    quiet = [0.001] * 150 + [0.0011] * 150
    quiet[100] = 0.2  # the step a 199 ms collection ran in
    paused = StepTimes(tuple(quiet), 0.3, 0.5, 0.0, gc_s=0.199, gc_steps=(100,))
    combined = combine([paused, paused])
    assert combined.cv > 0.5 and combined.gc_share == pytest.approx(0.398)
    assert judge(combined, max_round_spread=0.15, max_cv=0.5) == ("ok", None)
    untold = StepTimes(tuple(quiet), 0.3, 0.5, 0.0, gc_s=0.199, gc_steps=None)
    quality, reason = judge(combine([untold, untold]), max_round_spread=0.15, max_cv=0.5)
    assert quality == "unstable" and reason == f"step times scatter: CV {combined.cv:.2f} (> 0.50)"
    disturbed = [s * (1 + 3 * (i % 2)) for i, s in enumerate(quiet)]  # 1 and 4 ms steps
    noisy = StepTimes(tuple(disturbed), 0.3, 0.5, 0.0, gc_s=0.199, gc_steps=(100,))
    quality, reason = judge(combine([noisy, noisy]), max_round_spread=0.15, max_cv=0.5)
    assert quality == "unstable"
    assert reason.startswith("step times scatter: CV 0.6") and "garbage collector" in reason


def test_the_trial_server_collects_its_imports_garbage_once_it_has_loaded_them():
    """The forkserver's last preload runs one full collection, so trials forked from it do not
    inherit one already due (it landed in their first timed steps)."""
    import gc
    import importlib
    import sys

    from batchscale.sweep import isolation

    full: list[int] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            full.append(info["generation"])

    sys.modules.pop(isolation.SETTLE_GC, None)
    gc.callbacks.append(watch)
    gc.disable()  # only the module's own collection
    try:
        importlib.import_module(isolation.SETTLE_GC)
    finally:
        gc.enable()
        gc.callbacks.remove(watch)
    assert full == [2]
    import multiprocessing.forkserver

    isolation._context(("torchvision",))  # what the server will preload, in order
    assert multiprocessing.forkserver._forkserver._preload_modules[-1] == isolation.SETTLE_GC


def test_a_rows_budget_and_step_cap_are_split_over_its_rounds():
    share = trial_share(SweepConfig(time_budget_s=2.0, max_timed_steps=2000, rounds=2))
    assert (share.time_budget_s, share.max_timed_steps) == (1.0, 1000)
    share = trial_share(SweepConfig(min_timed_steps=20, max_timed_steps=30, rounds=4))
    assert share.max_timed_steps == 20 and share.min_timed_steps == 20


# ---------------------------------------------------------------- cells
def ok_result(*seconds: float) -> TrialResult:
    return TrialResult(TrialStatus.OK, seconds, 1e6, 1000, "cpu_trial_process_peak_rss",
                       process_cpu_s=sum(seconds), wall_s=sum(seconds))


def test_a_later_failure_ends_the_cell_and_says_what_was_timed_before():
    cell = SweepCell("synthetic", 64, "listed")
    cell.add(ok_result(0.002, 0.002), {"load_avg_1m": 0.5, "usable_cpus": 2}, "round 1/2",
             retry=False)
    assert cell.timed and cell.rounds == 1
    oom = TrialResult(TrialStatus.OOM, peak_memory_bytes=9000, error="OutOfMemoryError: boom")
    cell.add(oom, {"load_avg_1m": 1.5, "usable_cpus": 2}, "round 2/2", retry=False)
    row = measured_columns(cell, 0.15, 0.5, 1e9)
    assert not cell.timed
    assert row["status"] == "oom" and row.get("quality") is None
    assert row["error"].startswith("round 2/2: OutOfMemoryError: boom (earlier trials had "
                                   "timed it at 2.000 ms per step")
    assert row["rounds"] == 0 and row["timed_steps"] == 0 and row["peak_memory_bytes"] == 9000
    assert row["load_avg_1m"] == 1.5


def test_conditions_combine_to_the_worst_any_trial_saw():
    worst = worst_conditions([
        {"load_avg_1m": 0.2, "usable_cpus": 4, "threads_oversubscribed": False,
         "gpu_other_processes": None, "gpu_sm_clock_mhz": 1980.0, "gpu_temperature_c": 40.0},
        {"load_avg_1m": 3.0, "usable_cpus": 2, "threads_oversubscribed": True,
         "gpu_other_processes": 1, "gpu_sm_clock_mhz": 1400.0, "gpu_temperature_c": 80.0},
    ])
    assert worst == {"load_avg_1m": 3.0, "usable_cpus": 2, "threads_oversubscribed": True,
                     "gpu_other_processes": 1, "gpu_sm_clock_mhz": 1400.0,
                     "gpu_temperature_c": 80.0}
    assert worst_conditions([{"load_avg_1m": None}])["load_avg_1m"] is None


# ---------------------------------------------------------------- real sweeps
def table_rows(path) -> list[dict]:
    return check_schema("sweep", read_table_file(path)).to_pylist()


def test_two_rounds_give_one_row_per_cell_visited_in_alternating_order(tmp_path):
    cfg = SweepConfig(batch_sizes=[1, 64], input_modes=["synthetic"], rounds=2, max_retries=2,
                      **NEVER_FLAG, **FAST)
    log = Log()
    rows = sweep(cfg, "digits-mlp", ENV, tmp_path / "s.parquet", log=log)
    assert log.trials() == [("round 1/2", 1), ("round 1/2", 64), ("round 2/2", 64),
                            ("round 2/2", 1)]
    written = table_rows(tmp_path / "s.parquet")
    key = ("batch_size", "rounds", "round_spread", "step_time_median_s", "quality")
    assert [[r[k] for k in key] for r in written] == [[r[k] for k in key] for r in rows]
    assert [(r["batch_size"], r["rounds"], r["retries"]) for r in rows] == [(1, 2, 0), (64, 2, 0)]
    for r in rows:
        assert 0 <= r["round_spread"] <= 2
        assert r["quality"] == "ok" and r["quality_reason"] is None
        assert r["step_time_p10_s"] <= r["step_time_median_s"] <= r["step_time_p90_s"]
        assert r["timed_steps"] >= 2 * FAST["min_timed_steps"]
        # The conditions it ran under, as this machine reports them.
        assert r["load_avg_1m"] >= 0 and r["usable_cpus"] >= 1
        assert r["process_cpu_per_wall"] > 0
        assert r["cpu_wait_share"] is None or 0 <= r["cpu_wait_share"] <= 1
        assert r["threads_oversubscribed"] == (torch.get_num_threads() > r["usable_cpus"])
        assert r["gpu_other_processes"] is r["gpu_sm_clock_mhz"] is None
    text = "\n".join(summary_lines(summarize(rows)))
    assert "measurement quality: all 2 timed rows ok\nrounds: 2 per row, 0 row(s) " \
           "re-measured; stable rows: rounds agree (their closest majority, after a " \
           "re-measurement) within" in text
    assert "conditions: load average up to" in text


def test_a_cv_limit_no_timing_meets_retries_every_row_then_flags_it(tmp_path):
    """max_cv 1e-9: every timed row is re-measured max_retries times, then kept as unstable
    with its reason; the sweep's validation then fails (exit 3) above max_unstable_share with
    sweep.unstable_fails and passes with a visible warning at or below it."""
    cfg = SweepConfig(batch_sizes=[1, 16], input_modes=["synthetic"], rounds=2, max_retries=2,
                      max_round_spread=1e6, max_cv=1e-9, **NO_NEIGHBOUR_CHECKS, **FAST)
    log = Log()
    out = tmp_path / "s.parquet"
    rows = sweep(cfg, "digits-mlp", ENV, out, log=log)
    assert [label for label, _ in log.trials()] == (["round 1/2"] * 2 + ["round 2/2"] * 2
                                                    + ["retry 1/2"] * 2 + ["retry 2/2"] * 2)
    assert [b for _, b in log.trials()] == [1, 16, 16, 1, 1, 16, 16, 1]
    for r in table_rows(out):
        assert (r["rounds"], r["retries"], r["quality"]) == (2, 2, "unstable")
        assert r["quality_reason"].startswith("step times scatter: CV ")
        assert r["quality_reason"].endswith("(> 0.00)")
    assert "UNSTABLE: step times scatter" in log[-1]
    text = "\n".join(summary_lines(summarize(rows)))
    assert "every timed row was flagged unstable: no throughput figure is given" in text
    assert "2 of 2 timed rows UNSTABLE" in text and "rerun on a quiet node" in text
    assert "rounds: 2 per row, 2 row(s) re-measured; no stable rows" in text

    config = ExperimentConfig(sweep=cfg.model_copy(update={"max_unstable_share": 0.5,
                                                           "unstable_fails": True}))
    with pytest.raises(ValidationFailed) as failed:
        validate_sweep(config.to_json(), str(out), str(tmp_path / "v.json"),
                       str(tmp_path / "v.html"))
    assert failed.value.exit_code == 3
    assert "expect_unstable_share_to_be_at_most(quality)" in str(failed.value)
    assert "2 of 2 unexpected" in str(failed.value)

    config = ExperimentConfig(sweep=cfg.model_copy(update={"max_unstable_share": 1.0}))
    validate_sweep(config.to_json(), str(out), str(tmp_path / "w.json"), str(tmp_path / "w.html"))
    saved = json.loads((tmp_path / "w.json").read_text())[0]
    assert saved["success"] and saved["statistics"]["warnings"] == 1
    assert "pass, with a warning" in (tmp_path / "w.html").read_text()


def test_search_keeps_its_trial_bound_and_later_rounds_only_remeasure(tmp_path):
    """Round 1 is the search as before (within its bound); round 2 re-measures what fit, in
    the reverse order, and never searches again."""
    cfg = SweepConfig(batch_sizes="auto", max_batch_size=8, input_modes=["synthetic"], rounds=2,
                      **NEVER_FLAG, **FAST)
    log = Log()
    rows = sweep(cfg, "digits-mlp", ENV, tmp_path / "a.parquet", log=log)
    search = [b for label, b in log.trials() if label == "round 1/2"]
    assert search == [1, 2, 4, 8] and len(search) <= trial_budget(1, 8)
    assert [b for label, b in log.trials() if label == "round 2/2"] == [8, 4, 2, 1]
    assert [(r["batch_size"], r["rounds"], r["search_phase"]) for r in rows] == [
        (b, 2, "doubling") for b in (1, 2, 4, 8)]
