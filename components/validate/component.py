"""KFP wrappers of validate: one per table group; a failed check fails the step. Each takes the
config sections its checks read (docs/architecture.md, "Component interfaces")."""

from typing import List

from kfp import dsl
from kfp.dsl import HTML, Artifact, Dataset, Input, Output

from batchscale.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def validate_dataset(experiment: dict, dataset_config: dict, dataset: Input[Dataset],
                     results: Output[Artifact], page: Output[HTML]):
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.checks.stage import validate_dataset as run
        from batchscale.config.stage_inputs import StageConfig
        cfg = StageConfig(experiment, dataset=dataset_config)
        run(cfg, dataset.path, results.path, page.path)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def validate_sweep(experiment: dict, sweep_config: dict, sweep: Input[Dataset],
                   results: Output[Artifact], page: Output[HTML]):
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.checks.stage import validate_sweep as run
        from batchscale.config.stage_inputs import StageConfig
        run(StageConfig(experiment, sweep=sweep_config), sweep.path, results.path, page.path)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def validate_runs(experiment: dict, convergence_config: dict, curves: Input[List[Dataset]],
                  runs: Input[List[Dataset]], decisions: Input[List[Dataset]],
                  merged_curves: Output[Dataset], merged_runs: Output[Dataset],
                  merged_decisions: Output[Dataset], results: Output[Artifact],
                  page: Output[HTML]):
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.checks.stage import validate_runs as run
        from batchscale.config.stage_inputs import StageConfig
        cfg = StageConfig(experiment, convergence=convergence_config)
        run(cfg, [c.path for c in curves], [r.path for r in runs], merged_curves.path,
            merged_runs.path, results.path, page.path, [d.path for d in decisions],
            merged_decisions.path)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def validate_analysis(experiment: dict, sweep_config: dict, convergence_config: dict,
                      analysis: Input[Dataset], plan: Input[Dataset],
                      results: Output[Artifact], page: Output[HTML]):
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.checks.stage import validate_analysis as run
        from batchscale.config.stage_inputs import StageConfig
        cfg = StageConfig(experiment, sweep=sweep_config, convergence=convergence_config)
        run(cfg, analysis.path, results.path, page.path, plan_path=plan.path)


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def validate_regressions(experiment: dict, regressions: Input[Dataset],
                         results: Output[Artifact], page: Output[HTML]):
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.checks.stage import validate_regressions as run
        from batchscale.config.stage_inputs import StageConfig
        run(StageConfig(experiment), regressions.path, results.path, page.path)
