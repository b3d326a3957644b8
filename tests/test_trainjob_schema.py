"""The TrainJob the kubeflow launcher sends (batchscale/convergence/trainjob_body.py), checked
offline against Kubeflow Trainer itself: the TrainJob CRD's openAPIV3Schema of a pinned
release and the admission rules of its webhook and Torch plugin (trainer_rules.py, stand-ins for
an API server and a Trainer, which cannot run here). The checks are first shown to catch what
the real ones refuse, so a clean result means something.
"""

from __future__ import annotations

import copy
import json

import pytest

from batchscale.config import parse_config
from batchscale.convergence.trainjob_body import (
    IMAGE_ENV,
    JobRequest,
    LaunchingPod,
    build_trainjob,
    trainer_env,
    trainjob_image,
)
from batchscale.errors import BadInput
from batchscale.images import CPU_IMAGE, GPU_IMAGE
from batchscale.storage import S3Settings
from trainer_rules import (
    CRD_BLOB_IDS,
    DATA,
    RUNTIME_FILE,
    crd_bytes,
    git_blob_id,
    nproc_per_node,
    schema_problems,
    torch_distributed_runtime,
    unknown_fields,
    webhook_problems,
    world_size,
)

ACCESS_KEY, SECRET_KEY = "AKIA-TEST-ACCESS-KEY", "test-secret-key-value"  # must never appear
SETTINGS = S3Settings(endpoint_url="http://s3.example:8333", bucket="mlpipeline",
                      prefix="shared/batchscale", access_key=ACCESS_KEY, secret_key=SECRET_KEY)
OWNER = LaunchingPod("convergence-pod-0", "pod-uid-0", "team-a", 3600.0)
PLACED = {"node_selector": {"pool": "train"}, "tolerations": [{"key": "spot", "value": "yes",
                                                               "effect": "NoSchedule"}],
          "gpu_node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                                "pool": "gpu"},
          "gpu_tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
          "service_account": "batchscale-trainer", "image_pull_secrets": ["regcred"]}
CONFIGS = {
    "default": {},
    "cpu": {"gpus_per_worker": 0},
    "placed-gpu": PLACED,
    "placed-cpu": {**PLACED, "gpus_per_worker": 0},
    "unmeasured": {"measure_cpus": None, "stage_cpus": 0.5, "stage_memory_gib": 1.5},
    "unmeasured-cpu": {"measure_cpus": None, "gpus_per_worker": 0},
}
RUNTIME = torch_distributed_runtime()


def body(kubernetes: dict | None = None, workers: int = 2, owner=OWNER,
         namespace: str = "team-a") -> dict:
    """The TrainJob object exactly as trainjob.py sends it (`.to_dict()` is what it posts)."""
    cfg = parse_config({"convergence": {"launcher": "kubeflow"},
                        "kubernetes": kubernetes or {}})
    request = JobRequest(
        name="batchscale-0123456789ab", namespace=namespace, runtime_name="torch-distributed",
        runtime_kind="ClusterTrainingRuntime",
        command=["torchrun", "--max-restarts=2", "-m", "batchscale.convergence.train",
                 "--spec", "s3://mlpipeline/shared/batchscale/convergence/r/b64-w2/spec.json"],
        workers=workers, deadline_s=1800, image="registry.example/batchscale:test",
        env=trainer_env(cfg.kubernetes, SETTINGS, "0123abc", "registry.example/batchscale:test"),
        owner=owner)
    return build_trainjob(cfg, request).to_dict()


def node_pod_patch(job: dict) -> dict:
    [patch] = job["spec"]["runtimePatches"]
    [rjob] = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    return rjob["template"]["spec"]["template"]["spec"]


# -------------------------------------------------------------------- the pinned upstream
@pytest.mark.parametrize("version", sorted(CRD_BLOB_IDS))
def test_pinned_crds_are_the_upstream_files(version):
    """Each copy decompresses to the git blob of kubeflow/trainer's CRD at that tag."""
    assert git_blob_id(crd_bytes(version)) == CRD_BLOB_IDS[version]


def test_pinned_runtime_is_the_upstream_file():
    assert git_blob_id(RUNTIME_FILE.read_bytes()) == "601941548464a06ec770c2c543ddc2faf4600284"
    assert (DATA / "README.md").exists()


