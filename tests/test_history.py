"""History and report rebuilt from the lake (real SeaweedFS, the real CLI), and the lake read
with pyarrow.dataset and with DuckDB (its built-in Parquet reader on a local copy of the lake:
DuckDB's S3 support is the httpfs extension, which it downloads on first use)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from test_publish import WORKLOAD, env_columns, publish_synthetic_run, sweep_row

from batchscale.lake.history import (
    History,
    _critical,
    critical_lines,
    load_history,
)
from batchscale.lake.history_chart import plot_history
from batchscale.lake.lake import PARTITIONING, lake_path
from batchscale.lake.publish import run_manifest_key, table_key
from batchscale.schemas import make_table
from batchscale.storage import ObjectStore, parquet_bytes
from helpers import run_cli, store_env

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
RUN_IDS = [f"20260601T00000{i}Z-hist{i}" for i in range(4)]
RATES = [{4: 1000.0, 64: 9000.0}, {4: 1010.0, 64: 9100.0}, {4: 990.0, 64: 8900.0},
         {4: 1005.0, 64: 6000.0}]
B_CRITS = [60.0, 64.0, 70.0, 66.0]


def publish_lake(store, monkeypatch, tmp_path):
    """Four runs of the workload on one device, the last one slower at batch 64, plus one run
    on another device."""
    for run_id, rates, b_crit in zip(RUN_IDS, RATES, B_CRITS, strict=True):
        publish_synthetic_run(store, monkeypatch, tmp_path, run_id, rates,
                              b_crit=b_crit, history_runs=3)
    publish_synthetic_run(store, monkeypatch, tmp_path, "20260601T000009Z-gpu",
                          {4: 50_000.0}, device="NVIDIA H200")
    return store


@pytest.fixture(scope="module")
def lake(seaweed, tmp_path_factory):
    """The lake, published once for the tests that only read it (five publishes take ~10 s)."""
    store = ObjectStore(seaweed.settings(prefix=f"test-{uuid.uuid4().hex[:12]}"), max_attempts=2)
    with pytest.MonkeyPatch.context() as monkeypatch:
        return publish_lake(store, monkeypatch, tmp_path_factory.mktemp("lake"))


@pytest.fixture
def own_lake(lake, object_store):
    """The same lake, of the test's own, for tests that add objects to it: the shared lake's
    objects copied under the test's prefix (publishing it again takes 10-30 s a test)."""
    for key in lake.list():
        relative = key.removeprefix(lake.settings.prefix).lstrip("/")
        object_store.put_bytes(object_store.key(relative), lake.get_bytes(key))
    return object_store


def test_history_lists_runs_in_publication_order_with_throughput_and_b_crit(lake):
    history = load_history(lake, WORKLOAD, device="test cpu")
    at_64 = history.throughput[history.throughput["batch_size"] == 64]
    assert at_64["run_id"].tolist() == RUN_IDS
    assert at_64["samples_per_s"].tolist() == [r[64] for r in RATES]
    assert history.critical["run_id"].tolist() == RUN_IDS
    assert history.critical["b_crit"].tolist() == B_CRITS
    assert set(history.throughput["date"]) == {"2026-06-01"}
    everything = load_history(lake, WORKLOAD)
    assert set(everything.throughput["device_name"]) == {"cpu: Test CPU", "NVIDIA H200"}
    recent = load_history(lake, WORKLOAD, device="cpu", last=2)
    assert recent.critical["run_id"].tolist() == RUN_IDS[2:]


def test_history_cli_prints_tables_and_writes_a_png(lake, tmp_path):
    result = run_cli(["history", "--workload", WORKLOAD, "--device", "test",
                      "--plot", "h.png"], cwd=tmp_path, env=store_env(lake))
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "samples/s — cpu: Test CPU, fp32, synthetic input" in out
    assert "B=4" in out and "B=64" in out and "9,100" in out and "6,000?" in out
    assert "? suspected (one run below its baseline)" in out
    assert all(run_id in out for run_id in RUN_IDS) and "H200" not in out
    assert "B_crit (90 % interval)" in out and "[53, 82]" in out  # 0.8, 1.25 × 66
    assert (tmp_path / "h.png").read_bytes().startswith(PNG_SIGNATURE)


