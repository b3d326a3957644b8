"""The analysis stage's default plan: the plan table for the configured worker
counts and the extrapolated ones, passing its suite through the analysis's validate step, and
the report's "What if" section — or, for a run without data-parallel runs, an empty plan table
and the reason in the report."""

from __future__ import annotations

import json
from pathlib import Path

import plan_tables as pt
import pyarrow as pa

from batchscale.checks.stage import validate_analysis
from batchscale.config import AnalysisConfig, ConvergenceConfig, ExperimentConfig
from batchscale.report.stage import run_stage
from batchscale.schemas import make_table
from batchscale.storage import read_table_file, write_table_atomic


def stage(tmp: Path, parallel_batches=(128,)) -> tuple[str, pa.Table, str]:
    tables = pt.tables(parallel_batches)
    paths = {}
    for name, table in (*tables.items(), ("curves", make_table("curves", [], pt.ENV))):
        paths[name] = str(tmp / f"{name}.parquet")
        write_table_atomic(paths[name], table)
    scaling = {"scaling_workers": [2], "scaling_batch_sizes": [128]} if parallel_batches else {}
    convergence = ConvergenceConfig(batch_sizes=list(pt.SINGLE_BATCHES), **scaling)
    config = ExperimentConfig(name="plan-stage", convergence=convergence,
                              analysis=AnalysisConfig(bootstrap_samples=10)).to_json()
    out = {name: str(tmp / name) for name in ("analysis.parquet", "report.html", "summary.md",
                                              "plan.parquet")}
    run_stage(config, "plan-run", paths["sweep"], paths["curves"], paths["runs"],
              out["analysis.parquet"], out["report.html"], out["summary.md"],
              plan_path=out["plan.parquet"])
    validate_analysis(config, out["analysis.parquet"], str(tmp / "v.json"),
                      str(tmp / "v.html"), plan_path=out["plan.parquet"])
    return Path(out["report.html"]).read_text(), read_table_file(out["plan.parquet"]), \
        (tmp / "v.json").read_text()


def test_stage_writes_a_validated_plan_and_the_what_if_section(tmp_path):
    page, plan, validation = stage(tmp_path)
    assert sorted(set(plan.column("workers").to_pylist())) == [1, 2, 4, 8]
    extrapolated = {w for w, e in zip(plan.column("workers").to_pylist(),
                                      plan.column("extrapolated").to_pylist(), strict=True) if e}
    assert extrapolated == {4, 8}
    assert [t["table"] for t in json.loads(validation)] == ["analysis", "plan"]
    assert "<h2>What if: more workers</h2>" in page
    assert "Pareto front" in page
    # no all-reduce probe in these runs: the bandwidth is the steps' effective one, said so
    assert "not measured: link bandwidth (effective), latency (assumed)" in page
    assert "Worker counts 4, 8 were not run" in page


def test_without_data_parallel_runs_the_plan_is_empty_and_the_report_says_why(tmp_path):
    page, plan, validation = stage(tmp_path, parallel_batches=())
    assert plan.num_rows == 0
    assert [t["table"] for t in json.loads(validation)] == ["analysis"]
    assert "No plan for this run: the run has no data-parallel runs" in page


def _plan_text(runs) -> str:
    from batchscale.planner.table import default_plan, plan_lines

    frames = pt.frames()
    plan, missing = default_plan(frames["sweep"], runs, frames["analysis"], workload=None,
                                 configured_workers=[1, 2])
    assert plan is not None, missing
    return "\n".join(plan_lines(plan))


def test_a_plan_from_disturbed_data_parallel_trials_is_not_trusted():
    """The communication model comes from the two-worker trials: when their threads waited for
    a CPU beyond the limit, the recommendation says NOT TRUSTED."""
    quiet = pt.frames()["runs"].assign(gradient_bytes=pt.GRADIENT_BYTES, cpu_wait_share=0.02)
    calm = _plan_text(quiet)
    assert "NOT TRUSTED" not in calm
    busy = quiet.assign(cpu_wait_share=quiet["workers"].map({1: 0.02, 2: 0.35}))
    text = _plan_text(busy)
    recommendation = next(line for line in text.splitlines() if line.startswith("recommendation"))
    assert "NOT TRUSTED" in recommendation and "up to 35%" in recommendation, text
    # A link stated in full takes nothing from those trials: their CPU waits flag nothing.
    from batchscale.planner.inputs import read_plan_inputs
    from batchscale.planner.model import CommModel
    from batchscale.planner.table import make_plan

    frames = pt.frames()
    inputs = read_plan_inputs(frames["sweep"], busy, frames["analysis"], None)
    stated = make_plan(inputs, CommModel.from_link(100, 5), [1, 2, 4])
    assert "NOT TRUSTED" not in stated.recommendation


def test_recorded_gradient_bytes_plan_a_workload_whose_model_cannot_be_built(tmp_path,
                                                                           monkeypatch):
    """A TrainingLoop's trials record their gradient bytes (trial.prepare saw the model): the
    pipeline's plan uses them instead of building the workload, which a loop cannot be."""
    from batchscale.planner.table import default_plan

    monkeypatch.chdir(Path(__file__).parent)  # loop_workloads is imported from here
    frames = pt.frames()
    runs = frames["runs"].assign(gradient_bytes=pt.GRADIENT_BYTES)
    plan, missing = default_plan(frames["sweep"], runs, frames["analysis"],
                                 workload="loop_workloads:good_loop", configured_workers=[1, 2])
    assert plan is not None, missing
    unrecorded = frames["runs"].assign(gradient_bytes=None)
    plan, missing = default_plan(frames["sweep"], unrecorded, frames["analysis"],
                                 workload="loop_workloads:good_loop", configured_workers=[1, 2])
    assert plan is None and "is a TrainingLoop: batchscale cannot build its model" in missing
