"""`batchscale analyze` on tables a user brings: batchscale's own tables read back as Parquet and
CSV give the analysis rows `analyze()` gives on the originals; a foreign CSV with other column
names is read through --column; steps come from examples; every bad input is refused with exit
2, a message naming the problem, and nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from test_analyze import make_runs, make_sweep

from batchscale import cli, schemas
from batchscale.analysis.analyze import analyze
from batchscale.analysis.usertables import (
    KNOWN_LR_RULES,
    complete_runs,
)
from batchscale.checks.suites import load_suite
from batchscale.cli.common import terminal_text
from batchscale.config import AnalysisConfig, load_config
from batchscale.errors import BadInput
from batchscale.external.stage import RUN_ID_PREFIX, read_user_table
from batchscale.schemas import OLD_LR_RULES
from batchscale.storage import read_table_file, write_table_atomic

BOOTSTRAP = 20  # resamples: enough to exercise the interval, few enough to stay fast
ENV = {field.name: "orig" if field.type == "string" else 1 for field in schemas.ENV_FIELDS}
INSTALLED = Path(sys.executable).with_name("batchscale")


def analysis_frame(rows: list[dict] | pa.Table) -> pd.DataFrame:
    """The analysis rows without the environment columns, for comparing two analyses."""
    table = rows if isinstance(rows, pa.Table) else schemas.make_table("analysis", rows, ENV)
    return table.select(schemas.ANALYSIS.names).to_pandas()


def records(frame: pd.DataFrame, kind: str) -> list[dict]:
    """`frame`'s rows for make_table: NaN as null, and integer columns as ints (pandas turned
    those with a gap into floats)."""
    schema = schemas.TABLES[kind]
    whole = {f.name for f in schema if pa.types.is_integer(f.type)}
    return [{k: None if pd.isna(v) else int(v) if k in whole else v for k, v in row.items()}
            for row in frame.to_dict("records")]


def batchscale_tables() -> tuple[pa.Table, pa.Table]:
    """A runs and a sweep table as the pipeline writes them (every schema column)."""
    runs = make_runs(seeds=(0, 1)).assign(target_val_accuracy=0.9, final_val_accuracy=0.91)
    sweep = make_sweep().assign(precision="fp32", timed_steps=20)
    return (schemas.make_table("runs", records(runs, "runs"), ENV),
            # a CPU sweep on two threads (no CUDA), as the quality notes read it
            schemas.make_table("sweep", records(sweep, "sweep"),
                               {**ENV, "threads": 2, "cuda_version": None}))


def save(table: pa.Table, path: Path) -> Path:
    if path.suffix == ".csv":
        pacsv.write_csv(table, path)
    else:
        write_table_atomic(path, table)
    return path


def run_analyze(args: list[str], capsys) -> tuple[int, str, str]:
    code = cli.main(["analyze", *args])
    out, err = capsys.readouterr()
    return code, out, err


# ------------------------------------------------------------------------------ round trips
@pytest.fixture(scope="module")
def originals() -> tuple[pa.Table, pa.Table, pd.DataFrame]:
    runs, sweep = batchscale_tables()
    result = analyze(sweep.to_pandas(), runs.to_pandas(), None,
                     AnalysisConfig(bootstrap_samples=BOOTSTRAP))
    return runs, sweep, analysis_frame(result.rows)


@pytest.mark.parametrize("suffix", [".parquet", ".csv"])
def test_batchscale_tables_give_the_pipelines_analysis(tmp_path, capsys, originals, suffix):
    runs, sweep, expected = originals
    out = tmp_path / "out"
    code, stdout, stderr = run_analyze(
        [str(save(runs, tmp_path / f"runs{suffix}")), "--sweep",
         str(save(sweep, tmp_path / f"sweep{suffix}")), "--bootstrap-samples", str(BOOTSTRAP),
         "--out", str(out)], capsys)
    assert code == 0, stderr
    table = read_table_file(out / "analysis.parquet")
    pd.testing.assert_frame_equal(analysis_frame(table), expected)
    # a table batchscale wrote says where it was measured; the analysis keeps that label
    for name in ("workload", "experiment", "device_name", "torch_version"):
        assert set(table.column(name).to_pylist()) == {"orig"}, name
    run_id = table.column("run_id")[0].as_py()
    assert run_id.startswith(RUN_ID_PREFIX)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["run_id"] == run_id and summary["notes"] == []  # nothing assumed
    assert summary["analysis_settings"]["bootstrap_samples"] == BOOTSTRAP
    assert terminal_text(summary["markdown"]) in stdout  # the stage's narrative, for a terminal
    assert "validate analysis: passed" in stdout and f"report: {out / 'report.html'}" in stdout
    assert "<html" in (out / "report.html").read_text()[:200].lower()
    # the sweep's own threads (2, on a CPU) reach the quality notes, not this analysis's
    threads = sweep.column("threads").to_pylist()
    assert set(threads) == {2} and summary["summary"]["quality"]["cpu_threads"] == 2
    assert "ran on 2 CPU threads" in (out / "report.html").read_text()


def test_the_same_inputs_land_in_the_same_default_directory(tmp_path, capsys, monkeypatch,
                                                            originals):
    """No --out: .batchscale/analyze/<external-digest>/, a digest of inputs and settings; the
    settings come from --config's analysis section."""
    runs, sweep, _ = originals
    monkeypatch.chdir(tmp_path)
    # batchscale's trainer records the optimizer it built (and so ran the config's schedule)
    trained = runs.to_pandas().assign(optimizer="sgd")
    save(pa.Table.from_pandas(trained, preserve_index=False), tmp_path / "runs.parquet")
    (tmp_path / "mine.yaml").write_text("name: mine\nanalysis:\n  bootstrap_samples: 7\n")
    code, stdout, stderr = run_analyze(["runs.parquet", "--config", "mine.yaml"], capsys)
    assert code == 0, stderr
    (made,) = (tmp_path / ".batchscale" / "analyze").iterdir()
    assert made.name.startswith(RUN_ID_PREFIX) and f"analysis: {made}" in stdout
    assert sorted(p.name for p in made.iterdir()) == [
        "analysis.parquet", "plan.parquet", "report.html", "summary.json", "validation.html",
        "validation.json"]
    summary = json.loads((made / "summary.json").read_text())
    assert summary["analysis_settings"]["bootstrap_samples"] == 7
    # the config the runs ran with gives the warm-up that goes with the learning rate
    warmup = load_config(tmp_path / "mine.yaml").convergence.warmup_steps
    assert (f"reached by a linear warm-up over the first {warmup} steps, as the runs had "
            "(convergence.warmup_steps)") in stdout
    assert "note: the learning rate is given without the warm-up" not in stderr
    code, stdout, stderr = run_analyze(["runs.parquet"], capsys)
    assert code == 0 and "linear warm-up" not in stdout
    # summary.json and the report say it too, not only the terminal
    unknown = "with the warm-up the runs had, which the runs table does not record"
    assert unknown in stdout
    (again,) = [p for p in (tmp_path / ".batchscale" / "analyze").iterdir() if p != made]
    assert unknown in (again / "summary.json").read_text()
    assert ("note: the learning rate is given without the warm-up the trials ran with (the runs "
            "table does not record convergence.warmup_steps)") in stderr


