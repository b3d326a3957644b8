"""Lake partitions written before a table changed shape stay readable: a run published
with the version 1 layout (one target, no schema_version, none of the columns added since) next
to runs of today's layout, read by `batchscale history`, the regression check and a plain
pyarrow.dataset read (real SeaweedFS)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.dataset as ds
import pyarrow.parquet as pq
from test_publish import WORKLOAD, publish_synthetic_run, write_run_files

from batchscale.lake.history import load_history
from batchscale.lake.lake import PARTITIONING, lake_path, read_lake_table
from batchscale.schemas import SCHEMA_VERSION, schema_for

# The columns layout 2 added to each table (docs/architecture.md, "Schema versions").
ADDED_IN_2 = {
    "sweep": ["schema_version", "tokens_per_s"],
    "curves": ["schema_version", "val_loss", "val_perplexity", "val_miou", "val_pixel_accuracy",
               "val_map50", "train_batch_loss", "at_gap_budget"],
    "runs": ["schema_version", "target_metric", "target_value", "final_metric_value"],
    "analysis": ["schema_version", "target_metric", "target_value"],
}
OLD_RUN = "20260501T000000Z-layout1"
NEW_RUNS = [f"20260601T00000{i}Z-new{i}" for i in range(3)]
RATES = {4: 1000.0, 64: 9000.0}


def as_layout_1(paths: dict[str, str]) -> None:
    """Rewrite a run's tables as version 1 wrote them: without the columns added since."""
    for kind, added in ADDED_IN_2.items():
        path = paths[f"{kind}_path"]
        table = pq.read_table(path)
        pq.write_table(table.drop_columns([c for c in added if c in table.column_names]), path)


def publish_old_then_new(store, monkeypatch, tmp_path: Path) -> None:
    paths = write_run_files(tmp_path / OLD_RUN, OLD_RUN, RATES)
    as_layout_1(paths)
    assert "target_metric" not in pq.read_schema(paths["runs_path"]).names
    monkeypatch.setattr("test_publish.write_run_files", lambda *a, **k: paths)
    publish_synthetic_run(store, monkeypatch, tmp_path, OLD_RUN, RATES)
    monkeypatch.undo()
    for run_id in NEW_RUNS:
        publish_synthetic_run(store, monkeypatch, tmp_path, run_id, RATES, history_runs=3)


def test_history_and_lake_reads_take_old_and_new_layouts_together(
        object_store, monkeypatch, tmp_path):
    publish_old_then_new(object_store, monkeypatch, tmp_path)
    history = load_history(object_store, WORKLOAD)
    assert sorted(set(history.throughput["run_id"])) == sorted([OLD_RUN, *NEW_RUNS])
    assert set(history.critical["run_id"]) == {OLD_RUN, *NEW_RUNS}
    runs = read_lake_table(object_store, "runs")
    by_run = runs.groupby("run_id")
    old = by_run.get_group(OLD_RUN)
    assert old["schema_version"].isna().all() and old["target_metric"].isna().all()
    assert (old["target_val_accuracy"] == 0.95).all()  # a layout 1 row's one target
    for run_id in NEW_RUNS:
        assert (by_run.get_group(run_id)["schema_version"] == SCHEMA_VERSION).all()


def test_the_regression_check_judges_a_new_run_against_old_layout_history(
        object_store, monkeypatch, tmp_path):
    publish_old_then_new(object_store, monkeypatch, tmp_path)
    verdicts = pq.read_table(tmp_path / NEW_RUNS[-1] / "out" / "regressions.parquet")
    judged = verdicts.to_pylist()
    assert judged and all(v["verdict"] == "ok" for v in judged), judged
    assert {v["history_runs"] for v in judged} == {3}  # the layout 1 run and two new ones


def test_a_plain_pyarrow_dataset_read_with_todays_schema_sees_every_run(
        object_store, monkeypatch, tmp_path):
    """pyarrow takes the first file's schema unless given one: pass today's (or
    pa.unify_schemas of the files'), and old rows read the added columns as null."""
    publish_old_then_new(object_store, monkeypatch, tmp_path)
    schema = schema_for("runs").append(PARTITIONING.schema.field("date"))  # run_id: in both
    dataset = ds.dataset(lake_path(object_store, "runs"), format="parquet",
                         filesystem=object_store.pyarrow_filesystem(),
                         partitioning=PARTITIONING, schema=schema)
    table = dataset.to_table(columns=["run_id", "schema_version", "target_metric",
                                      "steps_to_target"])
    versions = {}
    for row in table.to_pylist():
        versions.setdefault(row["run_id"], set()).add(row["schema_version"])
    assert versions == {OLD_RUN: {None}, **{r: {SCHEMA_VERSION} for r in NEW_RUNS}}
    assert table.column("steps_to_target").null_count == 0


def test_every_suite_accepts_todays_layout_and_no_later_one():
    """A suite's schema_version range ends at SCHEMA_VERSION: a table written today passes it,
    one claiming a layout this code does not know does not."""
    from batchscale.checks.suites import load_suite
    from batchscale.schemas import TABLES

    highest = {}
    for kind in TABLES:
        for e in load_suite(kind)["expectations"]:
            if e["kwargs"].get("column") == "schema_version":
                highest[kind] = e["kwargs"]["max_value"]
    assert len(highest) >= 10 and set(highest.values()) == {SCHEMA_VERSION}, highest
