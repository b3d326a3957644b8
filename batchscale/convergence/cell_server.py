"""One process that trains one-worker convergence cells one after another, so a caller that runs
many small cells (the adaptive search) pays Python's and torch's start-up once instead of one
torchrun per cell (docs/architecture.md, "Adaptive search").

The caller writes a spec path per line on the server's stdin; the server trains that spec as a
one-rank torchrun worker would (`train.run_spec`: the same trial code, files and checkpoints)
and answers one JSON line on stdout: {"spec": path, "ok": true} or {"spec": path, "ok": false,
"error": message}. A failed cell ends the server; the caller then launches that cell with
torchrun as before, whose restarts and messages are the ones a user knows, except when the
workload's own code failed (usererror.UserCodeError, answered with "user_error": true): that
would fail the same way under torchrun, so the caller raises it (exit 2). The server dies with
its caller (stopping.die_with_parent), and a cell past its time limit is stopped with its group.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import traceback
from functools import partial
from pathlib import Path

from batchscale.errors import BatchscaleError
from batchscale.stopping import die_with_parent, stop_group

MODULE = "batchscale.convergence.cell_server"


class CellServer:
    """The caller's side: started on the first cell, stopped on `close` (or a failure)."""

    def __init__(self, env: dict):
        self.env = env
        self.proc: subprocess.Popen | None = None

    def run(self, spec_path: Path, timeout_s: float) -> bool:
        """Train the spec at `spec_path`; False when the server failed on it (it is stopped:
        the caller launches the cell another way). A cell past `timeout_s` raises, as a
        torchrun launch does, and so does an error of the workload's own code (UserCodeError,
        with where the finished trials are)."""
        if self.proc is None:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", MODULE], env=self.env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True, start_new_session=True,
                preexec_fn=partial(die_with_parent, signal.SIGKILL))
        try:
            self.proc.stdin.write(f"{spec_path}\n")
            self.proc.stdin.flush()
            answer = self._answer(timeout_s, spec_path.parent / "trials")
        except (BrokenPipeError, OSError):
            answer = None
        if answer is None or not answer.get("ok"):
            self.close()
            if answer is not None and answer.get("user_error"):
                from batchscale.convergence.usererror import UserCodeError

                raise UserCodeError(f"{answer.get('error')}; finished trials are kept in "
                                    f"{spec_path.parent / 'trials'}")
            return False
        return True

    def _answer(self, timeout_s: float, trials: Path) -> dict | None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            if not selector.select(timeout_s):
                self.close()
                raise BatchscaleError(f"convergence trials timed out after {timeout_s:.0f} s; "
                                      f"finished trials are kept in {trials}")
        line = self.proc.stdout.readline()
        try:
            return json.loads(line) if line else None
        except ValueError:
            return None

    def close(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, first=signal.SIGKILL)
            self.proc = None

    def __enter__(self) -> CellServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(lines, reply) -> int:
    """Train the spec of each line until one fails (returns 1) or the input ends (0)."""
    from batchscale.convergence.spec import read_spec
    from batchscale.convergence.train import run_spec
    from batchscale.convergence.usererror import UserCodeError

    for line in lines:
        path = line.strip()
        try:
            run_spec(read_spec(path))
        except UserCodeError as err:  # the same under torchrun: the caller raises it
            reply({"spec": path, "ok": False, "error": str(err), "user_error": True})
            return 1
        except BatchscaleError as err:
            reply({"spec": path, "ok": False, "error": str(err)})
            return 1
        except Exception as err:  # noqa: BLE001  what a torchrun worker would print, then stop
            traceback.print_exc()
            reply({"spec": path, "ok": False, "error": f"{type(err).__name__}: {err}"})
            return 1
        reply({"spec": path, "ok": True})
    return 0


def main() -> int:
    die_with_parent()
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the trials print goes to stderr, never into the answers

    def reply(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    return serve(sys.stdin, reply)


if __name__ == "__main__":
    sys.exit(main())
