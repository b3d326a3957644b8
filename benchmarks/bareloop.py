"""A hand-written training loop, run the way the sweep runs a trial: in a fresh process forked
from the sweep's forkserver (torch preloaded), with the trial's thread count, malloc settings,
seed, model, optimizer, fixed on-device input, warm-up and number of timed steps. The only
differences left are the harness's own: its timing windows, progress callbacks, memory watchdog
and row bookkeeping. That is what bench_sweep's harness ÷ bare ratio measures.

Its options put back one piece of the harness at a time (the trial's step body, its timing
helper, the parent's memory watch), so bench_overhead_account can say where the difference goes.

Kept apart from bench_sweep.py so that the child process imports nothing but this module.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from batchscale.contract_check import synthetic_batch
from batchscale.precision import autocast
from batchscale.sweep.isolation import WATCH_INTERVAL_S
from batchscale.sweep.trial import (
    SGD_LR,
    SGD_MOMENTUM,
    process_memory_bytes,
    steady_state_malloc,
)
from batchscale.timing import time_steps
from batchscale.workloads import get_workload

# A fixed step count for the timing helper: min = max, and a budget that never cuts it short.
FIXED_STEPS_BUDGET_S = 3600.0


@dataclass(frozen=True)
class BareSpec:
    workload: str
    batch_size: int
    image_px: int
    threads: int
    untimed_steps: int
    timed_steps: int
    channels_last: bool = False
    trial_malloc: bool = True
    """Give malloc the trial's steady-state thresholds (False: a fresh process's defaults, to
    show what the allocator state alone does to the step time)."""
    trial_step: bool = False
    """Build and step as the trial does: the workload contract's model factory, loss and
    synthetic batch, read through a generator, under the precision context (fp32: none)."""
    trial_timing: bool = False
    """Time the same fixed number of steps with the sweep's timing helper (timing.time_steps:
    windows, a clock sync per window, CPU and run-queue readings) instead of a plain clock."""


def _plain_step(spec: BareSpec):
    """(step, model): the hand-written step on the workload's model and a fixed batch."""
    workload = get_workload(spec.workload, image_size=spec.image_px)
    model = workload.build()
    x, y = workload.synthetic_batch(spec.batch_size, "cpu")
    if spec.channels_last and workload.is_image:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=SGD_LR, momentum=SGD_MOMENTUM)

    def step() -> None:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    # The trial counts FLOPs with one forward and backward before its warm-up: the same here.
    F.cross_entropy(model(x), y).backward()
    model.zero_grad(set_to_none=True)
    return step, model


def _trial_step(spec: BareSpec):
    """(step, model): the step as trial._measure builds it (channels_last off, fp32, no
    torch.compile)."""
    workload = get_workload(spec.workload, image_size=spec.image_px)
    contract = workload.contract_for(None)
    model = contract.model().to("cpu")
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=SGD_LR, momentum=SGD_MOMENTUM)
    fixed = synthetic_batch(contract, spec.batch_size, "cpu")

    def batches():
        while True:
            yield fixed

    stream = batches()
    loss_of = contract.loss
    precision = autocast("cpu", "fp32")

    def step() -> None:
        batch = next(stream)
        with precision:
            loss = loss_of(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    loss_of(model, next(stream)).backward()
    model.zero_grad(set_to_none=True)
    return step, model


def bare_step_seconds(spec: BareSpec) -> list[float]:
    """Per-step seconds of `spec.timed_steps` plain training steps (host clock between steps,
    as the harness's CPU clock reads it)."""
    if spec.trial_malloc:
        steady_state_malloc()
    torch.set_num_threads(spec.threads)
    torch.manual_seed(0)
    step, _ = _trial_step(spec) if spec.trial_step else _plain_step(spec)
    if spec.trial_timing:
        return list(time_steps(step, untimed_steps=spec.untimed_steps,
                               min_steps=spec.timed_steps, max_steps=spec.timed_steps,
                               time_budget_s=FIXED_STEPS_BUDGET_S).seconds)
    for _ in range(spec.untimed_steps):
        step()
    edges = [time.perf_counter()]
    for _ in range(spec.timed_steps):
        step()
        edges.append(time.perf_counter())
    return [b - a for a, b in zip(edges, edges[1:], strict=False)]


def _child(spec: BareSpec, conn) -> None:
    try:
        conn.send(bare_step_seconds(spec))
    finally:
        conn.close()


def _watch(proc, receiver) -> None:
    """What the sweep's parent does while a CPU trial runs (isolation._await): wake every
    WATCH_INTERVAL_S and read the child's resident memory (never over any cap here)."""
    while not receiver.poll(WATCH_INTERVAL_S):
        process_memory_bytes("VmRSS", proc.pid)
        if not proc.is_alive() and not receiver.poll():
            return


def run_bare(spec: BareSpec, watch_memory: bool = False) -> list[float]:
    """`bare_step_seconds` in a fresh process from the forkserver the sweep's trials come from
    (a sweep trial must have run first in this Python process, so that the server exists with
    the sweep's preload list). `watch_memory`: the parent polls the child's memory meanwhile,
    as the sweep's does."""
    ctx = multiprocessing.get_context("forkserver")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(spec, sender), daemon=True, name="bare-loop")
    proc.start()
    sender.close()
    try:
        if watch_memory:
            _watch(proc, receiver)
        return receiver.recv()
    except EOFError as err:
        raise RuntimeError(f"bare loop process exited with code {proc.exitcode} before "
                           "reporting") from err
    finally:
        proc.join()
        receiver.close()
