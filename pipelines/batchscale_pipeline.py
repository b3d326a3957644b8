"""The batchscale pipeline (kfp v2): the same function runs under kfp.local and on a cluster.

    data_prep -> validate(dataset) -> throughput_sweep -> validate(sweep)
              -> convergence per batch size (serial) -> validate(runs)
              -> analysis -> validate(analysis) -> publish

Measurement stages run one after another (ParallelFor parallelism=1, and convergence waits for
the sweep's validation) because overlapping measurements distort each other's timings.
Caching is off everywhere: a cached measurement is not a measurement.
"""

from batchscale.components.analysis.component import analysis
from batchscale.components.convergence.component import convergence
from batchscale.components.data_prep.component import data_prep
from batchscale.components.publish.component import publish
from batchscale.components.throughput_sweep.component import throughput_sweep
from batchscale.components.validate.component import (
    validate_analysis,
    validate_dataset,
    validate_runs,
    validate_sweep,
)
from kfp import dsl

from batchscale.config import ExperimentConfig

PIPELINE_NAME = "batchscale"
STAGE_NAMES = ("data-prep", "validate-dataset", "throughput-sweep", "validate-sweep",
               "convergence", "validate-runs", "analysis", "validate-analysis", "publish")


def _no_cache(task: dsl.PipelineTask) -> dsl.PipelineTask:
    return task.set_caching_options(False)


def build_pipeline(cfg: ExperimentConfig):
    """A pipeline function for `cfg`: the batch-size fan-out is fixed at build time, the config
    itself is the `config_json` parameter (its default is `cfg`)."""
    cells = cfg.convergence.fan_out()

    @dsl.pipeline(name=PIPELINE_NAME, description="Why a bigger batch does not train faster: "
                  "throughput, memory and critical batch size, with a recommendation.")
    def batchscale_pipeline(config_json: str = cfg.to_json(), run_id: str = "manual"):
        prep = _no_cache(data_prep(config_json=config_json))
        dataset = prep.outputs["dataset"]
        data_ok = _no_cache(validate_dataset(config_json=config_json, dataset=dataset))
        sweep = _no_cache(throughput_sweep(config_json=config_json, run_id=run_id,
                                           dataset=dataset).after(data_ok))
        sweep_ok = _no_cache(validate_sweep(config_json=config_json,
                                            sweep=sweep.outputs["sweep"]))
        with dsl.ParallelFor(cells, parallelism=1) as cell:
            conv = _no_cache(convergence(config_json=config_json, run_id=run_id,
                                         batch_size=cell.batch_size, workers=cell.workers,
                                         dataset=dataset).after(sweep_ok))
        runs_ok = _no_cache(validate_runs(config_json=config_json,
                                          curves=dsl.Collected(conv.outputs["curves"]),
                                          runs=dsl.Collected(conv.outputs["runs"])))
        analysed = _no_cache(analysis(config_json=config_json, run_id=run_id,
                                      sweep=sweep.outputs["sweep"],
                                      curves=runs_ok.outputs["merged_curves"],
                                      runs=runs_ok.outputs["merged_runs"]))
        analysis_ok = _no_cache(validate_analysis(config_json=config_json,
                                                  analysis=analysed.outputs["analysis_table"]))
        publish_task = _no_cache(publish(run_id=run_id, dataset=dataset,
                                         sweep=sweep.outputs["sweep"],
                                         curves=runs_ok.outputs["merged_curves"],
                                         runs=runs_ok.outputs["merged_runs"],
                                         analysis_table=analysed.outputs["analysis_table"],
                                         report=analysed.outputs["report"]).after(analysis_ok))
        publish_task.set_retry(num_retries=3, backoff_duration="30s", backoff_factor=2.0)

    return batchscale_pipeline


def compile_pipeline(cfg: ExperimentConfig, output_path: str) -> str:
    from kfp import compiler

    compiler.Compiler().compile(build_pipeline(cfg), package_path=output_path)
    return output_path
