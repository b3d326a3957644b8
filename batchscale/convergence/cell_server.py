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
knows, except when the workload's own code failed on any rank (usererror.UserCodeError, whose
message the rank leaves in the cell's ERROR_FILE_NAME, as under torchrun): that would fail the
same way under torchrun, so the caller raises it (exit 2). The server dies with its caller
(stopping.die_with_parent), and a cell past its time limit is stopped with its group.
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
from datetime import timedelta
from functools import partial
from pathlib import Path

from batchscale.convergence.outcome import kept_text
from batchscale.convergence.usererror import (
    ERROR_FILE_NAME,
    UserCodeError,
    log_traceback,
    read_error_file,
    write_error_file,
)
from batchscale.errors import BatchscaleError
from batchscale.stopping import child_pids, die_with_parent, kill_groups, stop_group

MODULE = "batchscale.convergence.cell_server"
CONTROL_TIMEOUT = timedelta(days=1)
"""How long the ranks of a group wait for the next cell's spec path: as long as the caller
takes to choose it."""


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
        # No restarts: a failed cell is handed back, and torchrun's launch has its own. The
        # ranks' stdout stays the answers' pipe even where PET_REDIRECTS or PET_TEE are set.
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={self.workers}", "--max-restarts=0", "--redirects=0",
                "--tee=0", "-m", MODULE]

    def run(self, spec_path: Path, timeout_s: float) -> bool:
        """Train the spec at `spec_path`; False when the server failed on it (it is stopped:
        the caller launches the cell another way). A cell past `timeout_s` raises, as a
        torchrun launch does, and so does an error of the workload's own code on any rank
        (UserCodeError, with where the finished trials are)."""
        error_file = spec_path.parent / ERROR_FILE_NAME
        error_file.unlink(missing_ok=True)  # an earlier launch's: this one starts afresh
        if self.proc is None:
            self.proc = subprocess.Popen(
                self.command(), env=self.env, stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, text=True, start_new_session=True,
                preexec_fn=partial(die_with_parent, signal.SIGKILL))
        try:
            self.proc.stdin.write(f"{spec_path}\n")
            self.proc.stdin.flush()
            answer = self._answer(timeout_s, spec_path.parent)
        except (BrokenPipeError, OSError, ValueError):
            answer = None
        if answer is not None and answer.get("ok"):
            return True
        self.close()
        # A rank that failed on the workload's code wrote why before it ended (any rank: the
        # others then fail on the group or are stopped by torchrun, without that message).
        user_error = read_error_file(error_file)
        if user_error is not None:
            raise UserCodeError(f"{user_error}; {kept_text(spec_path.parent)}")
        # not the workload's fault: say why, so a cell that keeps falling back is explained
        why = (answer or {}).get("error") or "it ended without an answer"
        print(f"batchscale: the cell server failed on {spec_path.parent.name} ({why}); that "
              "cell trains in a torchrun launch of its own", file=sys.stderr, flush=True)
        return False

    def _answer(self, timeout_s: float, out_dir: Path) -> dict | None:
        with selectors.DefaultSelector() as selector:
            selector.register(self.proc.stdout, selectors.EVENT_READ)
            if not selector.select(timeout_s):
                self.close()
                raise BatchscaleError(f"convergence trials timed out after {timeout_s:.0f} s; "
                                      f"{kept_text(out_dir)}")
        line = self.proc.stdout.readline()
        try:
            return json.loads(line) if line else None
        except ValueError:  # not an answer: the server is not what it should be
            return None

    def close(self) -> None:
        """Stop the server; a group's ranks too, which torchrun started in sessions of their
        own (their parent-death signal would stop them, but only after this returns)."""
        if self.proc is not None:
            ranks = child_pids(self.proc.pid) if self.workers > 1 else []
            stop_group(self.proc, first=signal.SIGKILL)
            kill_groups(ranks)
            self.proc = None

    def __enter__(self) -> CellServer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def spec_paths(lines) -> Iterator[str]:
    """The spec paths to train: the lines rank 0 reads, each broadcast to the group's other
    ranks (which do not read their input), until rank 0's input ends. The broadcast goes over
    a gloo group of its own: between cells the ranks wait on the CPU, however long the caller
    takes, not in the training group's (NCCL's) collective and its timeout."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        yield from (line.strip() for line in lines)
        return
    import torch.distributed as dist

    from batchscale.convergence.distributed import init_distributed

    reader = iter(lines) if init_distributed(world).is_main else iter(())
    control = dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)
    while True:
        box = [next(reader, None)]
        dist.broadcast_object_list(box, src=0, group=control)
        if box[0] is None:
            return
        yield box[0].strip()


def serve(lines, reply) -> int:
    """Train the spec of each line until one fails (returns 1) or the input ends (0). In a
    group every rank trains it and only rank 0 replies; a rank that fails on the workload's
    code also leaves its message in the cell's directory (ERROR_FILE_NAME), and a rank that
    ends makes torchrun stop the group, so the caller reads that file or no answer at all."""
    from batchscale.convergence.spec import read_spec
    from batchscale.convergence.train import run_spec

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ.get("RANK", "0")) != 0:
        reply = _no_reply
    for path in spec_paths(lines):
        try:
            run_spec(read_spec(path))
        except UserCodeError as err:  # the same under torchrun: the caller raises it
            write_error_file(err, Path(path).parent / ERROR_FILE_NAME)
            log_traceback(err)
            reply({"spec": path, "ok": False, "error": str(err)})
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
