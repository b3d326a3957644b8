"""KFP wrappers of validate: one per table group; a failed check fails the step."""

from typing import List

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Output

from batchscale.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def validate_dataset(config_json: str, dataset: Input[Dataset], results: Output[Artifact],
                     page: Output[HTML]):
    from batchscale.checks.stage import validate_dataset as run
    from batchscale.errors import task_refusals

    with task_refusals():
        run(config_json, dataset.path, results.path, page.path)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def validate_sweep(config_json: str, sweep: Input[Dataset], results: Output[Artifact],
                   page: Output[HTML]):
    from batchscale.checks.stage import validate_sweep as run
    from batchscale.errors import task_refusals

    with task_refusals():
        run(config_json, sweep.path, results.path, page.path)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def validate_runs(config_json: str, curves: Input[List[Dataset]], runs: Input[List[Dataset]],
                  decisions: Input[List[Dataset]], merged_curves: Output[Dataset],
                  merged_runs: Output[Dataset], merged_decisions: Output[Dataset],
                  results: Output[Artifact], page: Output[HTML]):
    from batchscale.checks.stage import validate_runs as run
    from batchscale.errors import task_refusals

    with task_refusals():
        run(config_json, [c.path for c in curves], [r.path for r in runs], merged_curves.path,
            merged_runs.path, results.path, page.path, [d.path for d in decisions],
            merged_decisions.path)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def validate_analysis(config_json: str, analysis: Input[Dataset], plan: Input[Dataset],
                      results: Output[Artifact], page: Output[HTML]):
    from batchscale.checks.stage import validate_analysis as run
    from batchscale.errors import task_refusals

    with task_refusals():
        run(config_json, analysis.path, results.path, page.path, plan_path=plan.path)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def validate_regressions(config_json: str, regressions: Input[Dataset],
                         results: Output[Artifact], page: Output[HTML]):
    from batchscale.checks.stage import validate_regressions as run
    from batchscale.errors import task_refusals

    with task_refusals():
        run(config_json, regressions.path, results.path, page.path)
