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
    write_run_files,
)

from batchscale.lake.publish import gate_stage, run_manifest_key, run_stage, table_key
from batchscale.lake.regression import (
    ENVIRONMENT_CHANGED,
    INSUFFICIENT_HISTORY,
    MIN_HISTORY_RUNS,
    NO_REGRESSION,
    NOT_JUDGED,
    REGRESSION,
    RegressionFound,
    check_regressions,
    read_history,
    regressed_cells,
    regressions_markdown,
    regressions_table,
    verdict_lines,
)
from batchscale.schemas import REGRESSIONS, SWEEP, make_table
from batchscale.storage import parquet_bytes, read_table_file, write_table_atomic
from helpers import store_env

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


# ------------------------------------- judge only what was measured well, like with like (#18)

QUIET_CV = 0.02
BATCHES = (16, 256, 1024)


def measured_row(batch: int, rate: float, *, quality: str | None = "ok",
                 reason: str | None = None, cpu_wait: float | None = 0.01) -> dict:
    """A sweep row with the quality flags and conditions the sweep records (issue 12)."""
    return {**sweep_row(batch, rate), "quality": quality, "quality_reason": reason,
            "cpu_wait_share": cpu_wait, "rounds": 2, "usable_cpus": 2, "load_avg_1m": 0.3}


def run_frame(run_id: str, rows: list[dict], **env) -> pd.DataFrame:
    return make_table("sweep", rows, {**env_columns(run_id), **env}).to_pandas()


def quiet_run(run_id: str, scale: float = 1.0, **env) -> pd.DataFrame:
    return run_frame(run_id, [measured_row(b, scale * MEAN_RATE * (1 + 0.01 * i))
                              for i, b in enumerate(BATCHES)], **env)


BUSY_REASON = "rounds disagree by 180 % (more than 15 %); threads waited for a CPU 45 %"


def busy_run(run_id: str) -> pd.DataFrame:
    """The fourth run of the issue's scenario: a busy neighbour on one core, so every row is
    slow and the sweep flagged it unstable."""
    return run_frame(run_id, [measured_row(b, 0.05 * MEAN_RATE, quality="unstable",
                                           reason=BUSY_REASON, cpu_wait=0.45)
                              for b in BATCHES])


def three_quiet_runs(**env) -> pd.DataFrame:
    return pd.concat([quiet_run(f"q{i}", **env) for i in range(3)], ignore_index=True)


def by_batch(table: pd.DataFrame, column: str = "verdict") -> dict:
    return dict(zip(table["batch_size"], table[column], strict=True))


def gate(table: pd.DataFrame, tmp_path, fail: bool = True) -> None:
    path = tmp_path / "regressions.parquet"
    write_table_atomic(path, regressions_table(table))
    gate_stage(config_json(fail_on_regression=fail), str(path))


def test_a_disturbed_fourth_run_is_not_judged_says_why_and_fails_nothing(tmp_path):
    table = check_regressions(busy_run("busy"), three_quiet_runs(), HISTORY)
    assert set(table["verdict"]) == {NOT_JUDGED}
    assert table["reason"].str.startswith("measurement disturbed: 3 of 3 timed rows").all()
    assert regressed_cells(table) == []
    [line] = verdict_lines(table)
    assert "not judged: measurement disturbed" in line
    assert "**Not judged: measurement disturbed" in regressions_markdown(table)
    gate(table, tmp_path, fail=True)  # --fail-on-regression: no exception


def test_the_same_slow_figures_without_the_flags_are_regressions(tmp_path):
    """The control of the test above: it is the flags, not the figures, that spare the run."""
    slow = run_frame("slow", [measured_row(b, 0.05 * MEAN_RATE) for b in BATCHES])
    table = check_regressions(slow, three_quiet_runs(), HISTORY)
    assert set(table["verdict"]) == {REGRESSION}
    with pytest.raises(RegressionFound, match="batch 1024"):
        gate(table, tmp_path)


def test_one_unstable_row_is_not_judged_with_its_reason_and_the_rest_are():
    rows = [measured_row(16, 0.05 * MEAN_RATE, quality="unstable", reason=BUSY_REASON),
            measured_row(256, MEAN_RATE), measured_row(1024, 0.5 * MEAN_RATE)]
    # One of three rows is more than the sweep's default 25 %: allow half here.
    table = check_regressions(run_frame("now", rows), three_quiet_runs(), HISTORY,
                              max_unstable_share=0.5)
    assert by_batch(table) == {16: NOT_JUDGED, 256: NO_REGRESSION, 1024: REGRESSION}
    assert by_batch(table, "reason")[16] == f"unstable: {BUSY_REASON}"
    assert any("not judged" in line and "batch 16" in line for line in verdict_lines(table))


