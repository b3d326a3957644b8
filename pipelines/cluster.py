"""Cluster settings of the compiled pipeline: what only Kubernetes understands, per stage.

kfp.local ignores all of it, so the local pipeline is built without (batchscale_pipeline.py):
- placement (node selectors, tolerations; the GPU pool's only for pods that request a GPU),
  pod deadlines, image pull secrets, S3 settings with the credentials as a Secret reference;
- images: the CUDA image only where a pod requests a GPU, the CPU image elsewhere;
- sizes: a measuring pod (sweep, convergence) gets CPU and memory requests = limits in whole
  CPUs, every other pod a modest request (`kubernetes.measure_*`, `stage_*`);
- GPUs, CPUs and memory per convergence cell: each ParallelFor iteration requests what its own
  cell needs. A static request is one value for every iteration, and one `dsl.Collected`
  cannot gather several loops (nor a `dsl.OneOf` of branches), so where the cells differ
  (several worker counts with torchrun) the requests ride in the loop items as strings and
  the task's resource fields name them (where all cells are alike they are constants): the
  KFP driver (kubeflow/pipelines backend/src/v2/driver/driver.go, initPodSpecPatch, since
  backend 2.4.0) resolves such a field per iteration with
  `resolvePodSpecInputRuntimeParameter` (driver/resolve.go), which reads the value with
  GetStringValue, so a number would resolve to nothing. The SDK (kfp 2.17.3) wires a loop
  item's field in a resource field to an input of the loop's DAG that nothing defines;
  `wire_loop_fields` wires it the way the SDK wires the same field as an argument
  (batch_sizes, workers): the loop item with a selector;
- the convergence pod of `launcher: kubeflow` only waits for its TrainJob: CPU image, no GPU,
  and the variables its launcher needs (the TrainJob's image, the pod's name, uid, namespace
  and deadline);
- the sweep pod of a TrainingLoop measures nothing (the loop's speed comes from its own
  trials), so it requests no GPU, where the compile can import the loop's module to tell.
"""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path
from types import SimpleNamespace

import yaml
from kfp import dsl, kubernetes

from batchscale.config import ExperimentConfig, KubernetesConfig, TolerationConfig
from batchscale.errors import BadInput
from batchscale.images import CPU_IMAGE, GPU_IMAGE, IMAGE_REF_ENV
from batchscale.names import is_factory_spec
from batchscale.quantities import cpu_quantity, mebibytes

GPU_STAGES = ("throughput-sweep", "convergence", "batch-schedule")
"""Stages that measure: on the accelerator where the config gives them one."""
POD_FIELD_ENV = {"BATCHSCALE_POD_NAME": "metadata.name", "BATCHSCALE_POD_UID": "metadata.uid",
                 "BATCHSCALE_POD_NAMESPACE": "metadata.namespace"}
"""Downward-API variables of a kubeflow-launched convergence pod: its TrainJob's owner."""
LOOP_FIELD = re.compile(r"(pipelinechannel--loop-item-param-\d+)-subvar-(\w+)")
"""How the SDK names a loop item's field (kfp/dsl/for_loop.py, LoopArgumentVariable)."""
STUDY_STAGE = "compare-study"
"""A study's last step: it reads every variant's tables from the lake and publishes the study."""
TRAINJOB_IMAGE_ENV = "BATCHSCALE_TRAINJOB_IMAGE"
POD_DEADLINE_ENV = "BATCHSCALE_POD_DEADLINE_S"

Tasks = dict[str, dsl.PipelineTask]


def uses_trainjob(cfg: ExperimentConfig) -> bool:
    return cfg.convergence.launcher == "kubeflow"


def sweep_gpus(cfg: ExperimentConfig) -> int:
    """The sweep is one process: one worker's GPUs; none when it measures on the CPU, or for a
    TrainingLoop, whose sweep step only records that it measured nothing."""
    if cfg.sweep.device == "cpu" or _is_loop(cfg.workload):
        return 0
    return cfg.kubernetes.gpus_per_worker


def cell_gpus(cfg: ExperimentConfig, workers: int) -> int:
    """GPUs one convergence cell's pod requests: torchrun runs all W workers in it; a
    kubeflow-launched pod only waits (its TrainJob's nodes request the GPUs)."""
    return 0 if uses_trainjob(cfg) else workers * cfg.kubernetes.gpus_per_worker


def _is_loop(workload: str) -> bool | None:
    """Whether the user's workload is a TrainingLoop (workloads.is_training_loop); a built-in
    one is not, told without importing torch (compiling needs none)."""
    if not is_factory_spec(workload):
        return False
    from batchscale.workloads import is_training_loop

    return is_training_loop(workload)


