"""The one timing helper: warm-up excluded, per-step times kept, the stop rules honoured."""

from __future__ import annotations

import gc
import inspect
import os
import time

import pytest

from batchscale.conditions import run_queue_wait_s
from batchscale.config import SweepConfig
from batchscale.timing import (
    StepTimes,
    clock_for,
    coefficient_of_variation,
    time_steps,
)

# Measures time: run alone, not beside other tests (the Makefile's serial phase).
pytestmark = pytest.mark.serial

STEP_SLEEP_S = 0.002


class CountingStep:
    """A real step that sleeps a fixed time and counts its calls."""

    def __init__(self, sleep_s: float = 0.0):
        self.calls = 0
        self.sleep_s = sleep_s

    def __call__(self) -> None:
        self.calls += 1
        if self.sleep_s:
            time.sleep(self.sleep_s)


def test_untimed_steps_run_but_are_not_timed():
    step = CountingStep()
    times = time_steps(step, untimed_steps=3, min_steps=7, max_steps=7)
    assert step.calls == 10
    assert len(times.seconds) == 7


def test_each_step_time_covers_the_step():
    times = time_steps(CountingStep(STEP_SLEEP_S), untimed_steps=1, min_steps=5, max_steps=5)
    assert all(s >= STEP_SLEEP_S for s in times.seconds)
    assert times.median_s >= STEP_SLEEP_S


def test_stops_at_min_steps_once_the_cv_target_is_met():
    """A target no spread can miss: the first check, exactly at min_steps, stops the loop."""
    step = CountingStep()
    times = time_steps(step, untimed_steps=0, min_steps=12, max_steps=1000, target_cv=1e9,
                       min_time_s=0.0)
    assert len(times.seconds) == 12


def test_a_met_cv_target_still_needs_the_minimum_time():
    """Sub-millisecond steps that meet the CV target keep being timed for min_time_s."""
    started = time.perf_counter()
    times = time_steps(CountingStep(), untimed_steps=0, min_steps=5, max_steps=10**7,
                       target_cv=1e9, min_time_s=0.05)
    assert len(times.seconds) > 5
    assert time.perf_counter() - started >= 0.05


def test_time_budget_ends_an_unreachable_cv_target():
    step = CountingStep(STEP_SLEEP_S)
    times = time_steps(step, untimed_steps=0, min_steps=5, max_steps=100_000, target_cv=1e-12,
                       time_budget_s=0.05)
    assert 5 <= len(times.seconds) < 100_000
    assert sum(times.seconds) >= 0.05


def test_max_steps_caps_the_timed_steps():
    times = time_steps(CountingStep(), untimed_steps=0, min_steps=3, max_steps=40, target_cv=1e-12,
                       time_budget_s=1e6)
    assert len(times.seconds) == 40


def test_on_window_reports_progress_between_windows():
    seen: list[int] = []
    times = time_steps(CountingStep(), untimed_steps=0, min_steps=30, max_steps=30,
                       on_window=seen.append)
    assert seen == sorted(seen) and seen[-1] == len(times.seconds) == 30


def test_defaults_are_the_sweep_configs():
    """Each stop rule's default is defined once, in SweepConfig; time_steps reads it there."""
    params = inspect.signature(time_steps).parameters
    defaults = SweepConfig()
    assert params["untimed_steps"].default == defaults.untimed_steps
    assert params["min_steps"].default == defaults.min_timed_steps
    assert params["max_steps"].default == defaults.max_timed_steps
    assert params["target_cv"].default == defaults.target_cv
    assert params["time_budget_s"].default == defaults.time_budget_s


def test_summaries_of_known_step_times():
    times = StepTimes((1.0, 2.0, 3.0, 4.0, 5.0))
    assert times.median_s == 3.0
    assert times.quantile_s(0.1) == pytest.approx(1.4)
    assert times.quantile_s(0.9) == pytest.approx(4.6)
    assert times.cv == pytest.approx(coefficient_of_variation([1, 2, 3, 4, 5]))
    assert times.cv == pytest.approx(1.5811388 / 3.0)
    assert coefficient_of_variation([2.0]) != coefficient_of_variation([2.0])  # NaN


