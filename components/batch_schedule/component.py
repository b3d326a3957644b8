"""KFP wrapper of the batch-schedule measurement: B_crit over training, the schedule it
suggests and that schedule's check (docs/batch-schedule.md)."""

from kfp import dsl
from kfp.dsl import Dataset, Input, Markdown, Output

from batchscale.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def batch_schedule(experiment: dict, batch_schedule_config: dict, convergence_config: dict,
                   analysis_config: dict, run_id: str, dataset: Input[Dataset],
                   critical_over_training: Output[Dataset], schedule_check: Output[Dataset],
                   summary: Output[Markdown]):
    import os
    import sys
    import tempfile

    from batchscale.errors import task_refusals

    # Trials and validation pages live only as long as the task: a local run's executor shares
    # /tmp with the next one, so nothing is left there.
    with task_refusals(), tempfile.TemporaryDirectory(prefix="batch-schedule-") as work:
        from batchscale.batch_schedule.stage import run_stage
        from batchscale.config.stage_inputs import StageConfig
        cfg = StageConfig(experiment, batch_schedule=batch_schedule_config,
                          convergence=convergence_config, analysis=analysis_config)
        run_stage(cfg, run_id, dataset.path, critical_over_training.path,
                  schedule_check.path, summary.path, os.path.join(work, "work"), work,
                  lambda line: print(line, file=sys.stderr, flush=True))
