"""A workload's own code failing inside a convergence trial, past the checks before any trial
(batchscale/contract_check.py reads two examples only): an item the dataset cannot give, a
collate, a forward pass at the evaluation batch size, a loss or an `evaluate` that raises.

Such an error is the same at every attempt, so it is bad input (exit 2), not a crash to
restart: the trial raises `UserCodeError`, one message naming the Workload member, the trial
(batch size, seed, step) and the original exception (its type and text, shortened), with no
traceback. Under a launcher that watches for it (runner.launch_local sets ERROR_FILE_ENV), the
failing rank also writes the message to a small JSON file in the cell's work directory; the
launcher stops the torchrun group as soon as the file appears (no restart re-runs the trial),
and a rank of a group restarted before that stops at once.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from batchscale.datasplit import error_text
from batchscale.errors import BadInput, BatchscaleError

__all__ = ["UserCodeError", "error_text", "is_user_error", "read_error_file",
           "restarted_after_user_error", "write_error_file"]

ERROR_FILE_ENV = "BATCHSCALE_USER_ERROR_FILE"
"""Where a rank writes a user error for its launcher (unset: nowhere, e.g. a TrainJob)."""
ERROR_FILE_NAME = "user-error.json"
"""The file's name in the cell's work directory (runner.launch_local)."""

_NOT_THE_USERS = ("gloo", "nccl", "connection closed by peer", "connection reset by peer",
                  "processgroup", "c10d")
"""Words of a distributed failure (a peer rank died): not the workload's code, whichever call
of it was running."""


class UserCodeError(BadInput):
    """A Workload member raised inside a trial; deterministic, so never restarted (exit 2)."""


def is_user_error(err: BaseException) -> bool:
    """Whether `err`, raised while the workload's code ran, is that code's own failure: not
    batchscale's (a BatchscaleError says what it is already), not out of memory (a resource,
    handled as before), not a distributed failure (a peer died: torchrun's restart is for
    that)."""
    if isinstance(err, BatchscaleError | MemoryError) or not isinstance(err, Exception):
        return False
    import torch

    if isinstance(err, torch.OutOfMemoryError):
        return False
    dist_error = getattr(torch.distributed, "DistError", None)
    if dist_error is not None and isinstance(err, dist_error):
        return False
    text = str(err).lower()
    if "out of memory" in text or "can't allocate memory" in text:
        return False
    return not any(word in text for word in _NOT_THE_USERS)


def error_file() -> Path | None:
    """The file this rank's launcher watches for a user error, when it watches one."""
    path = os.environ.get(ERROR_FILE_ENV)
    return Path(path) if path else None


def write_error_file(err: UserCodeError) -> None:
    """Tell the launcher (when one watches): the file appears whole or not at all."""
    path = error_file()
    if path is None:
        return
    from batchscale.storage import write_bytes_atomic

    try:
        write_bytes_atomic(path, json.dumps({"exit_code": err.exit_code,
                                             "message": str(err)}).encode())
    except OSError:
        pass  # the rank's exit status and its printed message still say it


def read_error_file(path: Path) -> UserCodeError | None:
    """The user error a rank wrote to `path`; None when there is none (or it is unreadable)."""
    try:
        record = json.loads(path.read_text())
        return UserCodeError(str(record["message"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def restarted_after_user_error() -> bool:
    """Whether this rank belongs to a group torchrun restarted after a rank's user error (the
    launcher had not stopped the group yet): it must not train the same trial again."""
    path = error_file()
    restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0")
    return bool(path is not None and restarted and path.exists())
