"""A hand-written training loop, run the way the sweep runs a trial: in a fresh process forked
from the sweep's forkserver (torch preloaded), with the trial's thread count, malloc settings,
seed, model, optimizer, fixed on-device input, warm-up and number of timed steps. The only
differences left are the harness's own: its timing windows, progress callbacks, memory watchdog
and row bookkeeping. That is what bench_sweep's harness ÷ bare ratio measures.

Kept apart from bench_sweep.py so that the child process imports nothing but this module.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from batchscale.sweep.trial import SGD_LR, SGD_MOMENTUM, steady_state_malloc
from batchscale.workloads import get_workload


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


def bare_step_seconds(spec: BareSpec) -> list[float]:
    """Per-step seconds of `spec.timed_steps` plain training steps (host clock between steps,
    as the harness's CPU clock reads it)."""
    if spec.trial_malloc:
        steady_state_malloc()
    torch.set_num_threads(spec.threads)
    torch.manual_seed(0)
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


def run_bare(spec: BareSpec) -> list[float]:
    """`bare_step_seconds` in a fresh process from the forkserver the sweep's trials come from
    (a sweep trial must have run first in this Python process, so that the server exists with
    the sweep's preload list)."""
    ctx = multiprocessing.get_context("forkserver")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(spec, sender), daemon=True, name="bare-loop")
    proc.start()
    sender.close()
    try:
        return receiver.recv()
    except EOFError as err:
        raise RuntimeError(f"bare loop process exited with code {proc.exitcode} before "
                           "reporting") from err
    finally:
        proc.join()
        receiver.close()