# ------------------------------------------------------------------------------ other tables
S_MIN, E_MIN = 1000.0, 64000.0  # B_crit = 64
FOREIGN_BATCHES = (16, 32, 64, 128, 256, 512, 1024)


def foreign_runs_csv(path: Path) -> pd.DataFrame:
    """Another team's log: their column names, three runs per batch size, 3 % noise, time
    0.01 s per step at batch 512 growing with B."""
    rng = np.random.default_rng(3)
    rows = []
    for batch in FOREIGN_BATCHES:
        for run in range(3):
            steps = round((S_MIN + E_MIN / batch) * (1 + rng.uniform(-0.03, 0.03)))
            rows.append({"bs": batch, "run": run, "steps": steps,
                         "secs": round(steps * 0.01 * (1 + batch / 512), 3)})
    frame = pd.DataFrame(rows)
    frame.to_csv(path, index=False)
    return frame


def test_a_foreign_csv_is_read_through_column_mapping(tmp_path, capsys):
    frame = foreign_runs_csv(tmp_path / "theirs.csv")
    pd.DataFrame({"batch": FOREIGN_BATCHES, "throughput": [1e4 * b / (b + 64)
                                                          for b in FOREIGN_BATCHES]}) \
        .to_csv(tmp_path / "speed.csv", index=False)
    out = tmp_path / "out"
    code, _, stderr = run_analyze(
        [str(tmp_path / "theirs.csv"), "--sweep", str(tmp_path / "speed.csv"),
         "--column", "batch_size=bs", "--column", "seed=run", "--column", "steps_to_target=steps",
         "--column", "time_to_target_s=secs", "--column", "sweep.batch_size=batch",
         "--column", "samples_per_s=throughput", "--bootstrap-samples", str(BOOTSTRAP),
         "--out", str(out)], capsys)
    assert code == 0, stderr
    rows = read_table_file(out / "analysis.parquet").to_pandas()
    medians = frame.groupby("bs")["steps"].median()
    assert rows["batch_size"].tolist() == list(FOREIGN_BATCHES)
    assert rows["steps_to_target"].tolist() == medians.loc[list(FOREIGN_BATCHES)].tolist()
    assert set(rows["lr_rule"]) == {"tuned"}
    assert rows["b_crit"].iloc[0] == pytest.approx(E_MIN / S_MIN, rel=0.25)
    notes = json.loads((out / "summary.json").read_text())["notes"]
    assert any("labelled 'tuned'" in n for n in notes) and any("no lr column" in n for n in notes)
    assert "note: runs: no lr column" in stderr  # what was assumed is said, not hidden
    # The stand-in LR of a table without one is never recommended.
    summary = json.loads((out / "summary.json").read_text())["summary"]
    # A table that does not name its target is not given batchscale's default one.
    assert summary["target"].startswith("the target of your runs (not named")
    recommendation = summary["recommendation"]
    assert recommendation["batch_size"] is not None
    assert recommendation["learning_rate"] is None
    assert recommendation["learning_rate_reason"] == ("the runs table gives no learning rates "
                                                      "(no lr column)")


