"""What a trial records about the conditions it trained under, besides its curve: how long its
threads waited for a CPU (`CpuContention`), and, in a data-parallel group, the bare
all-reduce (`allreduce_probe`), timed at the trial's gradient size and at a small
message, on the interconnect the trial trained over (gloo between local processes, nccl
between a cluster's GPUs).

Two message sizes separate the ring's two terms (latency per hop, bytes over bandwidth) even at
one worker count, and the step time of the same trial says how much of the all-reduce training
exposed. The planner fits the link from these rows (docs/architecture.md, "What-if planner").
Every rank runs the same fixed number of all-reduces (a collective must be matched on every
rank, so no rank may stop on its own noise); rank 0's times are the ones kept.
"""

from __future__ import annotations

import statistics
import time

import torch
import torch.distributed as dist

from batchscale.conditions import run_queue_wait_s
from batchscale.convergence.distributed import Dist, all_reduce, backend_of, barrier
from batchscale.timing import time_steps

SMALL_MESSAGE_BYTES = 1024
"""Small enough that the ring's latency terms dominate on any interconnect."""
PROBE_REPEATS = 20
PROBE_WARMUP = 3
FP32_BYTES = 4


class CpuContention:
    """How long this process's threads waited for a CPU while the trial ran (the kernel's
    run-queue delay, conditions.run_queue_wait_s), as a share of their runnable time. A trial
    resumed from a checkpoint covers only its last segment. Evaluation and checkpoints are in
    the span: they run under the same conditions, and the share is about the machine, not the
    steps (docs/architecture.md, "Measurement rules")."""

    def __init__(self) -> None:
        self.wait_started = run_queue_wait_s()
        self.cpu_started = time.process_time()

    def share(self, d: Dist) -> float | None:
        """The worst share over the ranks (a collective: every rank calls it); None where the
        kernel does not report the wait."""
        wait_now = run_queue_wait_s()
        if self.wait_started is None or wait_now is None:
            local = -1.0  # unknown on this rank; the max over ranks keeps any known value
        else:
            waited = max(0.0, wait_now - self.wait_started)
            runnable = waited + (time.process_time() - self.cpu_started)
            local = waited / runnable if runnable > 0 else -1.0
        worst = all_reduce(torch.tensor([local], dtype=torch.float64), d,
                           dist.ReduceOp.MAX if d.world_size > 1 else None)
        value = float(worst[0])
        return value if value >= 0 else None


def gradient_bytes(params: list[torch.Tensor]) -> int:
    """Bytes one gradient all-reduce carries: the trainable parameters in their own dtype (fp32
    under bf16 autocast: the parameters, and so their gradients, stay fp32)."""
    return sum(p.numel() * p.element_size() for p in params)


def _timed_all_reduce(d: Dist, n_bytes: int) -> tuple[float, float]:
    """(median seconds, coefficient of variation) of PROBE_REPEATS all-reduces of `n_bytes`."""
    buffer = torch.ones(max(1, n_bytes // FP32_BYTES), dtype=torch.float32, device=d.device)
    barrier(d)  # start together: a rank arriving late would show up as the others' latency
    times = time_steps(lambda: dist.all_reduce(buffer), device=d.device,
                       untimed_steps=PROBE_WARMUP, min_steps=PROBE_REPEATS,
                       max_steps=PROBE_REPEATS, time_budget_s=float("inf"))
    seconds = times.seconds
    median = statistics.median(seconds)
    spread = statistics.stdev(seconds) / statistics.fmean(seconds) if len(seconds) > 1 else 0.0
    return median, spread


def allreduce_probe(d: Dist, params: list[torch.Tensor]) -> dict:
    """The runs-table columns of the probe: the gradient's bytes always; the all-reduce times
    only where there is a group (2+ workers), else null."""
    return probe_columns(d, gradient_bytes(params))


def agreed_gradient_bytes(d: Dist, grad: int | None) -> int | None:
    """`grad` where every rank counted the same gradient (a collective: every rank calls it),
    else None. A user's loop shows batchscale its model or not on each rank by itself, and the
    probe runs on all ranks or on none."""
    if d.world_size < 2 or not dist.is_initialized():
        return grad
    mine = grad if grad else -1
    bounds = all_reduce(torch.tensor([mine, -mine], dtype=torch.int64), d, dist.ReduceOp.MIN)
    low, high = int(bounds[0]), -int(bounds[1])
    return grad if low == high and low > 0 else None


def probe_columns(d: Dist, grad: int | None) -> dict:
    """The probe's columns for a gradient of `grad` bytes (a collective where there is a
    group); null times without a group or without a gradient size."""
    row = {"gradient_bytes": grad, "allreduce_backend": None, "allreduce_small_bytes": None,
           "allreduce_small_s": None, "allreduce_gradient_s": None, "allreduce_cv": None}
    if grad is None or d.world_size < 2 or not dist.is_initialized():
        return row
    small_s, _ = _timed_all_reduce(d, SMALL_MESSAGE_BYTES)
    gradient_s, spread = _timed_all_reduce(d, grad)
    return {**row, "allreduce_backend": backend_of(d.device), "allreduce_small_bytes":
            SMALL_MESSAGE_BYTES, "allreduce_small_s": small_s, "allreduce_gradient_s": gradient_s,
            "allreduce_cv": spread}
