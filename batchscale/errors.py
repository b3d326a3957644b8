"""Errors the user can act on. The CLI prints their message (no traceback) and exits non-zero;
a pipeline task does the same (`task_refusals`), and `batchscale run` reads its message back
(`task_refusal`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path


class BatchscaleError(Exception):
    """A problem the user can fix; `exit_code` is what the CLI returns."""

    exit_code = 1


class BadInput(BatchscaleError):
    """Invalid config, argument or file: nothing was started, nothing written (exit 2)."""

    exit_code = 2


class StoreError(BatchscaleError):
    """The object store refused or could not be reached."""

    exit_code = 2


class ObjectExists(StoreError):
    """A create-only write found different bytes already stored under the key."""


class ValidationFailed(BatchscaleError):
    """A table failed its great-expectations suite."""

    exit_code = 3


REFUSAL_MARK = "batchscale-task-refusal "
_REFUSAL = re.compile(rf"^\s*{REFUSAL_MARK}(\{{.*\}})\s*$", re.MULTILINE)


@contextlib.contextmanager
def task_refusals() -> Iterator[None]:
    """Around a pipeline task's stage call: a BatchscaleError (bad input, a failed validation,
    a regression) ends the task with the error's exit status and its message, not the KFP
    executor's traceback; a machine-readable line after it lets `batchscale run` say which
    task refused what, with the same exit status. Ctrl-C (the terminal sends it to every task
    process of `batchscale run`) ends the task with exit 130 and no traceback: whatever the
    stage had finished is written by then, and `batchscale run` says so."""
    try:
        yield
    except KeyboardInterrupt:
        print("batchscale: interrupted", file=sys.stderr, flush=True)
        raise SystemExit(130) from None
    except BatchscaleError as err:
        from batchscale.names import redact_url

        message = redact_url(str(err))
        print(f"batchscale: error: {message}", file=sys.stderr, flush=True)
        record = json.dumps({"exit_code": err.exit_code, "message": message})
        print(f"{REFUSAL_MARK}{record}", file=sys.stderr, flush=True)
        raise SystemExit(err.exit_code) from None


def task_refusal(log_text: str) -> BatchscaleError | None:
    """The last refusal a task printed (`task_refusals`) in a pipeline's log, as an error with
    the task's exit status; None when no task refused (it failed some other way)."""
    found = _REFUSAL.findall(log_text)
    if not found:
        return None
    record = json.loads(found[-1])
    error = BatchscaleError(record["message"])
    error.exit_code = int(record["exit_code"])
    return error


SITE_PREFIX = " (at "
"""Begins `error_site`'s text: how an error message names the line of the user's code."""


def error_site(err: BaseException) -> str:
    """" (at my_model.py:42)": the innermost frame of `err`'s traceback in the user's own code
    (outside installed packages, the standard library and batchscale); "" where none is."""
    ours = str(Path(__file__).parent)  # the batchscale package
    system = (os.sep + "site-packages" + os.sep, os.sep + "lib" + os.sep + "python")
    for frame in reversed(traceback.extract_tb(err.__traceback__)):
        name = frame.filename
        if not name.startswith(ours) and not any(part in name for part in system) \
                and not name.startswith("<"):
            return f"{SITE_PREFIX}{name}:{frame.lineno})"
    return ""
