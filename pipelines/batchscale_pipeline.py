"""The batchscale pipeline (kfp v2): the same stages run under kfp.local and on a cluster.

    data_prep -> validate(dataset) -> throughput_sweep -> validate(sweep)
              -> convergence per batch size (serial) -> validate(runs)
              -> analysis -> validate(analysis) -> publish -> regression gate

Measurement stages run one after another (ParallelFor parallelism=1, and convergence waits for
the sweep's validation) because overlapping measurements distort each other's timings.
Caching is off everywhere: a cached measurement is not a measurement.

`build_pipeline(cfg, for_cluster=True)` adds what only a Kubernetes cluster understands (GPU
requests, node placement, pod deadlines, S3 settings from a Secret) and takes the run id from
KFP, so every run and every scheduled run publishes under its own id. kfp.local ignores
kfp-kubernetes settings, so the local pipeline is built without them.
"""

import math

from kfp import dsl, kubernetes

from batchscale.components.analysis.component import analysis
from batchscale.components.convergence.component import convergence
from batchscale.components.data_prep.component import data_prep
from batchscale.components.publish.component import publish, regression_gate
from batchscale.components.throughput_sweep.component import throughput_sweep
from batchscale.components.validate.component import (
    validate_analysis,
    validate_dataset,
    validate_runs,
    validate_sweep,
)
from batchscale.config import ExperimentConfig, KubernetesConfig, TolerationConfig

PIPELINE_NAME = "batchscale"
PIPELINE_DESCRIPTION = ("Why a bigger batch does not train faster: throughput, memory and "
                        "critical batch size, with a recommendation.")
STAGE_NAMES = ("data-prep", "validate-dataset", "throughput-sweep", "validate-sweep",
               "convergence", "validate-runs", "analysis", "validate-analysis", "publish",
               "regression-gate")
GPU_STAGES = ("throughput-sweep", "convergence")
"""Stages that measure on the accelerator."""
LOCAL_RUN_ID = "manual"
PUBLISH_RETRIES = 3
PUBLISH_BACKOFF = "30s"
PUBLISH_BACKOFF_FACTOR = 2.0

Tasks = dict[str, dsl.PipelineTask]


def _no_cache(task: dsl.PipelineTask) -> dsl.PipelineTask:
    return task.set_caching_options(False)


def _stages(cells: list[dict], config_json: str, run_id: str) -> Tasks:
    """Create every stage's task (inside a pipeline function); returns them by stage name so the
    cluster settings can be applied per stage."""
    prep = _no_cache(data_prep(config_json=config_json))
    dataset = prep.outputs["dataset"]
    data_ok = _no_cache(validate_dataset(config_json=config_json, dataset=dataset))
    sweep = _no_cache(throughput_sweep(config_json=config_json, run_id=run_id,
                                       dataset=dataset).after(data_ok))
    sweep_ok = _no_cache(validate_sweep(config_json=config_json, sweep=sweep.outputs["sweep"]))
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
    publish_task = _no_cache(publish(config_json=config_json, run_id=run_id, dataset=dataset,
                                     sweep=sweep.outputs["sweep"],
                                     curves=runs_ok.outputs["merged_curves"],
                                     runs=runs_ok.outputs["merged_runs"],
                                     analysis_table=analysed.outputs["analysis_table"],
                                     report=analysed.outputs["report"]).after(analysis_ok))
    publish_task.set_retry(num_retries=PUBLISH_RETRIES, backoff_duration=PUBLISH_BACKOFF,
                           backoff_factor=PUBLISH_BACKOFF_FACTOR)
    # Its own step, without retries: a regression is a verdict, not a flaky store.
    gate = _no_cache(regression_gate(config_json=config_json,
                                     regressions=publish_task.outputs["regressions"]))
    return dict(zip(STAGE_NAMES, (prep, data_ok, sweep, sweep_ok, conv, runs_ok, analysed,
                                  analysis_ok, publish_task, gate), strict=True))


# ------------------------------------------------------------------------ cluster settings
def gpu_count(stage: str, cfg: ExperimentConfig) -> int:
    """GPUs a stage's pod requests. A torchrun convergence task runs all its workers in its pod,
    so it needs one device set per worker of the largest worker count; a kubeflow-launched one
    only waits for its TrainJob, and a GPU held by the waiting pod could starve the job."""
    if stage not in GPU_STAGES:
        return 0
    per_worker = cfg.kubernetes.gpus_per_worker
    if stage != "convergence":
        return per_worker
    if cfg.convergence.launcher != "torchrun":
        return 0
    return per_worker * max(cell["workers"] for cell in cfg.convergence.fan_out())


