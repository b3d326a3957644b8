"""KFP wrappers of a study's two steps on a cluster: each variant's run id, and the comparison
of the variants after every one has published. S3 settings and credentials come from the
environment (a Kubernetes Secret on a cluster), never from parameters, so they stay out of the
compiled YAML."""

from kfp import dsl
from kfp.dsl import HTML, Dataset, Markdown, Output

from batchscale.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def variant_run_id(study_id: str, variant: str) -> str:
    """Its own step because a backend does not reliably substitute KFP's run UUID inside a
    formatted string (kubeflow/pipelines#11035); passed whole, it does."""
    from batchscale.config.variants import variant_run_id as run_id_of

    return run_id_of(study_id, variant)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def compare_study(config: dict, study_id: str, study: Output[Dataset],
                  study_axes: Output[Dataset], report: Output[HTML], answer: Output[Markdown]):
    from batchscale.errors import task_refusals

    # The whole study config: its variants are whole experiments, made from it here.
    with task_refusals():
        from batchscale.config.stage_inputs import config_from_input
        from batchscale.study.stage import run_compare_stage
        study_config = config_from_input(config, "pipeline input config")
        markdown = run_compare_stage(study_config, study_id, study.path, study_axes.path,
                                     report.path)
    with open(answer.path, "w") as f:
        f.write(markdown)
