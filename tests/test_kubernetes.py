"""The pipeline compiled for a cluster: GPU requests, placement, deadlines, S3 access through a
Secret, caching and retries, read back through KFP's own protos (PipelineSpec, PlatformSpec,
KubernetesExecutorConfig) the way the KFP backend reads them.

No Kubernetes cluster or KFP backend runs here, so these tests stop at the compiled spec: they
prove what a cluster would be asked for, not that a cluster grants it.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp import dsl
from kfp.kubernetes import kubernetes_executor_config_pb2 as k8s_pb
from kfp.pipeline_spec import pipeline_spec_pb2

from batchscale.config import parse_config
from batchscale.pipelines.batchscale_pipeline import (
    GPU_STAGES,
    STAGE_NAMES,
    compile_pipeline,
)

CLUSTER = {
    "name": "k8s-test",
    "convergence": {"batch_sizes": [16, 64], "scaling_workers": [2, 4],
                    "scaling_batch_sizes": [64], "timeout_s": 1000.5},
    "kubernetes": {
        "gpus_per_worker": 2,
        "gpu_node_selector": {"pool": "h100"},
        "gpu_tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}],
        "node_selector": {"kubernetes.io/arch": "amd64"},
        "tolerations": [{"key": "spot", "value": "true", "effect": "NoSchedule"}],
        "s3_endpoint_url": "https://s3.example.com",
        "s3_bucket": "bench-lake",
        "s3_prefix": "team/bs",
        "s3_secret_name": "lake-creds",
        "s3_secret_env": {"id": "AWS_ACCESS_KEY_ID", "key": "AWS_SECRET_ACCESS_KEY"},
        "stage_timeout_s": 1234,
        "convergence_timeout_margin_s": 100,
    },
}
LARGEST_WORKERS = 4
ContainerSpec = pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec


class Compiled:
    """A compiled pipeline file, parsed into protos, with per-stage lookups."""

    def __init__(self, path: Path):
        self.text = path.read_text()
        docs = list(yaml.safe_load_all(self.text))
        self.spec = json_format.ParseDict(docs[0], pipeline_spec_pb2.PipelineSpec())
        self.platform = (json_format.ParseDict(docs[1], pipeline_spec_pb2.PlatformSpec())
                         if len(docs) > 1 else None)
        self.tasks = {name: task for comp in [self.spec.root, *self.spec.components.values()]
                      for name, task in comp.dag.tasks.items()}
        self.deployment = json_format.ParseDict(
            json_format.MessageToDict(self.spec.deployment_spec),
            pipeline_spec_pb2.PipelineDeploymentConfig())

    def executor_label(self, stage: str) -> str:
        return self.spec.components[self.tasks[stage].component_ref.name].executor_label

    def container(self, stage: str) -> ContainerSpec:
        return self.deployment.executors[self.executor_label(stage)].container

    def gpus(self, stage: str) -> tuple[str, int]:
        accelerator = self.container(stage).resources.accelerator
        return accelerator.resource_type, int(accelerator.resource_count or 0)

    def env(self, stage: str) -> dict[str, str]:
        return {e.name: e.value for e in self.container(stage).env}

    def k8s(self, stage: str) -> k8s_pb.KubernetesExecutorConfig:
        executors = self.platform.platforms["kubernetes"].deployment_spec.executors
        struct = executors[self.executor_label(stage)]
        return json_format.ParseDict(json_format.MessageToDict(struct),
                                     k8s_pb.KubernetesExecutorConfig())


def compiled(tmp_path: Path, data: dict, for_cluster: bool = True) -> Compiled:
    path = tmp_path / "pipeline.yaml"
    compile_pipeline(parse_config(data), str(path), for_cluster=for_cluster)
    return Compiled(path)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Compiled:
    return compiled(tmp_path_factory.mktemp("cluster"), CLUSTER)


def test_every_stage_is_a_task(cluster):
    assert set(STAGE_NAMES) <= set(cluster.tasks)


def test_gpu_stages_request_nvidia_gpus(cluster):
    expected = {"throughput-sweep": 2, "convergence": 2 * LARGEST_WORKERS}
    for stage in STAGE_NAMES:
        assert cluster.gpus(stage) == (("nvidia.com/gpu", expected[stage]) if stage in GPU_STAGES
                                       else ("", 0)), stage


def test_node_selectors_and_tolerations_come_from_the_config(cluster):
    for stage in STAGE_NAMES:
        cfg = cluster.k8s(stage)
        labels = dict(cfg.node_selector.labels)
        tolerations = {(t.key, t.operator, t.value, t.effect) for t in cfg.tolerations}
        assert labels.get("kubernetes.io/arch") == "amd64"
        assert ("spot", "Equal", "true", "NoSchedule") in tolerations
        gpu_toleration = ("nvidia.com/gpu", "Exists", "", "NoSchedule")
        assert (labels.get("pool") == "h100") == (stage in GPU_STAGES), stage
        assert (gpu_toleration in tolerations) == (stage in GPU_STAGES), stage


def test_only_lake_stages_get_the_s3_secret_and_settings(cluster):
    for stage in STAGE_NAMES:
        secrets = cluster.k8s(stage).secret_as_env
        env = cluster.env(stage)
        if stage != "publish":  # torchrun convergence, built-in dataset: only publish uses S3
            assert not secrets and not env, stage
            continue
        (secret,) = secrets
        assert secret.secret_name_parameter.runtime_value.constant.string_value == "lake-creds"
        assert {m.secret_key: m.env_var for m in secret.key_to_env} == {
            "id": "AWS_ACCESS_KEY_ID", "key": "AWS_SECRET_ACCESS_KEY"}
        assert not secret.optional
        assert env == {"BATCHSCALE_S3_ENDPOINT": "https://s3.example.com",
                       "BATCHSCALE_S3_BUCKET": "bench-lake", "BATCHSCALE_S3_PREFIX": "team/bs"}


def test_every_stage_has_a_pod_deadline(cluster):
    for stage in STAGE_NAMES:
        expected = math.ceil(1000.5) + 100 if stage == "convergence" else 1234
        assert cluster.k8s(stage).active_deadline_seconds == expected, stage


def test_caching_off_everywhere_and_publish_retries(cluster):
    for name, task in cluster.tasks.items():
        assert not task.caching_options.enable_cache, name
    assert cluster.tasks["publish"].retry_policy.max_retry_count == 3


def test_run_id_is_the_kfp_run_uuid(cluster):
    """Each run, scheduled ones included, publishes under its own id (no parameter to forget)."""
    assert set(cluster.spec.root.input_definitions.parameters) == {"config_json"}
    for stage in ("throughput-sweep", "convergence", "analysis", "publish"):
        value = cluster.tasks[stage].inputs.parameters["run_id"].runtime_value.constant
        assert value.string_value == dsl.PIPELINE_JOB_ID_PLACEHOLDER


def test_defaults_use_the_kfp_seaweedfs_and_its_secret(tmp_path):
    default = compiled(tmp_path, {})
    (secret,) = default.k8s("publish").secret_as_env
    assert secret.secret_name == "mlpipeline-minio-artifact"
    assert {m.secret_key for m in secret.key_to_env} == {"accesskey", "secretkey"}
    env = default.env("publish")
    assert env["BATCHSCALE_S3_ENDPOINT"] == "http://seaweedfs.kubeflow:8333"
    assert env["BATCHSCALE_S3_BUCKET"] == "mlpipeline"


def test_kubeflow_launcher_leaves_the_gpu_to_its_trainjob_and_gets_the_store(tmp_path):
    """The launcher pod only waits for its TrainJob; it stages inputs through S3."""
    data = {**CLUSTER, "convergence": {**CLUSTER["convergence"], "launcher": "kubeflow"}}
    result = compiled(tmp_path, data)
    assert result.gpus("convergence") == ("", 0)
    assert result.k8s("convergence").secret_as_env[0].secret_name == "lake-creds"
    assert result.env("convergence")["BATCHSCALE_S3_BUCKET"] == "bench-lake"
    assert "pool" not in result.k8s("convergence").node_selector.labels
    assert result.gpus("throughput-sweep") == ("nvidia.com/gpu", 2)


def test_zero_gpus_requests_none(tmp_path):
    data = {**CLUSTER, "kubernetes": {**CLUSTER["kubernetes"], "gpus_per_worker": 0}}
    result = compiled(tmp_path, data)
    for stage in GPU_STAGES:
        assert result.gpus(stage) == ("", 0)
        assert "pool" not in result.k8s(stage).node_selector.labels


def test_local_pipeline_has_no_cluster_settings(tmp_path):
    """kfp.local ignores kfp-kubernetes settings; the local build does not carry them at all and
    keeps the run id a parameter (reusing it resumes a local run)."""
    local = compiled(tmp_path, CLUSTER, for_cluster=False)
    assert local.platform is None
    assert set(local.spec.root.input_definitions.parameters) == {"config_json", "run_id"}
    for stage in STAGE_NAMES:
        assert local.gpus(stage) == ("", 0) and not local.env(stage)
