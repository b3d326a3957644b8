"""Run a convergence spec as a Kubeflow Trainer v2 TrainJob (`launcher: kubeflow`).

The convergence component's pod does not train: it stages the dataset and the spec in the
object store, submits a TrainJob on the `torch-distributed` runtime with the project image
through the `kubeflow` SDK's TrainerClient, streams the first node's log into the step's log,
waits for the job, deletes it, and reads the trial tables the job's pods wrote to the store.
The pods run the same entry point as local torchrun (`torchrun -m ...convergence.train`, which
picks up the PET_* variables Trainer injects), so both executors share one training script.
A failed job fails the step with the job's own reason, its events and the log above.

The pipeline's service account needs the RBAC in manifests/rbac-trainjob.yaml.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
from dataclasses import dataclass

import pyarrow as pa

from batchscale.config import ExperimentConfig
from batchscale.convergence.runner import (
    ENTRY_MODULE,
    build_spec,
    check_checkpoints,
    collect,
)
from batchscale.convergence.spec import ConvergenceSpec
from batchscale.envinfo import git_commit
from batchscale.errors import BadInput, BatchscaleError
from batchscale.images import GPU_IMAGE
from batchscale.location import LocalLocation, S3Location, copy_files, is_s3_uri
from batchscale.storage import ObjectStore, S3Settings

NODE = "node"  # the trainer's replicated job and container in the torch-distributed runtime
COMPLETE, FAILED, RUNNING = "Complete", "Failed", "Running"
POLL_INTERVAL_S = 5
JOB_NAME_PREFIX = "batchscale-"
SPEC_HASH_CHARS = 12
JOB_LABELS = {"app.kubernetes.io/part-of": "batchscale",
              "app.kubernetes.io/component": "convergence"}


@dataclass(frozen=True)
class StagedRun:
    """Where a TrainJob's inputs and outputs live in the object store."""

    root: S3Location
    spec: ConvergenceSpec
    spec_uri: str


def cell_name(batch_sizes: list[int], workers: int) -> str:
    return f"b{'-'.join(map(str, batch_sizes))}-w{workers}"


def stage_inputs(cfg: ExperimentConfig, batch_sizes: list[int], *, data_dir: str, run_id: str,
                 workers: int, store: ObjectStore) -> StagedRun:
    """Copy the dataset and the spec to `convergence/<run_id>/<cell>/` in the store (create-only
    keys: a retried step re-sends identical bytes; the spec is named by its hash, so a changed
    config gets a new spec, and its checkpoints are then refused by identity)."""
    root = S3Location(store, f"convergence/{run_id}/{cell_name(batch_sizes, workers)}")
    data = root.child("data")
    copy_files(LocalLocation(data_dir), data)
    spec = build_spec(cfg, batch_sizes, data_dir=data.uri, out_dir=root.child("out").uri,
                      run_id=run_id, workers=workers)
    text = spec.to_json()
    name = f"spec-{hashlib.sha256(text).hexdigest()[:SPEC_HASH_CHARS]}.json"
    root.put_bytes(name, text)
    return StagedRun(root, spec, f"{root.uri}/{name}")


def trainjob_command(spec_uri: str, max_restarts: int) -> list[str]:
    """torchrun reads nodes, ranks and the rendezvous from the PET_* variables Trainer sets."""
    return ["torchrun", f"--max-restarts={max_restarts}", "-m", ENTRY_MODULE,
            "--spec", spec_uri]


def trainjob_arguments(cfg: ExperimentConfig, staged: StagedRun, job_name: str,
                       settings: S3Settings) -> dict:
    """Keyword arguments of TrainerClient.train: runtime, trainer and options. One process per
    node (the runtime's numProcPerNode 'auto' gives 1 on CPU, one per GPU requested)."""
    from kubeflow.trainer import CustomTrainerContainer
    from kubeflow.trainer.options import (
        ContainerPatch,
        JobSetSpecPatch,
        JobSetTemplatePatch,
        JobSpecPatch,
        JobTemplatePatch,
        Labels,
        Name,
        PodSpecPatch,
        PodTemplatePatch,
        ReplicatedJobPatch,
        RuntimePatch,
        TrainerCommand,
        TrainingRuntimeSpecPatch,
    )

    c, k8s = cfg.convergence, cfg.kubernetes
    secret_env = [{"name": env_name, "valueFrom": {"secretKeyRef": {
        "name": k8s.s3_secret_name, "key": secret_key}}}
        for secret_key, env_name in sorted(k8s.s3_secret_env.items())]
    credentials = RuntimePatch(training_runtime_spec=TrainingRuntimeSpecPatch(
        template=JobSetTemplatePatch(spec=JobSetSpecPatch(replicated_jobs=[ReplicatedJobPatch(
            name=NODE, template=JobTemplatePatch(spec=JobSpecPatch(template=PodTemplatePatch(
                spec=PodSpecPatch(containers=[ContainerPatch(name=NODE, env=secret_env)])))))]))))
    trainer = CustomTrainerContainer(
        image=GPU_IMAGE,
        num_nodes=staged.spec.training.workers,
        # A string quantity, as kubectl writes it (an int would be sent as 1.0).
        resources_per_node={k8s.gpu_resource: str(k8s.gpus_per_worker)}
        if k8s.gpus_per_worker else None,
        env={"BATCHSCALE_S3_ENDPOINT": settings.endpoint_url or "",
             "BATCHSCALE_S3_BUCKET": settings.bucket, "BATCHSCALE_S3_PREFIX": settings.prefix,
             "BATCHSCALE_GIT_COMMIT": git_commit()},
    )
    options = [Name(job_name), Labels(dict(JOB_LABELS)),
               TrainerCommand(trainjob_command(staged.spec_uri, c.max_restarts)), credentials]
    return {"runtime": c.trainjob_runtime, "trainer": trainer, "options": options}


