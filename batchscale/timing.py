"""The one timing helper. Every samples/s figure in batchscale comes from `time_steps`.

Rules: warm-up steps are excluded; the device is synchronized at the edges of every timed
window (never inside one, so the host may queue work ahead as a real training loop does);
per-step times are kept, with the process's CPU time and its threads' run-queue wait over the
timed span (a trial that did not get the CPU it asked for shows it), and the time Python's
garbage collector ran, with the steps its full collections fell in (`GcPauses`: a collection
that rescans every object of a process with torch imported stops the step for tens of
milliseconds, a property of the training loop, not a disturbance); timing repeats until the
coefficient of variation is below a target or the budget is spent. On CUDA, steps
are delimited by CUDA events recorded on the stream, so a step's time is the device's time
between its edges, free of host launch jitter.
"""

from __future__ import annotations

import bisect
import gc
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise

from batchscale.conditions import run_queue_wait_s
from batchscale.config import SweepConfig

# The stop rules' defaults are the sweep's, defined once in its config model; callers timing
# something else (a peak-FLOP/s matmul, the benchmarks) pass their own values.
SWEEP_DEFAULTS = SweepConfig()
# A CV below target is only trusted over at least this much timed work (or the whole budget, if
# smaller): a few dozen sub-millisecond steps can fall in a quiet moment between bursts of load
# from other processes, or before caches and clocks settle.
MIN_TIMED_S = 0.2
# CV is judged over the latest window of this many steps, so one slow early step
# (a page fault, a late allocation) does not keep the loop running to the budget.
CV_WINDOW_STEPS = 20
# A synchronized window lasts about this long: long enough that the sync at its edges costs
# nothing measurable, short enough that the CV and budget checks between windows stay timely.
SYNC_WINDOW_S = 0.05
MAX_WINDOW_STEPS = 1000


