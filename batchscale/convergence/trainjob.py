"""Run a convergence spec as a Kubeflow Trainer v2 TrainJob (`launcher: kubeflow`).

The convergence component's pod does not train: it stages the dataset and the spec in the
object store, submits a TrainJob on the `torch-distributed` runtime (its body: trainjob_body.py),
copies the first node's log into the step's log, waits for the job, deletes it, and reads the
trial tables the job's pods wrote to the store. The pods run the same entry point as local
torchrun (`torchrun -m ...convergence.train`, which picks up the PET_* variables Trainer
injects), so both executors share one training script. A failed job fails the step with the
job's own reason, its events and the log above.

No orphans: the job ends by itself at its activeDeadlineSeconds (convergence.timeout_s, cut so
it ends before the step pod's own deadline), is owned by the step's pod (deleted with it), is
deleted when the step ends for any reason, including SIGTERM from the kubelet, and every wait
here is bounded so that all of it fits inside the pod's deadline (WaitLimits).

Needs Kubeflow Trainer >= v2.2 (runtimePatches, activeDeadlineSeconds); the job is created with
`fieldValidation=Strict`, so an older Trainer's API server refuses it (instead of silently
dropping those fields) and the step says which version it needs. The pipeline's service
account needs the RBAC in manifests/ (docs/kubeflow.md).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import secrets
import sys
import time
from dataclasses import dataclass

import pyarrow as pa

from batchscale.config import ExperimentConfig
from batchscale.convergence.runner import (
    ENTRY_MODULE,
    build_spec,
    check_checkpoints,
    collect,
    say_twins,
)
from batchscale.convergence.spec import ConvergenceSpec, ProbeSpec
from batchscale.convergence.trainjob_body import (
    JobRequest,
    LaunchingPod,
    build_trainjob,
    trainer_env,
    trainjob_image,
)
from batchscale.convergence.trainjob_wait import WaitLimits, api_call, await_job, warn
from batchscale.deadline import DeadlinePassed, call_within
from batchscale.envinfo import git_commit
from batchscale.errors import BadInput, BatchscaleError
from batchscale.location import LocalLocation, S3Location, copy_files, is_s3_uri
from batchscale.stopping import Terminated, sigterm_raises
from batchscale.storage import ObjectStore, S3Settings

JOB_NAME_PREFIX = "batchscale-"
SPEC_HASH_CHARS = 12
DEFAULT_LIMITS = WaitLimits()
MIN_TRAINER_VERSION = "v2.2"  # runtimePatches and activeDeadlineSeconds appeared in v2.2.0


@dataclass(frozen=True)
class StagedRun:
    """Where a TrainJob's inputs and outputs live in the object store."""

    root: S3Location
    spec: ConvergenceSpec
    spec_uri: str


def cell_name(batch_sizes: list[int], workers: int) -> str:
    return f"b{'-'.join(map(str, batch_sizes))}-w{workers}"


def stage_inputs(cfg: ExperimentConfig, batch_sizes: list[int], *, data_dir: str, run_id: str,
                 workers: int, store: ObjectStore,
                 prune_at_step: int | None = None,
                 probe: ProbeSpec | None = None) -> StagedRun:
    """Copy the dataset and the spec to `convergence/<run_id>/<cell>/` in the store (create-only
    keys: a retried step re-sends identical bytes; the spec is named by its hash, so a changed
    config gets a new spec, and its checkpoints are then refused by identity)."""
    root = S3Location(store, f"convergence/{run_id}/{cell_name(batch_sizes, workers)}")
    data = root.child("data")
    copy_files(LocalLocation(data_dir), data)
    spec = build_spec(cfg, batch_sizes, data_dir=data.uri, out_dir=root.child("out").uri,
                      run_id=run_id, workers=workers, prune_at_step=prune_at_step,
                      probe=probe)
    say_twins(spec)
    text = spec.to_json()
    name = f"spec-{hashlib.sha256(text).hexdigest()[:SPEC_HASH_CHARS]}.json"
    root.put_bytes(name, text)
    return StagedRun(root, spec, f"{root.uri}/{name}")


def trainjob_command(spec_uri: str, max_restarts: int) -> list[str]:
    """torchrun reads nodes, ranks and the rendezvous from the PET_* variables Trainer sets."""
    return ["torchrun", f"--max-restarts={max_restarts}", "-m", ENTRY_MODULE,
            "--spec", spec_uri]


# ------------------------------------------------------------------------- the API, bounded
def trainer_client(namespace: str | None, timeout_s: float):
    """In a pod: the in-cluster service account and namespace. Elsewhere: the kubeconfig named
    by $KUBECONFIG now (the kubernetes client reads that variable once, at import) and its
    current context's namespace. The SDK reads a ConfigMap as it starts, without any timeout,
    so the start has a deadline of its own."""
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient
    from kubernetes.client import Configuration

    kubeconfig = os.environ.get("KUBECONFIG")
    if kubeconfig and namespace is None:
        namespace = kubeconfig_namespace(kubeconfig)
    config = KubernetesBackendConfig(namespace=namespace, config_file=kubeconfig)
    try:
        return call_within(lambda: TrainerClient(config), timeout_s, name="k8s-client")
    except DeadlinePassed:
        raise BatchscaleError(f"the Kubernetes API at {Configuration.get_default_copy().host} "
                              f"did not answer the Trainer client's first request within "
                              f"{timeout_s:g} s") from None


