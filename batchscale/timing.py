"""The one timing helper. Every samples/s figure in batchscale comes from `time_steps`.

Rules (DESIGN §5): warm-up steps are excluded; the device is synchronized at the edges of every
timed window so queued GPU work is charged to the step that issued it; per-step times are kept;
timing repeats until the coefficient of variation is below a target or the budget is spent.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

WARMUP_STEPS = 5
MIN_TIMED_STEPS = 20
MAX_TIMED_STEPS = 400
TARGET_CV = 0.05
TIME_BUDGET_S = 3.0
# CV is judged over the latest window of this many steps, so one slow early step
# (a page fault, a late allocation) does not keep the loop running to the budget.
CV_WINDOW_STEPS = 20


@dataclass(frozen=True)
class StepTimes:
    """Per-step wall-clock seconds of the timed steps, with the usual summaries."""

    seconds: tuple[float, ...]

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds)

    def quantile_s(self, q: float) -> float:
        ordered = sorted(self.seconds)
        pos = q * (len(ordered) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ordered) - 1)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)

    @property
    def cv(self) -> float:
        return coefficient_of_variation(self.seconds)


def coefficient_of_variation(values) -> float:
    values = list(values)
    if len(values) < 2:
        return float("nan")
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean > 0 else float("nan")


class _WallClock:
    """Host clock; `sync` is called at window edges (a no-op on CPU, cuda.synchronize on GPU)."""

    def __init__(self, sync: Callable[[], None]):
        self.sync = sync

    def time_one(self, step: Callable[[], object]) -> float:
        self.sync()
        start = time.perf_counter()
        step()
        self.sync()
        return time.perf_counter() - start


class _CudaEvents:
    """CUDA events measure GPU time of the step without host launch jitter."""

    def __init__(self, device):
        import torch

        self.torch = torch
        self.device = device

    def time_one(self, step: Callable[[], object]) -> float:
        torch = self.torch
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(self.device)
        start.record()
        step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0


def clock_for(device: str):
    """The right clock for a torch device string ('cpu', 'cuda', 'cuda:0')."""
    if device.startswith("cuda"):
        return _CudaEvents(device)
    return _WallClock(lambda: None)


def time_steps(
    step: Callable[[], object],
    *,
    device: str = "cpu",
    warmup_steps: int = WARMUP_STEPS,
    min_steps: int = MIN_TIMED_STEPS,
    max_steps: int = MAX_TIMED_STEPS,
    target_cv: float = TARGET_CV,
    time_budget_s: float = TIME_BUDGET_S,
    on_step: Callable[[int], None] | None = None,
) -> StepTimes:
    """Run `step` warmup_steps times untimed, then time it one call at a time until at least
    `min_steps` were timed and either the CV of the last window is below `target_cv`, or
    `max_steps` or `time_budget_s` is reached."""
    clock = clock_for(device)
    for _ in range(warmup_steps):
        clock.time_one(step)
    seconds: list[float] = []
    started = time.perf_counter()
    while len(seconds) < max_steps:
        seconds.append(clock.time_one(step))
        if on_step:
            on_step(len(seconds))
        if len(seconds) < min_steps:
            continue
        window = seconds[-max(CV_WINDOW_STEPS, min_steps):]
        if coefficient_of_variation(window) <= target_cv:
            break
        if time.perf_counter() - started >= time_budget_s:
            break
    return StepTimes(tuple(seconds))
