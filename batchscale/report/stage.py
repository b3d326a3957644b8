"""The analysis step's entry: the run's tables in; the analysis table (analysis.stage), the
plan table (planner.stage), the HTML report, the KFP metrics and the Markdown summary out."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from batchscale.analysis.stage import analyse
from batchscale.config.stage_inputs import Config, stage_config
from batchscale.envinfo import environment
from batchscale.planner.stage import plan_run
from batchscale.storage import read_table_file


def run_stage(
    config: str | Config,
    run_id: str,
    sweep_path: str,
    curves_path: str,
    runs_path: str,
    analysis_path: str,
    report_path: str,
    markdown_path: str,
    plan_path: str | None = None,
    decisions_path: str | None = None,
    schedule_paths: tuple[str, str] | None = None,
) -> dict[str, float]:
    """Fit, plan, render; returns the flat metrics for KFP's Metrics artifact. `plan_path`:
    where the plan table goes; `decisions_path`: the adaptive search's decisions (its section
    when they have rows); `schedule_paths`: the batch-schedule stage's two tables
    (critical_over_training, schedule_check), for their section and the answer card."""
    from batchscale.batch_schedule.section import read_section
    from batchscale.report.render import render_html

    cfg = stage_config(config)
    sweep = read_table_file(sweep_path).to_pandas()
    curves = read_table_file(curves_path).to_pandas()
    runs = read_table_file(runs_path).to_pandas()
    env = environment(run_id=run_id, config_hash=cfg.config_hash, experiment=cfg.name,
                      workload=cfg.workload, variant=cfg.variant)
    decisions = (read_table_file(decisions_path).to_pandas() if decisions_path is not None
                 else None)
    result = analyse(cfg, sweep, runs, curves, env, analysis_path,
                     adaptive=decisions is not None and not decisions.empty)
    plan, plan_missing = plan_run(cfg, sweep, runs, result.rows, env, plan_path)
    schedule = (read_section(*schedule_paths, cfg.analysis.max_cpu_wait_share)
                if schedule_paths else None)
    Path(report_path).write_text(
        render_html(result, sweep, runs, curves, title=f"batchscale: {cfg.name} ({run_id})",
                    plan=plan, plan_missing=plan_missing,
                    adaptive=_adaptive(cfg, decisions, runs), schedule=schedule)
    )
    text = result.markdown + (f"\n{schedule.answer}\n" if schedule and schedule.answer else "")
    Path(markdown_path).write_text(text)
    print(text)
    return result.metrics


def run_task(metrics, config: str | Config, run_id: str, sweep_path: str, curves_path: str,
             runs_path: str, decisions_path: str, analysis_path: str, plan_path: str,
             report_path: str, markdown_path: str,
             schedule_paths: tuple[str, str] | None = None) -> None:
    """The analysis components' body: `run_stage` (a refusal is one line and its exit status,
    errors.task_refusals), then its finite figures into KFP's Metrics artifact `metrics`."""
    from batchscale.errors import task_refusals

    with task_refusals():
        values = run_stage(config, run_id, sweep_path, curves_path, runs_path,
                           analysis_path, report_path, markdown_path,
                           decisions_path=decisions_path, plan_path=plan_path,
                           schedule_paths=schedule_paths)
    for name, value in values.items():
        if value is not None and math.isfinite(value):
            metrics.log_metric(name, float(value))


def _adaptive(cfg, decisions: pd.DataFrame | None, runs: pd.DataFrame):
    """The adaptive search's report section, when the run was one (its decisions table has
    rows); the grid it is compared with: the config's batch sizes and seeds."""
    from batchscale.adaptive.section import adaptive_section
    from batchscale.analysis.critical import read_level

    if decisions is None:
        return None
    c = cfg.convergence
    return adaptive_section(decisions, runs, list(c.batch_sizes), len(c.seeds),
                            cfg.analysis.b_crit_range_factor,
                            read_level(cfg.analysis, adaptive=True))
