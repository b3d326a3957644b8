"""The `kubernetes:` section of the config: cluster settings of the compiled pipeline and of a
TrainJob (compile, submit, schedule; kfp.local ignores them)."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import Field, StrictInt, ValidationInfo, field_validator, model_validator

from batchscale import names
from batchscale.config.fields import (
    MAX_K8S_ENTRIES,
    MAX_SECONDS,
    NonNegativeInt,
    PositiveInt,
    _checked,
    _Strict,
    quote_value,
)

S3_CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


class TolerationConfig(_Strict):
    """One Kubernetes toleration of a node taint."""

    key: str = ""
    """Taint key; empty (with operator Exists) tolerates every taint."""
    operator: Literal["Equal", "Exists"] = "Equal"
    """Equal matches `value`; Exists matches any value of `key`."""
    value: str = ""
    """Taint value (operator Equal only)."""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    """Taint effect tolerated; empty tolerates every effect."""

    @model_validator(mode="after")
    def _consistent(self) -> TolerationConfig:
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        if not self.key and self.operator != "Exists":
            raise ValueError("an empty key needs operator Exists")
        return self


NodeSelector = Annotated[dict[str, str], Field(max_length=MAX_K8S_ENTRIES)]
Tolerations = Annotated[list[TolerationConfig], Field(max_length=MAX_K8S_ENTRIES)]


class KubernetesConfig(_Strict):
    """Cluster settings of the compiled pipeline (compile, submit, schedule); kfp.local ignores
    them."""

    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource the GPU stages request (throughput_sweep; convergence with the
    torchrun launcher; a kubeflow-launched convergence asks for GPUs in its TrainJob instead)."""
    gpus_per_worker: NonNegativeInt = 1
    """GPUs per worker, 0 or 1: a worker is one training process on one device. The sweep (one
    process) requests this many unless `sweep.device` is cpu; a torchrun convergence cell of W
    workers requests W x this in its pod; a TrainJob node this. 0 runs those stages on CPU with
    the CPU image. More GPUs per trial: raise `convergence.workers` or `scaling_workers`."""
    gpu_node_selector: NodeSelector = {}
    """Node labels the GPU stages must match, e.g.
    {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"} (at most 64)."""
    gpu_tolerations: Tolerations = []
    """Taints of the GPU node pool that the GPU stages tolerate (at most 64)."""
    node_selector: NodeSelector = {}
    """Node labels every stage must match (at most 64)."""
    tolerations: Tolerations = []
    """Taints every stage tolerates (at most 64)."""
    measure_cpus: Annotated[StrictInt, Field(gt=0, le=1024)] | None = 4
    """Whole CPUs of each measuring process (the sweep; each convergence worker), 1-1024: its
    container requests and is limited to exactly this many, and `measure_memory_gib`, so timings
    neither lose CPU to neighbours nor burst into idle ones (a torchrun convergence pod: workers
    x this; a TrainJob node: this). null: measuring pods get the other stages' requests."""
    measure_memory_gib: float = Field(16.0, gt=0.0, le=65536.0)
    """Memory of each measuring process with `measure_cpus`, GiB (request = limit, whole MiB;
    a torchrun convergence pod: workers x this)."""
    stage_cpus: float = Field(1.0, gt=0.0, le=1024.0)
    """CPU request of every other pod (data prep, validation, analysis, publish, a convergence
    pod that only waits for its TrainJob), CPUs (a request, no limit; thousandths)."""
    stage_memory_gib: float = Field(2.0, gt=0.0, le=65536.0)
    """Memory request of every other pod, GiB (a request, no limit; whole MiB)."""
    image_pull_secrets: Annotated[list[str], Field(max_length=MAX_K8S_ENTRIES)] = []
    """Secrets (type kubernetes.io/dockerconfigjson, in the run's namespace) every pod, the
    TrainJob's too, pulls its image with: names only (at most 64)."""
    stage_timeout_s: Annotated[PositiveInt, Field(le=MAX_SECONDS)] = 7200
    """Pod deadline (activeDeadlineSeconds, image pull included) of every stage but convergence,
    seconds (at most a year)."""
    convergence_timeout_margin_s: Annotated[PositiveInt, Field(le=MAX_SECONDS)] = 900
    """A convergence pod's deadline is `convergence.timeout_s` plus this, so the stage's own
    timeout fires first and reports which trial ran over."""
    s3_endpoint_url: str = "http://seaweedfs.kubeflow:8333"
    """S3 endpoint of the results lake (default: the KFP deployment's SeaweedFS): http(s)://host
    with an optional port, nothing else (no credentials, path or query)."""
    s3_bucket: str = "mlpipeline"
    """Bucket of the results lake (S3 naming rules: 3-63 lowercase letters, digits, '.', '-')."""
    s3_prefix: str = "shared/batchscale"
    """Key prefix of the results lake inside the bucket: '/'-separated parts of letters, digits,
    '.', '_' or '-' (no empty, '.' or '..' part). Multi-user Kubeflow lets a profile's
    credentials write only artifacts/, private-artifacts/<ns>/, private/<ns>/ and shared/ of
    its bucket: the default works there and standalone; private/<namespace>/batchscale keeps
    one profile's results to itself."""
    s3_secret_name: str = "mlpipeline-minio-artifact"
    """Kubernetes Secret, in the run's namespace, holding the S3 credentials."""
    s3_secret_env: dict[str, str] = {"accesskey": "AWS_ACCESS_KEY_ID",
                                     "secretkey": "AWS_SECRET_ACCESS_KEY"}
    """Key of `s3_secret_name` -> environment variable it fills (both AWS variables)."""
    service_account: str = ""
    """Kubernetes service account of the run's pods and its TrainJob's (with the kubeflow
    launcher it needs the RBAC in manifests/rbac-trainjob/); empty: KFP's default
    (pipeline-runner standalone, default-editor in a multi-user profile); a TrainJob's pods
    then run as the namespace's `default` account (they call no Kubernetes API)."""

    @field_validator("gpus_per_worker")
    @classmethod
    def _one_device_per_worker(cls, gpus: int) -> int:
        if gpus > 1:
            raise ValueError(
                f"{gpus} GPUs per worker is not allowed: a worker is one training process on "
                "one device, so 0 (CPU) or 1 are allowed; to train on more GPUs, raise "
                "convergence.workers (or add worker counts to convergence.scaling_workers)")
        return gpus

    @field_validator("service_account", "s3_secret_name")
    @classmethod
    def _object_name(cls, name: str, info: ValidationInfo) -> str:
        if name or info.field_name != "service_account":
            cls._check_object_name(name)
        return name

    @field_validator("image_pull_secrets")
    @classmethod
    def _secret_names(cls, names_: list[str]) -> list[str]:
        for name in names_:
            cls._check_object_name(name)
        return names_

    @staticmethod
    def _check_object_name(name: str) -> None:
        """Kubernetes object names (Secrets, service accounts): an RFC 1123 subdomain."""
        if len(name) > 253 or not re.fullmatch(
                r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", name):
            raise ValueError(f"{quote_value(name)} is not a Kubernetes object name: at most 253 "
                             "lowercase letters, digits, '-' or '.', starting and ending with a "
                             "letter or digit")

    @field_validator("s3_endpoint_url")
    @classmethod
    def _endpoint(cls, url: str) -> str:
        return _checked(names.check_endpoint, url, "S3 endpoint")

    @field_validator("s3_bucket")
    @classmethod
    def _bucket(cls, bucket: str) -> str:
        return _checked(names.check_bucket, bucket, "S3 bucket")

    @field_validator("s3_prefix")
    @classmethod
    def _prefix(cls, prefix: str) -> str:
        _checked(names.check_prefix, prefix, "S3 prefix")
        return prefix  # as given: the lake's settings strip the '/' themselves

    @field_validator("s3_secret_env")
    @classmethod
    def _both_credentials(cls, mapping: dict[str, str]) -> dict[str, str]:
        if sorted(mapping.values()) != sorted(S3_CREDENTIAL_ENV):
            raise ValueError(f"must map one Secret key to each of {', '.join(S3_CREDENTIAL_ENV)}")
        return mapping