def test_examples_to_target_alone_gives_the_steps_analysis(tmp_path, capsys):
    runs = make_runs(rules=("sqrt",), seeds=(0, 1))
    given = runs[["batch_size", "lr_rule", "lr", "seed"]].assign(
        examples_to_target=runs["steps_to_target"] * runs["batch_size"])
    given.to_csv(tmp_path / "examples.csv", index=False)
    out = tmp_path / "out"
    code, _, stderr = run_analyze([str(tmp_path / "examples.csv"), "--bootstrap-samples",
                                   str(BOOTSTRAP), "--out", str(out)], capsys)
    assert code == 0, stderr
    assert "steps_to_target = examples_to_target ÷ batch_size" in stderr
    by_steps = runs[["batch_size", "lr_rule", "lr", "seed", "status", "steps_to_target"]]
    expected = analyze(None, by_steps, None, AnalysisConfig(bootstrap_samples=BOOTSTRAP))
    pd.testing.assert_frame_equal(
        analysis_frame(read_table_file(out / "analysis.parquet")), analysis_frame(expected.rows))


def completed(tmp_path: Path, text: str):
    path = tmp_path / "runs.csv"
    path.write_text(text)
    return complete_runs(read_user_table(str(path), "runs table"))


def test_a_parquet_file_without_an_extension_is_read_by_its_content(tmp_path):
    """A pipeline run's artifacts (.batchscale/pipeline_root/…/runs) carry no extension."""
    path = tmp_path / "runs"
    write_table_atomic(path, pa.table({"batch_size": [4, 8], "steps_to_target": [100, 60]}))
    assert read_user_table(str(path), "runs table").table.num_rows == 2
    (tmp_path / "notes").write_text("batch_size,steps_to_target\n4,100\n")
    with pytest.raises(BadInput, match="unknown file type '\\(no extension\\)'.*a Parquet file "
                                       "without one"):
        read_user_table(str(tmp_path / "notes"), "runs table")


