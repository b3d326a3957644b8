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


def test_a_tasks_outputs_and_the_streamed_logs_heading_stay_in_the_log_file_only():
    """kfp.local's record of a task's outputs (each artifact's name, URI and metadata over
    several lines) is bookkeeping: a user reading `batchscale run` sees the tasks' own lines
    and their start and end; the log file keeps everything."""
    chunk = ("02:04:25.129 - INFO - Executing task 'validate-sweep'\n"
             "02:04:25.129 - INFO - Streamed logs:\n"
             "    []\n"
             "    validate sweep: passed (90/90 expectations)\n"
             "02:04:28.496 - INFO - Task 'validate-sweep' finished with status SUCCESS\n"
             "02:04:28.497 - INFO - Task 'throughput-sweep' outputs:\n"
             "    sweep: Dataset( name='sweep',\n"
             "                    uri='/tmp/x/throughput-sweep/sweep',\n"
             "                    metadata={} )\n"
             "\n"
             "--------------------------------------------------------------------------------\n"
             "02:04:28.500 - INFO - Executing task 'converge'\n")
    console, log = io.StringIO(), io.StringIO()
    TaskLogFilter(console, log).write(chunk)
    shown = console.getvalue()
    assert "Executing task 'validate-sweep'" in shown and "Executing task 'converge'" in shown
    assert "validate sweep: passed" in shown and "finished with status SUCCESS" in shown
    assert "outputs:" not in shown and "Dataset(" not in shown and "uri=" not in shown
    assert "Streamed logs" not in shown and "[]" not in shown
    assert log.getvalue() == chunk
