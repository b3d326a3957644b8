"""KFP wrappers of publish and of the regression gate after it. S3 settings and credentials come
from the environment (a Kubernetes Secret on a cluster), never from parameters, so they stay
out of the compiled YAML."""

from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Markdown, Output

from batchscale.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def publish(config_json: str, run_id: str, dataset: Input[Dataset], sweep: Input[Dataset],
            curves: Input[Dataset], runs: Input[Dataset], analysis_table: Input[Dataset],
            decisions: Input[Dataset], plan: Input[Dataset],
            lake_manifest: Output[Artifact],
            regressions: Output[Dataset], regressions_summary: Output[Markdown]):
    from batchscale.lake.publish import run_task

    run_task(lake_manifest.path, config_json, run_id, dataset.path, sweep.path, curves.path,
             runs.path, analysis_table.path, regressions.path,
             regressions_summary.path, decisions.path, plan.path)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def publish_with_schedule(config_json: str, run_id: str, dataset: Input[Dataset],
                          sweep: Input[Dataset], curves: Input[Dataset], runs: Input[Dataset],
                          analysis_table: Input[Dataset], decisions: Input[Dataset],
                          plan: Input[Dataset],
                          critical_over_training: Input[Dataset],
                          schedule_check: Input[Dataset], lake_manifest: Output[Artifact],
                          regressions: Output[Dataset], regressions_summary: Output[Markdown]):
    """publish, with the batch-schedule stage's two tables (a config that enables it)."""
    from batchscale.lake.publish import run_task

    run_task(lake_manifest.path, config_json, run_id, dataset.path, sweep.path, curves.path,
             runs.path, analysis_table.path, regressions.path,
             regressions_summary.path, decisions.path, plan.path,
             schedule_paths=(critical_over_training.path, schedule_check.path))


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def regression_gate(config_json: str, regressions: Input[Dataset]):
    from batchscale.errors import task_refusals
    from batchscale.lake.publish import gate_stage

    with task_refusals():
        gate_stage(config_json, regressions.path)
