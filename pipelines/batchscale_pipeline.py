"""The batchscale pipeline (kfp v2): the same stages run under kfp.local and on a cluster.

    data_prep -> validate(dataset) -> throughput_sweep -> validate(sweep)
              -> convergence per cell (serial) -> validate(runs)
              -> analysis -> validate(analysis) -> publish -> validate(regressions)
              -> regression gate

Measurement stages run one after another (ParallelFor parallelism=1, and convergence waits for
the sweep's validation) because overlapping measurements distort each other's timings.
Caching is off everywhere: a cached measurement is not a measurement.

Each task is given only the parts of the config its component declares (`experiment` and one
`<section>_config` per section its stage reads, batchscale/config/stage_inputs.py), as constants
fixed when the pipeline is built, as its batch-size fan-out is: a run submitted with other
values would not match the cells compiled into it.

`build_pipeline(cfg, for_cluster=True)` adds what only a Kubernetes cluster understands (GPU,
CPU and memory requests per stage and per convergence cell, images, node placement, pod
deadlines, S3 settings from a Secret: pipelines/cluster.py) and takes the run id from KFP, so
every run and every scheduled run publishes under its own id. kfp.local ignores those
settings, so the local pipeline is built without them.

A study config (a `study:` section) compiles for a cluster into one pipeline in which every
variant is its own branch of the stages above, with the variant's config baked in as a
constant (the fan-out is fixed at build time, like the batch sizes') and its run id
`<run UUID>-<variant>`; nothing joins the branches until `compare-study`, which runs after every
variant has published, so a cluster with the GPUs runs the variants side by side: each
measuring pod requests its own GPUs (and with `kubernetes.measure_cpus` reserves its CPUs), but
variants placed on one node still share its memory bandwidth and links. Locally `batchscale
study` runs the variants one after another without a pipeline of its own.
"""

from kfp import dsl