def test_a_run_whose_threads_waited_for_a_cpu_is_disturbed_even_if_rows_passed():
    rows = [measured_row(b, 0.5 * MEAN_RATE, cpu_wait=0.3) for b in BATCHES]
    table = check_regressions(run_frame("now", rows), three_quiet_runs(), HISTORY)
    assert set(table["verdict"]) == {NOT_JUDGED}
    assert "waited for a CPU 30%" in table["reason"].iloc[0]
    off = check_regressions(run_frame("now", rows), three_quiet_runs(), HISTORY,
                            max_cpu_wait_share=None)
    assert set(off["verdict"]) == {REGRESSION}


def test_unstable_rows_and_disturbed_runs_of_earlier_runs_are_no_baseline():
    """Slow earlier figures that were flagged would drag the median down and hide the drop."""
    flagged_rows = [measured_row(16, 0.3 * MEAN_RATE, quality="unstable", reason="cv 0.9"),
                    measured_row(256, MEAN_RATE), measured_row(1024, MEAN_RATE)]
    history = pd.concat([three_quiet_runs(), busy_run("busy1"), busy_run("busy2"),
                         run_frame("one-bad-row-1", flagged_rows),
                         run_frame("one-bad-row-2", flagged_rows)], ignore_index=True)
    current = run_frame("now", [measured_row(b, 0.6 * MEAN_RATE) for b in BATCHES])
    table = check_regressions(current, history, HISTORY, max_unstable_share=0.5)
    # Cell 16: the three quiet runs only; cells 256/1024 also the two runs with one bad row.
    assert by_batch(table, "history_runs") == {16: 3, 256: 5, 1024: 5}
    assert set(table["verdict"]) == {REGRESSION}
    assert by_batch(table, "history_median")[16] == pytest.approx(MEAN_RATE)
    # With the sweep's default limit (25 %) one unstable row of three disturbs a run.
    strict = check_regressions(current, history, HISTORY)
    assert by_batch(strict, "history_runs") == {16: 3, 256: 3, 1024: 3}


def test_another_thread_count_is_environment_changed_naming_threads(tmp_path):
    current = quiet_run("now", scale=0.55, threads=1)
    table = check_regressions(current, three_quiet_runs(), HISTORY)
    assert set(table["verdict"]) == {ENVIRONMENT_CHANGED}
    assert set(table["reason"]) == {"threads 2 -> 1: new baseline"}
    assert by_batch(table, "change")[16] == pytest.approx(-0.45)  # the step, shown
    assert "threads=1" in table["fingerprint"].iloc[0]
    assert table["fingerprint"].iloc[0].endswith("python_version=3.11")  # not 3.11.9
    markdown = regressions_markdown(table)
    assert "Environment changed: new baseline" in markdown and "−45.0%" in markdown
    gate(table, tmp_path, fail=True)  # not a regression: nothing fails


def test_a_new_torch_is_named_and_the_new_environment_builds_its_own_baseline():
    old = three_quiet_runs()
    new_env = {"torch_version": "2.15.0"}
    first = check_regressions(quiet_run("n0", scale=0.8, **new_env), old, HISTORY)
    assert set(first["reason"]) == {"torch_version 2.14.1 -> 2.15.0: new baseline"}
    history = pd.concat([old, quiet_run("n0", scale=0.8, **new_env)], ignore_index=True)
    second = check_regressions(quiet_run("n1", scale=0.8, **new_env), history, HISTORY)
    assert set(second["verdict"]) == {INSUFFICIENT_HISTORY}
    assert second["reason"].iloc[0].startswith("1 earlier run judged well with this fingerprint")
    newer = pd.concat([history, *(quiet_run(f"n{i}", scale=0.8, **new_env) for i in (1, 2))],
                      ignore_index=True)
    steady = check_regressions(quiet_run("n3", scale=0.8, **new_env), newer, HISTORY)
    assert set(steady["verdict"]) == {NO_REGRESSION}
    assert set(steady["history_runs"]) == {3}  # the new torch's runs only
    slower = check_regressions(quiet_run("n3", scale=0.5, **new_env), newer, HISTORY)
    assert set(slower["verdict"]) == {REGRESSION}


def test_a_genuine_slowdown_on_the_same_fingerprint_with_stable_rows_fails_the_gate(tmp_path):
    """A code change (another git commit) is what the check is for: not in the fingerprint;
    nor is a Python patch release (compared by major.minor)."""
    current = quiet_run("now", scale=0.7, git_commit="def456", python_version="3.11.10")
    table = check_regressions(current, three_quiet_runs(), HISTORY)
    assert set(table["verdict"]) == {REGRESSION}
    assert table["reason"].isna().all()
    with pytest.raises(RegressionFound, match="3 throughput regression"):
        gate(table, tmp_path)


# ------------------------------------------------------------------------ through the lake