def test_history_cli_names_the_workloads_it_has_when_asked_for_another(lake, tmp_path):
    result = run_cli(["history", "--workload", "resnet-none"], cwd=tmp_path,
                     env=store_env(lake))
    assert result.returncode == 2  # a name that is not there: bad input
    assert "no published run of workload 'resnet-none'" in result.stderr
    typo = run_cli(["history", "--workload", WORKLOAD[:-1] + "x"], cwd=tmp_path,
                   env=store_env(lake))
    assert f"(did you mean {WORKLOAD!r}?)" in typo.stderr
    assert f"workloads there: {WORKLOAD}" in result.stderr
    bad = run_cli(["history", "--workload", WORKLOAD, "--last", "0"], cwd=tmp_path,
                  env=store_env(lake))
    assert bad.returncode == 2 and "--last" in bad.stderr


def test_report_cli_rebuilds_the_report_from_the_lake(lake, tmp_path):
    run_id = RUN_IDS[-1]
    result = run_cli(["report", "--run-id", run_id, "--out", "rebuilt.html"], cwd=tmp_path,
                     env=store_env(lake))
    assert result.returncode == 0, result.stderr
    page = (tmp_path / "rebuilt.html").read_text()
    assert f"batchscale: lake-test ({run_id})" in page
    assert page.count("<img ") >= 3  # throughput, step time, memory, steps, ...
    assert "<h2>Regressions</h2>" in page and "batch 64" in page
    assert page.count("<strong>Batch size:") == 1
    assert f"batchscale run {run_id}" in result.stdout
    # One slow run (6,000 after ~9,000) is suspected, not confirmed: it does not fail a run.
    assert "regressions: none confirmed in 2 cells judged against history" in result.stdout
    assert "suspected (one run below the baseline" in result.stdout
    assert "rebuilt from the lake" in result.stdout
    missing = run_cli(["report", "--run-id", "20990101T000000Z-none"], cwd=tmp_path,
                      env=store_env(lake))
    assert missing.returncode == 2, missing.stderr
    assert ("no published run '20990101T000000Z-none' in the lake" in missing.stderr
            and "batchscale history --workload NAME` lists the published runs" in missing.stderr)


def test_lake_reads_with_pyarrow_dataset(lake):
    dataset = ds.dataset(lake_path(lake, "sweep"), filesystem=lake.pyarrow_filesystem(),
                         format="parquet", partitioning=PARTITIONING)
    table = dataset.to_table(filter=(ds.field("batch_size") == 64),
                             columns=["date", "run_id", "samples_per_s"])
    assert sorted(table.column("run_id").to_pylist()) == RUN_IDS


def copy_lake(store, folder: Path) -> Path:
    """The store's objects as local files under the same keys."""
    for key in store.list():
        path = folder / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(store.get_bytes(key))
    return folder / store.key()


def test_lake_reads_with_duckdb_on_a_local_copy(lake, tmp_path):
    duckdb = pytest.importorskip("duckdb")
    root = copy_lake(lake, tmp_path / "copy")
    query = f"""
        SELECT s.run_id, s.date, s.batch_size, s.samples_per_s, a.b_crit
        FROM read_parquet('{root}/sweep/*/*/*.parquet', hive_partitioning = true) s
        JOIN (SELECT DISTINCT run_id, b_crit
              FROM read_parquet('{root}/analysis/*/*/*.parquet', hive_partitioning = true)) a
          USING (run_id)
        WHERE s.workload = '{WORKLOAD}' AND s.device_name LIKE 'cpu:%' AND s.batch_size = 64
        ORDER BY s.run_id"""
    rows = duckdb.sql(query).fetchall()
    assert [r[0] for r in rows] == RUN_IDS
    assert [r[3] for r in rows] == [r[64] for r in RATES]
    assert [r[4] for r in rows] == B_CRITS
    assert str(rows[0][1]) == "2026-06-01"


# ------------------------------------------------ a stray object must not poison the lake
DATE = "2026-06-01"


def assert_history_unchanged(store) -> None:
    history = load_history(store, WORKLOAD, device="test cpu")
    at_64 = history.throughput[history.throughput["batch_size"] == 64]
    assert at_64["run_id"].tolist() == RUN_IDS
    assert at_64["samples_per_s"].tolist() == [r[64] for r in RATES]
    assert history.critical["b_crit"].tolist() == B_CRITS