# ------------------------------------------------------------- the checks can fail at all
def test_the_schema_check_catches_what_the_api_server_refuses_or_prunes():
    good = body(PLACED)
    assert schema_problems(good) == []
    cases = {
        "spec.trainer.numProcPerNod": ("numProcPerNod", 1, "would prune"),
        "spec.trainer.numProcPerNode": ("numProcPerNode", "auto", "is not of type 'integer'"),
        "spec.activeDeadlineSeconds": ("activeDeadlineSeconds", 0, "less than the minimum"),
    }
    for field, (key, value, expected) in cases.items():
        bad = copy.deepcopy(good)
        parent = bad["spec"]["trainer"] if field.startswith("spec.trainer") else bad["spec"]
        parent[key] = value
        assert any(expected in p for p in schema_problems(bad)), field
    bad = copy.deepcopy(good)
    bad["spec"]["trainer"]["env"].append({"name": "OMP_NUM_THREADS", "value": "2"})
    assert any("duplicate entries" in p for p in schema_problems(bad))
    bad = copy.deepcopy(good)
    bad["metadata"]["name"] = "Batchscale_Job"
    assert "(root): metadata.name must match RFC 1035 DNS label format" in schema_problems(bad)
    bad = copy.deepcopy(good)
    node_pod_patch(bad)["hostNetwork"] = True  # not a field runtime patches may set
    assert any("hostNetwork: not in the CRD's schema" in p for p in schema_problems(bad))


def test_trainer_2_1_does_not_know_runtime_patches_or_the_deadline():
    """Against v2.1.0's CRD the same body loses exactly the two fields that need v2.2, which is
    what the launcher's fieldValidation=Strict turns into a refusal."""
    assert unknown_fields(body(PLACED), "v2.1.0") == ["spec.activeDeadlineSeconds",
                                                      "spec.runtimePatches"]


def test_the_webhook_rules_refuse_what_trainer_refuses():
    """kubeflow/trainer v2.3.0 jobset.go and torch.go Validate, each rule on a body that breaks
    it; the launcher's body breaks none."""
    good = body(PLACED)
    assert webhook_problems(good, RUNTIME) == []
    env_patch = copy.deepcopy(good)  # what the launcher used to send for the credentials
    node_pod_patch(env_patch)["containers"] = [{"name": "node", "env": [
        {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {
            "name": "s", "key": "accesskey"}}}]}]
    assert webhook_problems(env_patch, RUNTIME) == [
        "spec.runtimePatches: must not have envs for the dataset-initializer, "
        "model-initializer, node containers"]
    reserved = copy.deepcopy(good)
    reserved["spec"]["trainer"]["env"].append({"name": "PET_NPROC_PER_NODE", "value": "1"})
    assert webhook_problems(reserved, RUNTIME) == [
        "spec.trainer.env: must not have reserved envs, invalid envs configured: "
        "['PET_NPROC_PER_NODE']"]
    unknown_job = copy.deepcopy(good)
    unknown_job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"][
        "replicatedJobs"][0]["name"] = "launcher"
    assert webhook_problems(unknown_job, RUNTIME) == [
        "spec.runtimePatches: must not have replicated job that doesn't exist in the runtime "
        "job template"]
    manager = copy.deepcopy(good)
    manager["spec"]["runtimePatches"][0]["manager"] = "batchscale launcher"
    assert webhook_problems(manager, RUNTIME) == [
        'spec.runtimePatches.manager: must be a domain-prefixed path (such as "acme.io/foo")']


# ------------------------------------------------------------------- the launcher's body
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_the_launchers_body_is_admitted_as_sent(name):
    """Every field survives the CRD (nothing pruned, types, enums, required, ranges, CEL) and
    the webhook accepts it, for each placement and sizing the config allows."""
    job = body(CONFIGS[name])
    assert schema_problems(job) == []
    assert webhook_problems(job, RUNTIME) == []


@pytest.mark.parametrize("gpus", [0, 1])
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_world_size_is_the_workers_one_process_per_node(workers, gpus):
    """numProcPerNode is explicitly 1, so the Torch plugin gives PET_NPROC_PER_NODE=1 with or
    without GPUs and torchrun's world size is the configured workers, which is what
    init_distributed checks; each node requests gpus_per_worker GPUs."""
    job = body({"gpus_per_worker": gpus}, workers=workers)
    trainer = job["spec"]["trainer"]
    assert (trainer["numNodes"], trainer["numProcPerNode"]) == (workers, 1)
    assert nproc_per_node(job, RUNTIME) == "1"
    assert world_size(job, RUNTIME) == workers
    assert trainer["resourcesPerNode"]["limits"].get("nvidia.com/gpu") == \
        (str(gpus) if gpus else None)


def test_without_num_proc_per_node_gpus_would_multiply_the_world_size():
    """The upstream behaviour the explicit numProcPerNode avoids (torch.go: "auto" with a GPU
    request is one process per GPU): the same job without it, on 2-GPU nodes, would start 2
    processes per node."""
    job = body({"gpus_per_worker": 1}, workers=2)
    del job["spec"]["trainer"]["numProcPerNode"]
    for side in ("requests", "limits"):
        job["spec"]["trainer"]["resourcesPerNode"][side]["nvidia.com/gpu"] = "2"
    assert nproc_per_node(job, RUNTIME) == "auto"
    assert world_size(job, RUNTIME) == 4


