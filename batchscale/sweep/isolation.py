"""Run each trial in a fresh process forked from a forkserver that has torch preloaded.

Why a process per trial: its peak resident memory is the trial's own, and everything it
allocated goes back to the OS at exit — no stale references, no allocator fragmentation, no
half-freed CUDA cache left by an out-of-memory failure. Why a forkserver: a spawned process would
pay the torch import (seconds) per trial, and a plain fork of the sweep process is unsafe once it
has used OpenMP threads or CUDA. A fork from the preloaded server costs a few milliseconds.

On CPU the parent also enforces the memory cap, the way a container's memory limit would: it
polls the trial's resident memory and stops the process when it goes over. On CUDA the trial
caps its own allocator (see trial.PeakMemory).

As with any multiprocessing start method but fork, each trial process imports the caller's main
module: a script that calls the sweep must keep its work under `if __name__ == "__main__":`.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from multiprocessing.connection import Connection

from batchscale.schemas import TrialStatus
from batchscale.stopping import signals_held
from batchscale.sweep.trial import (
    SweepTrial,
    TrialResult,
    process_memory_bytes,
    trial_process_main,
)

# Imported once by the forkserver so trial processes start warm. torch._dynamo is what
# torch.optim imports on first use (about two seconds); a real training process pays it too,
# so its memory belongs in every trial's baseline.
FORKSERVER_PRELOAD = ("batchscale.sweep.trial", "torch._dynamo",
                      "torch.utils.flop_counter", "tqdm")
# Last in the preload list: collects what the imports left (sweep/settle_gc.py).
SETTLE_GC = "batchscale.sweep.settle_gc"
# How often the parent checks a CPU trial's resident memory against the cap. Reading
# /proc/<pid>/status takes tens of microseconds: at this rate the cost is far below noise.
WATCH_INTERVAL_S = 0.02
EXIT_GRACE_S = 2.0
"""How long a trial that has sent its result may take to exit before it is killed. Its exit
handlers unregister the semaphores its libraries made (tqdm's lock, made by Hugging Face
datasets' formatting): killed first, it leaves them to the resource tracker, which warns of
"leaked semaphore objects" when the sweep ends."""
MEMORY_SOURCE_WATCHDOG = "cpu_trial_process_rss_at_stop"
NVML_CUDA_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def _context(preload: tuple[str, ...]):
    """The forkserver context. The preload list only takes effect when the server starts (the
    first trial of this Python process); later trials that need more import it themselves.
    The server inherits this environment: with the NVML-based check, a preloaded module that
    asks torch.cuda.is_available() does not initialize CUDA in the server, which would break
    CUDA in every process forked from it."""
    os.environ.setdefault(NVML_CUDA_CHECK, "1")
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload([*FORKSERVER_PRELOAD, *preload, SETTLE_GC])
    return ctx


def run_isolated(spec: SweepTrial, preload: tuple[str, ...] = ()) -> TrialResult:
    """Run `spec` in its own process and return what it measured. Ctrl-C (KeyboardInterrupt)
    stops the trial process and propagates."""
    ctx = _context(preload)
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=trial_process_main, args=(spec, sender), daemon=True,
                       name=f"trial-{spec.input_mode}-{spec.batch_size}")
    try:
        with signals_held():
            proc.start()
        sender.close()
        result = _await(proc, receiver, spec)
        proc.join(EXIT_GRACE_S)  # its exit handlers release what it registered (below)
        return result
    finally:
        sender.close()
        if proc.pid is not None:  # started (a signal held over the start ends the trial here)
            if proc.is_alive():
                proc.kill()
            proc.join()
        receiver.close()


def _await(proc, receiver: Connection, spec: SweepTrial) -> TrialResult:
    watch = spec.memory_cap_bytes if spec.device == "cpu" else None
    while not receiver.poll(WATCH_INTERVAL_S):
        if watch is not None:
            rss = process_memory_bytes("VmRSS", proc.pid)
            if rss is not None and rss > watch:
                proc.kill()
                return TrialResult(
                    TrialStatus.OOM, peak_memory_bytes=rss, memory_source=MEMORY_SOURCE_WATCHDOG,
                    error=f"resident memory reached {rss} bytes, over the cap of {watch} bytes "
                          "(memory_limit_bytes less the safety margin): trial stopped")
        if not proc.is_alive() and not receiver.poll():
            proc.join()
            return _died(proc.exitcode)
    try:
        result = receiver.recv()
    except EOFError:
        proc.join()
        return _died(proc.exitcode)
    return _within_cap(result, watch)


def _within_cap(result: TrialResult, cap: int | None) -> TrialResult:
    """The watchdog samples every WATCH_INTERVAL_S, so a short spike can slip between samples;
    the trial's own high-water mark is exact. A peak over the cap does not fit: it is an oom."""
    peak = result.peak_memory_bytes
    if cap is None or result.status != TrialStatus.OK or peak is None or peak <= cap:
        return result
    return TrialResult(TrialStatus.OOM, peak_memory_bytes=peak, memory_source=result.memory_source,
                       error=f"peak resident memory {peak} bytes exceeded the cap of {cap} "
                             "bytes (memory_limit_bytes less the safety margin)")


def _died(exitcode: int | None) -> TrialResult:
    """A trial process that exited without a result: SIGKILL is the kernel's OOM killer."""
    if exitcode == -signal.SIGKILL:
        return TrialResult(TrialStatus.OOM, error="trial process was killed (SIGKILL), most likely "
                                             "by the kernel's out-of-memory killer")
    return TrialResult(TrialStatus.ERROR, error=f"trial process exited with code {exitcode} "
                                           "before reporting a result")
