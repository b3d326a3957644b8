"""A total deadline for a call that has only per-read timeouts (botocore, pyarrow's S3 reads,
the KFP API client): a server that trickles its bytes keeps every read inside its timeout and
the call going forever."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class DeadlinePassed(Exception):
    """The call did not complete within its deadline (it is left running in its thread)."""


def call_within(call: Callable[[], T], deadline_s: float, name: str = "bounded-call") -> T:
    """`call()`, given at most `deadline_s` seconds in all. It runs in a daemon thread the
    caller waits for: a call past its deadline is left to its own read timeouts (or the
    process's end), never waited for. Its exceptions are re-raised in the caller's thread."""
    done: queue.SimpleQueue = queue.SimpleQueue()

    def run() -> None:
        try:
            done.put((True, call()))
        except BaseException as exc:  # re-raised in the caller's thread
            done.put((False, exc))

    threading.Thread(target=run, daemon=True, name=name).start()
    try:
        ok, value = done.get(timeout=deadline_s)
    except queue.Empty:
        raise DeadlinePassed(f"no answer within {deadline_s:g} s") from None
    if ok:
        return value
    raise value