def deadline_s(stage: str, cfg: ExperimentConfig) -> int:
    """Pod deadline of a stage: convergence gets its own trial timeout plus a margin, so the
    component reports the overrun itself before Kubernetes kills the pod."""
    k8s = cfg.kubernetes
    if stage == "convergence":
        return math.ceil(cfg.convergence.timeout_s) + k8s.convergence_timeout_margin_s
    return k8s.stage_timeout_s


def s3_stages(cfg: ExperimentConfig) -> set[str]:
    """Stages that talk to S3 with the store's credentials; only they get the Secret. Publish
    writes the lake; data_prep reads an s3:// dataset source; convergence stages its inputs for
    a TrainJob's pods (which share nothing but the store) or keeps s3:// checkpoints."""
    stages = {"publish"}
    if (cfg.dataset.source_uri or "").startswith("s3://"):
        stages.add("data-prep")
    conv = cfg.convergence
    if conv.launcher == "kubeflow" or (conv.checkpoint_uri or "").startswith("s3://"):
        stages.add("convergence")
    return stages


def _place(task: dsl.PipelineTask, node_selector: dict[str, str],
           tolerations: list[TolerationConfig]) -> None:
    for key, value in node_selector.items():
        kubernetes.add_node_selector(task, label_key=key, label_value=value)
    for t in tolerations:
        kubernetes.add_toleration(task, key=t.key or None, operator=t.operator,
                                  value=t.value or None, effect=t.effect or None)


def _use_lake(task: dsl.PipelineTask, k8s: KubernetesConfig) -> None:
    """Endpoint, bucket and prefix as plain variables; the credentials only as a reference to a
    Secret, so no key ever appears in the compiled YAML."""
    task.set_env_variable("BATCHSCALE_S3_ENDPOINT", k8s.s3_endpoint_url)
    task.set_env_variable("BATCHSCALE_S3_BUCKET", k8s.s3_bucket)
    task.set_env_variable("BATCHSCALE_S3_PREFIX", k8s.s3_prefix)
    kubernetes.use_secret_as_env(task, secret_name=k8s.s3_secret_name,
                                 secret_key_to_env=dict(k8s.s3_secret_env))


def apply_cluster_settings(tasks: Tasks, cfg: ExperimentConfig) -> None:
    """Placement, deadlines, GPU requests and S3 access of every stage (kfp-kubernetes)."""
    k8s, lake_stages = cfg.kubernetes, s3_stages(cfg)
    for stage, task in tasks.items():
        _place(task, k8s.node_selector, k8s.tolerations)
        kubernetes.set_timeout(task, deadline_s(stage, cfg))
        gpus = gpu_count(stage, cfg)
        if gpus:
            task.set_accelerator_type(k8s.gpu_resource).set_accelerator_limit(gpus)
            _place(task, k8s.gpu_node_selector, k8s.gpu_tolerations)
        if stage in lake_stages:
            _use_lake(task, k8s)


# ------------------------------------------------------------------------------ pipelines
def build_pipeline(cfg: ExperimentConfig, for_cluster: bool = False):
    """A pipeline function for `cfg`: the batch-size fan-out is fixed at build time, the config
    itself is the `config_json` parameter (its default is `cfg`). Locally the run id is a
    parameter (the CLI makes one, and reusing it resumes a run); on a cluster it is KFP's run
    UUID, because parameter macros are not expanded in v2 recurring runs (kubeflow/pipelines
    #12494) and a fixed id would collide in the create-only lake."""
    cells = cfg.convergence.fan_out()
    if for_cluster:
        @dsl.pipeline(name=PIPELINE_NAME, description=PIPELINE_DESCRIPTION)
        def batchscale_cluster_pipeline(config_json: str = cfg.to_json()):
            tasks = _stages(cells, config_json, dsl.PIPELINE_JOB_ID_PLACEHOLDER)
            apply_cluster_settings(tasks, cfg)

        return batchscale_cluster_pipeline

    @dsl.pipeline(name=PIPELINE_NAME, description=PIPELINE_DESCRIPTION)
    def batchscale_pipeline(config_json: str = cfg.to_json(), run_id: str = LOCAL_RUN_ID):
        _stages(cells, config_json, run_id)

    return batchscale_pipeline


def compile_pipeline(cfg: ExperimentConfig, output_path: str, for_cluster: bool = True) -> str:
    """Write the IR YAML (PipelineSpec, plus PlatformSpec when compiled for a cluster)."""
    from kfp import compiler

    compiler.Compiler().compile(build_pipeline(cfg, for_cluster), package_path=output_path)
    return output_path
