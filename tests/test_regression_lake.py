"""Regression detection through the real lake (SeaweedFS): several runs published in a row,
the history the publish stage reads back (incomplete, foreign, damaged and older partitions),
suspected then confirmed verdicts with their attribution, and the gate. The judging rules
themselves, on histories held in memory: test_regression.py."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from test_publish import (
    WORKLOAD,
    config_json,
    env_columns,
    publish_synthetic_run,
    sweep_row,
    write_run_files,
)
from test_regression import BATCHES, BUSY_REASON, DROP, MEAN_RATE, NOISE_SHARE, measured_row

from batchscale.lake.publish import gate_stage, run_manifest_key, run_stage, table_key
from batchscale.lake.regression import (
    CONFIRMED,
    NO_REGRESSION,
    NOT_JUDGED,
    SUSPECTED,
    RegressionFound,
    read_history,
)
from batchscale.schemas import REGRESSIONS, SWEEP, make_table
from batchscale.storage import parquet_bytes, read_table_file, write_table_atomic
from helpers import store_env

# --------------------------------------------------------------------- through the real lake


def test_lake_history_confirms_the_drop_fails_the_gate_after_publishing(
        object_store, monkeypatch, tmp_path, capsys):
    rng = np.random.default_rng(3)
    for i in range(6):
        rates = {b: MEAN_RATE * (1 + NOISE_SHARE * rng.standard_normal()) for b in (4, 64)}
        publish_synthetic_run(object_store, monkeypatch, tmp_path, f"20260401T00000{i}Z-h",
                              rates)
    first = publish_synthetic_run(object_store, monkeypatch, tmp_path, "20260401T000009Z-drop1",
                                  {4: MEAN_RATE, 64: (1 - DROP) * MEAN_RATE})
    assert first["regressions"] == []  # suspected only: nothing fails on one run
    gate_stage(config_json(fail_on_regression=True),
               str(tmp_path / "20260401T000009Z-drop1" / "out" / "regressions.parquet"))
    run_id = "20260402T000000Z-drop"
    manifest = publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id,
                                     {4: MEAN_RATE, 64: (1 - DROP) * MEAN_RATE})
    [cell] = manifest["regressions"]
    assert "batch 64" in cell and "over 5 runs" in cell  # history_runs = 5
    verdict_table = object_store.get_table(
        table_key(object_store, "regressions", "2026-04-02", run_id)).to_pandas()
    assert dict(zip(verdict_table["batch_size"], verdict_table["verdict"], strict=True)) == {
        4: NO_REGRESSION, 64: CONFIRMED}
    report = next(o["key"] for o in manifest["objects"] if o["key"].endswith(".html"))
    page = object_store.get_bytes(report).decode()
    assert "<h2>Regressions</h2>" in page and "1 of 2 judged cells regressed" in page
    # where the next run should land, from the published history: stored and said
    steady = verdict_table.set_index("batch_size").loc[4]
    assert steady["next_run_low"] <= steady["samples_per_s"] <= steady["next_run_high"]
    assert steady["next_run_basis"] == "history of 8 runs"  # 6 earlier, drop1 and this one
    assert "Next run: the next comparable run should land within" in page
    verdict_file = str(tmp_path / run_id / "out" / "regressions.parquet")
    capsys.readouterr()
    gate_stage(config_json(fail_on_regression=False), verdict_file)
    assert "not failing" in capsys.readouterr().out
    with pytest.raises(RegressionFound, match="batch 64") as err:
        gate_stage(config_json(fail_on_regression=True), verdict_file)
    assert err.value.exit_code == 4 and "tables are published" in str(err.value)


def test_history_ignores_incomplete_runs_and_other_workloads(
        object_store, monkeypatch, tmp_path):
    for i in range(2):
        publish_synthetic_run(object_store, monkeypatch, tmp_path, f"20260501T00000{i}Z-ok",
                              {4: MEAN_RATE})
    publish_synthetic_run(object_store, monkeypatch, tmp_path, "20260501T000009Z-other",
                          {4: MEAN_RATE}, workload="mnist-mlp")
    partial = "20260501T000005Z-partial"  # tables uploaded, manifest never written
    table = make_table("sweep", [sweep_row(4, 1.0)], env_columns(partial))
    object_store.put_bytes(table_key(object_store, "sweep", "2026-05-01", partial),
                           parquet_bytes(table))
    history = read_history(object_store, "20260502T000000Z-now", [WORKLOAD])
    assert history["run_id"].tolist() == ["20260501T000000Z-ok", "20260501T000001Z-ok"]
    assert read_history(object_store, "x", ["no-such-workload"]) is None


def test_a_stray_object_and_a_damaged_manifest_do_not_stop_the_next_publish(
        object_store, monkeypatch, tmp_path, capsys):
    """Publish reads the lake's history before writing: a foreign file under the sweep table
    and a run whose manifest is not JSON are skipped with warnings, and the run is judged
    against the healthy runs only."""
    for i in range(3):
        publish_synthetic_run(object_store, monkeypatch, tmp_path, f"20260701T00000{i}Z-h",
                              {4: MEAN_RATE})
    stray = object_store.key("sweep", "date=2026-07-01", "run_id=20260701T000001Z-h",
                             "junk.bin")
    object_store.put_bytes(stray, b"\x00 not parquet")
    damaged = "20260701T000005Z-damaged"
    table = make_table("sweep", [sweep_row(4, MEAN_RATE / 2)], env_columns(damaged))
    object_store.put_bytes(table_key(object_store, "sweep", "2026-07-01", damaged),
                           parquet_bytes(table))
    object_store.put_bytes(run_manifest_key(object_store, damaged), b"not json")
    capsys.readouterr()
    run_id = "20260702T000000Z-now"
    manifest = publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id,
                                     {4: MEAN_RATE})
    assert manifest["regressions"] == []
    verdict = object_store.get_table(
        table_key(object_store, "regressions", "2026-07-02", run_id)).to_pandas()
    assert verdict["history_runs"].tolist() == [3]
    assert verdict["history_median"].tolist() == [MEAN_RATE]
    warnings = capsys.readouterr().err
    bucket = object_store.settings.bucket
    assert f"s3://{bucket}/{stray}" in warnings
    assert f"s3://{bucket}/{run_manifest_key(object_store, damaged)}" in warnings


# ------------------------------- sweep rows with quality flags, published run by run


def publish_rows(store, monkeypatch, tmp_path, run_id: str, rows: list[dict],
                 drop: tuple[str, ...] = (), commit: str | None = None) -> dict:
    """Publish one run whose sweep rows are `rows`; `drop` removes sweep columns first, as in
    partitions published before those columns existed; `commit` replaces the git commit."""
    for name, value in store_env(store).items():
        monkeypatch.setenv(name, value)
    paths = write_run_files(tmp_path / run_id, run_id, {}, sweep=rows)
    sweep = read_table_file(paths["sweep_path"])
    if drop:
        sweep = sweep.drop_columns(list(drop))
    if commit:
        index = sweep.schema.get_field_index("git_commit")
        sweep = sweep.set_column(index, "git_commit", pa.array([commit] * sweep.num_rows))
    write_table_atomic(paths["sweep_path"], sweep)
    out = tmp_path / run_id / "out"
    out.mkdir(exist_ok=True)
    return run_stage(config_json(fail_on_regression=True), run_id,
                     regressions_path=str(out / "regressions.parquet"),
                     markdown_path=str(out / "regressions.md"), **paths)


def stored_verdicts(store, date: str, run_id: str) -> pd.DataFrame:
    return store.get_table(table_key(store, "regressions", date, run_id)).to_pandas()


NEWER_COLUMNS = ("rounds", "round_spread", "retries", "quality", "quality_reason",
                 "load_avg_1m", "usable_cpus", "process_cpu_per_wall", "cpu_wait_share",
                 "threads_oversubscribed", "gpu_other_processes", "gpu_sm_clock_mhz",
                 "gpu_temperature_c", "channels_last", "compiled", "image_size_px")


def test_four_runs_through_the_lake_the_busy_one_is_recorded_not_judged(
        object_store, monkeypatch, tmp_path):
    quiet = [measured_row(b, MEAN_RATE) for b in BATCHES]
    for i in range(3):
        publish_rows(object_store, monkeypatch, tmp_path, f"20260801T00000{i}Z-q", quiet)
    run_id = "20260801T000009Z-busy"
    busy = [measured_row(b, 0.05 * MEAN_RATE, quality="unstable", reason=BUSY_REASON,
                         cpu_wait=0.45) for b in BATCHES]
    manifest = publish_rows(object_store, monkeypatch, tmp_path, run_id, busy)
    assert manifest["regressions"] == []
    stored = object_store.get_table(table_key(object_store, "regressions", "2026-08-01",
                                              run_id))
    assert stored.schema == REGRESSIONS
    frame = stored.to_pandas()
    assert set(frame["verdict"]) == {NOT_JUDGED}
    assert frame["reason"].str.contains("measurement disturbed").all()
    gate_stage(config_json(fail_on_regression=True),
               str(tmp_path / run_id / "out" / "regressions.parquet"))
    page = object_store.get_bytes(next(o["key"] for o in manifest["objects"]
                                       if o["key"].endswith(".html"))).decode()
    assert "Not judged: measurement disturbed" in page
    # The busy run is no baseline for the next one: a 30 % drop is judged against quiet runs,
    # suspected at the first slow run and confirmed at the second.
    slow_rows = [measured_row(b, 0.7 * MEAN_RATE) for b in BATCHES]
    slow = publish_rows(object_store, monkeypatch, tmp_path, "20260801T000010Z-slow", slow_rows)
    assert slow["regressions"] == []
    first = stored_verdicts(object_store, "2026-08-01", "20260801T000010Z-slow")
    assert set(first["verdict"]) == {SUSPECTED} and set(first["history_runs"]) == {3}
    again = publish_rows(object_store, monkeypatch, tmp_path, "20260801T000011Z-slow2",
                         slow_rows)
    assert len(again["regressions"]) == len(BATCHES)
    assert all("over 3 runs" in cell for cell in again["regressions"])


def test_a_slowdown_in_two_published_runs_is_confirmed_and_attributed_to_the_new_commit(
        object_store, monkeypatch, tmp_path, capsys):
    """The issue's "done when": a genuine slowdown (new code, same fingerprint) in two
    consecutive runs, through the publish entry point and a real store: the first is suspected
    and fails nothing; the second is confirmed, names the commit range, fails the gate."""
    quiet = [measured_row(b, MEAN_RATE) for b in BATCHES]
    for i in range(3):
        publish_rows(object_store, monkeypatch, tmp_path, f"20261101T00000{i}Z-q", quiet)
    slow = [measured_row(b, 0.7 * MEAN_RATE) for b in BATCHES]
    first = publish_rows(object_store, monkeypatch, tmp_path, "20261101T000003Z-slow1", slow,
                         commit="def456")
    assert first["regressions"] == []
    assert set(stored_verdicts(object_store, "2026-11-01", "20261101T000003Z-slow1")[
        "verdict"]) == {SUSPECTED}
    capsys.readouterr()
    gate_stage(config_json(fail_on_regression=True),
               str(tmp_path / "20261101T000003Z-slow1" / "out" / "regressions.parquet"))
    assert "suspected (one run below the baseline" in capsys.readouterr().out
    run_id = "20261101T000004Z-slow2"
    manifest = publish_rows(object_store, monkeypatch, tmp_path, run_id, slow, commit="def456")
    assert len(manifest["regressions"]) == len(BATCHES)
    stored = stored_verdicts(object_store, "2026-11-01", run_id)
    assert set(stored["verdict"]) == {CONFIRMED} and set(stored["runs_below"]) == {2}
    assert set(stored["last_good_run_id"]) == {"20261101T000002Z-q"}
    assert set(stored["first_bad_run_id"]) == {"20261101T000003Z-slow1"}
    assert set(stored["last_good_commit"]) == {"abc123"}
    assert set(stored["first_bad_commit"]) == {"def456"}
    expected = ("between commit abc123 (run 20261101T000002Z-q of 2026-11-01, 10,000 samples/s)"
                " and def456 (run 20261101T000003Z-slow1 of 2026-11-01, 7,000 samples/s); "
                "changed: git_commit abc123 -> def456")
    assert all(expected in cell for cell in manifest["regressions"])
    page = object_store.get_bytes(next(o["key"] for o in manifest["objects"]
                                       if o["key"].endswith(".html"))).decode()
    assert "regressed</strong> (confirmed)" in page and "between commit abc123" in page
    with pytest.raises(RegressionFound, match="git_commit abc123 -> def456"):
        gate_stage(config_json(fail_on_regression=True),
                   str(tmp_path / run_id / "out" / "regressions.parquet"))


def test_old_partitions_without_the_quality_columns_count_as_stable(
        object_store, monkeypatch, tmp_path):
    """Rows published by earlier versions carry no quality, conditions or sweep-setting columns:
    read as null, they are stable and match any fingerprint value (not recorded then)."""
    assert set(NEWER_COLUMNS) <= set(SWEEP.names)
    old = [sweep_row(b, MEAN_RATE) for b in BATCHES]
    for i in range(3):
        publish_rows(object_store, monkeypatch, tmp_path, f"20260901T00000{i}Z-old", old,
                     drop=NEWER_COLUMNS)
    history = read_history(object_store, "20260902T000000Z-x", [WORKLOAD])
    assert history["quality"].isna().all() and len(history) == 3 * len(BATCHES)
    publish_rows(object_store, monkeypatch, tmp_path, "20260902T000000Z-new",
                 [measured_row(b, 0.7 * MEAN_RATE) for b in BATCHES])
    verdict = stored_verdicts(object_store, "2026-09-02", "20260902T000000Z-new")
    assert set(verdict["verdict"]) == {SUSPECTED} and set(verdict["history_runs"]) == {3}


def test_unstable_rows_are_no_baseline_in_a_lake_that_also_holds_older_partitions(
        object_store, monkeypatch, tmp_path):
    """An upgraded lake: old partitions first, then runs with quality flags. The flags of the
    newer runs are still read (the lake reads under today's schema), so they leave the
    baseline."""
    publish_rows(object_store, monkeypatch, tmp_path, "20261001T000000Z-old",
                 [sweep_row(b, MEAN_RATE) for b in BATCHES], drop=NEWER_COLUMNS)
    busy = [measured_row(b, 0.05 * MEAN_RATE, quality="unstable", reason=BUSY_REASON)
            for b in BATCHES]
    publish_rows(object_store, monkeypatch, tmp_path, "20261001T000001Z-busy", busy)
    history = read_history(object_store, "20261002T000000Z-x", [WORKLOAD])
    assert history["quality"].isna().tolist() == [True] * len(BATCHES) + [False] * len(BATCHES)
    assert set(history["quality"].dropna()) == {"unstable"}
    for i in (2, 3):
        publish_rows(object_store, monkeypatch, tmp_path, f"20261001T00000{i}Z-q",
                     [measured_row(b, MEAN_RATE) for b in BATCHES])
    publish_rows(object_store, monkeypatch, tmp_path, "20261002T000000Z-slow",
                 [measured_row(b, 0.7 * MEAN_RATE) for b in BATCHES])
    # Baseline: the old run and the two quiet ones, never the busy one.
    verdict = stored_verdicts(object_store, "2026-10-02", "20261002T000000Z-slow")
    assert set(verdict["verdict"]) == {SUSPECTED} and set(verdict["history_runs"]) == {3}
