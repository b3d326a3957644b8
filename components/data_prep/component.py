"""KFP wrapper of data_prep: config in, a directory of Parquet shards plus manifest out."""

from kfp import dsl
from kfp.dsl import Dataset, Output

from batchscale.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def data_prep(config_json: str, dataset: Output[Dataset]):
    from batchscale.data.prep import run_stage
    from batchscale.errors import task_refusals

    with task_refusals():
        run_stage(config_json, dataset.path)
