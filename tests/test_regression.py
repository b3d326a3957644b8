"""Regression detection: known answers on synthetic histories, then through the real lake."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from test_publish import (
    DEVICE,
    WORKLOAD,
    config_json,
    env_columns,
    publish_synthetic_run,
    sweep_row,
)

from batchscale.lake.publish import gate_stage, run_manifest_key, table_key
from batchscale.lake.regression import (
    INSUFFICIENT_HISTORY,
    MIN_HISTORY_RUNS,
    NO_REGRESSION,
    REGRESSION,
    RegressionFound,
    check_regressions,
    read_history,
    regressed_cells,
)
from batchscale.schemas import make_table
from batchscale.storage import parquet_bytes

MEAN_RATE = 10_000.0
NOISE_SHARE = 0.02
"""Run-to-run noise of a healthy benchmark: 2 % standard deviation."""
DROP = 0.20
HISTORY = 10


def sweep_frame(run_id: str, rates: dict[int, float], **row) -> pd.DataFrame:
    rows = [sweep_row(b, r, **row) for b, r in rates.items()]
    return make_table("sweep", rows, env_columns(run_id)).to_pandas()


def noisy_history(rng: np.random.Generator, runs: int = HISTORY,
                  batches=(4, 64)) -> pd.DataFrame:
    frames = [sweep_frame(f"h{i:02d}", {b: MEAN_RATE * (1 + NOISE_SHARE * rng.standard_normal())
                                        for b in batches}) for i in range(runs)]
    return pd.concat(frames, ignore_index=True)


def verdicts(current: pd.DataFrame, history: pd.DataFrame | None,
             runs: int = HISTORY) -> dict[int, str]:
    table = check_regressions(current, history, runs)
    return dict(zip(table["batch_size"], table["verdict"], strict=True))


def test_an_injected_20_percent_drop_is_flagged_and_normal_noise_is_not():
    rng = np.random.default_rng(7)
    history = noisy_history(rng)
    normal = MEAN_RATE * (1 + NOISE_SHARE * rng.standard_normal())
    current = sweep_frame("now", {4: normal, 64: MEAN_RATE * (1 - DROP)})
    assert verdicts(current, history) == {4: NO_REGRESSION, 64: REGRESSION}
    table = check_regressions(current, history, HISTORY)
    flagged = table[table["verdict"] == REGRESSION].iloc[0]
    assert flagged["change"] == pytest.approx(-DROP, abs=0.03)
    assert flagged["history_runs"] == HISTORY
    [line] = regressed_cells(table)
    assert "batch 64" in line and WORKLOAD in line and DEVICE in line and "%" in line


def test_many_draws_of_normal_noise_raise_no_alarm():
    rng = np.random.default_rng(11)
    history = noisy_history(rng)
    draws = MEAN_RATE * (1 + NOISE_SHARE * rng.standard_normal(200))
    flagged = [rate for rate in draws
               if verdicts(sweep_frame("now", {4: rate}), history)[4] == REGRESSION]
    assert flagged == []


def test_a_small_drop_within_the_floor_is_not_flagged_even_on_a_quiet_history():
    history = pd.concat([sweep_frame(f"h{i}", {4: MEAN_RATE}) for i in range(5)])
    assert verdicts(sweep_frame("now", {4: 0.97 * MEAN_RATE}), history) == {4: NO_REGRESSION}
    assert verdicts(sweep_frame("now", {4: 0.92 * MEAN_RATE}), history) == {4: NO_REGRESSION}
    assert verdicts(sweep_frame("now", {4: 0.85 * MEAN_RATE}), history) == {4: REGRESSION}


def test_too_little_history_is_not_judged():
    history = pd.concat([sweep_frame(f"h{i}", {4: MEAN_RATE})
                         for i in range(MIN_HISTORY_RUNS - 1)])
    current = sweep_frame("now", {4: 0.5 * MEAN_RATE})
    assert verdicts(current, history) == {4: INSUFFICIENT_HISTORY}
    assert verdicts(current, None) == {4: INSUFFICIENT_HISTORY}


def test_only_the_last_n_runs_form_the_baseline():
    """A slow era long ago, then a faster one: judged against the recent runs only."""
    old = [sweep_frame(f"a{i}", {4: 0.5 * MEAN_RATE}) for i in range(10)]
    recent = [sweep_frame(f"b{i}", {4: MEAN_RATE}) for i in range(5)]
    history = pd.concat(old + recent, ignore_index=True)
    assert verdicts(sweep_frame("now", {4: 0.8 * MEAN_RATE}), history, runs=5) == {
        4: REGRESSION}
    assert verdicts(sweep_frame("now", {4: 0.8 * MEAN_RATE}), history, runs=15) == {
        4: NO_REGRESSION}


def test_running_out_of_memory_where_history_timed_fine_is_a_regression():
    history = pd.concat([sweep_frame(f"h{i}", {256: MEAN_RATE}) for i in range(5)])
    current = sweep_frame("now", {256: None}, status="oom")
    table = check_regressions(current, history, HISTORY)
    assert table["verdict"].tolist() == [REGRESSION]
    assert "oom now" in regressed_cells(table)[0]


def test_cells_of_other_precisions_and_input_modes_are_separate_baselines():
    history = pd.concat([sweep_frame(f"h{i}", {4: MEAN_RATE}, precision="bf16")
                         for i in range(5)])
    assert verdicts(sweep_frame("now", {4: 0.5 * MEAN_RATE}), history) == {
        4: INSUFFICIENT_HISTORY}


# --------------------------------------------------------------------- through the real lake


def test_lake_history_flags_the_drop_fails_the_gate_after_publishing(
        object_store, monkeypatch, tmp_path, capsys):
    rng = np.random.default_rng(3)
    for i in range(6):
        rates = {b: MEAN_RATE * (1 + NOISE_SHARE * rng.standard_normal()) for b in (4, 64)}
        publish_synthetic_run(object_store, monkeypatch, tmp_path, f"20260401T00000{i}Z-h",
                              rates)
    run_id = "20260402T000000Z-drop"
    manifest = publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id,
                                     {4: MEAN_RATE, 64: (1 - DROP) * MEAN_RATE})
    [cell] = manifest["regressions"]
    assert "batch 64" in cell and "over 5 runs" in cell  # history_runs = 5
    verdict_table = object_store.get_table(
        table_key(object_store, "regressions", "2026-04-02", run_id)).to_pandas()
    assert dict(zip(verdict_table["batch_size"], verdict_table["verdict"], strict=True)) == {
        4: NO_REGRESSION, 64: REGRESSION}
    report = next(o["key"] for o in manifest["objects"] if o["key"].endswith(".html"))
    page = object_store.get_bytes(report).decode()
    assert "<h2>Regressions</h2>" in page and "1 of 2 judged cells regressed" in page
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
