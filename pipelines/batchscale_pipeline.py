"""The batchscale pipeline (kfp v2): the same stages run under kfp.local and on a cluster.

    data_prep -> validate(dataset) -> throughput_sweep -> validate(sweep)
              -> convergence per cell (serial) -> validate(runs)
              -> analysis -> validate(analysis) -> publish -> validate(regressions)
              -> regression gate

Measurement stages run one after another (ParallelFor parallelism=1, and convergence waits for
the sweep's validation) because overlapping measurements distort each other's timings.
Caching is off everywhere: a cached measurement is not a measurement.

`build_pipeline(cfg, for_cluster=True)` adds what only a Kubernetes cluster understands (GPU,
CPU and memory requests per stage and per convergence cell, images, node placement, pod
deadlines, S3 settings from a Secret: pipelines/cluster.py) and takes the run id from KFP, so
every run and every scheduled run publishes under its own id. kfp.local ignores those
settings, so the local pipeline is built without them.
"""

from kfp import dsl

from batchscale.components.analysis.component import analysis
from batchscale.components.convergence.component import convergence
from batchscale.components.data_prep.component import data_prep
from batchscale.components.publish.component import publish, regression_gate
from batchscale.components.throughput_sweep.component import throughput_sweep
from batchscale.components.validate.component import (
    validate_analysis,
    validate_dataset,
    validate_regressions,
    validate_runs,
    validate_sweep,
)
from batchscale.config import ExperimentConfig
from batchscale.pipelines.cluster import (
    GPU_STAGES,
    apply_cluster_settings,
    check_devices,
    cluster_cells,
    wire_loop_fields,
)

PIPELINE_NAME = "batchscale"
PIPELINE_DESCRIPTION = ("Why a bigger batch does not train faster: throughput, memory and "
                        "critical batch size, with a recommendation.")
STAGE_NAMES = ("data-prep", "validate-dataset", "throughput-sweep", "validate-sweep",
               "convergence", "validate-runs", "analysis", "validate-analysis", "publish",
               "validate-regressions", "regression-gate")
__all__ = ["GPU_STAGES", "STAGE_NAMES", "build_pipeline", "compile_pipeline"]
LOCAL_RUN_ID = "manual"
PUBLISH_RETRIES = 3
PUBLISH_BACKOFF = "30s"
PUBLISH_BACKOFF_FACTOR = 2.0

Tasks = dict[str, dsl.PipelineTask]


def _no_cache(task: dsl.PipelineTask) -> dsl.PipelineTask:
    return task.set_caching_options(False)


def _stages(cells: list[dict], config_json: str, run_id: str) -> tuple[Tasks, object]:
    """Create every stage's task (inside a pipeline function); returns them by stage name so the
    cluster settings can be applied per stage, and the convergence loop's item, whose fields
    carry each cell's own requests on a cluster."""
    prep = _no_cache(data_prep(config_json=config_json))
    dataset = prep.outputs["dataset"]
    data_ok = _no_cache(validate_dataset(config_json=config_json, dataset=dataset))
    sweep = _no_cache(throughput_sweep(config_json=config_json, run_id=run_id,
                                       dataset=dataset).after(data_ok))
    sweep_ok = _no_cache(validate_sweep(config_json=config_json, sweep=sweep.outputs["sweep"]))
    with dsl.ParallelFor(cells, parallelism=1) as cell:
        conv = _no_cache(convergence(config_json=config_json, run_id=run_id,
                                     batch_sizes=cell.batch_sizes, workers=cell.workers,
                                     dataset=dataset,
                                     sweep=sweep.outputs["sweep"]).after(sweep_ok))
    runs_ok = _no_cache(validate_runs(config_json=config_json,
                                      curves=dsl.Collected(conv.outputs["curves"]),
                                      runs=dsl.Collected(conv.outputs["runs"]),
                                      decisions=dsl.Collected(conv.outputs["decisions"])))
    analysed = _no_cache(analysis(config_json=config_json, run_id=run_id,
                                  sweep=sweep.outputs["sweep"],
                                  curves=runs_ok.outputs["merged_curves"],
                                  runs=runs_ok.outputs["merged_runs"],
                                  decisions=runs_ok.outputs["merged_decisions"]))
    analysis_ok = _no_cache(validate_analysis(config_json=config_json,
                                              analysis=analysed.outputs["analysis_table"],
                                              plan=analysed.outputs["plan"]))
    publish_task = _no_cache(publish(config_json=config_json, run_id=run_id, dataset=dataset,
                                     sweep=sweep.outputs["sweep"],
                                     curves=runs_ok.outputs["merged_curves"],
                                     runs=runs_ok.outputs["merged_runs"],
                                     analysis_table=analysed.outputs["analysis_table"],
                                     report=analysed.outputs["report"],
                                     decisions=runs_ok.outputs["merged_decisions"],
                                     plan=analysed.outputs["plan"]
                                     ).after(analysis_ok))
    publish_task.set_retry(num_retries=PUBLISH_RETRIES, backoff_duration=PUBLISH_BACKOFF,
                           backoff_factor=PUBLISH_BACKOFF_FACTOR)
    # Its own step, without retries: a regression is a verdict, not a flaky store.
    verdicts = publish_task.outputs["regressions"]
    verdicts_ok = _no_cache(validate_regressions(config_json=config_json, regressions=verdicts))
    gate = _no_cache(regression_gate(config_json=config_json,
                                     regressions=verdicts).after(verdicts_ok))
    tasks = dict(zip(STAGE_NAMES, (prep, data_ok, sweep, sweep_ok, conv, runs_ok, analysed,
                                   analysis_ok, publish_task, verdicts_ok, gate), strict=True))
    return tasks, cell


# ------------------------------------------------------------------------------ pipelines
def build_pipeline(cfg: ExperimentConfig, for_cluster: bool = False):
    """A pipeline function for `cfg`: the batch-size fan-out is fixed at build time, the config
    itself is the `config_json` parameter (its default is `cfg`). Locally the run id is a
    parameter (the CLI makes one, and reusing it resumes a run); on a cluster it is KFP's run
    UUID, because parameter macros are not expanded in v2 recurring runs (kubeflow/pipelines
    #12494) and a fixed id would collide in the create-only lake."""
    if for_cluster:
        check_devices(cfg)

        @dsl.pipeline(name=PIPELINE_NAME, description=PIPELINE_DESCRIPTION)
        def batchscale_cluster_pipeline(config_json: str = cfg.to_json()):
            tasks, cell = _stages(cluster_cells(cfg), config_json,
                                  dsl.PIPELINE_JOB_ID_PLACEHOLDER)
            apply_cluster_settings(tasks, cell, cfg)

        return batchscale_cluster_pipeline

    cells = cfg.convergence.fan_out(one_batch_size_per_cell=False)

    @dsl.pipeline(name=PIPELINE_NAME, description=PIPELINE_DESCRIPTION)
    def batchscale_pipeline(config_json: str = cfg.to_json(), run_id: str = LOCAL_RUN_ID):
        _stages(cells, config_json, run_id)

    return batchscale_pipeline


def compile_pipeline(cfg: ExperimentConfig, output_path: str, for_cluster: bool = True) -> str:
    """Write the IR YAML (PipelineSpec, plus PlatformSpec when compiled for a cluster)."""
    from kfp import compiler

    compiler.Compiler().compile(build_pipeline(cfg, for_cluster), package_path=output_path)
    if for_cluster:
        wire_loop_fields(output_path)
    return output_path
