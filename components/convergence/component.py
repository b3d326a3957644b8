"""KFP wrapper of convergence: one cell's trials (its batch sizes x LR rules x seeds); a cell is
one batch size on a cluster, one worker count's batch sizes locally, or the adaptive search."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Output

from batchscale.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def convergence(config_json: str, run_id: str, batch_sizes: str, workers: str,
                dataset: Input[Dataset], sweep: Input[Dataset], curves: Output[Dataset],
                runs: Output[Dataset], decisions: Output[Dataset]):
    from batchscale.adaptive.stage import run_stage
    from batchscale.errors import task_refusals

    with task_refusals():
        run_stage(config_json, run_id, batch_sizes, int(workers), dataset.path, curves.path,
                  runs.path, decisions.path, sweep_path=sweep.path)
