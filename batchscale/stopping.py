"""Stopping cleanly: SIGTERM handled like Ctrl-C, and child processes that die with their
parent.

SIGTERM is what `timeout`, systemd, a Kubernetes pod deletion and kfp.local's cancellation
send. Its default action ends a process on the spot, so no `finally` runs and a torchrun agent
or a sweep's trial process started in its own process group keeps running, orphaned.
`sigterm_raises` turns it into `Terminated`, a BaseException like KeyboardInterrupt, so cleanup
runs; `die_with_parent` asks the kernel to send SIGTERM to a process when its parent dies, even
by SIGKILL, which no handler can see (docs/architecture.md, "Stopping").
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

EXIT_SIGTERM = 143
"""Exit status after SIGTERM (128 + 15, as a shell reports a process the signal ended)."""
EXIT_SIGINT = 130
"""Exit status after Ctrl-C (128 + 2)."""
RESUME_RUN_ID_ENV = "BATCHSCALE_RESUME_RUN_ID"
"""The --run-id that resumes the command the user typed, where it is not the pipeline run's
own (a study's variant runs under `<study>-<variant>`; its stage's stop message names the
study's); set by the command for the stages it starts, which inherit its environment."""


def resume_run_id(run_id: str) -> str:
    """The --run-id a stop message tells the user to rerun with: the command's, else `run_id`."""
    return os.environ.get(RESUME_RUN_ID_ENV) or run_id


@contextlib.contextmanager
def resumable(run_id: str) -> Iterator[None]:
    """While the body runs, the stages it starts (they inherit the environment) name `run_id`
    in their stop messages; stopped by Ctrl-C or SIGTERM, it says how to resume: a stage's own
    message may never reach the terminal (a pipeline task's log is shown when it ends)."""
    before = os.environ.get(RESUME_RUN_ID_ENV)
    os.environ[RESUME_RUN_ID_ENV] = run_id
    try:
        yield
    except (KeyboardInterrupt, Terminated):
        print(f"batchscale: to resume, rerun the same command with --run-id {run_id}",
              file=sys.stderr, flush=True)
        raise
    finally:
        if before is None:
            os.environ.pop(RESUME_RUN_ID_ENV, None)
        else:
            os.environ[RESUME_RUN_ID_ENV] = before


STOP_GRACE_S = 5.0
"""How long a process group gets to stop after SIGTERM before SIGKILL."""
_PR_SET_PDEATHSIG = 1


class Terminated(BaseException):
    """SIGTERM arrived. A BaseException, like KeyboardInterrupt, so no `except Exception` on
    the way (libraries wrap their errors) swallows it before the cleanup runs."""


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block, SIGTERM raises Terminated in the main thread; later SIGTERMs are
    ignored until the cleanup is done. Outside the main thread (no handlers there), nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigterm(signum, frame):
        signal.signal(signal.SIGTERM, _ignore)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _ignore(signum, frame) -> None:
    """A handler that does nothing: unlike SIG_IGN, which the processes started meanwhile
    would inherit (and then shrug off the SIGTERM that stops them), exec resets it."""


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT are held and take effect (through the handlers in
    place before) when it ends. For steps that must not be cut midway: a process start stopped
    between the fork and the message that tells the child what to run leaves a child that reads
    half a message and prints a traceback."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: held.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if held:
            signal.raise_signal(held[0])


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (Linux
    PR_SET_PDEATHSIG; elsewhere nothing). Safe in a `preexec_fn` (no allocation of Python
    objects beyond the call). If the parent is already gone, stop now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # orphaned before the request: the parent already died
        os.kill(os.getpid(), sig)


def stop_group(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S,
               first: int = signal.SIGTERM) -> None:
    """Stop `proc`'s process group (it was started with start_new_session): `first` (SIGTERM),
    then SIGKILL after `grace_s`, and reap `proc`."""
    for sig, wait_s in ((first, grace_s), (signal.SIGKILL, grace_s)):
        if proc.poll() is not None:
            break
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=wait_s)
    # The leader may be gone while others of its group still run (a worker ignoring SIGTERM).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextlib.contextmanager
