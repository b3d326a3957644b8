"""The fault-injection drill of the training script (tests, game days): the rank named by
FAULT_KILL_RANK_ENV (default 0) SIGKILLs itself after the step named by FAULT_KILL_AT_STEP_ENV,
on the group's first attempt only, so `torchrun --max-restarts` has something real to recover
from."""

from __future__ import annotations

import os
import signal
import sys

FAULT_KILL_AT_STEP_ENV = "BATCHSCALE_FAULT_KILL_AT_STEP"
FAULT_KILL_RANK_ENV = "BATCHSCALE_FAULT_KILL_RANK"


def drill_step() -> int | None:
    """The step after which the drill kills a rank; None when no drill is set."""
    at = os.environ.get(FAULT_KILL_AT_STEP_ENV)
    return None if at is None else int(at)


def maybe_inject_fault(step: int, rank: int) -> None:
    """The fault-injection drill (see FAULT_KILL_AT_STEP_ENV): SIGKILL, no cleanup, like an OOM
    kill or a lost node."""
    at = os.environ.get(FAULT_KILL_AT_STEP_ENV)
    if at is None or int(at) != step:
        return
    if rank == int(os.environ.get(FAULT_KILL_RANK_ENV, "0")) and \
            os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0":
        print(f"fault drill: rank {rank} kills itself after step {step}", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
