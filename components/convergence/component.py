"""KFP wrapper of convergence: one cell's trials (its batch sizes x LR rules x seeds); a cell is
one batch size on a cluster, one worker count's batch sizes locally, or the adaptive search."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Output

from batchscale.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def convergence(experiment: dict, convergence_config: dict, analysis_config: dict,
                kubernetes_config: dict, run_id: str, batch_sizes: str, workers: str,
                dataset: Input[Dataset], sweep: Input[Dataset], curves: Output[Dataset],
                runs: Output[Dataset], decisions: Output[Dataset]):
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.adaptive.stage import run_stage
        from batchscale.config.stage_inputs import StageConfig
        cfg = StageConfig(experiment, convergence=convergence_config, analysis=analysis_config,
                          kubernetes=kubernetes_config)
        run_stage(cfg, run_id, batch_sizes, int(workers), dataset.path, curves.path, runs.path,
                  decisions.path, sweep_path=sweep.path)