from batchscale.components.analysis.component import analysis, analysis_with_schedule
from batchscale.components.batch_schedule.component import batch_schedule
from batchscale.components.convergence.component import convergence
from batchscale.components.data_prep.component import data_prep
from batchscale.components.publish.component import (
    publish,
    publish_with_schedule,
    regression_gate,
)
from batchscale.components.study.component import compare_study, variant_run_id
from batchscale.components.throughput_sweep.component import throughput_sweep
from batchscale.components.validate.component import (
    validate_analysis,
    validate_dataset,
    validate_regressions,
    validate_runs,
    validate_sweep,
)
from batchscale.config import ExperimentConfig
from batchscale.config.stage_inputs import component_inputs, config_input
from batchscale.config.variants import Variant, expand
from batchscale.errors import BadInput
from batchscale.pipelines.cluster import (
    GPU_STAGES,
    STUDY_STAGE,
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
VARIANT_RUN_ID_STAGE = "variant-run-id"
SCHEDULE_STAGE = "batch-schedule"
"""The batch-schedule measurement's stage, in a pipeline whose config enables it."""
__all__ = ["GPU_STAGES", "SCHEDULE_STAGE", "STAGE_NAMES", "STUDY_STAGE", "VARIANT_RUN_ID_STAGE",
           "build_pipeline", "compile_pipeline"]
LOCAL_RUN_ID = "manual"
PUBLISH_RETRIES = 3
PUBLISH_BACKOFF = "30s"
PUBLISH_BACKOFF_FACTOR = 2.0

Tasks = dict[str, dsl.PipelineTask]


def _no_cache(task: dsl.PipelineTask) -> dsl.PipelineTask:
    return task.set_caching_options(False)


def _configured(cfg: ExperimentConfig):
    """A task factory: `op`'s task, uncached, given the parts of `cfg` its component declares
    (its `experiment` and `<section>_config` inputs, config.stage_inputs) as constants."""
    def task(op, **inputs) -> dsl.PipelineTask:
        return _no_cache(op(**component_inputs(cfg, op.component_spec.inputs), **inputs))
    return task


def _stages(cells: list[dict], cfg: ExperimentConfig, run_id: str,
            schedule: bool = False) -> tuple[Tasks, object]:
    """Create every stage's task (inside a pipeline function); returns them by stage name so the
    cluster settings can be applied per stage, and the convergence loop's item, whose fields
    carry each cell's own requests on a cluster. `schedule`: add the batch-schedule stage (the
    config's batch_schedule.enabled), whose tables the analysis and publish then take."""
    task = _configured(cfg)
    prep = task(data_prep)
    dataset = prep.outputs["dataset"]
    data_ok = task(validate_dataset, dataset=dataset)
    extra: Tasks = {}
    analysis_op, publish_op, schedule_tables = analysis, publish, {}
    if schedule:
        extra[SCHEDULE_STAGE] = task(batch_schedule, run_id=run_id,
                                     dataset=dataset).after(data_ok)
        schedule_tables = {name: extra[SCHEDULE_STAGE].outputs[name]
                           for name in ("critical_over_training", "schedule_check")}
        analysis_op, publish_op = analysis_with_schedule, publish_with_schedule
    sweep = task(throughput_sweep, run_id=run_id, dataset=dataset).after(data_ok)
    sweep_ok = task(validate_sweep, sweep=sweep.outputs["sweep"])
    with dsl.ParallelFor(cells, parallelism=1) as cell:
        conv = task(convergence, run_id=run_id, batch_sizes=cell.batch_sizes,
                    workers=cell.workers, dataset=dataset,
                    sweep=sweep.outputs["sweep"]).after(sweep_ok)
    runs_ok = task(validate_runs, curves=dsl.Collected(conv.outputs["curves"]),
                   runs=dsl.Collected(conv.outputs["runs"]),
                   decisions=dsl.Collected(conv.outputs["decisions"]))
    analysed = task(analysis_op, run_id=run_id, sweep=sweep.outputs["sweep"],
                    curves=runs_ok.outputs["merged_curves"],
                    runs=runs_ok.outputs["merged_runs"],
                    decisions=runs_ok.outputs["merged_decisions"], **schedule_tables)
    analysis_ok = task(validate_analysis, analysis=analysed.outputs["analysis_table"],
                       plan=analysed.outputs["plan"])
    publish_task = task(publish_op, run_id=run_id, dataset=dataset,
                        sweep=sweep.outputs["sweep"], curves=runs_ok.outputs["merged_curves"],
                        runs=runs_ok.outputs["merged_runs"],
                        analysis_table=analysed.outputs["analysis_table"],
                        decisions=runs_ok.outputs["merged_decisions"],
                        plan=analysed.outputs["plan"], **schedule_tables).after(analysis_ok)
    publish_task.set_retry(num_retries=PUBLISH_RETRIES, backoff_duration=PUBLISH_BACKOFF,
                           backoff_factor=PUBLISH_BACKOFF_FACTOR)
    # Its own step, without retries: a regression is a verdict, not a flaky store.
    verdicts = publish_task.outputs["regressions"]
    verdicts_ok = task(validate_regressions, regressions=verdicts)
    gate = task(regression_gate, regressions=verdicts).after(verdicts_ok)
    tasks = dict(zip(STAGE_NAMES, (prep, data_ok, sweep, sweep_ok, conv, runs_ok, analysed,
                                   analysis_ok, publish_task, verdicts_ok, gate), strict=True))
    return {**tasks, **extra}, cell


# -------------------------------------------------------------------------------- studies
def _variant_branch(variant: Variant) -> dsl.PipelineTask:
    """One variant's stages, with its own config, cells, cluster settings and run id; returns
    its publish task, which the study's comparison waits for."""
    cfg = variant.config
    run_id = _no_cache(variant_run_id(study_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                                      variant=variant.name))
    tasks, cell = _stages(cluster_cells(cfg), cfg, run_id.output, cfg.batch_schedule.enabled)
    apply_cluster_settings({VARIANT_RUN_ID_STAGE: run_id, **tasks}, cell, cfg)
    return tasks["publish"]


def _study_pipeline(cfg: ExperimentConfig):
    """The cluster pipeline of a study config: a branch per variant, then `compare-study`. The
    study id is KFP's run UUID (see build_pipeline); each variant's run id is made from it by a
    step of its own, since a backend does not reliably substitute the UUID inside a formatted
    string (kubeflow/pipelines#11035)."""
    variants = expand(cfg)
    for variant in variants:
        check_devices(variant.config)

    @dsl.pipeline(name=PIPELINE_NAME, description=PIPELINE_DESCRIPTION)
    def batchscale_study_pipeline():
        published = [_variant_branch(variant) for variant in variants]
        compare = _no_cache(compare_study(config=config_input(cfg),
                                          study_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER
                                          ).after(*published))
        apply_cluster_settings({STUDY_STAGE: compare}, None, cfg)

    return batchscale_study_pipeline


# ------------------------------------------------------------------------------ pipelines
def build_pipeline(cfg: ExperimentConfig, for_cluster: bool = False):
    """A pipeline function for `cfg`: like the batch-size fan-out, the config is fixed at build
    time, each task given the parts its component reads as constants. Locally the run id is a
    parameter (the CLI makes one, and reusing it resumes a run); on a cluster it is KFP's run
    UUID, because parameter macros are not expanded in v2 recurring runs (kubeflow/pipelines
    #12494) and a fixed id would collide in the create-only lake. A study config builds the
    study's cluster pipeline (see the module's docstring); it has no local pipeline."""
    if cfg.study.is_study:
        if not for_cluster:
            raise BadInput("a study config has no local pipeline: run it with `batchscale "
                           "study`, which runs its variants one after another")
        return _study_pipeline(cfg)
    if for_cluster:
        check_devices(cfg)

        @dsl.pipeline(name=PIPELINE_NAME, description=PIPELINE_DESCRIPTION)
        def batchscale_cluster_pipeline():
            tasks, cell = _stages(cluster_cells(cfg), cfg,
                                  dsl.PIPELINE_JOB_ID_PLACEHOLDER, cfg.batch_schedule.enabled)
            apply_cluster_settings(tasks, cell, cfg)

        return batchscale_cluster_pipeline

    cells = cfg.convergence.fan_out(one_batch_size_per_cell=False)

    @dsl.pipeline(name=PIPELINE_NAME, description=PIPELINE_DESCRIPTION)
    def batchscale_pipeline(run_id: str = LOCAL_RUN_ID):
        _stages(cells, cfg, run_id, cfg.batch_schedule.enabled)

    return batchscale_pipeline


def compile_pipeline(cfg: ExperimentConfig, output_path: str, for_cluster: bool = True) -> str:
    """Write the IR YAML (PipelineSpec, plus PlatformSpec when compiled for a cluster)."""
    from kfp import compiler

    compiler.Compiler().compile(build_pipeline(cfg, for_cluster), package_path=output_path)
    if for_cluster:
        wire_loop_fields(output_path)
    return output_path