def test_stray_objects_under_a_table_are_skipped_with_a_warning_naming_them(
        own_lake, tmp_path, capsys):
    strays = {
        own_lake.key("sweep", f"date={DATE}", f"run_id={RUN_IDS[1]}", "notes.txt"): b"not parquet",
        own_lake.key("sweep", f"date={DATE}", f"run_id={RUN_IDS[2]}", "empty.parquet"): b"",
        own_lake.key("sweep", "README.md"): b"# the sweep table",
        own_lake.key("analysis", f"date={DATE}", f"run_id={RUN_IDS[3]}", "a-foreign.parquet"):
            parquet_bytes(pa.table({"run_id": [RUN_IDS[3]], "b_crit": ["high"]})),
    }
    for key, data in strays.items():
        own_lake.put_bytes(key, data)
    capsys.readouterr()
    assert_history_unchanged(own_lake)
    warnings = capsys.readouterr().err
    for key in strays:
        assert f"warning: s3://{own_lake.settings.bucket}/{key} " in warnings
    result = run_cli(["history", "--workload", WORKLOAD, "--plot", "h.png"], cwd=tmp_path,
                     env=store_env(own_lake))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert all(f"s3://{own_lake.settings.bucket}/{key}" in result.stderr for key in strays)
    assert all(run_id in result.stdout for run_id in RUN_IDS)


DAMAGED_MANIFESTS = {"20260601T000007Z-notjson": b"{not json",
                     "20260601T000008Z-list": b"[1, 2]",
                     "20260601T000009Z-binary": b"\xff\xfe\x00"}


def test_a_damaged_run_manifest_makes_its_run_incomplete_with_a_warning(own_lake, tmp_path, capsys):
    for run_id, manifest in DAMAGED_MANIFESTS.items():
        table = make_table("sweep", [sweep_row(64, 1.0)], env_columns(run_id))
        own_lake.put_bytes(table_key(own_lake, "sweep", DATE, run_id), parquet_bytes(table))
        own_lake.put_bytes(run_manifest_key(own_lake, run_id), manifest)
    capsys.readouterr()
    assert_history_unchanged(own_lake)
    warnings = capsys.readouterr().err
    for run_id in DAMAGED_MANIFESTS:
        assert (f"warning: s3://{own_lake.settings.bucket}/{run_manifest_key(own_lake, run_id)}"
                in warnings)
    assert "counts as incomplete" in warnings


@pytest.mark.parametrize("run_id", list(DAMAGED_MANIFESTS))
def test_report_of_a_run_with_a_damaged_manifest_is_refused_naming_it(
        object_store, tmp_path, run_id):
    key = run_manifest_key(object_store, run_id)
    object_store.put_bytes(key, DAMAGED_MANIFESTS[run_id])
    result = run_cli(["report", "--run-id", run_id, "--out", "r.html"], cwd=tmp_path,
                     env=store_env(object_store))
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert f"s3://{object_store.settings.bucket}/{key}" in result.stderr
    assert "damaged" in result.stderr
    assert not (tmp_path / "r.html").exists()


# ------------------------------------------------ B_crit bounds and quality, as printed


def critical_frame(rows: list[dict]) -> pd.DataFrame:
    published = pd.Timestamp("2026-06-01 00:00", tz="UTC")
    return pd.DataFrame([{"published_at": published, "date": DATE, **row} for row in rows])


