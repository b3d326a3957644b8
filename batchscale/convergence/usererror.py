"""A workload's own code failing inside a convergence trial, past the checks before any trial
(batchscale/contract_check.py reads two examples only): an item the dataset cannot give, a
collate, a forward pass at the evaluation batch size, a loss or an `evaluate` that raises.

Such an error is the same at every attempt, so it is bad input (exit 2), not a crash to
restart: the trial raises `UserCodeError`, one message naming the Workload member, the trial
(batch size, seed, step) and the original exception (its type and text, shortened), with no
traceback. Under a launcher that watches for it (runner.launch_local sets ERROR_FILE_ENV), the
failing rank also writes the message to a small JSON file in the cell's work directory; the
launcher stops the torchrun group as soon as the file appears (no restart re-runs the trial),
and a rank of a group restarted before that stops at once. A TrainJob's pods reach the launcher
through nothing but the object store and the log: there the launcher finds the message in
node-0's log (`user_error_in_log`, trainjob_wait.py) and raises it as the same error.
"""

from __future__ import annotations

import json
import os
import re
import sys
import traceback
from pathlib import Path

from batchscale.contract_check import CHECK_EXAMPLES, describe_batch, transposed_list_hint
from batchscale.datasplit import DataFailure, error_text, failure_of
from batchscale.errors import BadInput, BatchscaleError, error_site

__all__ = ["UserCodeError", "data_error", "data_hint", "error_text", "evaluation_failed",
           "fail_if_user", "is_user_error", "loss_failed", "read_error_file",
           "restarted_after_user_error", "user_error", "user_error_in_log", "write_error_file"]

ERROR_FILE_ENV = "BATCHSCALE_USER_ERROR_FILE"
"""Where a rank writes a user error for its launcher (unset: nowhere, e.g. a TrainJob)."""
ERROR_FILE_NAME = "user-error.json"
"""The file's name in the cell's work directory (runner.launch_local)."""

_NOT_THE_USERS = ("gloo", "nccl", "connection closed by peer", "connection reset by peer",
                  "processgroup", "c10d")
"""Words of a distributed failure (a peer rank died): not the workload's code, whichever call
of it was running."""


LOG_LINE = re.compile(r"error: (workload '.*?': \S.* failed .*)")
"""How a rank prints a UserCodeError (train.main: "error: " and its message), found again in a
node's log where no launcher watches an error file (a TrainJob)."""


class UserCodeError(BadInput):
    """A Workload member raised inside a trial; deterministic, so never restarted (exit 2).
    `original`: the workload's own exception, whose traceback goes to the rank's log only."""

    original: BaseException | None = None


def log_traceback(err: UserCodeError) -> None:
    """The workload's own traceback, on this rank's stderr: the launcher keeps it in the cell's
    log (torchrun.log) and shows the user the one-line message only."""
    if err.original is not None:
        print("traceback of the workload's error (the message below says what failed):",
              file=sys.stderr)
        traceback.print_exception(err.original, file=sys.stderr)


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


def write_error_file(err: UserCodeError, path: Path | None = None) -> None:
    """Tell the launcher (when one watches: `path`, else ERROR_FILE_ENV's): the file appears
    whole or not at all."""
    path = path or error_file()
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


def user_error_in_log(line: str) -> str | None:
    """The message of a user error a rank printed on `line` of its log; None otherwise."""
    found = LOG_LINE.search(line.strip())
    return found.group(1) if found else None


def restarted_after_user_error() -> bool:
    """Whether this rank belongs to a group torchrun restarted after a rank's user error (the
    launcher had not stopped the group yet): it must not train the same trial again."""
    path = error_file()
    restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") not in ("", "0")
    return bool(path is not None and restarted and path.exists())


