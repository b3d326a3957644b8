"""A table its stage leaves empty on purpose (a TrainingLoop's sweep, and so its regression
verdicts; the dataset manifest of a workload that reads its own data) says why in its Parquet
metadata: its validation checks the schema and passes saying
so, where an empty table without a reason still fails, and the run's summary and regressions
text say why there is nothing instead of a misleading "too few earlier runs". Curves left empty
because every trial failed first are refused with the trials' own reasons."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
from test_analyze import run_row
from test_publish import env_columns, sweep_row

from batchscale.checks.stage import validate_regressions, validate_runs, validate_sweep
from batchscale.config import load_config
from batchscale.errors import ValidationFailed
from batchscale.lake.summary import throughput_lines
from batchscale.lake.verdicts import regressions_markdown, verdict_lines
from batchscale.schemas import (
    REGRESSIONS,
    make_table,
    not_measured_reason,
    not_measured_table,
)
from batchscale.storage import read_table_file, write_table_atomic

WHY = "no throughput sweep: my:loop is a TrainingLoop"


def test_the_reason_survives_the_parquet_file_and_only_an_empty_table_has_one(tmp_path):
    path = tmp_path / "sweep.parquet"
    write_table_atomic(path, not_measured_table("sweep", env_columns("r1"), WHY))
    table = read_table_file(path)
    assert table.num_rows == 0 and not_measured_reason(table) == WHY
    assert not_measured_reason(make_table("sweep", [], env_columns("r1"))) is None
    # rows with the key are not "left empty": whatever the metadata says, they are checked
    measured = make_table("sweep", [sweep_row(4, 100.0)], env_columns("r1"))
    marked = measured.replace_schema_metadata({b"batchscale.not_measured": WHY.encode()})
    assert not_measured_reason(marked) is None


@pytest.mark.parametrize(("kind", "validate", "table"), [
    ("sweep", validate_sweep, lambda: not_measured_table("sweep", env_columns("r1"), WHY)),
    ("regressions", validate_regressions,
     lambda: not_measured_table("regressions", None, f"no throughput to judge: {WHY}")),
])
def test_a_table_left_empty_on_purpose_passes_saying_why(tmp_path, capsys, kind, validate,
                                                         table):
    path = tmp_path / f"{kind}.parquet"
    write_table_atomic(path, table())
    validate(load_config(), str(path), str(tmp_path / "r.json"), str(tmp_path / "r.html"))
    [result] = json.loads((tmp_path / "r.json").read_text())
    assert result["success"] and result["rows"] == 0 and WHY in result["not_measured"]
    assert "no rows to check: " in (tmp_path / "r.html").read_text()
    assert f"validate {kind}: no rows to check" in capsys.readouterr().out


@pytest.mark.parametrize(("kind", "validate", "table"), [
    ("sweep", validate_sweep, lambda: make_table("sweep", [], env_columns("r1"))),
    ("regressions", validate_regressions, lambda: pa.Table.from_pylist([], schema=REGRESSIONS)),
])
def test_an_empty_table_without_a_reason_still_fails(tmp_path, kind, validate, table):
    path = tmp_path / f"{kind}.parquet"
    write_table_atomic(path, table())
    with pytest.raises(ValidationFailed, match="an empty table means"):
        validate(load_config(), str(path), str(tmp_path / "r.json"), str(tmp_path / "r.html"))


def test_a_run_without_a_sweep_says_so_in_its_summary_and_regressions():
    assert throughput_lines(not_measured_table("sweep", env_columns("r1"), WHY)) == [
        f"throughput: none: {WHY}"]
    nothing = pd.DataFrame(columns=REGRESSIONS.names)
    assert verdict_lines(nothing) == [
        "regressions: not judged: the run has no throughput rows (a TrainingLoop has no sweep)"]
    assert "Not judged: the run has no throughput rows (a TrainingLoop has no sweep)." in \
        regressions_markdown(nothing)


def test_the_sweep_stage_of_a_loop_writes_an_empty_table_saying_why(tmp_path, monkeypatch,
                                                                    capsys):
    from batchscale.config import parse_config
    from batchscale.sweep.sweep import pipeline_stage

    monkeypatch.chdir(Path(__file__).parent)  # the stage imports loop_workloads from here
    cfg = parse_config({"workload": "loop_workloads:good_loop"})
    out = tmp_path / "sweep.parquet"
    assert pipeline_stage(cfg, "r1", None, str(out)) == []
    reason = not_measured_reason(read_table_file(out))
    assert reason is not None and "loop_workloads:good_loop is a TrainingLoop" in reason
    assert reason in capsys.readouterr().err


def test_runs_whose_trials_all_failed_before_an_evaluation_are_refused_naming_why(tmp_path):
    why = "broken (TrainingLoop.train) raised ValueError: my loop is broken (at broken.py:5)"
    rows = [{**run_row(b, "sqrt", 0.01, 0, 0, status="failed"), "stop_reason": why}
            for b in (8, 32)]
    paths = {name: str(tmp_path / f"{name}.parquet") for name in ("curves", "runs")}
    write_table_atomic(paths["curves"], make_table("curves", [], env_columns("r1")))
    write_table_atomic(paths["runs"], make_table("runs", rows, env_columns("r1")))
    with pytest.raises(ValidationFailed) as failed:
        validate_runs(load_config(), [paths["curves"]], [paths["runs"]],
                      *(str(tmp_path / name) for name in ("c.parquet", "r.parquet", "v.json",
                                                          "v.html")))
    assert str(failed.value).startswith(
        f"no trial recorded an evaluation: all 2 ended first, with: {why}\n[curves]")


@pytest.mark.parametrize(("workload", "how"), [
    ("contract_workloads:good", "(Workload.train_data and val_data)"),
    ("loop_workloads:good_loop", "(a TrainingLoop)"),
])
def test_data_prep_of_a_workload_with_its_own_data_prepares_nothing_and_says_why(
        tmp_path, monkeypatch, capsys, workload, how):
    """The config's dataset (digits) is not what such a run trains on: it is neither prepared
    nor published as the run's dataset, and the dataset check passes on the reason."""
    from batchscale.checks.stage import validate_dataset
    from batchscale.config import parse_config
    from batchscale.data.prep import run_stage
    from batchscale.shards import MANIFEST_FILE

    monkeypatch.chdir(Path(__file__).parent)  # the stage imports the workload from here
    cfg = parse_config({"workload": workload})
    run_stage(cfg, str(tmp_path / "data"))
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [MANIFEST_FILE]
    reason = not_measured_reason(read_table_file(tmp_path / "data" / MANIFEST_FILE))
    assert reason is not None and how in reason and "(digits)" in reason
    assert f"data_prep: {reason}" in capsys.readouterr().out
    validate_dataset(cfg, str(tmp_path / "data"), str(tmp_path / "v.json"),
                     str(tmp_path / "v.html"))
    [result] = json.loads((tmp_path / "v.json").read_text())
    assert result["success"] and result["rows"] == 0 and result["not_measured"] == reason


def test_an_empty_manifest_without_a_reason_still_fails_the_dataset_check(tmp_path):
    from batchscale.checks.stage import validate_dataset
    from batchscale.shards import MANIFEST_FILE

    write_table_atomic(tmp_path / MANIFEST_FILE, make_table("manifest", []))
    with pytest.raises(ValidationFailed, match="an empty table means"):
        validate_dataset(load_config(), str(tmp_path), str(tmp_path / "v.json"),
                         str(tmp_path / "v.html"))