def test_history_prints_a_bound_as_a_bound_and_reads_older_runs_without_the_columns(tmp_path):
    older = critical_frame([{"run_id": RUN_IDS[0], "lr_rule": "linear", "b_crit": 64.0,
                             "b_crit_low": 51.0, "b_crit_high": 80.0}])  # before bounds existed
    newer = critical_frame([{"run_id": RUN_IDS[1], "lr_rule": "linear", "b_crit": float("nan"),
                             "b_crit_low": float("nan"), "b_crit_high": float("nan"),
                             "b_crit_bound": "above", "b_crit_bound_batch": 1024.0}])
    critical = pd.concat([_critical(older), _critical(newer)], ignore_index=True)
    throughput = critical_frame([{"run_id": r, "device_name": "cpu", "precision": "fp32",
                                  "input_mode": "synthetic", "batch_size": 64,
                                  "samples_per_s": 9000.0} for r in RUN_IDS[:2]])
    history = History(WORKLOAD, throughput, critical)
    lines = critical_lines(history)
    assert any(RUN_IDS[0] in line and "64  [51, 80]" in line for line in lines)
    bound = next(line for line in lines if RUN_IDS[1] in line)
    assert "> 1,024  above 1,024: steps still fall like 1/B" in bound
    assert plot_history(history, tmp_path / "h.png").read_bytes().startswith(PNG_SIGNATURE)
    # An interval reaching past the batches the fit measured says so, as the run's summary does.
    cut = critical_frame([{"run_id": RUN_IDS[2], "lr_rule": "sqrt", "batch_size": b,
                           "b_crit": 23.0, "b_crit_low": 8.0, "b_crit_high": 74.0}
                          for b in (16, 64, 256)])
    reaching = critical_lines(History(WORKLOAD, throughput, _critical(cut)))
    assert any(line.endswith("23  [8, 74] (reaches below 16, the smallest batch measured)")
               for line in reaching), reaching


def test_run_summary_states_bounds_edge_cases_and_quality():
    """`batchscale run`'s summary says what the report says: the bound in words, why there is
    no B_crit, the unstable rows left out and what to do."""
    from batchscale.lake.summary import convergence_lines, quality_lines, throughput_lines

    env = env_columns(RUN_IDS[0])
    bound = [{"lr_rule": "linear", "batch_size": b, "steps_to_target": 65536 / b,
              "b_crit": float("nan"), "b_crit_bound": "below", "b_crit_bound_batch": 4.0}
             for b in (4, 16, 64)]
    diverged = [{"lr_rule": "sqrt", "batch_size": b, "steps_to_target": float("nan"),
                 "b_crit": float("nan")} for b in (4, 16, 64)]
    analysis = make_table("analysis", bound + diverged, env)
    runs = make_table("runs", [
        {"trial_id": f"sqrt-{b}", "batch_size": b, "lr_rule": "sqrt", "lr": 0.1, "seed": 0,
         "workers": 1, "status": "diverged", "steps_run": 10} for b in (4, 16, 64)], env)
    text = "\n".join(convergence_lines(analysis, runs))
    assert "B_crit (linear): below 4: no batch size saved steps" in text
    assert "B_crit (sqrt): not estimated (every trial diverged (3 trials at 3 batch sizes)" in text
    # a fit that failed on its own data says why in the run summary, not "see the report"
    scattered = [{"lr_rule": "sqrt", "batch_size": b, "steps_to_target": 100.0,
                  "b_crit": float("nan"), "b_crit_reason": "3 batch sizes scatter ±17 %"}
                 for b in (4, 16, 64)]
    text = "\n".join(convergence_lines(make_table("analysis", scattered, env), None))
    assert "B_crit (sqrt): not estimated (3 batch sizes scatter ±17 %)" in text
    sweep_rows = [{**sweep_row(b, 1000.0 * b), "quality": "ok", "load_avg_1m": 1.8,
                   "usable_cpus": 2} for b in (4, 16, 64)]
    sweep_rows[0] |= {"quality": "unstable", "quality_reason": "cv 0.9 > 0.5",
                      "load_avg_1m": 3.2}
    sweep = make_table("sweep", sweep_rows, env)
    assert "unstable: left out" in throughput_lines(sweep)[2]
    assert "not recorded" in throughput_lines(sweep)[2]  # these rows carry no rerun interval
    sweep_rows[1] |= {"samples_per_s_low": 14000.0, "samples_per_s_high": 18500.0}
    with_interval = throughput_lines(make_table("sweep", sweep_rows, env))
    assert "16000      [14,000, 18,500]" in with_interval[3]
    lines = quality_lines({"sweep": sweep, "analysis": analysis})
    assert lines[0].startswith("measurement quality: Some timings cannot be trusted: 1 of 3")
    assert "Synthetic batch 4 — cv 0.9 > 0.5" in "\n".join(lines)
    assert "rerun on a quiet node" in lines[-1].lower() and "Guaranteed QoS" in lines[-1]
    quiet = make_table("sweep", [{**r, "quality": "ok", "load_avg_1m": 1.8}
                                 for r in sweep_rows[1:]], env)
    stable, threads = quality_lines({"sweep": quiet})
    assert stable == ("measurement quality: Measurements look stable: none of the 2 timed sweep"
                      " rows flagged; load average up to 1.8 on 2 usable CPUs.")
    assert threads.startswith("  threads: the trials ran on 2 CPU threads")  # a CPU sweep


