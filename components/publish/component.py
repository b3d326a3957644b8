"""KFP wrappers of publish and of the regression gate after it. S3 settings and credentials come
from the environment (a Kubernetes Secret on a cluster), never from parameters, so they stay
out of the compiled YAML."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Markdown, Output

from batchscale.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def publish(experiment: dict, publish_config: dict, analysis_config: dict,
            convergence_config: dict, sweep_config: dict, run_id: str,
            dataset: Input[Dataset], sweep: Input[Dataset],
            curves: Input[Dataset], runs: Input[Dataset], analysis_table: Input[Dataset],
            decisions: Input[Dataset], plan: Input[Dataset],
            lake_manifest: Output[Artifact],
            regressions: Output[Dataset], regressions_summary: Output[Markdown]):
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.config.stage_inputs import StageConfig
        from batchscale.lake.publish import run_task
        cfg = StageConfig(experiment, publish=publish_config, analysis=analysis_config,
                          convergence=convergence_config, sweep=sweep_config)
    run_task(lake_manifest.path, cfg, run_id, dataset.path, sweep.path, curves.path,
             runs.path, analysis_table.path, regressions.path,
             regressions_summary.path, decisions.path, plan.path)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def publish_with_schedule(experiment: dict, publish_config: dict, analysis_config: dict,
                          convergence_config: dict, sweep_config: dict, run_id: str,
                          dataset: Input[Dataset],
                          sweep: Input[Dataset], curves: Input[Dataset], runs: Input[Dataset],
                          analysis_table: Input[Dataset], decisions: Input[Dataset],
                          plan: Input[Dataset],
                          critical_over_training: Input[Dataset],
                          schedule_check: Input[Dataset], lake_manifest: Output[Artifact],
                          regressions: Output[Dataset], regressions_summary: Output[Markdown]):
    """publish, with the batch-schedule stage's two tables (a config that enables it)."""
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.config.stage_inputs import StageConfig
        from batchscale.lake.publish import run_task
        cfg = StageConfig(experiment, publish=publish_config, analysis=analysis_config,
                          convergence=convergence_config, sweep=sweep_config)
    run_task(lake_manifest.path, cfg, run_id, dataset.path, sweep.path, curves.path,
             runs.path, analysis_table.path, regressions.path,
             regressions_summary.path, decisions.path, plan.path,
             schedule_paths=(critical_over_training.path, schedule_check.path))


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def regression_gate(experiment: dict, publish_config: dict, regressions: Input[Dataset]):
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.config.stage_inputs import StageConfig
        from batchscale.lake.publish import gate_stage
        gate_stage(StageConfig(experiment, publish=publish_config), regressions.path)
