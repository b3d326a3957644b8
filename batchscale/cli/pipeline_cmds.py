"""`batchscale run` and `batchscale compile`: the whole pipeline, run locally or written out as
IR YAML for a KFP cluster."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from batchscale.cli.common import STATE_DIR, connect_store, given_run_id
from batchscale.cliflags import check_output_file, config_from_args
from batchscale.config import load_config
from batchscale.errors import BadInput, BatchscaleError, task_refusal
from batchscale.stopping import resumable

WORKFLOW_SIZE_WARNING_BYTES = 1_000_000
"""A compiled pipeline above this may not fit the workflow object a cluster stores (a study's
variants each add their tasks)."""


def own_code_note(workload: str, environ) -> str | None:
    """What a compiled pipeline of the user's own workload needs that the default images lack;
    None for a built-in workload or where BATCHSCALE_IMAGE names an image of the user's."""
    from batchscale.names import is_factory_spec

    if not is_factory_spec(workload) or workload.startswith("batchscale.") \
            or "BATCHSCALE_IMAGE" in environ:
        return None
    return (f"workload {workload} is your own code, and the images above are batchscale's, "
            "without it: every pod would fail to import it. Build on them with your package "
            "and compile with BATCHSCALE_IMAGE and BATCHSCALE_GPU_IMAGE naming yours "
            "(docs/kubeflow.md, \"Your own workload on a cluster\")")


def loop_note(workload: str) -> str | None:
    """What the compile could tell of a user's TrainingLoop (its sweep step's GPU depends on
    it: pipelines/cluster.py, sweep_gpus); None for a built-in workload or another kind."""
    from batchscale.names import is_factory_spec
    from batchscale.workloads import is_training_loop

    if not is_factory_spec(workload):
        return None
    found = is_training_loop(workload)
    if found:
        return (f"{workload} is a TrainingLoop: its throughput-sweep step measures nothing and "
                "requests no GPU")
    if found is None:
        return (f"cannot import {workload} here, so the compile cannot tell whether it is a "
                "TrainingLoop; if it is, its throughput-sweep step holds a GPU for its few "
                "seconds (compile from the directory that holds it: docs/kubeflow.md)")
    return None


def run_header(cfg, workload, run_id: str) -> str:
    """The run's first line: its id, name, workload and the data it trains on."""
    data = "on its own data" if workload.has_own_data else f"on {cfg.dataset.name}"
    return f"batchscale run {run_id}: {cfg.name} ({cfg.workload} {data})"


def checked_workload(cfg):
    """(workload, cfg with the workload's own targets), refused now (BadInput) where a stage
    would fail on it later: a user factory that cannot be imported or returns no nn.Module, a
    loss or evaluation that fails on two examples, data smaller than the largest batch, a
    TrainingLoop with the batch-schedule stage."""
    from batchscale.contract_check import check_workload, with_workload_targets
    from batchscale.workloads import get_workload

    workload = get_workload(cfg.workload, image_size=cfg.sweep.image_size_px)
    cfg = with_workload_targets(cfg, workload)
    # Checked as the convergence stage will run it: a mistake there is refused now, not after
    # the data preparation and the whole sweep.
    check_workload(workload, batch_sizes=cfg.convergence.batch_sizes,
                   targets=cfg.convergence.resolved_targets(), convergence=True)
    if workload.loop is not None and cfg.batch_schedule.enabled:
        from batchscale.batch_schedule.stage import loop_refusal

        # refused before any stage runs, not by the batch-schedule stage mid-pipeline
        raise BadInput(f"{loop_refusal(cfg.workload)}, or set batch_schedule.enabled: false")
    return workload, cfg