def test_columns_added_since_an_old_partition_are_read_from_the_newer_ones(own_lake):
    """A partition written before a column existed, read first, must not drop that column from
    the newer files (a dataset takes its schema from its first file): old rows get nulls."""
    from batchscale.lake.lake import read_lake_table

    old = pa.table({"run_id": [RUN_IDS[0]], "workload": [WORKLOAD], "device_name": ["test cpu"],
                    "input_mode": ["synthetic"], "batch_size": [2], "status": ["ok"],
                    "samples_per_s": [500.0]})
    key = own_lake.key("sweep", f"date={DATE}", f"run_id={RUN_IDS[0]}", "a-old-format.parquet")
    own_lake.put_bytes(key, parquet_bytes(old))
    frame = read_lake_table(own_lake, "sweep")
    old_rows = frame[frame["batch_size"] == 2]
    assert len(old_rows) == 1 and old_rows["threads"].isna().all()
    newer = frame[(frame["run_id"] == RUN_IDS[1]) & (frame["batch_size"] == 64)]
    assert newer["threads"].tolist() == [2]  # a column the first file lacks, kept
    assert "cpu_wait_share" in frame.columns  # today's schema, null where never written


def test_rows_written_with_the_old_lr_rule_name_are_read_under_the_new_one(own_lake):
    """The tuned rule was called "grid" before: a partition written then reads as `tuned`, as
    the same rows would from a run published today (read_lake_table; load_run does the same
    to whole tables)."""
    from batchscale.lake.lake import read_lake_table
    from batchscale.schemas import current_lr_rules

    old = pa.table({"run_id": [RUN_IDS[0]], "workload": [WORKLOAD], "lr_rule": ["grid"],
                    "batch_size": [64], "b_crit": [40.0]})
    key = own_lake.key("analysis", f"date={DATE}", f"run_id={RUN_IDS[0]}", "a-old-rule.parquet")
    own_lake.put_bytes(key, parquet_bytes(old))
    frame = read_lake_table(own_lake, "analysis")
    assert "grid" not in set(frame["lr_rule"])
    assert frame.loc[frame["b_crit"] == 40.0, "lr_rule"].tolist() == ["tuned"]
    table = current_lr_rules(pa.table({"lr_rule": ["grid", "sqrt", None]}))
    assert table.column("lr_rule").to_pylist() == ["tuned", "sqrt", None]


def test_a_rebuilt_card_names_the_target_as_the_config_did():
    """The manifest keeps the config's primary target, or that it marked none (the analysis then
    chooses again from the same tables); a run published before it kept one is rebuilt for the
    target its analysis was made for."""
    import pyarrow as pa

    from batchscale.lake.summary import rebuilt_primary_target

    analysis = {"analysis": pa.table({"target_metric": ["val_loss"], "target_value": [0.5]})}
    assert rebuilt_primary_target({"primary_target": None}, analysis) is None
    assert rebuilt_primary_target({"primary_target": ["val_accuracy", 0.9]}, analysis) == (
        "val_accuracy", 0.9)
    assert rebuilt_primary_target({}, analysis) == ("val_loss", 0.5)


def test_the_summary_says_at_which_level_the_b_crit_intervals_are_read():
    """After an adaptive search the terminal says the intervals are read at 98 %, as the report
    does; a grid's say nothing more; a configured level is named as such."""
    from batchscale.config import AnalysisConfig
    from batchscale.lake.summary import level_lines

    assert level_lines(AnalysisConfig(), adaptive=False) == []
    assert level_lines(AnalysisConfig(), adaptive=True) == [
        "  (B_crit intervals: 90%, read at the 98% level: an adaptive search chose these trials "
        "from the results so far (where to train next, when to stop), which a 90% reading "
        "over-claims)"]
    assert "analysis.b_crit_read_level" in level_lines(AnalysisConfig(b_crit_read_level=0.95),
                                                       adaptive=False)[0]
