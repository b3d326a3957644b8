"""KFP wrapper of data_prep: its config section in, Parquet shards plus a manifest out."""

from kfp import dsl
from kfp.dsl import Dataset, Output

from batchscale.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def data_prep(experiment: dict, dataset_config: dict, dataset: Output[Dataset]):
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.config.stage_inputs import StageConfig
        from batchscale.data.prep import run_stage
        run_stage(StageConfig(experiment, dataset=dataset_config), dataset.path)
