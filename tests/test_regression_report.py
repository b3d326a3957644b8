"""The run's own report draws its cells' history (baseline band, suspected and confirmed runs,
change points), and the regression verdicts get their suite checked before the gate reads them.

The runs are published to a real SeaweedFS through the publish stage's entry point
(`publish_synthetic_run`); the verdict suite runs through the validate stage's entry point.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from test_publish import config_json, publish_synthetic_run

from batchscale.analysis.figures import PNG_DATA_URI_PREFIX
from batchscale.checks.stage import validate_regressions
from batchscale.errors import ValidationFailed
from batchscale.lake.history import History, with_run
from batchscale.lake.history_chart import HISTORY_CAPTION
from batchscale.lake.publish import publish_date, report_key
from batchscale.storage import read_table_file, write_table_atomic

NORMAL, SLOW = 1000.0, 600.0
"""samples/s at batch 64: a steady series, then a 40 % drop (beyond the 8 % floor)."""


def stored_report(store, run_id: str) -> str:
    return store.get_bytes(report_key(store, publish_date(store, run_id), run_id)).decode()


def regressions_section(page: str) -> str:
    """The "Regressions" section of a report page, up to its end."""
    start = page.index("<h2>Regressions</h2>")
    return page[start:page.index("</section>", start)]


def test_first_run_report_says_why_there_is_no_history_plot(object_store, monkeypatch,
                                                            tmp_path):
    run_id = "20260501T000000Z-first0"
    publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id, {64: NORMAL})
    section = regressions_section(stored_report(object_store, run_id))
    assert "no earlier run of this workload is in the lake" in section
    assert PNG_DATA_URI_PREFIX not in section


def test_report_of_a_confirmed_regression_embeds_the_history_plot(object_store, monkeypatch,
                                                                  tmp_path):
    """Three steady runs, then two slow ones: the second slow run is confirmed, and its own
    report carries the cells' series (the plot) beside the verdict that names the change."""
    for i in range(3):
        publish_synthetic_run(object_store, monkeypatch, tmp_path, f"20260502T00000{i}Z-good{i}",
                              {64: NORMAL})
    publish_synthetic_run(object_store, monkeypatch, tmp_path, "20260503T000000Z-slow01",
                          {64: SLOW})
    last = "20260503T000001Z-slow02"
    manifest = publish_synthetic_run(object_store, monkeypatch, tmp_path, last, {64: SLOW})
    assert len(manifest["regressions"]) == 1
    page = stored_report(object_store, last)
    regressions = regressions_section(page)
    assert "regressed" in regressions and "20260503T000000Z-slow01" in regressions
    assert HISTORY_CAPTION.replace("'", "&#39;") in regressions
    assert f'<img src="{PNG_DATA_URI_PREFIX}' in regressions


def test_history_of_another_device_is_not_drawn(object_store, monkeypatch, tmp_path):
    publish_synthetic_run(object_store, monkeypatch, tmp_path, "20260504T000000Z-devaa0",
                          {64: NORMAL}, device="cpu: Other CPU")
    run_id = "20260504T000001Z-devbb0"
    publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id, {64: NORMAL})
    page = stored_report(object_store, run_id)
    assert "no earlier run on this device and precision is in the lake" in page


def test_with_run_appends_the_current_run_last_with_its_verdicts():
    import pandas as pd

    earlier = pd.Timestamp("2026-05-01", tz="UTC")
    cell = {"device_name": "cpu: X", "precision": "fp32", "input_mode": "synthetic",
            "batch_size": 64}
    past = History(
        "digits-mlp",
        pd.DataFrame([{"published_at": earlier, "date": "2026-05-01", "run_id": "a", **cell,
                       "samples_per_s": NORMAL}]),
        pd.DataFrame(columns=["published_at", "date", "run_id", "lr_rule", "b_crit",
                              "b_crit_low", "b_crit_high", "b_crit_bound",
                              "b_crit_bound_batch"]),
    )
    sweep = pd.DataFrame([{**cell, "status": "ok", "samples_per_s": SLOW},
                          {**cell, "batch_size": 128, "status": "oom", "samples_per_s": None}])
    verdicts = pd.DataFrame([{**cell, "verdict": "suspected", "history_median": NORMAL,
                              "allowed_drop": 80.0, "first_bad_run_id": None}])
    both = with_run(past, "b", "2026-05-02", sweep, verdicts)
    assert both.throughput["run_id"].tolist() == ["a", "b"]  # the OOM row is not a figure
    assert both.throughput["samples_per_s"].tolist() == [NORMAL, SLOW]
    assert both.throughput["published_at"].is_monotonic_increasing
    assert both.verdicts[["run_id", "verdict"]].values.tolist() == [["b", "suspected"]]


def test_published_verdicts_pass_their_suite(object_store, monkeypatch, tmp_path):
    run_id = "20260505T000000Z-suite0"
    publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id, {64: NORMAL, 16: 300.0})
    verdicts = tmp_path / run_id / "out" / "regressions.parquet"
    results = tmp_path / "results.json"
    validate_regressions(config_json(), str(verdicts), str(results), str(tmp_path / "v.html"))
    [result] = json.loads(results.read_text())
    assert result["table"] == "regressions" and result["success"] is True


def test_a_malformed_verdict_table_stops_the_run_before_the_gate(object_store, monkeypatch,
                                                                 tmp_path):
    run_id = "20260506T000000Z-suite1"
    publish_synthetic_run(object_store, monkeypatch, tmp_path, run_id, {64: NORMAL})
    path = tmp_path / run_id / "out" / "regressions.parquet"
    table = read_table_file(path)
    column = table.schema.get_field_index("verdict")
    broken = table.set_column(column, "verdict", pa.array(["fine"] * table.num_rows))
    write_table_atomic(path, broken)
    with pytest.raises(ValidationFailed, match="verdict"):
        validate_regressions(config_json(), str(path), str(tmp_path / "r.json"),
                             str(tmp_path / "v.html"))
