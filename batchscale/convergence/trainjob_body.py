"""The TrainJob one kubeflow-launched convergence cell submits, built from the Trainer's own API
models (`kubeflow_trainer_api`, generated from kubeflow/trainer's OpenAPI; the same models the
`kubeflow` SDK serialises).

Why not `TrainerClient.train()`: the SDK 0.5 cannot express four things this job needs. Secret
references in `.spec.trainer.env` (its `CustomTrainerContainer.env` is `dict[str, str]`), an
explicit `numProcPerNode`, an ownerReference in `.metadata`, and `fieldValidation=Strict` on
create (trainjob.py). Building the whole body from the models keeps it typed end to end instead
of patching a dict the SDK made; trainjob.py still uses the SDK for everything else (runtime
lookup, status, logs, events) and creates through the SDK backend's own CustomObjectsApi.

Rules this body keeps (kubeflow/trainer v2.3.0, the validating webhook runs on CREATE with
`failurePolicy: Fail`):
- No `env` on the `node` container in a runtime patch
  (pkg/runtime/framework/plugins/jobset/jobset.go, "must not have envs"). The S3 credentials are
  `.spec.trainer.env` entries with `valueFrom.secretKeyRef`, which the Torch plugin copies onto
  the node container (torch.go EnforceMLPolicy -> pkg/apply/apply.go EnvVar keeps SecretKeyRef);
  no key ever appears in the object.
- No PET_* names in `.spec.trainer.env` (torch.go Validate, constants.TorchRunReservedEnvNames).
- A runtime patch's manager is a domain-prefixed path and names only replicated jobs the runtime
  has (jobset.go); it sets only fields of PodSpecPatch (nodeSelector, tolerations,
  serviceAccountName, imagePullSecrets here, all present since v2.2.0).
- `numProcPerNode` is explicit: without it the Torch plugin sets PET_NPROC_PER_NODE=auto, which
  on a GPU node starts one process per GPU (torch.go EnforceMLPolicy), and the world size would
  no longer be the configured workers.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING

from batchscale.config import ExperimentConfig, KubernetesConfig, TolerationConfig
from batchscale.errors import BadInput
from batchscale.images import CPU_IMAGE, GPU_IMAGE, IMAGE_REF_ENV
from batchscale.quantities import cpu_quantity, mebibytes
from batchscale.storage import S3Settings

if TYPE_CHECKING:  # the models import is heavy; only the builders below need it at run time
    from kubeflow_trainer_api import models

NODE = "node"  # the trainer's replicated job and container in the torch-distributed runtime
PROCESSES_PER_NODE = 1  # a worker is one process on one device: W workers = W nodes x 1
PATCH_MANAGER = "batchscale/convergence"  # jobset.go: a domain-prefixed path
IMAGE_ENV = "BATCHSCALE_TRAINJOB_IMAGE"
JOB_LABELS = {"app.kubernetes.io/part-of": "batchscale",
              "app.kubernetes.io/component": "convergence"}


@dataclass(frozen=True)
class LaunchingPod:
    """The convergence step's own pod, from the downward-API variables the compiled pipeline
    sets: the TrainJob's owner, and the deadline every wait must fit in."""

    name: str
    uid: str
    namespace: str
    deadline_s: float | None

    @classmethod
    def from_env(cls, environ=os.environ) -> LaunchingPod | None:
        """None outside a pipeline pod (no BATCHSCALE_POD_NAME / _UID)."""
        name, uid = environ.get("BATCHSCALE_POD_NAME"), environ.get("BATCHSCALE_POD_UID")
        if not (name and uid):
            return None
        return cls(name, uid, environ.get("BATCHSCALE_POD_NAMESPACE", ""),
                   pod_deadline_s(environ.get("BATCHSCALE_POD_DEADLINE_S")))


def pod_deadline_s(text: str | None) -> float | None:
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise BadInput(f"BATCHSCALE_POD_DEADLINE_S: {text!r} is not a positive number of "
                       "seconds (the pod's activeDeadlineSeconds, set by the compiled pipeline)")
    return value


def trainjob_image(gpus_per_worker: int, environ=os.environ) -> str:
    """The image the job's nodes run: the one compiled into the pipeline (read now, inside the
    launching pod), else the default of batchscale/images.py with a warning."""
    image = environ.get(IMAGE_ENV)
    if image:
        return image
    fallback = GPU_IMAGE if gpus_per_worker else CPU_IMAGE
    print(f"warning: {IMAGE_ENV} is not set (the compiled pipeline sets it); the TrainJob runs "
          f"the default image {fallback}", file=sys.stderr, flush=True)
    return fallback


