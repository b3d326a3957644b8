"""One process group that trains convergence cells one after another, so a caller that runs
many small cells (the adaptive search) pays Python's, torch's and the group's start-up once
instead of one torchrun per cell (docs/architecture.md, "Adaptive search").

One worker: a plain process. Several: one `torchrun --standalone` group of that many ranks,
which keeps its process group between cells; rank 0 reads the caller's lines and broadcasts
each to the other ranks. The caller writes a spec path per line on the server's stdin; every
rank trains that spec as a torchrun worker would (`train.run_spec`: the same trial code, files
and checkpoints) and rank 0 answers one JSON line on stdout: {"spec": path, "ok": true} or
{"spec": path, "ok": false, "error": message}. A failed cell ends the server; the caller then
launches that cell with torchrun as before, whose restarts and messages are the ones a user
knows, except when the workload's own code failed (usererror.UserCodeError, answered with
"user_error": true): that would fail the same way under torchrun, so the caller raises it
(exit 2). The server dies with its caller (stopping.die_with_parent), and a cell past its time
limit is stopped with its group.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import sys
import traceback
from collections.abc import Iterator
from functools import partial
from pathlib import Path

from batchscale.errors import BatchscaleError
from batchscale.stopping import die_with_parent, stop_group

MODULE = "batchscale.convergence.cell_server"


class CellServer:
    """The caller's side: started on the first cell, stopped on `close` (or a failure). It
    trains cells of `workers` workers; the caller launches others with torchrun."""

    def __init__(self, env: dict, workers: int = 1):
        self.env = env
        self.workers = workers
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        if self.workers == 1:
            return [sys.executable, "-m", MODULE]
        # No restarts: a failed cell is handed back, and torchrun's launch has its own.
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={self.workers}", "--max-restarts=0", "-m", MODULE]

    def run(self, spec_path: Path, timeout_s: float) -> bool:
        """Train the spec at `spec_path`; False when the server failed on it (it is stopped:
        the caller launches the cell another way). A cell past `timeout_s` raises, as a
        torchrun launch does, and so does an error of the workload's own code (UserCodeError,
        with where the finished trials are)."""
        if self.proc is None:
            self.proc = subprocess.Popen(
                self.command(), env=self.env, stdin=subprocess.PIPE,
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
        except ValueError:  # not an answer: the server is not what it should be
            return None

    def close(self) -> None:
        if self.proc is not None:
            stop_group(self.proc, first=signal.SIGKILL)
            self.proc = None

    def __enter__(self) -> CellServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def spec_paths(lines) -> Iterator[str]:
    """The spec paths to train: the lines rank 0 reads, each broadcast to the group's other
    ranks (which do not read their input), until rank 0's input ends."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        yield from (line.strip() for line in lines)
        return
    import torch.distributed as dist

    from batchscale.convergence.distributed import init_distributed

    reader = iter(lines) if init_distributed(world).is_main else iter(())
    while True:
        box = [next(reader, None)]
        dist.broadcast_object_list(box, src=0)
        if box[0] is None:
            return
        yield box[0].strip()


def serve(lines, reply) -> int:
    """Train the spec of each line until one fails (returns 1) or the input ends (0). In a
    group every rank trains it and only rank 0 replies; a rank that fails ends, and torchrun
    then stops the group, so the caller reads no answer and launches the cell itself."""
    from batchscale.convergence.spec import read_spec
    from batchscale.convergence.train import run_spec
    from batchscale.convergence.usererror import UserCodeError

    if int(os.environ.get("RANK", "0")) != 0:
        reply = _no_reply
    for path in spec_paths(lines):
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


def _no_reply(message: dict) -> None:
    """A rank other than 0: rank 0 answers for the group."""


def main() -> int:
    die_with_parent()  # with its caller, or (a rank) with its torchrun agent
    answers = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # what the trials print goes to stderr, never into the answers

    def reply(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    return serve(sys.stdin, reply)


if __name__ == "__main__":
    sys.exit(main())