def test_fractional_examples_round_up_to_whole_steps(tmp_path):
    runs = completed(tmp_path, "batch_size,examples_to_target\n10,1000.5\n10,1000\n")
    assert [r["steps_to_target"] for r in runs.rows] == [101, 100]
    assert any("rounded up" in note for note in runs.notes)


def test_empty_or_nan_steps_count_as_not_reached_and_say_so(tmp_path):
    runs = completed(tmp_path, "batch_size,steps_to_target\n8,100\n8,\n8,NaN\n")
    assert [r["status"] for r in runs.rows] == ["reached", "not_reached", "not_reached"]
    assert any("rows 2, 3" in n and "counted as not reached" in n for n in runs.notes)
    runs = completed(tmp_path, "batch_size,steps_to_target,status\n8,,reached\n8,5,reached\n")
    assert [r["status"] for r in runs.rows] == ["not_reached", "reached"]
    assert any("say reached" in n for n in runs.notes)
    assert [r["seed"] for r in runs.rows] == [0, 1]  # no seed column: each row is one run


def test_rows_identical_in_every_column_are_named_where_no_seed_tells_them_apart(tmp_path):
    runs = completed(tmp_path, "batch_size,steps_to_target\n8,100\n16,60\n8,100\n")
    assert [r["seed"] for r in runs.rows] == [0, 0, 1]
    assert any("rows 1 and 3 are identical in every column" in n and "if one is a copy" in n
               for n in runs.notes)
    assert any("no workers column: each run is read as 1 worker" in n for n in runs.notes)
    different = completed(tmp_path, "batch_size,steps_to_target\n8,100\n8,110\n")
    assert not any("identical" in n for n in different.notes)


def test_the_lr_rules_read_are_the_ones_the_suites_allow():
    """Today's rules, and the old names rows written before still carry."""
    for kind in ("runs", "analysis"):
        (allowed,) = [e["kwargs"]["value_set"] for e in load_suite(kind)["expectations"]
                      if e["kwargs"].get("column") == "lr_rule" and "value_set" in e["kwargs"]]
        assert set(allowed) == set(KNOWN_LR_RULES) | set(OLD_LR_RULES), kind


def test_a_table_with_the_old_rule_name_is_read_as_tuned(tmp_path):
    runs = completed(tmp_path, "batch_size,lr_rule,lr,steps_to_target\n8,grid,0.1,50\n"
                               "8,grid,0.2,40\n")
    assert {r["lr_rule"] for r in runs.rows} == {"tuned"}
    assert any("'grid' is read as 'tuned'" in n for n in runs.notes)


# ------------------------------------------------------------------- help, installed command
def test_help_documents_the_columns(capsys):
    with pytest.raises(SystemExit):
        cli.main(["analyze", "--help"])
    text = capsys.readouterr().out
    for needle in ("steps_to_target or examples_to_target", "--column NAME=SOURCE", "--sweep",
                   "lr_rule (constant, linear, sqrt, tuned", "--bootstrap-samples", "--out"):
        assert needle in text


