"""One trial of the throughput sweep, run inside its own process (see isolation.py).

A trial builds a fresh model and optimizer, counts FLOPs, times training steps with the one
timing helper and measures its own peak memory. Running it in a child process is what makes the
numbers trustworthy: the peak resident memory is the trial's alone (not the high-water mark of
everything the sweep did before), and whatever it allocated — including what an out-of-memory
failure leaves behind — goes back to the OS when the process exits, so it cannot poison the next
trial. torch is imported at module level on purpose: this module is preloaded into the
forkserver, so each trial process starts with torch already imported.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from batchscale.conditions import gpu_conditions
from batchscale.config import SweepConfig
from batchscale.errors import BadInput, error_site
from batchscale.precision import autocast as precision_autocast
from batchscale.schemas import TrialStatus
from batchscale.stopping import die_with_parent
from batchscale.timing import MIN_TIMED_S, StepTimes, time_steps
from batchscale.workloads import Workload, get_workload

# The optimizer every trial uses: SGD with momentum keeps one buffer per parameter, like most
# training setups; its learning rate does not matter for timing.
SGD_LR = 1e-3
SGD_MOMENTUM = 0.9
ERROR_MESSAGE_CHARS = 300
MEMORY_SOURCE_CPU = "cpu_trial_process_peak_rss"
MEMORY_SOURCE_CUDA = "cuda_allocator_max_reserved"
# /proc/self/clear_refs: writing "5" resets the process's peak resident set size (VmHWM).
CLEAR_REFS_RESET_PEAK = "5"
# glibc mallopt parameters and the values its dynamic rule reaches in a long-lived process
# (after the first large free: mmap threshold up to 32 MiB on 64-bit, trim threshold twice it).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
STEADY_MMAP_THRESHOLD_BYTES = 32 * 2**20
STEADY_TRIM_THRESHOLD_BYTES = 2 * STEADY_MMAP_THRESHOLD_BYTES


@dataclass(frozen=True)
class SweepTrial:
    """Everything a trial process needs; plain data, so it pickles to the child."""

    workload: str
    input_mode: str
    batch_size: int
    device: str
    cfg: SweepConfig
    """The trial's settings (the sweep passes rounds.trial_share: a row's limits split over its
    rounds)."""
    threads: int
    memory_cap_bytes: int | None = None
    dataset_dir: str | None = None
    show_progress: bool = False
    min_time_s: float = MIN_TIMED_S
    """Timed work required before a met CV target ends the timing, seconds."""
    own_pids: tuple[int, ...] = ()
    """Processes of this sweep that may hold a context on the GPU (told apart from others)."""


@dataclass(frozen=True)
class TrialResult:
    """What a trial measured; `seconds` is empty unless status is ok."""

    status: str
    seconds: tuple[float, ...] = ()
    flops_per_sample: float | None = None
    peak_memory_bytes: int | None = None
    memory_source: str | None = None
    error: str | None = None
    refused: bool = False
    """The trial refused its input (e.g. a factory that returned no nn.Module): the sweep stops
    with that message instead of recording a row per batch size."""
    process_cpu_s: float | None = None
    wall_s: float | None = None
    cpu_wait_s: float | None = None
    """CPU, wall and run-queue wait seconds of the timed span (timing.StepTimes)."""
    gc_s: float | None = None
    gc_steps: tuple[int, ...] | None = None
    """Garbage collection over the timed span (timing.StepTimes)."""
    gpu_conditions: dict = field(default_factory=dict)
    """On CUDA, conditions.gpu_conditions read right after the timed steps."""

    @property
    def times(self) -> StepTimes | None:
        if not self.seconds:
            return None
        return StepTimes(self.seconds, self.process_cpu_s, self.wall_s, self.cpu_wait_s,
                         self.gc_s, self.gc_steps)


def is_oom(err: BaseException) -> bool:
    """Out of memory on any device: CUDA's own error, Python's, or the CPU allocator's text."""
    if isinstance(err, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(err)
    return "out of memory" in text or "can't allocate memory" in text


class PeakMemory:
    """Peak memory of this trial process: CUDA allocator stats on GPU (reserved bytes, which is
    what the device must hold, fragmentation included); on CPU the process's peak resident set
    size, reset at the start so the forkserver's imports before the trial do not count twice."""

    def __init__(self, device: str, cap_bytes: int | None):
        self.device = device
        self.cap_bytes = cap_bytes

    @property
    def source(self) -> str:
        return MEMORY_SOURCE_CUDA if self.is_cuda else MEMORY_SOURCE_CPU

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def start(self) -> None:
        """Cap the CUDA allocator at the budget (its OOM is then real) and reset the peaks."""
        if self.is_cuda:
            if self.cap_bytes:
                total = torch.cuda.get_device_properties(self.device).total_memory
                # It wants an explicit index ("cuda" alone is refused by torch 2.11).
                torch.cuda.set_per_process_memory_fraction(
                    min(1.0, self.cap_bytes / total), torch.device(self.device).index or 0)
            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text(CLEAR_REFS_RESET_PEAK)
        except OSError:
            pass  # not Linux: VmHWM then also covers the start-up, a slight overestimate

    def peak_bytes(self) -> int | None:
        if self.is_cuda:
            return int(torch.cuda.max_memory_reserved(self.device))
        return process_memory_bytes("VmHWM")


def process_memory_bytes(key: str, pid: int | str = "self") -> int | None:
    """A memory line of /proc/<pid>/status (VmRSS, VmHWM) in bytes; None where unavailable."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def train_flops_per_sample(loss, model, batch, batch_size: int) -> float:
    """Forward + backward FLOPs of one step of `loss(model, batch)` (the workload's), counted
    by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        loss(model, batch).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / batch_size


def _to_format(batch, channels_last: bool):
    """Image batches in the channels_last layout when asked (detection inputs stay lists)."""
    if not channels_last:
        return batch
    x, y = batch
    if isinstance(x, torch.Tensor) and x.dim() == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x, y


def _batches(spec: SweepTrial, workload: Workload, contract) -> Iterator:
    """A step's input: one fixed on-device batch (synthetic: pure compute), or the next slice of
    the real dataset copied to the device every step (the input pipeline is part of the step)."""
    from batchscale.contract_check import load_split, synthetic_batch

    channels_last = spec.cfg.channels_last and workload.is_image
    if spec.input_mode == "synthetic":
        batch = _to_format(synthetic_batch(contract, spec.batch_size, spec.device), channels_last)
        while True:
            yield batch
    split = load_split(contract, "train")
    if len(split) < spec.batch_size:
        raise ValueError(f"the dataset has {len(split)} training rows, fewer than batch "
                         f"{spec.batch_size}")
    gen = torch.Generator().manual_seed(0)
    while True:
        for idx in torch.randperm(len(split), generator=gen).split(spec.batch_size):
            if len(idx) == spec.batch_size:
                yield _to_format(split.batch(idx, spec.device), channels_last)


def _progress(spec: SweepTrial):
    """A per-trial progress bar (steps timed) on a terminal; silent in logs. A thread lock:
    tqdm's default multiprocessing lock would leak a semaphore per trial process."""
    from tqdm import tqdm

    tqdm.set_lock(threading.RLock())
    return tqdm(desc=f"{spec.input_mode} batch {spec.batch_size}", unit="step", leave=False,
                file=sys.stderr, disable=not spec.show_progress)


def _measure(spec: SweepTrial, memory: PeakMemory) -> TrialResult:
    torch.manual_seed(0)
    cfg = spec.cfg
    workload = get_workload(spec.workload, image_size=cfg.image_size_px,
                            seq_len=cfg.sequence_length_tokens)
    # The workload's contract: a user's, or a built-in's with the prepared dataset as its data.
    contract = workload.contract_for(spec.dataset_dir if spec.input_mode == "real" else None)
    model = contract.model().to(spec.device)
    if cfg.channels_last and workload.is_image:
        model = model.to(memory_format=torch.channels_last)
    model.train()
    forward = torch.compile(model) if cfg.torch_compile else model
    opt = torch.optim.SGD(model.parameters(), lr=SGD_LR, momentum=SGD_MOMENTUM)
    batches = _batches(spec, workload, contract)
    loss_of = contract.loss
    autocast = precision_autocast(spec.device, cfg.precision)

    def step() -> None:
        batch = next(batches)
        with autocast:
            loss = loss_of(forward, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    with autocast:
        flops = train_flops_per_sample(loss_of, model, next(batches), spec.batch_size)
    with _progress(spec) as bar:
        times = time_steps(step, device=spec.device, untimed_steps=cfg.untimed_steps,
                           min_steps=cfg.min_timed_steps, max_steps=cfg.max_timed_steps,
                           target_cv=cfg.target_cv, time_budget_s=cfg.time_budget_s,
                           min_time_s=spec.min_time_s, on_window=lambda n: bar.update(n - bar.n))
    gpu = (gpu_conditions(torch.device(spec.device).index or 0, spec.own_pids + (os.getpid(),))
           if memory.is_cuda else {})
    return TrialResult(TrialStatus.OK, times.seconds, flops, memory.peak_bytes(), memory.source,
                       process_cpu_s=times.process_cpu_s, wall_s=times.wall_s,
                       cpu_wait_s=times.cpu_wait_s, gc_s=times.gc_s, gc_steps=times.gc_steps,
                       gpu_conditions=gpu)


def steady_state_malloc() -> None:
    """Give glibc malloc the thresholds a long-running training process has. A fresh process
    starts with low ones and hands freed activation memory back to the OS after every step,
    then faults it in again: measured on resnet18 at batch 16, thousands of page faults per
    step and a fifth of the throughput lost — an artefact of the fresh process, not the model.
    Best effort: other C libraries are left as they are."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(M_MMAP_THRESHOLD, STEADY_MMAP_THRESHOLD_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, STEADY_TRIM_THRESHOLD_BYTES)
    except (OSError, AttributeError):
        pass


def run_trial(spec: SweepTrial) -> TrialResult:
    """Measure one trial in this process; an OOM or a model failure becomes a result."""
    steady_state_malloc()
    torch.set_num_threads(spec.threads)
    if spec.device.startswith("cuda"):
        torch.backends.cudnn.benchmark = True  # autotuned in the warm-up steps, like real runs
    memory = PeakMemory(spec.device, spec.memory_cap_bytes)
    memory.start()
    try:
        return _measure(spec, memory)
    except BadInput as err:  # the same at every batch size: the sweep stops on it
        return TrialResult(TrialStatus.ERROR, error=str(err), refused=True)
    except Exception as err:  # reported as a row; the process exits right after
        status = TrialStatus.OOM if is_oom(err) else TrialStatus.ERROR
        return TrialResult(status, peak_memory_bytes=memory.peak_bytes(),
                           memory_source=memory.source,
                           error=f"{type(err).__name__}: {str(err)[:ERROR_MESSAGE_CHARS]}"
                                 f"{error_site(err)}")


def trial_process_main(spec: SweepTrial, conn) -> None:
    """Entry point of a trial process: measure, send the result, exit (freeing everything).
    It stops when its parent (the forkserver, which ends with the sweep) dies."""
    die_with_parent()
    try:
        conn.send(run_trial(spec))
    except KeyboardInterrupt:
        pass  # Ctrl-C reached the whole process group: the parent stops the sweep
    except (BrokenPipeError, EOFError):
        pass  # the sweep stopped (SIGTERM, Ctrl-C) before it read the result
    finally:
        conn.close()
