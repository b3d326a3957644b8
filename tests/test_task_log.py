"""What `batchscale run` shows of kfp.local's output (batchscale/pipelines/local.py): the
tasks' own lines, coloured on a terminal only; the log file keeps everything, uncoloured."""

from __future__ import annotations

import io

import pytest

from batchscale.pipelines.local import TaskLogFilter

COLOURED = "09:27:49.704 - INFO - Executing task \x1b[96m'data-prep'\x1b[0m\n"
PLAIN = "09:27:49.704 - INFO - Executing task 'data-prep'\n"


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("console", "no_color", "shown"), [
    (io.StringIO(), None, PLAIN),  # a file or a pipe
    (Terminal(), None, COLOURED),
    (Terminal(), "1", PLAIN),
])
def test_colour_reaches_a_terminal_only(console, no_color, shown, monkeypatch):
    if no_color:
        monkeypatch.setenv("NO_COLOR", no_color)
    else:
        monkeypatch.delenv("NO_COLOR", raising=False)
    log = io.StringIO()
    TaskLogFilter(console, log).write(COLOURED + "    Got executor_input: {\n    }\n")
    assert console.getvalue() == shown
    assert log.getvalue().startswith(PLAIN) and "\x1b[" not in log.getvalue()