def test_credentials_travel_as_secret_references_only():
    job = body(PLACED)
    text = json.dumps(job)
    assert ACCESS_KEY not in text and SECRET_KEY not in text
    refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in job["spec"]["trainer"]["env"]
            if "valueFrom" in e}
    assert refs == {"AWS_ACCESS_KEY_ID": {"name": "mlpipeline-minio-artifact",
                                          "key": "accesskey"},
                    "AWS_SECRET_ACCESS_KEY": {"name": "mlpipeline-minio-artifact",
                                              "key": "secretkey"}}
    assert "containers" not in node_pod_patch(job)  # no env through a runtime patch
    assert not [e for e in job["spec"]["trainer"]["env"] if e["name"].startswith("PET_")]


def test_placement_follows_the_nodes_device():
    """GPU nodes get every stage's placement plus the GPU pool's (the GPU label wins on a
    shared key); CPU nodes only every stage's; both the service account and pull secrets."""
    gpu, cpu = node_pod_patch(body(PLACED)), node_pod_patch(body({**PLACED,
                                                                  "gpus_per_worker": 0}))
    assert gpu["nodeSelector"] == {"pool": "gpu",
                                   "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert gpu["tolerations"] == [{"key": "spot", "operator": "Equal", "value": "yes",
                                   "effect": "NoSchedule"},
                                  {"key": "nvidia.com/gpu", "operator": "Exists"}]
    assert cpu["nodeSelector"] == {"pool": "train"}
    assert cpu["tolerations"] == [{"key": "spot", "operator": "Equal", "value": "yes",
                                   "effect": "NoSchedule"}]
    for patch in (gpu, cpu):
        assert patch["serviceAccountName"] == "batchscale-trainer"
        assert patch["imagePullSecrets"] == [{"name": "regcred"}]
    assert "runtimePatches" not in body({})["spec"]  # nothing to place: no patch at all


def test_a_node_is_sized_like_one_measuring_worker():
    measured = body({})["spec"]["trainer"]
    node = {"cpu": "4", "memory": "16384Mi", "nvidia.com/gpu": "1"}
    assert measured["resourcesPerNode"] == {"requests": node, "limits": node}
    assert {"name": "OMP_NUM_THREADS", "value": "4"} in measured["env"]
    modest = body(CONFIGS["unmeasured"])["spec"]["trainer"]
    assert modest["resourcesPerNode"] == {
        "requests": {"cpu": "500m", "memory": "1536Mi", "nvidia.com/gpu": "1"},
        "limits": {"nvidia.com/gpu": "1"}}
    assert not [e for e in modest["env"] if e["name"] == "OMP_NUM_THREADS"]
    assert body(CONFIGS["unmeasured-cpu"])["spec"]["trainer"]["resourcesPerNode"] == {
        "requests": {"cpu": "1", "memory": "2048Mi"}}


def test_the_launching_pod_owns_the_job_in_its_own_namespace_only(capsys):
    [owner] = body({})["metadata"]["ownerReferences"]
    assert owner == {"apiVersion": "v1", "kind": "Pod", "name": "convergence-pod-0",
                     "uid": "pod-uid-0", "controller": False, "blockOwnerDeletion": False}
    assert "ownerReferences" not in body({}, namespace="team-b")["metadata"]
    assert "an owner reference cannot cross namespaces" in capsys.readouterr().err
    assert "ownerReferences" not in body({}, owner=None)["metadata"]
    assert "BATCHSCALE_POD_NAME/BATCHSCALE_POD_UID are not set" in capsys.readouterr().err


def test_the_image_is_the_compiled_one_read_in_the_pod(capsys):
    assert trainjob_image(1, {IMAGE_ENV: "registry.example/cuda:1"}) == "registry.example/cuda:1"
    assert capsys.readouterr().err == ""
    assert trainjob_image(1, {}) == GPU_IMAGE
    assert trainjob_image(0, {}) == CPU_IMAGE
    assert capsys.readouterr().err.count(f"warning: {IMAGE_ENV} is not set") == 2


def test_launching_pod_from_the_downward_api_variables():
    env = {"BATCHSCALE_POD_NAME": "p", "BATCHSCALE_POD_UID": "u",
           "BATCHSCALE_POD_NAMESPACE": "ns", "BATCHSCALE_POD_DEADLINE_S": "2700"}
    assert LaunchingPod.from_env(env) == LaunchingPod("p", "u", "ns", 2700.0)
    assert LaunchingPod.from_env({"BATCHSCALE_POD_NAME": "p"}) is None
    with pytest.raises(BadInput, match="BATCHSCALE_POD_DEADLINE_S: 'soon' is not a positive"):
        LaunchingPod.from_env({**env, "BATCHSCALE_POD_DEADLINE_S": "soon"})