def check_devices(cfg: ExperimentConfig) -> None:
    """A sweep told to use CUDA in a pod that gets no GPU would fail only on the cluster; so
    would a batch schedule of a TrainingLoop (batchscale does not hold a loop's state)."""
    if cfg.batch_schedule.enabled and _is_loop(cfg.workload):
        from batchscale.batch_schedule.stage import loop_refusal

        raise BadInput(f"{loop_refusal(cfg.workload)}, or set batch_schedule.enabled: false")
    if cfg.sweep.device == "cuda" and not cfg.kubernetes.gpus_per_worker:
        raise BadInput("sweep.device is 'cuda' but kubernetes.gpus_per_worker is 0, so the "
                       "sweep's pod would get no GPU; set kubernetes.gpus_per_worker: 1, or "
                       "sweep.device: cpu or auto")


def cell_resources(cfg: ExperimentConfig, workers: int) -> dict[str, str]:
    """The requests of a convergence cell's pod that follow its worker count, as strings."""
    k8s, found = cfg.kubernetes, {}
    if uses_trainjob(cfg):
        return found
    if cell_gpus(cfg, workers):
        found["gpus"] = str(cell_gpus(cfg, workers))
    if k8s.measure_cpus:
        found["cpus"] = str(workers * k8s.measure_cpus)
        found["memory"] = mebibytes(workers * k8s.measure_memory_gib)
    return found


def requests_vary_per_cell(cfg: ExperimentConfig) -> bool:
    """Whether the convergence cells' requests differ (several worker counts with torchrun);
    where they do not, the task gets them as plain constants, which any KFP backend reads."""
    counts = {int(cell["workers"]) for cell in cfg.convergence.fan_out()}
    return len({tuple(cell_resources(cfg, w).items()) for w in counts}) > 1


def cluster_cells(cfg: ExperimentConfig) -> list[dict]:
    """The convergence fan-out, with each cell's own requests (cell_resources) in its item
    where they vary per cell."""
    cells = cfg.convergence.fan_out()
    if not requests_vary_per_cell(cfg):
        return cells
    return [{**cell, **cell_resources(cfg, int(cell["workers"]))} for cell in cells]


def deadline_s(stage: str, cfg: ExperimentConfig) -> int:
    """Pod deadline of a stage: convergence gets its own trial timeout plus a margin, so the
    component reports the overrun itself before Kubernetes kills the pod; the adaptive search's
    step runs up to `adaptive_max_cells` cells one after another, each with that timeout."""
    k8s = cfg.kubernetes
    if stage == "convergence":
        c = cfg.convergence
        cells = c.adaptive_max_cells if c.strategy == "adaptive" else 1
        return math.ceil(c.timeout_s) * cells + k8s.convergence_timeout_margin_s
    return k8s.stage_timeout_s


def s3_stages(cfg: ExperimentConfig) -> set[str]:
    """Stages that talk to S3 with the store's credentials; only they get the Secret. Publish
    writes the lake, a study's comparison reads and writes it; data_prep reads an s3:// dataset
    source; convergence stages its inputs for a TrainJob's pods (which share nothing but the
    store) or keeps s3:// checkpoints."""
    stages = {"publish", STUDY_STAGE}
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


# ---------------------------------------------------------------------------------- sizes
def _request_gpus(task: dsl.PipelineTask, k8s: KubernetesConfig, count) -> None:
    """`count`: an int, or a loop item's field (resolved per iteration)."""
    task.set_accelerator_type(k8s.gpu_resource).set_accelerator_limit(count)
    _place(task, k8s.gpu_node_selector, k8s.gpu_tolerations)


def _reserve(task: dsl.PipelineTask, cpus, memory) -> None:
    """Requests = limits: the scheduler reserves the CPUs and CFS caps the container at the
    same number, so a measurement neither loses CPU to its neighbours nor bursts into idle
    ones. The pod's QoS class stays Burstable all the same: KFP's own kfp-launcher init
    container requests 0.1 CPU with a 0.5 limit (kubeflow/pipelines backend/src/v2/compiler/
    argocompiler/argo.go, launcherResources), and Kubernetes sums every container's requests and
    limits (pkg/apis/core/v1/helper/qos), so no KFP task pod is Guaranteed and the static CPU
    manager does not pin it; a TrainJob's node pods can be."""
    task.set_cpu_request(cpus).set_cpu_limit(cpus)
    task.set_memory_request(memory).set_memory_limit(memory)


def _modest(task: dsl.PipelineTask, k8s: KubernetesConfig) -> None:
    task.set_cpu_request(cpu_quantity(k8s.stage_cpus))
    task.set_memory_request(mebibytes(k8s.stage_memory_gib))


def _size_sweep(task: dsl.PipelineTask, cfg: ExperimentConfig) -> None:
    k8s, gpus = cfg.kubernetes, sweep_gpus(cfg)
    if gpus:
        _request_gpus(task, k8s, gpus)
    _run_image(task, GPU_IMAGE if gpus else CPU_IMAGE)
    if k8s.measure_cpus:
        _reserve(task, str(k8s.measure_cpus), mebibytes(k8s.measure_memory_gib))
    else:
        _modest(task, k8s)