def secret_env(k8s: KubernetesConfig) -> list[models.IoK8sApiCoreV1EnvVar]:
    """The S3 credentials as references to the Secret, never values."""
    from kubeflow_trainer_api import models

    return [models.IoK8sApiCoreV1EnvVar(name=env_name, value_from=models.IoK8sApiCoreV1EnvVarSource(
        secret_key_ref=models.IoK8sApiCoreV1SecretKeySelector(name=k8s.s3_secret_name,
                                                              key=secret_key)))
            for secret_key, env_name in sorted(k8s.s3_secret_env.items())]


def trainer_env(k8s: KubernetesConfig, settings: S3Settings, commit: str,
                image: str) -> list[models.IoK8sApiCoreV1EnvVar]:
    """The store's settings, the commit, the image the nodes run (recorded in their rows), and
    torch's thread count matched to the node's CPUs (torch would otherwise start one thread per
    CPU of the machine, not of the container's limit; torchrun sets OMP_NUM_THREADS only for
    several processes per node)."""
    from kubeflow_trainer_api import models

    plain = {"BATCHSCALE_S3_ENDPOINT": settings.endpoint_url or "",
             "BATCHSCALE_S3_BUCKET": settings.bucket, "BATCHSCALE_S3_PREFIX": settings.prefix,
             "BATCHSCALE_GIT_COMMIT": commit, IMAGE_REF_ENV: image}
    if k8s.measure_cpus:
        plain["OMP_NUM_THREADS"] = str(k8s.measure_cpus)
    return [models.IoK8sApiCoreV1EnvVar(name=k, value=v) for k, v in plain.items()] + \
        secret_env(k8s)


def node_resources(k8s: KubernetesConfig) -> models.IoK8sApiCoreV1ResourceRequirements:
    """One node is one measuring worker: `measure_cpus` CPUs and `measure_memory_gib` with
    requests = limits (with the runtime's single container the pod's QoS class is Guaranteed,
    so the static CPU manager can pin it), or the other stages' modest requests when
    measure_cpus is null; plus gpus_per_worker GPUs (extended resources need requests =
    limits). Quantities are strings, as kubectl writes them."""
    from kubeflow_trainer_api import models

    def quantities(values: dict[str, str]) -> dict:
        return {k: models.IoK8sApimachineryPkgApiResourceQuantity(v) for k, v in values.items()}

    gpus = {k8s.gpu_resource: str(k8s.gpus_per_worker)} if k8s.gpus_per_worker else {}
    if k8s.measure_cpus:
        reserved = {"cpu": str(k8s.measure_cpus), "memory": mebibytes(k8s.measure_memory_gib),
                    **gpus}
        return models.IoK8sApiCoreV1ResourceRequirements(requests=quantities(reserved),
                                                         limits=quantities(reserved))
    modest = {"cpu": cpu_quantity(k8s.stage_cpus), "memory": mebibytes(k8s.stage_memory_gib)}
    return models.IoK8sApiCoreV1ResourceRequirements(
        requests=quantities({**modest, **gpus}), limits=quantities(gpus) or None)


def toleration(t: TolerationConfig) -> models.IoK8sApiCoreV1Toleration:
    """As the pipeline's own tasks get it: empty fields are left out."""
    from kubeflow_trainer_api import models

    return models.IoK8sApiCoreV1Toleration(key=t.key or None, operator=t.operator,
                                           value=t.value or None, effect=t.effect or None)


def placement(k8s: KubernetesConfig) -> tuple[dict[str, str], list[TolerationConfig]]:
    """Node selector and tolerations of the job's pods: every stage's, plus the GPU pool's when
    the nodes request GPUs (the GPU entry wins on a shared label key, as for the GPU tasks)."""
    if not k8s.gpus_per_worker:
        return dict(k8s.node_selector), list(k8s.tolerations)
    return {**k8s.node_selector, **k8s.gpu_node_selector}, [*k8s.tolerations,
                                                            *k8s.gpu_tolerations]


