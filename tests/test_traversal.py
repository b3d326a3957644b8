"""No command writes outside the directories it was given: run ids, experiment names, workload
names and key prefixes with traversal patterns are refused (exit 2, a message naming the input)
before anything starts, and the file system is the same afterwards.

Each case snapshots a temporary root (the --out directory lies three levels down, so a
`../../..` escape would still land inside the root and be seen), runs the command, and compares.
Refused inputs never train, so these runs are cheap: hypothesis walks the patterns in-process
through `batchscale.cli.main`, and a sample of them through the real command (`run_cli`)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscale.cli import main
from helpers import run_cli

SAFE = "abcXYZ019_.-"
# Pieces that make a name unsafe wherever they stand (separators, '..', control characters,
# look-alike dots, other scripts); each generated value holds at least one.
BAD_PIECES = ["..", "/", "../", "/..", "\\", "..\\", "\n", "\r", "\t", " ", "\0", "\u2024",
              "\uff0e\uff0e", "\u3002", "\u0665", "%2e%2e%2f", "~/", "*"]
TRAVERSALS = ["..", "../x", "../../X", "../../../escaped", "/abs", "a/../../b", "run\n", "x\0y",
              "..\\..\\x", "\u2024\u2024/x", "\uff0e\uff0e/x", "a" * 129, "-leading", ".hidden",
              "", " ", "a/b"]
unsafe = st.one_of(
    st.sampled_from(TRAVERSALS),
    st.builds(lambda a, bad, b: a + bad + b, st.text(SAFE, max_size=6),
              st.sampled_from(BAD_PIECES), st.text(SAFE, max_size=6)),
    st.text(SAFE, min_size=129, max_size=400).map(lambda s: "a" + s),
)
# NUL cannot travel in a process's arguments: the real command gets the rest.
unsafe_argv = unsafe.filter(lambda s: "\0" not in s)


def snapshot(root: Path) -> list[str]:
    """Every path under `root` (files and directories), relative, sorted."""
    return sorted(str(p.relative_to(root)) + ("/" if p.is_dir() else "")
                  for p in root.rglob("*"))


@contextlib.contextmanager
def temp_root():
    """A fresh root with the --out place three levels down; the working directory is the root
    (relative escapes land there too)."""
    with tempfile.TemporaryDirectory(prefix="batchscale-traversal-") as name:
        root = Path(name)
        (root / "l1" / "l2" / "l3").mkdir(parents=True)
        with contextlib.chdir(root):
            yield root


def cli_main(argv: list[str]) -> tuple[int, str]:
    """(exit status, stderr) of batchscale.cli.main in this process."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return code, stderr.getvalue()


def out_args(command: str, root: Path) -> list[str]:
    base = root / "l1" / "l2" / "l3"
    return ["--out", str(base / ("out" if command == "converge" else "s.parquet"))]


def assert_refused(code: int, stderr: str, needle: str) -> None:
    assert code == 2, stderr
    assert needle in stderr, stderr
    assert "Traceback" not in stderr


# ----------------------------------------------------------------------------- run ids
@given(st.sampled_from(["converge", "sweep"]), unsafe)
@settings(max_examples=100, deadline=None)
def test_any_unsafe_run_id_is_refused_in_process(command, run_id):
    with temp_root() as root:
        before = snapshot(root)
        code, stderr = cli_main([command, *out_args(command, root), f"--run-id={run_id}"])
        assert_refused(code, stderr, "run id")
        assert snapshot(root) == before


@given(st.sampled_from(["converge", "sweep"]), unsafe_argv)
@settings(max_examples=12, deadline=None)
def test_any_unsafe_run_id_is_refused_by_the_real_command(command, run_id):
    with temp_root() as root:
        before = snapshot(root)
        result = run_cli([command, *out_args(command, root), f"--run-id={run_id}"], cwd=root,
                         timeout_s=120)
        assert_refused(result.returncode, result.stderr, "run id")
        assert snapshot(root) == before


@pytest.mark.parametrize("run_id", ["../../X", "/ABS", "a/../../b", "run\n"])
@pytest.mark.parametrize("command", ["converge", "sweep", "run", "report"])
def test_every_command_with_a_run_id_refuses_traversal_before_starting(command, run_id):
    """`run` and `report` would start the local store and the pipeline: they refuse first (no
    .batchscale/ state directory appears)."""
    with temp_root() as root:
        if run_id == "/ABS":
            run_id = str(root / "abs")  # an absolute path, inside the root to be seen
        before = snapshot(root)
        extra = out_args(command, root) if command in ("converge", "sweep") else []
        result = run_cli([command, *extra, f"--run-id={run_id}"], cwd=root, timeout_s=120)
        assert_refused(result.returncode, result.stderr, "run id")
        assert snapshot(root) == before


# ------------------------------------------------------------------ experiment names
@given(st.sampled_from(["converge", "sweep"]), unsafe)
@settings(max_examples=60, deadline=None)
def test_any_unsafe_experiment_name_is_refused(command, name):
    with temp_root() as root:
        config = root / "l1" / "c.yaml"
        config.write_text(f"name: {json.dumps(name)}\n")  # JSON strings are YAML strings
        before = snapshot(root)
        code, stderr = cli_main([command, "--config", str(config), *out_args(command, root)])
        assert_refused(code, stderr, "name")
        assert snapshot(root) == before


# --------------------------------------------------------------------- workload names
@given(st.sampled_from(["converge", "sweep"]), unsafe)
@settings(max_examples=60, deadline=None)
def test_any_unsafe_workload_name_is_refused(command, workload):
    with temp_root() as root:
        before = snapshot(root)
        code, stderr = cli_main([command, f"--workload={workload}", *out_args(command, root)])
        assert_refused(code, stderr, "workload")
        assert snapshot(root) == before


@given(unsafe_argv)
@settings(max_examples=30, deadline=None)
def test_history_refuses_an_unsafe_workload_before_reading_the_lake(workload):
    with temp_root() as root:
        before = snapshot(root)
        code, stderr = cli_main(["history", f"--workload={workload}"])
        assert_refused(code, stderr, "--workload")
        assert snapshot(root) == before


# ------------------------------------------------------------------------- key prefixes
@pytest.mark.parametrize("prefix", ["../x", "a/../../b", "/..", "a//b", "x\n", "\u2024\u2024"])
def test_an_unsafe_store_prefix_is_refused_before_the_store_starts(prefix):
    with temp_root() as root:
        before = snapshot(root)
        result = run_cli(["report", "--run-id", "r1", "--out", "r.html"], cwd=root,
                         env={"BATCHSCALE_S3_PREFIX": prefix}, timeout_s=120)
        assert_refused(result.returncode, result.stderr, "BATCHSCALE_S3_PREFIX")
        assert snapshot(root) == before


def test_valid_names_still_run(tmp_path):
    """The other side: a safe run id and name pass, and the sweep writes where it was told."""
    (tmp_path / "c.yaml").write_text("name: ok-name_1.x\nworkload: digits-mlp\n")
    out = tmp_path / "l1" / "s.parquet"
    result = run_cli(["sweep", "--config", "c.yaml", "--batch-sizes", "4", "--time-budget-s",
                      "0.05", "--run-id", "20260101T000000Z-ok", "--out", str(out)],
                     cwd=tmp_path, timeout_s=300)
    assert result.returncode == 0, result.stderr
    assert out.exists()
    assert sorted(os.listdir(tmp_path)) == ["c.yaml", "l1"]