@dataclass(frozen=True)
class StepTimes:
    """Per-step seconds of the timed steps, with the usual summaries."""

    seconds: tuple[float, ...]
    process_cpu_s: float | None = None
    """CPU seconds this process (all its threads) used while the steps were timed."""
    wall_s: float | None = None
    """Wall-clock seconds of the same span (the timed windows and the checks between them)."""
    cpu_wait_s: float | None = None
    """Seconds this process's threads spent runnable but waiting for a CPU over the same span
    (the kernel's run-queue delay, conditions.run_queue_wait_s); None where not reported."""
    gc_s: float | None = None
    """Seconds Python's garbage collector ran over the same span (every generation)."""
    gc_steps: tuple[int, ...] | None = None
    """Indexes of the timed steps a full (generation 2) collection ran in; None where the
    clock cannot tell steps apart on the host (CUDA events time the device)."""

    @property
    def gc_share(self) -> float | None:
        """The share of the timed span Python's garbage collector ran."""
        if self.gc_s is None or not self.wall_s:
            return None
        return min(1.0, self.gc_s / self.wall_s)

    @property
    def cv_outside_gc(self) -> float:
        """The CV of the steps no full collection ran in (all steps where none did, or where
        the clock cannot tell): the scatter a disturbance would cause, without the pauses the
        loop's own garbage brings."""
        if not self.gc_steps:
            return self.cv
        skip = set(self.gc_steps)
        return coefficient_of_variation(s for i, s in enumerate(self.seconds) if i not in skip)

    @property
    def cpu_per_wall(self) -> float | None:
        """CPU time over wall time of the timed span: about the number of threads kept busy.
        Lower than usual means the threads waited for a CPU (another process had it). On CUDA
        it describes the host thread only (it may sleep or spin while the device works)."""
        if self.process_cpu_s is None or not self.wall_s:
            return None
        return self.process_cpu_s / self.wall_s

    @property
    def cpu_wait_share(self) -> float | None:
        """The share of the threads' runnable time spent waiting for a CPU: wait / (wait + CPU
        time). Near 0 when the process had the CPUs it asked for, whatever its thread count;
        about 0.5 for a thread that shares its CPU with one busy process."""
        if self.cpu_wait_s is None or self.process_cpu_s is None:
            return None
        runnable = self.cpu_wait_s + self.process_cpu_s
        return self.cpu_wait_s / runnable if runnable > 0 else None

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    def quantile_s(self, q: float) -> float:
        """Linear-interpolated quantile (q in [0, 1]) of the step times."""
        ordered = sorted(self.seconds)
        pos = q * (len(ordered) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    @property
    def cv(self) -> float:
        return coefficient_of_variation(self.seconds)


def coefficient_of_variation(values) -> float:
    """Sample standard deviation over mean; NaN for fewer than two values."""
    values = list(values)
    if len(values) < 2:
        return float("nan")
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else float("nan")


class _HostClock:
    """CPU work is synchronous: the host clock read between steps delimits them exactly."""

    def sync(self) -> None:
        """Nothing is queued on a CPU device."""

    edges: list[float] | None = None
    """The last window's step edges (perf_counter), for GcPauses."""

    def time_window(self, step: Callable[[], object], n: int) -> list[float]:
        edges = [time.perf_counter()]
        for _ in range(n):
            step()
            edges.append(time.perf_counter())
        self.edges = edges
        return [b - a for a, b in pairwise(edges)]


class _CudaClock:
    """CUDA events between steps; one synchronize at the window's end."""

    edges = None  # the device's step edges are not host times

    def __init__(self, device: str):
        import torch

        self.torch = torch
        self.device = device

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def time_window(self, step: Callable[[], object], n: int) -> list[float]:
        cuda = self.torch.cuda
        events = [cuda.Event(enable_timing=True) for _ in range(n + 1)]
        self.sync()
        events[0].record()
        for event in events[1:]:
            step()
            event.record()
        events[-1].synchronize()
        return [a.elapsed_time(b) / 1000.0 for a, b in pairwise(events)]


class GcPauses:
    """Python's garbage collections while registered in `gc.callbacks`: their total seconds,
    and the timed steps a full collection started in (`assign`, after each window)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.steps: set[int] | None = set()
        self._started: float | None = None
        self._full: list[float] = []

    def __call__(self, phase: str, info: dict) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
        elif self._started is not None:
            self.seconds += now - self._started
            if info.get("generation") == 2:
                self._full.append(self._started)
            self._started = None

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self)
        return self

    def __exit__(self, *_exc) -> None:
        gc.callbacks.remove(self)

    def assign(self, edges: list[float] | None, first_step: int) -> None:
        """The full collections since the last call that started inside the window whose step
        edges are `edges` (its first step being timed step `first_step`) mark their step;
        without edges no step can be told (`steps` becomes None)."""
        if edges is None:
            self.steps = None
        elif self.steps is not None:
            for started in self._full:
                i = bisect.bisect_right(edges, started) - 1
                if 0 <= i < len(edges) - 1:
                    self.steps.add(first_step + i)
        self._full.clear()


def clock_for(device: str) -> _HostClock | _CudaClock:
    """The right clock for a torch device string ('cpu', 'cuda', 'cuda:0')."""
    return _CudaClock(device) if device.startswith("cuda") else _HostClock()


def _next_window(done: list[float], min_steps: int, max_steps: int) -> int:
    """Steps in the next window: about SYNC_WINDOW_S of work, at least one step, never past
    `max_steps`, and ending exactly at `min_steps` (where the first stop check happens)."""
    if not done:
        return 1
    typical = statistics.median(done[-CV_WINDOW_STEPS:])
    wanted = int(SYNC_WINDOW_S / typical) if typical > 0 else MAX_WINDOW_STEPS
    limit = min(min_steps, max_steps) if len(done) < min_steps else max_steps
    return max(1, min(wanted, MAX_WINDOW_STEPS, limit - len(done)))


def time_steps(
    step: Callable[[], object],
    *,
    device: str = "cpu",
    untimed_steps: int = SWEEP_DEFAULTS.untimed_steps,
    min_steps: int = SWEEP_DEFAULTS.min_timed_steps,
    max_steps: int = SWEEP_DEFAULTS.max_timed_steps,
    target_cv: float = SWEEP_DEFAULTS.target_cv,
    time_budget_s: float = SWEEP_DEFAULTS.time_budget_s,
    min_time_s: float = MIN_TIMED_S,
    on_window: Callable[[int], None] | None = None,
) -> StepTimes:
    """Run `step` untimed_steps times untimed, then time it in synchronized windows until at
    least `min_steps` were timed and either the CV of the latest CV_WINDOW_STEPS (or
    `min_steps`, if more) is at most `target_cv` after at least `min_time_s` (capped by the
    budget), or `max_steps` or `time_budget_s` is reached.
    `on_window(steps_timed)` is called between windows (outside the timed region)."""
    clock = clock_for(device)
    for _ in range(untimed_steps):
        step()
    clock.sync()
    seconds: list[float] = []
    cpu_started = time.process_time()  # all threads of this process
    wait_started = run_queue_wait_s()
    started = time.perf_counter()
    with GcPauses() as pauses:
        while len(seconds) < max_steps:
            first = len(seconds)
            seconds += clock.time_window(step, _next_window(seconds, min_steps, max_steps))
            pauses.assign(clock.edges, first)
            if on_window:
                on_window(len(seconds))
            if len(seconds) < min_steps:
                continue
            elapsed = time.perf_counter() - started
            if elapsed >= time_budget_s:
                break
            recent = seconds[-max(CV_WINDOW_STEPS, min_steps):]
            if elapsed >= min(min_time_s, time_budget_s) and coefficient_of_variation(
                    recent) <= target_cv:
                break
    wait_ended = run_queue_wait_s()
    waited = (None if wait_started is None or wait_ended is None
              else max(0.0, wait_ended - wait_started))
    return StepTimes(tuple(seconds), process_cpu_s=time.process_time() - cpu_started,
                     wall_s=time.perf_counter() - started, cpu_wait_s=waited,
                     gc_s=pauses.seconds,
                     gc_steps=None if pauses.steps is None else tuple(sorted(pauses.steps)))