def placement_patch(k8s: KubernetesConfig) -> models.TrainerV1alpha1RuntimePatch | None:
    """One runtime patch for the `node` pods, or None when nothing is configured. Trainer merges
    it into the runtime's JobSet template with a strategic merge patch
    (pkg/runtime/core/trainingruntime.go mergeRuntimePatches): nodeSelector entries merge with
    the runtime's, tolerations replace the runtime's list (an atomic list), image pull secrets
    merge by name."""
    from kubeflow_trainer_api import models

    selector, tolerations = placement(k8s)
    pull_secrets = [models.IoK8sApiCoreV1LocalObjectReference(name=n)
                    for n in k8s.image_pull_secrets]
    if not (selector or tolerations or k8s.service_account or pull_secrets):
        return None
    pod_spec = models.TrainerV1alpha1PodSpecPatch(
        node_selector=selector or None,
        tolerations=[toleration(t) for t in tolerations] or None,
        service_account_name=k8s.service_account or None,
        image_pull_secrets=pull_secrets or None)
    return models.TrainerV1alpha1RuntimePatch(
        manager=PATCH_MANAGER,
        training_runtime_spec=models.TrainerV1alpha1TrainingRuntimeSpecPatch(
            template=models.TrainerV1alpha1JobSetTemplatePatch(
                spec=models.TrainerV1alpha1JobSetSpecPatch(replicated_jobs=[
                    models.TrainerV1alpha1ReplicatedJobPatch(
                        name=NODE, template=models.TrainerV1alpha1JobTemplatePatch(
                            spec=models.TrainerV1alpha1JobSpecPatch(
                                template=models.TrainerV1alpha1PodTemplatePatch(
                                    spec=pod_spec))))]))))


def owner_references(
        pod: LaunchingPod | None,
        job_namespace: str) -> list[models.IoK8sApimachineryPkgApisMetaV1OwnerReference] | None:
    """The launching pod owns the job, so deleting the pod (a deleted run, an evicted pod)
    garbage-collects the job and its pods. blockOwnerDeletion is false: true would need update
    rights on pods/finalizers (the OwnerReferencesPermissionEnforcement admission plugin; an
    owner reference itself needs only delete on trainjobs, which the RBAC grants), and nothing
    should wait for the job before the pod goes. Kubernetes treats an owner in another namespace
    as absent and would delete the job at once, so a job in another namespace gets no owner
    (its deadline and the SIGTERM handler still end it)."""
    from kubeflow_trainer_api import models

    if pod is None:
        print("warning: BATCHSCALE_POD_NAME/BATCHSCALE_POD_UID are not set (not in a pipeline "
              "pod): the TrainJob has no owner; its activeDeadlineSeconds still ends it",
              file=sys.stderr, flush=True)
        return None
    if pod.namespace != job_namespace:
        print(f"warning: the TrainJob runs in namespace {job_namespace!r}, the step's pod in "
              f"{pod.namespace!r}: an owner reference cannot cross namespaces, so the job has "
              "none; its activeDeadlineSeconds still ends it", file=sys.stderr, flush=True)
        return None
    return [models.IoK8sApimachineryPkgApisMetaV1OwnerReference(
        api_version="v1", kind="Pod", name=pod.name, uid=pod.uid, controller=False,
        block_owner_deletion=False)]


@dataclass(frozen=True)
class JobRequest:
    """What one cell's TrainJob is made of, besides the config."""

    name: str
    namespace: str
    runtime_name: str
    runtime_kind: str
    command: list[str]
    workers: int
    deadline_s: int
    image: str
    env: list
    owner: LaunchingPod | None


def build_trainjob(cfg: ExperimentConfig, req: JobRequest) -> models.TrainerV1alpha1TrainJob:
    """The whole TrainJob object, as trainjob.py sends it."""
    from kubeflow.trainer.constants import constants
    from kubeflow_trainer_api import models

    k8s = cfg.kubernetes
    patch = placement_patch(k8s)
    trainer = models.TrainerV1alpha1Trainer(
        image=req.image, command=req.command, num_nodes=req.workers,
        num_proc_per_node=PROCESSES_PER_NODE, resources_per_node=node_resources(k8s),
        env=req.env)
    return models.TrainerV1alpha1TrainJob(
        api_version=constants.API_VERSION, kind=constants.TRAINJOB_KIND,
        metadata=models.IoK8sApimachineryPkgApisMetaV1ObjectMeta(
            name=req.name, labels=dict(JOB_LABELS),
            owner_references=owner_references(req.owner, req.namespace)),
        spec=models.TrainerV1alpha1TrainJobSpec(
            runtime_ref=models.TrainerV1alpha1RuntimeRef(name=req.runtime_name,
                                                         kind=req.runtime_kind),
            trainer=trainer, runtime_patches=[patch] if patch else None,
            active_deadline_seconds=req.deadline_s))