def _size_one_device(task: dsl.PipelineTask, cfg: ExperimentConfig) -> None:
    """One measuring process on one worker's accelerator (the batch-schedule stage)."""
    k8s = cfg.kubernetes
    if k8s.gpus_per_worker:
        _request_gpus(task, k8s, k8s.gpus_per_worker)
    _run_image(task, GPU_IMAGE if k8s.gpus_per_worker else CPU_IMAGE)
    if k8s.measure_cpus:
        _reserve(task, str(k8s.measure_cpus), mebibytes(k8s.measure_memory_gib))
    else:
        _modest(task, k8s)


def _size_convergence(task: dsl.PipelineTask, cell, cfg: ExperimentConfig) -> None:
    """`cell`: the ParallelFor's loop item, whose fields carry the cell's own requests where
    they vary per cell (cluster_cells); else the one set of requests every cell has."""
    k8s = cfg.kubernetes
    if uses_trainjob(cfg):
        _run_image(task, CPU_IMAGE)  # it only waits: no multi-GB CUDA pull
        _modest(task, k8s)
        _launch_env(task, cfg)
        return
    if not requests_vary_per_cell(cfg):
        cell = SimpleNamespace(**cell_resources(cfg, cfg.convergence.workers))
    if k8s.gpus_per_worker:
        _request_gpus(task, k8s, cell.gpus)
    _run_image(task, GPU_IMAGE if k8s.gpus_per_worker else CPU_IMAGE)
    if k8s.measure_cpus:
        _reserve(task, cell.cpus, cell.memory)
    else:
        _modest(task, k8s)


def _run_image(task: dsl.PipelineTask, image: str) -> None:
    """The task's image, and its reference in the task's environment: a container cannot see
    its own image, and every result row records it (the regression check's `image` field)."""
    task.set_container_image(image)
    task.set_env_variable(IMAGE_REF_ENV, image)


def _launch_env(task: dsl.PipelineTask, cfg: ExperimentConfig) -> None:
    """What the TrainJob launcher reads: the image its nodes run (fixed now, at compile time:
    nothing sets it inside the pod), the pod's identity for the TrainJob's ownerReference, and
    the pod's deadline so every wait of the launcher fits inside it."""
    task.set_env_variable(TRAINJOB_IMAGE_ENV,
                          GPU_IMAGE if cfg.kubernetes.gpus_per_worker else CPU_IMAGE)
    task.set_env_variable(POD_DEADLINE_ENV, str(deadline_s("convergence", cfg)))
    for name, field_path in POD_FIELD_ENV.items():
        kubernetes.use_field_path_as_env(task, env_name=name, field_path=field_path)


def apply_cluster_settings(tasks: Tasks, cell, cfg: ExperimentConfig) -> None:
    """Placement, deadlines, pull secrets, S3 access, images and sizes of every stage; `cell`
    is the convergence loop's item (cluster_cells; None where `tasks` has no convergence)."""
    k8s, lake_stages = cfg.kubernetes, s3_stages(cfg)
    for stage, task in tasks.items():
        _place(task, k8s.node_selector, k8s.tolerations)
        kubernetes.set_timeout(task, deadline_s(stage, cfg))
        if k8s.image_pull_secrets:
            kubernetes.set_image_pull_secrets(task, list(k8s.image_pull_secrets))
        if stage in lake_stages:
            _use_lake(task, k8s)
        if stage == "throughput-sweep":
            _size_sweep(task, cfg)
        elif stage == "convergence":
            _size_convergence(task, cell, cfg)
        elif stage == "batch-schedule":
            _size_one_device(task, cfg)
        else:
            _run_image(task, CPU_IMAGE)
            _modest(task, k8s)


# ------------------------------------------------------------------- the compiled spec
def _wire_task_inputs(component: dict) -> int:
    """Point each input of the component's tasks that names an undefined loop item field at the
    loop item, selecting the field; returns how many it changed."""
    defined = set(component.get("inputDefinitions", {}).get("parameters", {}))
    changed = 0
    for task in component.get("dag", {}).get("tasks", {}).values():
        for spec in task.get("inputs", {}).get("parameters", {}).values():
            field = LOOP_FIELD.fullmatch(spec.get("componentInputParameter", ""))
            if field and field.group(0) not in defined and field.group(1) in defined:
                spec["componentInputParameter"] = field.group(1)
                spec["parameterExpressionSelector"] = f'parseJson(string_value)["{field[2]}"]'
                changed += 1
    return changed


def wire_loop_fields(path: str) -> int:
    """Rewrite the compiled YAML at `path` with every loop item field that a task's resources
    use wired to the loop item (see the module's docstring); the header comment and KFP's own
    formatting (yaml.dump_all, sorted keys) are kept. Returns the number of inputs changed."""
    text = Path(path).read_text()
    header = "".join(itertools.takewhile(lambda line: line.startswith("#"),
                                         text.splitlines(keepends=True)))
    docs = list(yaml.safe_load_all(text))
    spec = docs[0]
    changed = sum(_wire_task_inputs(c) for c in [spec["root"], *spec["components"].values()])
    if changed:
        Path(path).write_text(header + yaml.safe_dump_all(docs, sort_keys=True))
    return changed
