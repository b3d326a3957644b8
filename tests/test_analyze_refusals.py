"""`batchscale analyze` refusing a bad table, column mapping or setting: exit 2, a message
naming the problem (and, for a missing column, the --column flags that may map it), and nothing
written."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_analyze_cli import run_analyze

GOOD = "batch_size,seed,steps_to_target\n4,0,100\n8,0,60\n"
REFUSALS = {
    "missing file": ({}, ["does not exist"]),
    "unknown extension": ({"runs.xlsx": GOOD}, ["unknown file type '.xlsx'",
                                                "allowed: .parquet, .csv"]),
    "corrupt parquet": ({"runs.parquet": "PAR1 not really"}, ["not a valid Parquet file"]),
    "not utf-8": ({"runs.csv": b"\xff\xfe\x00batch\n1\n"}, ["not a readable CSV", "UTF-8"]),
    "empty file": ({"runs.csv": ""}, ["not a readable CSV"]),
    "header only": ({"runs.csv": "batch_size,steps_to_target\n"}, ["has no rows"]),
    "directory": ({"runs.csv/": ""}, ["not a file"]),
    "columns missing": ({"runs.csv": "bs,steps\n4,10\n"}, [
        "lacks batch_size; steps_to_target or examples_to_target",
        "Required: batch_size, and steps_to_target or examples_to_target",
        "Optional: seed, lr_rule, lr, status", "Columns found: bs, steps",
        "e.g. --column batch_size=bs --column steps_to_target=steps"]),
    "columns missing, nothing to guess from": ({"runs.csv": "a,b\n4,10\n"}, [
        "Columns found: a, b", "e.g. --column steps_to_target=<your column>"]),
    "columns missing, two candidates": ({"runs.csv": "batch,steps,step_ms\n4,10,1\n"}, [
        "e.g. --column batch_size=batch"]),
    "text in batch_size": ({"runs.csv": "batch_size,steps_to_target\n4,10\nabc,12\n"},
                           ["column 'batch_size' holds 'abc'", "whole numbers"]),
    "fractional batch": ({"runs.csv": "batch_size,steps_to_target\n4.5,10\n"},
                         ["'batch_size' holds 4.5", "row 1", "whole numbers"]),
    "non-positive batch": ({"runs.csv": "batch_size,steps_to_target\n4,10\n0,12\n-8,3\n"},
                           ["'batch_size' is not positive", "rows 2, 3", "≥ 1"]),
    "empty batch": ({"runs.csv": "batch_size,steps_to_target\n,10\n"},
                    ["'batch_size' is empty in row 1"]),
    "infinite steps": ({"runs.csv": "batch_size,steps_to_target\n4,inf\n"}, ["not finite"]),
    "negative steps": ({"runs.csv": "batch_size,steps_to_target\n4,-3\n"},
                       ["'steps_to_target' is not positive"]),
    "duplicate runs": ({"runs.csv": "batch_size,seed,steps_to_target\n4,0,10\n4,0,12\n"},
                       ["rows 1, 2", "repeat the same run (batch_size 4, seed 0)",
                        "different seeds"]),
    "unknown lr rule": ({"runs.csv": "batch_size,lr_rule,steps_to_target\n4,cosine,10\n"},
                        ["'cosine'", "constant, linear, sqrt, tuned"]),
    "unknown status": ({"runs.csv": "batch_size,status,steps_to_target\n4,done,10\n"},
                       ["'done'", "reached, not_reached, diverged"]),
    "steps and examples disagree": (
        {"runs.csv": "batch_size,steps_to_target,examples_to_target\n4,10,400\n"},
        ["'examples_to_target' disagrees with steps_to_target × batch_size"]),
    "lr with gaps": ({"runs.csv": "batch_size,lr,steps_to_target\n4,0.1,10\n8,,6\n"},
                     ["'lr' is empty in row 2"]),
    "sweep without times": ({"runs.csv": GOOD, "sweep.csv": "batch_size,foo\n4,1\n"},
                            ["sweep table", "step_time_median_s or samples_per_s"]),
    "text in a sweep time": ({"runs.csv": GOOD, "sweep.csv": "batch_size,samples_per_s\n4,fast\n"},
                             ["'samples_per_s' holds 'fast'", "expected numbers"]),
    "unknown input mode": ({"runs.csv": GOOD,
                            "sweep.csv": "batch_size,samples_per_s,input_mode\n4,9,disk\n"},
                           ["'disk'", "synthetic, real"]),
}
COLUMN_REFUSALS = {
    "no equals sign": (["--column", "steps"], ["write NAME=SOURCE"]),
    "unknown name": (["--column", "epochs=seed"], ["'epochs' is not a column batchscale reads"]),
    "misspelled name": (["--column", "batchsize=seed"], ["Did you mean 'batch_size'?",
                                                         "The runs table's: batch_size, and"]),
    "unknown source": (["--column", "steps_to_target=nope"], ["no column 'nope'",
                                                               "seed, steps_to_target"]),
    "mapped twice": (["--column", "seed=a", "--column", "seed=b"], ["mapped twice"]),
    "sweep not given": (["--column", "sweep.batch_size=seed"], ["no sweep table given"]),
    "both columns": (["--column", "steps_to_target=seed"], ["has both 'steps_to_target'"]),
    "bad setting": (["--bootstrap-samples", "0"], ["analysis.bootstrap_samples"]),
    "bad run id": (["--run-id", "../x"], ["run id '../x' is not allowed"]),
    "missing config": (["--config", "nope.yaml"], ["cannot read config nope.yaml"]),
}


def assert_refused(tmp_path: Path, code: int, stdout: str, stderr: str, needles: list[str]):
    assert code == 2, stderr
    assert stderr.startswith("batchscale: error: ") and "Traceback" not in stderr
    for needle in needles:
        assert needle in stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / ".batchscale").exists()
    assert "analysis:" not in stdout


def write_files(tmp_path: Path, files: dict) -> None:
    for name, content in files.items():
        path = tmp_path / name.rstrip("/")
        if name.endswith("/"):
            path.mkdir()
        elif isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


@pytest.mark.parametrize("case", REFUSALS)
def test_bad_tables_are_refused_naming_the_problem(tmp_path, capsys, monkeypatch, case):
    files, needles = REFUSALS[case]
    monkeypatch.chdir(tmp_path)
    write_files(tmp_path, files)
    runs = next((n.rstrip("/") for n in files if n.startswith("runs")), "runs.csv")
    sweep = ["--sweep", "sweep.csv"] if "sweep.csv" in files else []
    assert_refused(tmp_path, *run_analyze([runs, *sweep], capsys), needles)


@pytest.mark.parametrize("case", COLUMN_REFUSALS)
def test_bad_column_mappings_and_settings_are_refused(tmp_path, capsys, monkeypatch, case):
    args, needles = COLUMN_REFUSALS[case]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs.csv").write_text(GOOD)
    assert_refused(tmp_path, *run_analyze(["runs.csv", *args, "--out", "out"], capsys), needles)


def test_a_column_is_guessed_only_where_one_users_column_holds_its_word():
    """The refusal's example maps the user's own columns where exactly one holds a word of the
    needed one; never a step time, whose unit a guess cannot know."""
    from batchscale.analysis.usertables import RUNS_INPUT, SWEEP_INPUT, _likely_sources

    assert _likely_sources(RUNS_INPUT, ["batch", "steps", "step_ms"]) == {"batch_size": "batch"}
    assert _likely_sources(RUNS_INPUT, ["abs_error", "n_iter"]) == {"steps_to_target": "n_iter"}
    assert _likely_sources(RUNS_INPUT, ["bs", "samples"]) == {
        "batch_size": "bs", "examples_to_target": "samples"}
    assert _likely_sources(SWEEP_INPUT, ["bs", "step_ms"]) == {"batch_size": "bs"}
    assert _likely_sources(SWEEP_INPUT, ["bs", "throughput"]) == {
        "batch_size": "bs", "samples_per_s": "throughput"}