def test_cpu_clock_needs_no_device():
    clock = clock_for("cpu")
    clock.sync()
    assert len(clock.time_window(CountingStep(), 4)) == 4


@pytest.mark.gpu
def test_cuda_events_time_device_work():
    """A known amount of GPU work (torch.cuda._sleep spins for a number of cycles): the CUDA
    event time of one step matches the host clock around a synchronized run of the same work."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    cycles = 50_000_000

    def step():
        torch.cuda._sleep(cycles)

    times = time_steps(step, device="cuda", untimed_steps=2, min_steps=5, max_steps=5)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    host_per_step = (time.perf_counter() - start) / 5
    assert times.median_s == pytest.approx(host_per_step, rel=0.2)


def test_process_cpu_time_over_the_timed_steps_is_recorded():
    """A step that sleeps uses almost no CPU; one that computes uses some. The ratio is what
    the sweep records as process_cpu_per_wall (no speed is asserted, only where CPU went)."""
    sleeping = time_steps(CountingStep(STEP_SLEEP_S), untimed_steps=1, min_steps=10,
                          max_steps=10)
    assert sleeping.wall_s >= sum(sleeping.seconds) > 0
    assert 0 <= sleeping.cpu_per_wall < 0.5

    def compute() -> None:
        sum(i * i for i in range(20_000))

    computing = time_steps(compute, untimed_steps=1, min_steps=10, max_steps=10)
    assert computing.process_cpu_s > 0 and computing.cpu_per_wall > sleeping.cpu_per_wall
    assert StepTimes((1.0,)).cpu_per_wall is None


def _spin_pinned(cpu: int):
    """A real busy neighbour: a Python process spinning on one CPU."""
    import subprocess
    import sys

    return subprocess.Popen([sys.executable, "-c",
                             f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or run_queue_wait_s() is None,
                    reason="needs CPU affinity and the kernel's per-thread run-queue delay")
def test_a_step_sharing_its_cpu_with_a_busy_process_reports_the_wait():
    """Measured, not simulated: this thread and a spinning process pinned to the same CPU each
    get about half of it, so the steps' threads wait for the CPU about half their runnable time.
    No speed is asserted, only where the time went."""
    def compute() -> None:
        sum(i * i for i in range(20_000))

    cpu = min(os.sched_getaffinity(0))
    previous = os.sched_getaffinity(0)
    neighbour = _spin_pinned(cpu)
    try:
        time.sleep(0.3)  # let the neighbour start spinning
        os.sched_setaffinity(0, {cpu})  # this thread only
        shared = time_steps(compute, untimed_steps=2, min_steps=40, max_steps=40)
    finally:
        os.sched_setaffinity(0, previous)
        neighbour.kill()
        neighbour.wait()
    assert shared.cpu_wait_s > 0
    assert shared.cpu_wait_share > 0.2  # CPU_WAIT_SHARE is 0.1; fair sharing gives about 0.5
    assert StepTimes((1.0,), process_cpu_s=1.0).cpu_wait_share is None
    assert StepTimes((1.0,), 1.0, 2.0, 1.0).cpu_wait_share == pytest.approx(0.5)


def test_full_garbage_collections_are_timed_and_their_steps_named():
    """gc.callbacks see each collection: a step that runs a full one on every 5th call is
    named, the collections' time counted, and the CV outside those steps leaves them out."""
    step = CountingStep()

    def collecting() -> None:
        step()
        if step.calls % 5 == 0:
            gc.collect()  # a full (generation 2) collection of this whole test process

    gc.disable()  # no automatic collection: only the step's own are timed
    try:
        times = time_steps(collecting, untimed_steps=2, min_steps=20, max_steps=20)
    finally:
        gc.enable()
    # Calls 3..22 are timed steps 0..19; calls 5, 10, 15, 20 collected.
    assert times.gc_steps == (2, 7, 12, 17)
    assert 0 < times.gc_s <= times.wall_s and times.gc_share == times.gc_s / times.wall_s
    assert times.cv_outside_gc < times.cv
    untold = StepTimes(times.seconds, gc_s=times.gc_s, gc_steps=None)
    assert untold.cv_outside_gc == untold.cv

