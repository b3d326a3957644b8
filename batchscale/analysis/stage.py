"""analysis entry point: tables in; analysis table, HTML report, metrics and Markdown out."""

from __future__ import annotations

from pathlib import Path

from batchscale.config import config_from_json
from batchscale.envinfo import environment
from batchscale.schemas import make_table
from batchscale.storage import read_table_file, write_table_atomic


def run_stage(
    config_json: str,
    run_id: str,
    sweep_path: str,
    curves_path: str,
    runs_path: str,
    analysis_path: str,
    report_path: str,
    markdown_path: str,
) -> dict[str, float]:
    """Fit, recommend, render; returns the flat metrics for KFP's Metrics artifact."""
    from batchscale.analysis.analyze import analyze
    from batchscale.analysis.report import render_html

    cfg = config_from_json(config_json)
    sweep = read_table_file(sweep_path).to_pandas()
    curves = read_table_file(curves_path).to_pandas()
    runs = read_table_file(runs_path).to_pandas()
    result = analyze(sweep, runs, curves, cfg.analysis, primary_target=primary_target(cfg),
                     gap_epochs=cfg.convergence.gap_epochs)
    env = environment(
        run_id=run_id, config_hash=cfg.config_hash, experiment=cfg.name, workload=cfg.workload
    )
    write_table_atomic(analysis_path, make_table("analysis", result.rows, env))
    Path(report_path).write_text(
        render_html(result, sweep, runs, curves, title=f"batchscale: {cfg.name} ({run_id})")
    )
    Path(markdown_path).write_text(result.markdown)
    print(result.markdown)
    return result.metrics


def primary_target(cfg) -> tuple[str, float] | None:
    """The config's target marked `primary: true`, as (metric, value); None when none is."""
    marked = [t for t in cfg.convergence.resolved_targets() if t.primary]
    return (marked[0].metric, marked[0].value) if marked else None