# -- the messages of a trial (train.Trial) ------------------------------------------------------
def user_error(trial, member: str, error: str, doing: str, hint: str,
               where: str = "") -> UserCodeError:
    """One message: the Workload member, on what it failed, the trial (batch size, seed, step),
    what the trial was doing, the original error (type and text, shortened) and what is
    expected instead."""
    t = trial.t
    on = f" on {where}" if where else ""
    return UserCodeError(
        f"workload {trial.contract.name!r}: {member} failed{on} in trial {t.trial_id} "
        f"(batch size {t.batch_size}, seed {t.seed}) at step {trial.state.step}, {doing}: "
        f"{error}. {hint}")


def data_error(trial, failure: DataFailure, error: str, doing: str,
               split: str) -> UserCodeError:
    """A user error of the data (an item, collate) of `split` ("train", "val")."""
    data = trial.train if split == "train" else trial.val
    return user_error(trial, failure.member, error, doing, data_hint(data, failure),
                      failure.where)


def data_hint(data, failure: DataFailure) -> str:
    """What the workload's data (a datasplit.DatasetSplit) must do that `failure` shows it did
    not."""
    if failure.member == data.collate_member:
        return ("Workload.collate must make a batch of any list of the dataset's items "
                f"(the check before the trials collates the first {CHECK_EXAMPLES} only)")
    n = len(data.dataset)
    return (f"The dataset must give an item for every index from 0 to {n - 1} (its "
            f"__len__ is {n}); the check before the trials reads the first "
            f"{CHECK_EXAMPLES} only")


def fail_if_user(trial, err: Exception, member: str, doing: str, hint: str,
                 split: str = "train") -> None:
    """Raise UserCodeError when `err` is the workload's own failure (is_user_error); a failure
    of its data is named by its member (datasplit.DataFailure), else `member` is. Otherwise
    return: the caller re-raises `err` as it was (a crash, an OOM, a dead peer)."""
    if not is_user_error(err):
        return
    failure = failure_of(err)
    text = error_text(err) + error_site(err)
    found = (data_error(trial, failure, text, doing, split) if failure is not None
             else user_error(trial, member, text, doing, hint))
    found.original = err
    raise found from None


def loss_failed(trial, err: Exception, rows: int, batch) -> None:
    """Raise UserCodeError when the model's forward or the loss failed on a training batch (the
    workload's own code); return otherwise."""
    fail_if_user(
        trial, err, "Workload.loss (the model's forward and the loss)",
        f"training, on a micro-batch of {rows} examples {describe_batch(batch)}"
        f"{half_batch_note(trial, rows)}",
        "The model and the loss must accept every batch the data make (the check before "
        f"the trials runs a batch of {CHECK_EXAMPLES} examples only)"
        f"{transposed_list_hint(batch, rows)}")


def half_batch_note(trial, rows: int) -> str:
    """Why the loss saw a part of the batch: on one process, the gradient noise scale's step
    runs the loss on each half of the batch (convergence.gns_every_steps); "" otherwise."""
    batch = trial.local_batch
    if not (trial.d.world_size == 1 and trial.accumulation == 1 and rows < batch
            and trial.measures_noise(trial.state.step)):
        return ""
    return (f" (half of the batch of {batch}: on one process the step that measures the "
            "gradient noise scale, every convergence.gns_every_steps steps, runs the loss on "
            "each half; gns_every_steps: null keeps batches whole and measures no noise "
            "scale)")


def evaluation_failed(trial, err: Exception, split: str, doing: str) -> None:
    """Raise UserCodeError when the workload's code failed in an evaluation (its data,
    `evaluate`, or the model's forward and the loss at the evaluation batch size)."""
    size = trial.contract.eval_batch_size
    member = ("Workload.evaluate" if trial.contract.evaluate is not None
              else "Workload.loss (the model's forward and the loss, in evaluation)")
    fail_if_user(
        trial, err, member, f"{doing} in batches of up to Workload.eval_batch_size={size}",
        f"The model must accept batches of up to eval_batch_size ({size}) examples in "
        "eval mode without gradients: lower Workload.eval_batch_size if it cannot", split)
