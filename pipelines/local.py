"""Run the pipeline on this machine with kfp.local (SubprocessRunner, the installed package)."""

from __future__ import annotations

import contextlib
import io
import os
import re
import sys
import warnings
from pathlib import Path

from batchscale.config import ExperimentConfig
from batchscale.errors import REFUSAL_MARK
from batchscale.stopping import children_stop_with_this_process

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TIMESTAMP = re.compile(r"\d\d:\d\d:\d\d\.\d+ - ")
"""How kfp.local's own log records begin (its logger's format)."""
_OUTPUTS = re.compile(r" - INFO - Task '[^']*' outputs:\s*$")


class TaskLogFilter(io.TextIOBase):
    """kfp.local echoes each task's whole executor input (pages of JSON) and executor chatter.
    Keep all of it in the run's log file; show the console only the tasks' own lines. kfp.local
    colours task names and statuses: kept on a terminal, dropped where the console is a file
    or a pipe, or NO_COLOR is set (no-color.org), as in the log file."""

    def __init__(self, console, log_file):
        self.console, self.log_file = console, log_file
        self.buffer = ""
        self.in_json = False
        self.in_outputs = False
        self.color = _is_terminal(console) and not os.environ.get("NO_COLOR")

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.log_file.write(_ANSI.sub("", text))
        self.buffer += text
        while "\n" in self.buffer:
            line, self.buffer = self.buffer.split("\n", 1)
            if self.show(line):
                self.console.write((line if self.color else _ANSI.sub("", line)) + "\n")
        return len(text)

    def show(self, line: str) -> bool:
        if "Got executor_input" in line:
            self.in_json = True
            return False
        if self.in_json:
            self.in_json = line.rstrip() != "    }"
            return False
        plain = _ANSI.sub("", line)
        # A task's outputs (its artifacts' names, URIs and metadata, several lines each) and
        # the "Streamed logs:" heading are kfp.local's bookkeeping: the log file has them.
        if self.in_outputs and (_TIMESTAMP.match(plain) or plain.startswith("---")):
            self.in_outputs = False
        if _OUTPUTS.search(plain):
            self.in_outputs = True
        # "[]": the second line of great-expectations' "Loading 'datasources' ->" log record,
        # whose first line is executor chatter (dropped below)
        if self.in_outputs or plain.rstrip().endswith("Streamed logs:") or plain.strip() == "[]":
            return False
        # A task's refusal record is for `batchscale run` (errors.task_refusal), in the log only.
        return bool(line.strip()) and "[KFP Executor" not in line and REFUSAL_MARK not in line

    def flush(self) -> None:
        self.console.flush()
        self.log_file.flush()


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # no isatty, or a closed stream
        return False


def run_local(cfg: ExperimentConfig, run_id: str, state_dir: Path) -> Path:
    """Run the whole pipeline; returns the local pipeline root holding every task's outputs.
    The full log goes to <state_dir>/runs/<run_id>/pipeline.log."""
    from kfp import local

    from batchscale.pipelines.batchscale_pipeline import build_pipeline

    pipeline_root = state_dir / "pipeline_root"
    pipeline_root.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / "runs" / run_id / "pipeline.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("BATCHSCALE_WORK_DIR", str(state_dir / "work"))
    os.environ["PYTHONUNBUFFERED"] = "1"  # task output streams as it happens
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root),
               raise_on_error=True, enable_caching=False)
    pipeline = build_pipeline(cfg)
    # kfp.local warns on every task that our (cluster) base images are not used here: expected.
    warnings.filterwarnings("ignore", message=".*non-Python base image.*", category=RuntimeWarning)
    print(f"full log: {log_path}", file=sys.stderr)
    with open(log_path, "a") as log_file, children_stop_with_this_process(), \
            contextlib.redirect_stdout(TaskLogFilter(sys.stdout, log_file)):
        pipeline(run_id=run_id)
    return pipeline_root
