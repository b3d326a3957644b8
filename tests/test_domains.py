"""Language models, segmentation and detection through the stages the pipeline runs:
data prep, its validation, the throughput sweep, the convergence stage (a real torchrun process
group) with several targets, the runs validation and the analysis, on tiny sizes. The stage
functions are the ones the KFP components call; nothing here is specific to a domain but the
config."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from batchscale.checks import stage as checks
from batchscale.config import parse_config
from batchscale.convergence import runner
from batchscale.data import prep
from batchscale.report import stage as analysis_stage
from batchscale.sweep import sweep

pytestmark = pytest.mark.slow

QUIET_SWEEP = {"time_budget_s": 0.2, "min_timed_steps": 3, "untimed_steps": 1, "rounds": 1,
               "max_retries": 0, "max_unstable_share": 1.0, "overload_cpu_share": None,
               "max_cpu_wait_share": None}
DOMAINS = {
    "language_model": {
        "workload": "byte-transformer",
        "dataset": {"name": "python-docs", "sequence_length_tokens": 16, "max_rows": 600},
        "sweep": {**QUIET_SWEEP, "batch_sizes": [2, 8], "input_modes": ["synthetic", "real"],
                  "sequence_length_tokens": 16},
        "convergence": {"batch_sizes": [16], "lr_rules": ["constant"], "seeds": [0],
                        "optimizer": "adamw", "base_lr": 0.003, "warmup_steps": 5,
                        "targets": [{"metric": "val_loss", "value": 4.0},
                                    {"metric": "val_perplexity", "value": 60.0}],
                        "max_steps": 80, "eval_every_steps": 10, "train_eval_rows": 64,
                        "gap_epochs": 0.5},
    },
    "segmentation": {
        "workload": "lraspp_mobilenet_v3_large",
        "dataset": {"name": "shapes", "synthetic_train_rows": 64, "shapes_image_size_px": 32},
        "sweep": {**QUIET_SWEEP, "batch_sizes": [2], "input_modes": ["synthetic", "real"],
                  "image_size_px": 32},
        "convergence": {"batch_sizes": [8], "lr_rules": ["constant"], "seeds": [0],
                        "optimizer": "adamw", "base_lr": 0.001, "warmup_steps": 2,
                        "targets": [{"metric": "val_pixel_accuracy", "value": 0.7},
                                    {"metric": "val_loss", "value": 1.0}],
                        "max_steps": 60, "eval_every_steps": 10, "train_eval_rows": 16},
    },
    "detection": {
        "workload": "fasterrcnn_mobilenet_v3_large_320_fpn",
        "dataset": {"name": "shapes", "synthetic_train_rows": 8, "val_fraction": 0.34,
                    "shapes_image_size_px": 32},
        "sweep": {**QUIET_SWEEP, "batch_sizes": [1], "input_modes": ["real"],
                  "image_size_px": 32},
        "convergence": {"batch_sizes": [2], "lr_rules": ["constant"], "seeds": [0],
                        "base_lr": 0.001, "warmup_steps": 1,
                        "targets": [{"metric": "val_loss", "value": 50.0},
                                    {"metric": "val_map50", "value": 0.99}],
                        "max_steps": 2, "eval_every_steps": 1, "train_eval_rows": 2},
    },
}
METRIC_COLUMNS = {"language_model": ("val_loss", "val_perplexity", "train_loss"),
                  "segmentation": ("val_miou", "val_pixel_accuracy", "val_loss", "train_loss"),
                  "detection": ("val_loss", "val_map50", "train_loss")}


@pytest.mark.parametrize("domain", list(DOMAINS))
def test_a_domain_runs_through_every_stage(domain, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("BATCHSCALE_WORK_DIR", str(tmp_path / "work"))
    cfg = parse_config({"name": f"tiny-{domain.replace('_', '-')}", **DOMAINS[domain]})
    config_json = cfg.to_json()
    data, sweep_path = tmp_path / "data", tmp_path / "sweep.parquet"
    prep.run_stage(config_json, str(data))
    checks.validate_dataset(config_json, str(data), str(tmp_path / "d.json"),
                            str(tmp_path / "d.html"))

    rows = sweep.run_stage(config_json, "tiny", str(data), str(sweep_path))
    assert {r["input_mode"] for r in rows} == set(cfg.sweep.input_modes)
    assert all(r["status"] == "ok" and r["samples_per_s"] > 0 for r in rows)
    assert all(r["train_flops_per_sample"] > 0 for r in rows)
    if domain == "language_model":  # tokens/s is samples/s x bytes per sequence
        assert all(r["tokens_per_s"] == pytest.approx(16 * r["samples_per_s"]) for r in rows)
    checks.validate_sweep(config_json, str(sweep_path), str(tmp_path / "s.json"),
                          str(tmp_path / "s.html"))

    batch = cfg.convergence.batch_sizes[0]
    curves_path, runs_path = tmp_path / "curves.parquet", tmp_path / "runs.parquet"
    runner.run_stage(config_json, "tiny", batch, 1, str(data), str(curves_path), str(runs_path))
    runs, curves = pq.read_table(runs_path), pq.read_table(curves_path)
    targets = [(t.metric, t.value) for t in cfg.convergence.resolved_targets()]
    assert list(zip(runs.column("target_metric").to_pylist(),
                    runs.column("target_value").to_pylist(), strict=True)) == targets
    last = curves.slice(len(curves) - 1).to_pylist()[0]
    for column in METRIC_COLUMNS[domain]:
        assert last[column] is not None and last[column] >= 0, column
    assert last["val_accuracy"] is None  # not a classifier
    if domain != "detection":  # detection: two steps only, a smoke test of the loop
        assert runs.column("status").to_pylist() == ["reached", "reached"]
        assert curves.column("val_loss")[0].as_py() > last["val_loss"]  # it learned
    merged_curves, merged_runs = tmp_path / "mc.parquet", tmp_path / "mr.parquet"
    checks.validate_runs(config_json, [str(curves_path)], [str(runs_path)], str(merged_curves),
                         str(merged_runs), str(tmp_path / "r.json"), str(tmp_path / "r.html"))

    analysis_path, report = tmp_path / "analysis.parquet", tmp_path / "report.html"
    metrics = analysis_stage.run_stage(config_json, "tiny", str(sweep_path), str(merged_curves),
                                       str(merged_runs), str(analysis_path), str(report),
                                       str(tmp_path / "summary.md"))
    analysis = pq.read_table(analysis_path).to_pylist()
    assert {(r["target_metric"], r["target_value"]) for r in analysis} <= set(targets)
    assert json.dumps(metrics)  # plain floats for KFP's Metrics
    assert "B_crit vs target" in report.read_text()
