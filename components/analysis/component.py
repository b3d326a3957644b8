"""KFP wrappers of analysis: the plain one, and the one that also reads the batch-schedule
stage's tables (a pipeline whose config enables it; KFP's local runner cannot leave an
optional artifact input unset, kubeflow/pipelines#13061)."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Markdown, Metrics, Output

from batchscale.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def analysis(
    experiment: dict,
    analysis_config: dict,
    convergence_config: dict,
    sweep_config: dict,
    run_id: str,
    sweep: Input[Dataset],
    curves: Input[Dataset],
    runs: Input[Dataset],
    decisions: Input[Dataset],
    analysis_table: Output[Dataset],
    plan: Output[Dataset],
    report: Output[HTML],
    metrics: Output[Metrics],
    summary: Output[Markdown],
):
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.config.stage_inputs import StageConfig
        from batchscale.report.stage import run_task
        cfg = StageConfig(experiment, analysis=analysis_config, convergence=convergence_config,
                          sweep=sweep_config)
    run_task(metrics, cfg, run_id, sweep.path, curves.path, runs.path, decisions.path,
             analysis_table.path, plan.path, report.path, summary.path)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def analysis_with_schedule(
    experiment: dict,
    analysis_config: dict,
    convergence_config: dict,
    sweep_config: dict,
    run_id: str,
    sweep: Input[Dataset],
    curves: Input[Dataset],
    runs: Input[Dataset],
    decisions: Input[Dataset],
    critical_over_training: Input[Dataset],
    schedule_check: Input[Dataset],
    analysis_table: Output[Dataset],
    plan: Output[Dataset],
    report: Output[HTML],
    metrics: Output[Metrics],
    summary: Output[Markdown],
):
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.config.stage_inputs import StageConfig
        from batchscale.report.stage import run_task
        cfg = StageConfig(experiment, analysis=analysis_config, convergence=convergence_config,
                          sweep=sweep_config)
    run_task(metrics, cfg, run_id, sweep.path, curves.path, runs.path, decisions.path,
             analysis_table.path, plan.path, report.path, summary.path,
             schedule_paths=(critical_over_training.path, schedule_check.path))