def kubeconfig_namespace(path: str) -> str | None:
    from kubernetes import config

    _, current = config.list_kube_config_contexts(config_file=path)
    return current.get("context", {}).get("namespace")


def torch_runtime(client, name: str, timeout_s: float):
    """The runtime (namespaced first, as the SDK looks), which must be a torch one: the job's
    command is torchrun, fed by the Torch plugin's PET_* variables."""
    try:
        runtime = api_call(client, f"reading the runtime {name!r}",
                           lambda: client.get_runtime(name), 2 * timeout_s)
    except (RuntimeError, TimeoutError) as err:
        cause = f": {err.__cause__}" if err.__cause__ else ""
        raise BatchscaleError(f"convergence.trainjob_runtime: could not read the training "
                              f"runtime {name!r}: {err}{cause}") from None
    if runtime.trainer.framework != "torch":
        raise BadInput(f"convergence.trainjob_runtime: {name!r} is a "
                       f"{runtime.trainer.framework!r} runtime; the convergence job needs a "
                       "torch one (trainer.kubeflow.org/framework: torch), e.g. "
                       "torch-distributed")
    return runtime


def pod_seconds_left(client, pod: LaunchingPod | None, timeout_s: float) -> float | None:
    """Seconds until the step pod's activeDeadlineSeconds, which counts from the pod's
    status.startTime (image pull included); None without a pod deadline. If the pod cannot be
    read, the count starts now, with a warning (pod_reserve_s then also covers the time before
    this process started)."""
    if pod is None or pod.deadline_s is None:
        return None
    try:
        started = api_call(client, f"reading pod {pod.name}", lambda: (
            client.backend.core_api.read_namespaced_pod(
                pod.name, pod.namespace, _request_timeout=timeout_s)), timeout_s).status.start_time
    except Exception as err:  # noqa: BLE001 - any failure only loosens the bound, with a warning
        started, why = None, str(err)
    else:
        why = "it has no status.startTime"
    if started is None:
        warn(f"could not read when pod {pod.namespace}/{pod.name} started ({why}); its "
             "deadline is counted from now")
        return pod.deadline_s
    return pod.deadline_s - max(0.0, (dt.datetime.now(dt.UTC) - started).total_seconds())


def api_message(err) -> str:
    """The Status message of a refused request, else its reason."""
    import json

    try:
        return json.loads(err.body).get("message") or err.reason
    except (TypeError, ValueError, AttributeError):
        return str(err.reason)


def refusal(name: str, err) -> str:
    """Why the API server refused the job, and what to do about it."""
    message = api_message(err)
    unknown = re.findall(r'unknown field "([^"]+)"', message)
    if err.status == 400 and unknown:
        return (f"could not create TrainJob {name}: this cluster's TrainJob API does not know "
                f"{', '.join(unknown)}; batchscale needs Kubeflow Trainer {MIN_TRAINER_VERSION} "
                f"or newer (runtimePatches and activeDeadlineSeconds appeared in v2.2.0): "
                f"upgrade Trainer (the API server said: {message})")
    hint = (" (the step's service account needs the RBAC in manifests/)"
            if err.status == 403 and "forbidden" in message else "")
    return f"could not create TrainJob {name}: {err.status} {err.reason}: {message}{hint}"


def create_job(client, job, timeout_s: float) -> None:
    """Create through the SDK backend's CustomObjectsApi, refusing fields the cluster's CRD
    would prune (fieldValidation=Strict) rather than running a job without its deadline."""
    from kubeflow.trainer.constants import constants
    from kubernetes.client.exceptions import ApiException

    backend, name = client.backend, job.metadata.name
    try:
        api_call(client, f"creating TrainJob {name}", lambda: (
            backend.custom_api.create_namespaced_custom_object(
                constants.GROUP, constants.VERSION, backend.namespace, constants.TRAINJOB_PLURAL,
                job.to_dict(), field_validation="Strict", _request_timeout=timeout_s)), timeout_s)
    except ApiException as err:
        raise BatchscaleError(refusal(name, err)) from None
    except Exception as err:  # noqa: BLE001 - network errors of urllib3, named in the message
        raise BatchscaleError(f"could not create TrainJob {name}: {err}") from None