def children_stop_with_this_process() -> Iterator[None]:
    """Within the block, Ctrl-C or SIGTERM also stops every process this one started in its
    own process group, those started after the signal included, then takes effect as it
    would have (KeyboardInterrupt; Terminated). For a process whose work runs in children
    started from a thread pool: kfp.local runs a pipeline's tasks so, and its pool starts
    every queued task before it lets the exception through, so a stopped run went on with
    its queued tasks to their end, and SIGTERM to this process alone (`timeout`, a service
    manager) reached no task at all. Children that shared a terminal's Ctrl-C get
    STOP_GRACE_S to stop on their own; SIGTERM, then SIGKILL after STOP_GRACE_S. Further
    Ctrl-C and SIGTERM are ignored meanwhile: the stop is already bounded."""
    stop_signals = [sig for sig in (signal.SIGINT, signal.SIGTERM)
                    if signal.getsignal(sig) is not signal.SIG_IGN]
    if threading.current_thread() is not threading.main_thread() or not stop_signals:
        yield
        return
    done = threading.Event()
    previous = {sig: signal.getsignal(sig) for sig in stop_signals}
    stopper = []

    def on_signal(signum, frame):
        for sig in previous:
            signal.signal(sig, _ignore)
        stopper.append(threading.Thread(target=_stop_children, args=(signum, done), daemon=True))
        stopper[0].start()
        raise KeyboardInterrupt if signum == signal.SIGINT else Terminated

    for sig in previous:
        signal.signal(sig, on_signal)
    try:
        yield
    finally:
        done.set()
        if stopper:  # the children may outlive the block (Popen gives up on them at Ctrl-C)
            stopper[0].join(timeout=3 * STOP_GRACE_S)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_children(signum: int, done: threading.Event) -> None:
    """SIGTERM each process below this one in its process group (those there at a Ctrl-C got
    it too, and are left STOP_GRACE_S to act on it), SIGKILL those still running STOP_GRACE_S
    after their SIGTERM; until `done` is set and none is left."""
    me, group = os.getpid(), os.getpgrp()
    shared = set(_group_descendants(me, group)) if signum == signal.SIGINT else set()
    start, terminated = time.monotonic(), {}
    while True:
        running = [pid for pid in _group_descendants(me, group) if _running(pid)]
        if done.is_set() and not running:
            return
        now = time.monotonic()
        for pid in running:
            if pid in terminated:
                if now - terminated[pid] >= STOP_GRACE_S:
                    _send(pid, signal.SIGKILL)
            elif pid not in shared or now - start >= STOP_GRACE_S:
                _send(pid, signal.SIGTERM)
                terminated[pid] = now
        time.sleep(0.02)


def _group_descendants(pid: int, group: int) -> list[int]:
    """The processes below `pid` in process group `group` (not those that started their own:
    a torchrun agent, the object store), from /proc."""
    found, frontier = [], [pid]
    while frontier:
        below = []
        for child in (c for parent in frontier for c in child_pids(parent)):
            with contextlib.suppress(OSError):
                if os.getpgid(child) == group:
                    below.append(child)
        found += below
        frontier = below
    return found


def _send(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


def child_pids(pid: int) -> list[int]:
    """The children of process `pid` (Linux /proc; elsewhere, or once it is gone, none)."""
    try:
        return [int(child) for task in Path(f"/proc/{pid}/task").iterdir()
                for child in (task / "children").read_text().split()]
    except OSError:
        return []


def kill_groups(leaders: Iterable[int], wait_s: float = STOP_GRACE_S) -> None:
    """SIGKILL the process groups these processes lead (each started its own session), and
    wait up to `wait_s` until they are gone: for a launcher's children that outlive it, which
    its own group's signal does not reach."""
    leaders = list(leaders)
    for leader in leaders:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(leader, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while any(map(_running, leaders)) and time.monotonic() < deadline:
        time.sleep(0.02)


def _running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie (ended, waiting to be reaped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def exit_process(code: int) -> None:
    """End the process with `code` once its work is done, as the interpreter would (its
    non-daemon threads joined, Python's exit handlers run) but without the native libraries'
    teardown (`exit_at_once`)."""
    for thread in threading.enumerate():
        if thread is not threading.main_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    exit_at_once(code)


def exit_at_once(code: int) -> None:
    """stdout and stderr flushed, then `_exit(code)`: no interpreter or native teardown. The
    native libraries' thread pools (pyarrow's, gloo's) have aborted in their static destructors
    at exit (std::terminate, SIGABRT, exit -6: seen in a trainer rank after it had written
    everything, which torchrun reports as a failed group, and in `batchscale` after a refusal
    had been printed). A trainer rank ends this way directly, once its results are durable."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can be said
            pass
    os._exit(code)