def trainer_client(namespace: str | None):
    """In a pod: the in-cluster service account and namespace. Elsewhere: the kubeconfig named
    by $KUBECONFIG now (the kubernetes client reads that variable once, at import) and its
    current context's namespace."""
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    kubeconfig = os.environ.get("KUBECONFIG")
    if kubeconfig and namespace is None:
        namespace = kubeconfig_namespace(kubeconfig)
    return TrainerClient(KubernetesBackendConfig(namespace=namespace, config_file=kubeconfig))


def kubeconfig_namespace(path: str) -> str | None:
    from kubernetes import config

    _, current = config.list_kube_config_contexts(config_file=path)
    return current.get("context", {}).get("namespace")


def failure_reason(client, name: str) -> str:
    """The Failed condition's reason and message, plus the job's warning events."""
    from kubeflow.trainer.constants import constants

    backend = client.backend
    job = backend.custom_api.get_namespaced_custom_object(
        constants.GROUP, constants.VERSION, backend.namespace, constants.TRAINJOB_PLURAL, name)
    conditions = [c for c in job.get("status", {}).get("conditions", [])
                  if c.get("type") == FAILED and c.get("status") == "True"]
    reason = "; ".join(f"{c.get('reason', '?')}: {c.get('message', '')}" for c in conditions)
    events = [f"{e.involved_object_kind}/{e.involved_object_name} {e.reason}: {e.message}"
              for e in client.get_job_events(name)]
    return (reason or "no Failed condition recorded") + (
        f" (events: {' | '.join(events)})" if events else "")


def stream_logs(client, name: str) -> None:
    """Copy node-0's log to this step's log as it is produced (it ends when the pod ends)."""
    for line in client.get_job_logs(name, follow=True):
        print(f"[{name}] {line}", file=sys.stderr, flush=True)


def await_job(client, name: str, timeout_s: float, poll_interval_s: int) -> None:
    """Wait until the job runs, stream its log, then wait for Complete; Failed or a timeout
    raise BatchscaleError with the job's reason."""
    timeout = max(int(timeout_s), poll_interval_s + 1)
    try:
        job = client.wait_for_job_status(name, {RUNNING, COMPLETE, FAILED}, timeout,
                                         poll_interval_s)
        if job.status != FAILED:
            stream_logs(client, name)
            job = client.wait_for_job_status(name, {COMPLETE, FAILED}, timeout,
                                             poll_interval_s)
    except TimeoutError:
        raise BatchscaleError(f"TrainJob {name} did not finish within {timeout_s:.0f} s "
                              "(convergence.timeout_s); it was deleted") from None
    if job.status == FAILED:
        raise BatchscaleError(f"TrainJob {name} failed: {failure_reason(client, name)}")


def run_on_kubeflow(cfg: ExperimentConfig, batch_sizes: list[int], *, data_dir: str,
                    run_id: str, workers: int,
                    poll_interval_s: int = POLL_INTERVAL_S) -> tuple[pa.Table, pa.Table]:
    """Stage, submit, await, delete; (curves, runs) of the trials the job's pods wrote."""
    ckpt = cfg.convergence.checkpoint_uri
    if ckpt and not is_s3_uri(ckpt):
        raise BadInput(f"convergence.checkpoint_uri: {ckpt!r} is a local path, which a "
                       "TrainJob's pods cannot share; use s3://bucket/prefix or leave it unset")
    settings = S3Settings.from_env()
    staged = stage_inputs(cfg, batch_sizes, data_dir=data_dir, run_id=run_id, workers=workers,
                          store=ObjectStore(settings))
    check_checkpoints(staged.spec)
    client = trainer_client(cfg.convergence.trainjob_namespace)
    job_name = f"{JOB_NAME_PREFIX}{secrets.token_hex(6)}"
    try:
        client.train(**trainjob_arguments(cfg, staged, job_name, settings))
    except (RuntimeError, TimeoutError, ValueError) as err:
        cause = f": {err.__cause__}" if err.__cause__ else ""
        raise BatchscaleError(f"could not create TrainJob {job_name}: {err}{cause}") from None
    print(f"submitted TrainJob {client.backend.namespace}/{job_name} ({workers} nodes)",
          file=sys.stderr, flush=True)
    try:
        await_job(client, job_name, cfg.convergence.timeout_s, poll_interval_s)
    finally:
        client.delete_job(job_name)
    return collect(staged.spec, staged.root.child("out"))