def delete_job(client, name: str, timeout_s: float) -> bool:
    """Delete the job (its JobSet and pods follow by garbage collection); never raises, so it
    cannot hide why the step ended. False when it may still exist."""
    from kubeflow.trainer.constants import constants
    from kubernetes.client.exceptions import ApiException

    backend = client.backend
    try:
        api_call(client, f"deleting TrainJob {name}", lambda: (
            backend.custom_api.delete_namespaced_custom_object(
                constants.GROUP, constants.VERSION, backend.namespace, constants.TRAINJOB_PLURAL,
                name, _request_timeout=timeout_s)), timeout_s)
    except ApiException as err:
        if err.status == 404:
            return True
        warn(f"could not delete TrainJob {name}: {err.status} {api_message(err)}; it ends at "
             "its activeDeadlineSeconds")
        return False
    except Exception as err:  # noqa: BLE001 - the step's own error matters more
        warn(f"could not delete TrainJob {name}: {err}; it ends at its activeDeadlineSeconds")
        return False
    print(f"deleted TrainJob {backend.namespace}/{name}", file=sys.stderr, flush=True)
    return True


# How SIGTERM reaches a step on Kubeflow Pipelines (stopping.sigterm_raises turns it into
# Terminated, so the `finally` that deletes the job runs): Argo's emissary (the container's PID 1)
# forwards the kubelet's SIGTERM to the whole process group of the step's command
# (argo-workflows cmd/argoexec/commands/emissary.go, osspecific.Kill to -pgid), which holds the
# KFP launcher and this Python process. The KFP launcher has no handler
# (kubeflow/pipelines backend/src/v2/component/launcher_v2.go) and exits at once; the emissary
# reaps it within about a second and the container then ends, taking this process with it. So
# the delete, one request, has about a second: enough on a healthy API server, and where it is
# not, the owner reference and the job's own activeDeadlineSeconds still end the job.


# ------------------------------------------------------------------------------ the launch
def run_on_kubeflow(cfg: ExperimentConfig, batch_sizes: list[int], *, data_dir: str,
                    run_id: str, workers: int, limits: WaitLimits = DEFAULT_LIMITS,
                    prune_at_step: int | None = None,
                    probe: ProbeSpec | None = None) -> tuple[pa.Table, pa.Table]:
    """Stage, submit, await, delete; (curves, runs) of the trials the job's pods wrote."""
    ckpt = cfg.convergence.checkpoint_uri
    if ckpt and not is_s3_uri(ckpt):
        raise BadInput(f"convergence.checkpoint_uri: {ckpt!r} is a local path, which a "
                       "TrainJob's pods cannot share; use s3://bucket/prefix or leave it unset")
    pod = LaunchingPod.from_env()
    image = trainjob_image(cfg.kubernetes.gpus_per_worker)
    client = trainer_client(cfg.convergence.trainjob_namespace, limits.api_timeout_s)
    pod_left = pod_seconds_left(client, pod, limits.api_timeout_s)
    limits.room_s(pod_left)  # no room: say so before copying anything
    pod_end = None if pod_left is None else time.monotonic() + pod_left
    runtime = torch_runtime(client, cfg.convergence.trainjob_runtime, limits.api_timeout_s)
    settings = S3Settings.from_env()
    staged = stage_inputs(cfg, batch_sizes, data_dir=data_dir, run_id=run_id, workers=workers,
                          store=ObjectStore(settings), prune_at_step=prune_at_step,
                          probe=probe)
    check_checkpoints(staged.spec)
    deadline_s = limits.job_deadline_s(
        cfg.convergence.timeout_s, None if pod_end is None else pod_end - time.monotonic())
    request = JobRequest(
        name=f"{JOB_NAME_PREFIX}{secrets.token_hex(6)}", namespace=client.backend.namespace,
        runtime_name=runtime.name, runtime_kind=runtime.kind.value,
        command=trainjob_command(staged.spec_uri, cfg.convergence.max_restarts),
        workers=workers, deadline_s=deadline_s, image=image,
        env=trainer_env(cfg.kubernetes, settings, git_commit(), image), owner=pod)
    submit_and_await(client, build_trainjob(cfg, request), limits)
    return collect(staged.spec, staged.root.child("out"))


def submit_and_await(client, job, limits: WaitLimits) -> None:
    """Create the job, wait for it, delete it whatever happens (SIGTERM included)."""
    name, deadline_s = job.metadata.name, job.spec.active_deadline_seconds
    deleted = False
    try:
        with sigterm_raises():
            try:
                create_job(client, job, limits.api_timeout_s)
                created = time.monotonic()  # the job's deadline runs from its creation
                print(f"submitted TrainJob {client.backend.namespace}/{name} "
                      f"({job.spec.trainer.num_nodes} nodes x 1 process, deadline "
                      f"{deadline_s} s)", file=sys.stderr, flush=True)
                await_job(client, job, until=created + deadline_s + limits.trainer_grace_s,
                          limits=limits)
            finally:
                deleted = delete_job(client, name, limits.api_timeout_s)
    except Terminated:
        fate = "was deleted" if deleted else "could not be deleted (see above)"
        raise BatchscaleError(f"stopped by SIGTERM (the step's pod is being deleted or ran past "
                              f"its deadline); TrainJob {name} {fate}") from None
