"""KFP wrapper of throughput_sweep: dataset in, sweep table out."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Output

from batchscale.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def throughput_sweep(experiment: dict, sweep_config: dict, analysis_config: dict, run_id: str,
                     dataset: Input[Dataset], sweep: Output[Dataset]):
    from batchscale.errors import task_refusals

    with task_refusals():
        from batchscale.config.stage_inputs import StageConfig
        from batchscale.sweep.sweep import pipeline_stage
        cfg = StageConfig(experiment, sweep=sweep_config, analysis=analysis_config)
        pipeline_stage(cfg, run_id, dataset.path, sweep.path)