def cmd_run(args) -> int:
    cfg = config_from_args(args)
    run_id = given_run_id(args)
    if cfg.study.is_study:
        from batchscale.cli.study_cmd import run_study

        return run_study(cfg, run_id)
    workload, cfg = checked_workload(cfg)
    store = connect_store()
    print(run_header(cfg, workload, run_id), file=sys.stderr)
    if workload.loop is None and (note := cfg.convergence.lr_note()):
        print(f"note: {note}", file=sys.stderr)
    from batchscale.pipelines.local import run_local

    try:
        with resumable(run_id):
            run_local(cfg, run_id, STATE_DIR.resolve())
    except RuntimeError as err:
        if cfg.publish.fail_on_regression:
            _raise_if_regressed(store, run_id)
        reason = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
        _raise_if_refused(run_id, reason)
        raise BatchscaleError(f"pipeline run {run_id} failed: {reason} Tables already measured "
                              f"are kept under {STATE_DIR / 'work' / run_id}; rerun with "
                              f"--run-id {run_id} to resume.") from None
    from batchscale.lake.summary import print_run_summary

    tables = print_run_summary(store, run_id, STATE_DIR / "runs" / run_id)
    raise_if_unreached(tables.get("runs"), cfg, run_id)
    return 0


def raise_if_unreached(runs, cfg, run_id: str) -> None:
    """A run whose trials all ended short of the target has no answer: exit 1, as `converge`
    does, with how they ended and what to change (the run stays published)."""
    from batchscale.cli.stage_cmds import why_short
    from batchscale.schemas import RunStatus

    if runs is None or not runs.num_rows or RunStatus.REACHED in runs.column("status").to_pylist():
        return
    wanted = " or ".join(t.label for t in cfg.convergence.resolved_targets())
    raise BatchscaleError(f"run {run_id} is published, but no trial reached {wanted}, so it "
                          f"answers nothing: {why_short(runs.to_pylist(), cfg.convergence)}")


def _raise_if_refused(run_id: str, reason: str) -> None:
    """A task that refused its input (bad data, a failed validation) printed why: raise that,
    with the task's name and exit status, instead of a generic pipeline failure."""
    log = STATE_DIR / "runs" / run_id / "pipeline.log"
    refusal = task_refusal(log.read_text(errors="replace")) if log.exists() else None
    if refusal is None:
        return
    task = re.search(r"Inner task failed: '([^']+)'", reason)
    named = f"task {task[1]!r}" if task else "a task"
    error = BatchscaleError(f"pipeline run {run_id}: {named} refused to go on: {refusal} "
                            f"(full log: {log})")
    error.exit_code = refusal.exit_code
    raise error from None


def _raise_if_regressed(store, run_id: str) -> None:
    """A pipeline that failed only at the regression gate: print the published run and raise
    RegressionFound (exit 4) naming the cells, instead of a generic failure."""
    from batchscale.lake.publish import published_regressions, regression_message
    from batchscale.lake.regression import RegressionFound
    from batchscale.lake.summary import print_run_summary

    flagged = published_regressions(store, run_id)
    if flagged:
        print_run_summary(store, run_id, STATE_DIR / "runs" / run_id)
        raise RegressionFound(regression_message(flagged))


def cmd_compile(args) -> int:
    from batchscale.images import CPU_IMAGE, GPU_IMAGE
    from batchscale.pipelines.batchscale_pipeline import compile_pipeline

    cfg = load_config(args.config)
    check_output_file(args.output, "--output").parent.mkdir(parents=True, exist_ok=True)
    if cfg.study.is_study:
        from batchscale.cli.study_cmd import check_axes_reach_the_data
        from batchscale.config.variants import expand

        check_axes_reach_the_data(cfg, expand(cfg))
    path = compile_pipeline(cfg, args.output)
    print(f"wrote {path} (images {CPU_IMAGE}, {GPU_IMAGE})")
    for note in (own_code_note(cfg.workload, os.environ), loop_note(cfg.workload)):
        if note:
            print(f"note: {note}", file=sys.stderr)
    size = Path(path).stat().st_size
    if size > WORKFLOW_SIZE_WARNING_BYTES:
        print(f"warning: the pipeline is {size / 2**20:.1f} MiB; Argo keeps the whole workflow "
              "in one Kubernetes object, which etcd stores up to about 1.5 MiB (kubeflow/"
              "pipelines#13738): split the study into fewer variants per pipeline",
              file=sys.stderr)
    return 0
