"""KFP wrapper of convergence: one batch size's trials (all LR rules x seeds)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Output

from batchscale.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def convergence(config_json: str, run_id: str, batch_size: int, workers: int,
                dataset: Input[Dataset], curves: Output[Dataset], runs: Output[Dataset]):
    from batchscale.convergence.runner import run_stage

    run_stage(config_json, run_id, int(batch_size), int(workers), dataset.path, curves.path,
              runs.path)
