"""`batchscale report --run-id` (lake/summary.py `rebuild_report`) on runs published to a real
SeaweedFS (tests/conftest.py): the rebuilt report has the "What if: more workers" section, made
by the pipeline's own `default_plan` from the published tables — or says why there is none."""

from __future__ import annotations

import plan_tables as pt

from batchscale.lake.publish import publish_run
from batchscale.lake.summary import rebuild_report
from batchscale.storage import write_table_atomic

# As publish records them; few bootstrap samples keep the re-run analysis quick.
MANIFEST = {"workload": "digits-mlp", "analysis_config": {"bootstrap_samples": 10}}


def rebuilt_page(store, tmp_path, run_id: str, parallel_batches) -> str:
    files = {}
    for name, table in pt.tables(parallel_batches).items():
        files[name] = tmp_path / f"{run_id}-{name}.parquet"
        write_table_atomic(files[name], table)
    publish_run(store, run_id, files, extra=MANIFEST)
    lines = rebuild_report(store, run_id, tmp_path / f"{run_id}.html")
    page = (tmp_path / f"{run_id}.html").read_text()
    # The terminal's summary opens with the recommendation the report's box gives.
    at = lines.index("recommendation:")
    assert [line.split(":")[0] for line in lines[at + 1:at + 6]] == [
        "  For the target val_accuracy >= 0.9 — marked primary in the config.",
        "  Batch size", "  LR rule", "  Learning rate", "  Workers"]
    return page


def test_a_rebuilt_report_has_the_what_if_section(object_store, tmp_path):
    page = rebuilt_page(object_store, tmp_path, "20261201T120000Z-plan", (128,))
    assert "<h2>What if: more workers</h2>" in page
    assert "Pareto front (fastest first)" in page
    # the configured worker counts (1, 2: the trials') measured; 4 and 8 added, extrapolated
    assert "Worker counts 4, 8 were not run" in page
    # Which answer to act on when the plan's model and the card's measured times differ.
    assert "For the batch to train at on the devices this run used, act on the card" in page
    # the sweep's OOM at 256: b = 256 runs as 2 micro-batches of 128
    assert "accumulate gradients (b 256 = 2×128)" in page
    assert "What if: time to target vs device-hours" in page


def test_a_rebuilt_report_says_why_there_is_no_plan(object_store, tmp_path):
    page = rebuilt_page(object_store, tmp_path, "20261201T120001Z-nopl", ())
    assert "<h2>What if: more workers</h2>" in page
    assert "No plan for this run: the run has no data-parallel runs" in page