def test_installed_command_exit_codes(tmp_path):
    """The real `.venv/bin/batchscale` process: 2 on a bad table, 0 on a foreign CSV (and no
    abort at interpreter exit after reading CSV with pyarrow's threads)."""
    (tmp_path / "bad.csv").write_text("batch_size,steps_to_target\nabc,3\n")
    bad = subprocess.run([str(INSTALLED), "analyze", "bad.csv"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "holds 'abc'" in bad.stderr and "Traceback" not in bad.stderr
    assert not (tmp_path / ".batchscale").exists()
    foreign_runs_csv(tmp_path / "theirs.csv")
    good = subprocess.run(
        [str(INSTALLED), "analyze", "theirs.csv", "--column", "batch_size=bs", "--column",
         "steps_to_target=steps", "--bootstrap-samples", "5", "--out", "out"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert good.returncode == 0, good.stderr
    assert (tmp_path / "out" / "analysis.parquet").is_file()
    assert "validate analysis: passed" in good.stdout


def test_a_table_without_lr_rule_is_answered_with_the_rule_not_given(tmp_path, capsys):
    """Rows without lr_rule are labelled grid for the tables, but the answer does not present
    that label as a rule: "LR rule: not given", and the fit's heading says what S(B) is."""
    (tmp_path / "pub.csv").write_text(
        "batch_size,steps_to_target,time_to_target_s\n8,1000,10\n16,520,5.6\n32,280,3.2\n"
        "64,160,2.1\n128,100,1.6\n256,80,1.7\n")
    code, out, err = run_analyze([str(tmp_path / "pub.csv"), "--out", str(tmp_path / "a")],
                                 capsys)
    assert code == 0, err
    assert "LR rule: not given — the runs table gives no lr_rule" in out
    assert "(no LR rule given: the fewest steps over the runs' learning rates)" in out
    assert "grid LR rule" not in out and "LR rule: grid" not in out


def test_runs_an_adaptive_search_chose_are_read_at_its_level(tmp_path, capsys):
    """`batchscale converge --strategy adaptive --out d` writes d/runs.parquet beside
    d/decisions.parquet; analyzing d/runs.parquet reads B_crit's interval at the search's
    level (98 %) and says why, as the pipeline's report does. A decisions file that cannot be
    read is refused naming it, not silently ignored."""
    runs, sweep = batchscale_tables()
    save(runs, tmp_path / "runs.parquet")
    grid = tmp_path / "grid"
    code, stdout, stderr = run_analyze([str(tmp_path / "runs.parquet"), "--bootstrap-samples",
                                        str(BOOTSTRAP), "--out", str(grid)], capsys)
    assert code == 0, stderr
    assert "read at the 98% level" not in stdout
    # (the search's rule and target: the runs' own, so its section reads their fit)
    write_table_atomic(tmp_path / "decisions.parquet", search_decisions(runs, grid_recorded=True))
    code, stdout, stderr = run_analyze([str(tmp_path / "runs.parquet"), "--bootstrap-samples",
                                        str(BOOTSTRAP), "--out", str(tmp_path / "s")], capsys)
    assert code == 0, stderr
    assert "an adaptive search chose these trials, so B_crit's interval is read at 98%" in stderr
    assert "read at the 98% level" in stdout
    summary = json.loads((tmp_path / "s" / "summary.json").read_text())
    assert summary["analysis_settings"]["b_crit_read_level"] == 0.98
    # The search's own section, its cost against the grid its decisions record.
    assert "Adaptive search\n---" in stdout and "a grid of 7 batch sizes × 3 seeds" in stdout
    assert any("a grid of 7 batch sizes × 3 seeds" in s for s in summary["adaptive_search"])
    assert "<h2>Adaptive search</h2>" in (tmp_path / "s" / "report.html").read_text()

    # Decisions written before they recorded their grid: the batch sizes and seeds that ran.
    write_table_atomic(tmp_path / "decisions.parquet", search_decisions(runs, grid_recorded=False))
    code, stdout, stderr = run_analyze([str(tmp_path / "runs.parquet"), "--bootstrap-samples",
                                        str(BOOTSTRAP), "--out", str(tmp_path / "old")], capsys)
    ran = runs.to_pandas()
    assert code == 0, stderr
    assert (f"a grid of {ran['batch_size'].nunique()} batch sizes × {ran['seed'].nunique()} seeds"
            in stdout)

    written = search_decisions(runs, grid_recorded=True)
    spent = written.schema.get_field_index("examples_spent")
    holed = written.set_column(spent, pa.field("examples_spent", pa.int64()),
                               pa.array([None, 2000, 3000], pa.int64()))
    for content, needle in ((pa.table({"step": [0, 1]}), "missing columns"), (None, "Parquet"),
                            (holed, "examples_spent")):
        path = tmp_path / "decisions.parquet"
        path.unlink()
        if content is None:
            path.write_bytes(b"not parquet")
        else:
            write_table_atomic(path, content)
        code, _, stderr = run_analyze([str(tmp_path / "runs.parquet"), "--out",
                                       str(tmp_path / "bad")], capsys)
        assert code == 2 and "decisions.parquet beside the runs table cannot be read" in stderr
        assert needle in stderr and "move it away" in stderr and "Traceback" not in stderr
        assert not (tmp_path / "bad").exists()


def search_decisions(runs: pa.Table, grid_recorded: bool) -> pa.Table:
    """A search's decisions over `runs`'s rule and target as `converge --strategy adaptive`
    writes them: probe, place, stop (in a table of the layout before the grid columns when not
    `grid_recorded`)."""
    from test_adaptive_tables import ENV as SEARCH_ENV
    from test_adaptive_tables import decision

    first = runs.slice(0, 1).to_pylist()[0]
    grid = {"grid_batch_sizes": [4, 8, 16, 32, 64, 128, 256], "grid_seeds": 3,
            "lr_rule": first["lr_rule"], "target_metric": "val_accuracy",
            "target_value": first["target_val_accuracy"]}
    rows = [decision(0, action="probe", batch_size=16, seed=0), decision(1, action="place"),
            decision(2, action="stop", batch_size=None, seed=None,
                     reason="interval narrow enough at 90 %")]
    table = schemas.make_table("decisions", [r | grid for r in rows], SEARCH_ENV)
    return table if grid_recorded else table.drop_columns(["grid_batch_sizes", "grid_seeds"])


def test_tables_that_do_not_say_where_they_were_measured_are_labelled_external():
    """measured_env: a column absent, null or with several values leaves the field unknown."""
    from batchscale.external.stage import measured_env

    mixed = pa.table({"workload": ["a", "b"], "device_name": [None, None],
                      "experiment": ["e", "e"], "torch_version": [2, 2]})
    assert measured_env(mixed) == {"experiment": "e"}  # a number is not a version label
    assert measured_env(pa.table({"steps_to_target": [1, 2]})) == {}
    large = pa.table({"workload": pa.array(["w", "w"], pa.large_string())})
    assert measured_env(large) == {"workload": "w"}  # as pandas may write strings


def test_the_terminal_gets_the_answer_without_markdown_marks():
    """`analyze` prints the narrative for a terminal: a heading underlined, bold and code marks
    dropped, the words and list items kept."""
    text = terminal_text("## Why\n\n- **Batch size: 64** — fastest (`analysis.x`), 2 ** 3 kept")
    assert text.splitlines() == ["Why", "---", "", "- Batch size: 64 — fastest (analysis.x), "
                                 "2 ** 3 kept"]


@pytest.mark.parametrize(("command", "written"), [("report", "report.html"),
                                                  ("plan", "plan.parquet")])
def test_an_analyze_run_id_is_refused_by_the_lake_commands_naming_where_its_outputs_are(
        tmp_path, monkeypatch, capsys, command, written):
    """`analyze` never publishes: `report`/`plan --run-id external-…` say where its report and
    plan are instead of starting a local store to look for them in the lake."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("BATCHSCALE_S3_ENDPOINT", raising=False)
    code = cli.main([command, "--run-id", "external-10a341a1e66a"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "is `batchscale analyze`'s" in err and f"analyze/external-10a341a1e66a/{written}" in err
    assert "store:" not in err and not (tmp_path / ".batchscale").exists()