def publish_rows(store, monkeypatch, tmp_path, run_id: str, rows: list[dict],
                 drop: tuple[str, ...] = ()) -> dict:
    """Publish one run whose sweep rows are `rows`; `drop` removes sweep columns first, as in
    partitions published before those columns existed."""
    for name, value in store_env(store).items():
        monkeypatch.setenv(name, value)
    paths = write_run_files(tmp_path / run_id, run_id, {}, sweep=rows)
    if drop:
        sweep = read_table_file(paths["sweep_path"])
        write_table_atomic(paths["sweep_path"], sweep.drop_columns(list(drop)))
    out = tmp_path / run_id / "out"
    out.mkdir(exist_ok=True)
    return run_stage(config_json(fail_on_regression=True), run_id,
                     regressions_path=str(out / "regressions.parquet"),
                     markdown_path=str(out / "regressions.md"), **paths)


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
    # The busy run is no baseline for the next one: a 30 % drop is judged against quiet runs.
    slow = publish_rows(object_store, monkeypatch, tmp_path, "20260801T000010Z-slow",
                        [measured_row(b, 0.7 * MEAN_RATE) for b in BATCHES])
    assert len(slow["regressions"]) == len(BATCHES)
    assert all("over 3 runs" in cell for cell in slow["regressions"])


def test_old_partitions_without_the_quality_columns_count_as_stable(
        object_store, monkeypatch, tmp_path):
    """Rows published before issue 12 carry no quality, conditions or sweep-setting columns:
    read as null, they are stable and match any fingerprint value (not recorded then)."""
    assert set(NEWER_COLUMNS) <= set(SWEEP.names)
    old = [sweep_row(b, MEAN_RATE) for b in BATCHES]
    for i in range(3):
        publish_rows(object_store, monkeypatch, tmp_path, f"20260901T00000{i}Z-old", old,
                     drop=NEWER_COLUMNS)
    history = read_history(object_store, "20260902T000000Z-x", [WORKLOAD])
    assert history["quality"].isna().all() and len(history) == 3 * len(BATCHES)
    manifest = publish_rows(object_store, monkeypatch, tmp_path, "20260902T000000Z-new",
                            [measured_row(b, 0.7 * MEAN_RATE) for b in BATCHES])
    assert len(manifest["regressions"]) == len(BATCHES)
    assert all("over 3 runs" in cell for cell in manifest["regressions"])


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
    manifest = publish_rows(object_store, monkeypatch, tmp_path, "20261002T000000Z-slow",
                            [measured_row(b, 0.7 * MEAN_RATE) for b in BATCHES])
    # Baseline: the old run and the two quiet ones, never the busy one.
    assert all("over 3 runs" in cell for cell in manifest["regressions"])
    assert len(manifest["regressions"]) == len(BATCHES)


# ------------------------------------------------------------ the regressions table's suite


@pytest.fixture
def regressions_suite_registered(monkeypatch):
    """`regressions` as a validated table kind. Stand-in for the registration in
    schemas.TABLES, which belongs to the lead (see /work/notes/readme18_judge.md); once it is
    there this fixture changes nothing."""
    from batchscale import schemas
    from batchscale.checks import suites

    monkeypatch.setitem(schemas.TABLES, "regressions", REGRESSIONS)
    suites.load_suite.cache_clear()
    yield suites.load_suite("regressions")
    suites.load_suite.cache_clear()


def test_the_regressions_suite_passes_real_verdicts_and_catches_bad_ones(
        regressions_suite_registered):
    from batchscale.checks.validate import validate_table

    required = {e["kwargs"]["column"] for e in regressions_suite_registered["expectations"]
                if e["type"] == "expect_column_values_to_not_be_null"
                and "row_condition" not in e["kwargs"]}
    assert required == {f.name for f in REGRESSIONS if not f.nullable}
    rows = [measured_row(16, 0.05 * MEAN_RATE, quality="unstable", reason=BUSY_REASON),
            measured_row(256, MEAN_RATE), measured_row(1024, 0.5 * MEAN_RATE),
            {**sweep_row(2048, None, status="oom")}]
    history = pd.concat([three_quiet_runs(), quiet_run("other", threads=1)], ignore_index=True)
    frame = check_regressions(run_frame("now", rows), history, HISTORY, max_unstable_share=0.5)
    assert set(frame["verdict"]) == {NOT_JUDGED, ENVIRONMENT_CHANGED, INSUFFICIENT_HISTORY}
    clean = validate_table("regressions", regressions_table(frame))
    assert clean.success, clean.failure_message()
    judged = check_regressions(quiet_run("now", scale=0.5), three_quiet_runs(), HISTORY)
    assert validate_table("regressions", regressions_table(judged)).success
    broken = judged.assign(verdict=["regressed", NOT_JUDGED, REGRESSION],
                           history_runs=[3, 3, 1])
    report = validate_table("regressions", regressions_table(broken))
    message = report.failure_message()
    assert not report.success
    assert "verdict" in message and "regressed" in message
    assert "reason" in message  # not_judged without a reason
    assert "history_runs" in message  # a regression on one earlier run
