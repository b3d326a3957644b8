"""The pipeline compiled for a cluster: GPU, CPU and memory requests per stage and per
convergence cell, images, placement, deadlines, pull secrets, S3 access through a Secret, the
TrainJob launcher's variables, caching and retries, read back through KFP's own protos
(PipelineSpec, PlatformSpec, KubernetesExecutorConfig) the way the KFP backend reads them.

No Kubernetes cluster or KFP backend runs here, so these tests stop at the compiled spec: they
prove what a cluster would be asked for, not that a cluster grants it. Where a request differs
per ParallelFor iteration, `Compiled.per_cell` stands in for the KFP driver: it resolves the
resource field the way backend/src/v2/driver (resolvePodSpecInputRuntimeParameter and the
parameter expression selector) does, from the loop's items in the YAML.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp import compiler, dsl
from kfp.kubernetes import kubernetes_executor_config_pb2 as k8s_pb
from kfp.pipeline_spec import pipeline_spec_pb2

from batchscale.config import parse_config
from batchscale.errors import BadInput
from batchscale.images import CPU_IMAGE, GPU_IMAGE, IMAGE_REF_ENV
from batchscale.pipelines.batchscale_pipeline import (
    GPU_STAGES,
    STAGE_NAMES,
    build_pipeline,
    compile_pipeline,
)
from batchscale.pipelines.cluster import wire_loop_fields

CLUSTER = {
    "name": "k8s-test",
    "convergence": {"batch_sizes": [16, 64], "scaling_workers": [2, 4],
                    "scaling_batch_sizes": [64], "timeout_s": 1000.5},
    "kubernetes": {
        "gpus_per_worker": 1,
        "gpu_node_selector": {"pool": "h100"},
        "gpu_tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                             "effect": "NoSchedule"}],
        "node_selector": {"kubernetes.io/arch": "amd64"},
        "tolerations": [{"key": "spot", "value": "true", "effect": "NoSchedule"}],
        "measure_cpus": 2,
        "measure_memory_gib": 3.5,
        "stage_cpus": 0.5,
        "stage_memory_gib": 1.5,
        "image_pull_secrets": ["regcred", "mirror.creds"],
        "s3_endpoint_url": "https://s3.example.com",
        "s3_bucket": "bench-lake",
        "s3_prefix": "team/bs",
        "s3_secret_name": "lake-creds",
        "s3_secret_env": {"id": "AWS_ACCESS_KEY_ID", "key": "AWS_SECRET_ACCESS_KEY"},
        "stage_timeout_s": 1234,
        "convergence_timeout_margin_s": 100,
    },
}
CELL_WORKERS = [1, 1, 2, 4]
"""Worker count of each convergence cell of CLUSTER, in fan-out order."""
MEASURE_MIB = 3584  # 3.5 GiB
STAGE_REQUESTS = ("500m", "1536Mi")
ContainerSpec = pipeline_spec_pb2.PipelineDeploymentConfig.PipelineContainerSpec
PLACEHOLDER = re.compile(r"\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}")
ITEM_FIELD = re.compile(r'parseJson\(string_value\)\["(\w+)"\]')
QUANTITY = re.compile(r"[0-9]+(m|Mi)?")


def with_changes(**sections) -> dict:
    """CLUSTER with some fields of some sections replaced."""
    return {**CLUSTER, **{name: {**CLUSTER.get(name, {}), **fields}
                          for name, fields in sections.items()}}


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

    def loop(self):
        """The ParallelFor task around convergence (its items, its parallelism)."""
        (loop,) = [t for t in self.spec.root.dag.tasks.values()
                   if t.parameter_iterator.items.raw]
        return loop

    def per_cell(self, stage: str, value: str) -> list[str]:
        """A resource field's value in each loop iteration, as the KFP driver resolves it: a
        placeholder names a task input that selects one field of the loop item, and the driver
        reads that field with GetStringValue (so it must be a string). A constant is the same
        in every iteration."""
        items = json.loads(self.loop().parameter_iterator.items.raw)
        placeholder = PLACEHOLDER.fullmatch(value)
        if not placeholder:
            return [value] * len(items)
        spec = self.tasks[stage].inputs.parameters[placeholder.group(1)]
        assert spec.component_input_parameter == self.loop().parameter_iterator.item_input
        field = ITEM_FIELD.fullmatch(spec.parameter_expression_selector).group(1)
        values = [item[field] for item in items]
        assert all(isinstance(v, str) for v in values), values
        return values

    def gpus(self, stage: str) -> list[tuple[str, int]]:
        """(resource, count) per loop iteration; ("", 0) where the pod requests no GPU."""
        accelerator = self.container(stage).resources.accelerator
        counts = self.per_cell(stage, accelerator.resource_count or "0")
        return [(accelerator.resource_type if int(n) else "", int(n)) for n in counts]

    def sizes(self, stage: str) -> list[dict[str, str]]:
        """CPU and memory request and limit per loop iteration ('' where unset)."""
        resources = self.container(stage).resources
        fields = {"cpu_request": resources.resource_cpu_request,
                  "cpu_limit": resources.resource_cpu_limit,
                  "memory_request": resources.resource_memory_request,
                  "memory_limit": resources.resource_memory_limit}
        per_field = {name: self.per_cell(stage, value) for name, value in fields.items()}
        return [dict(zip(per_field, values, strict=True))
                for values in zip(*per_field.values(), strict=True)]

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


@pytest.fixture(scope="module")
def default(tmp_path_factory) -> Compiled:
    return compiled(tmp_path_factory.mktemp("default"), {})


def test_every_stage_is_a_task(cluster):
    assert set(STAGE_NAMES) <= set(cluster.tasks)


def test_each_convergence_cell_requests_the_gpus_of_its_own_workers(cluster):
    """Workers 1, 1, 2, 4 with torchrun: 1, 1, 2 and 4 GPUs, not 4 for every cell; the cells
    run one at a time; the sweep (one process) requests one GPU."""
    assert cluster.gpus("convergence") == [("nvidia.com/gpu", w) for w in CELL_WORKERS]
    assert cluster.loop().iterator_policy.parallelism_limit == 1
    assert set(cluster.gpus("throughput-sweep")) == {("nvidia.com/gpu", 1)}
    for stage in set(STAGE_NAMES) - set(GPU_STAGES):
        assert set(cluster.gpus(stage)) == {("", 0)}, stage


def test_the_sdk_alone_leaves_the_per_cell_requests_unwired(tmp_path):
    """Why compile_pipeline rewires loop item fields: kfp's compiler points the convergence
    task's resource inputs at inputs of the loop's DAG that nothing defines (the driver would
    fail the iteration). When a kfp release wires them itself, this fails: drop
    wire_loop_fields then."""
    path = tmp_path / "sdk-only.yaml"
    compiler.Compiler().compile(build_pipeline(parse_config(CLUSTER), for_cluster=True),
                                package_path=str(path))
    spec = next(yaml.safe_load_all(path.read_text()))
    (loop,) = [c for name, c in spec["components"].items() if "convergence" in
               c.get("dag", {}).get("tasks", {})]
    inputs = loop["dag"]["tasks"]["convergence"]["inputs"]["parameters"]
    sources = {i["componentInputParameter"] for i in inputs.values()
               if "subvar" in i.get("componentInputParameter", "")}
    assert sources and not sources & set(loop["inputDefinitions"]["parameters"])
    assert wire_loop_fields(str(path)) == len(sources)
    assert Compiled(path).gpus("convergence") == [("nvidia.com/gpu", w) for w in CELL_WORKERS]
    assert path.read_text().startswith("# PIPELINE DEFINITION\n# Name: batchscale\n")


def test_the_default_config_asks_one_gpu_per_single_worker_cell_as_constants(default):
    """Where every cell needs the same, the requests are constants (any KFP backend reads
    them) and the loop items are the plain fan-out."""
    cells = json.loads(default.loop().parameter_iterator.items.raw)
    assert cells == parse_config({}).convergence.fan_out()
    assert len(cells) == 9 and {c["workers"] for c in cells} == {"1"}
    assert default.gpus("convergence") == [("nvidia.com/gpu", 1)] * 9
    assert default.container("convergence").resources.accelerator.resource_count == "1"
    assert set(default.gpus("throughput-sweep")) == {("nvidia.com/gpu", 1)}
    (size,) = {tuple(s.items()) for s in default.sizes("convergence")}
    assert dict(size) == {"cpu_request": "4", "cpu_limit": "4", "memory_request": "16384Mi",
                          "memory_limit": "16384Mi"}


def test_measuring_tasks_request_what_they_are_limited_to_in_whole_cpus(cluster):
    (sweep,) = set(map(tuple, (s.items() for s in cluster.sizes("throughput-sweep"))))
    assert dict(sweep) == {"cpu_request": "2", "cpu_limit": "2",
                           "memory_request": f"{MEASURE_MIB}Mi",
                           "memory_limit": f"{MEASURE_MIB}Mi"}
    for workers, size in zip(CELL_WORKERS, cluster.sizes("convergence"), strict=True):
        assert size["cpu_request"] == size["cpu_limit"] == str(2 * workers)
        assert size["memory_request"] == size["memory_limit"] == f"{MEASURE_MIB * workers}Mi"
    for stage in set(GPU_STAGES) & set(cluster.tasks):
        for size in cluster.sizes(stage):
            assert all(QUANTITY.fullmatch(v) for v in size.values()), size


def test_other_stages_get_modest_requests_without_limits(cluster):
    for stage in set(STAGE_NAMES) - set(GPU_STAGES):
        (size,) = set(map(tuple, (s.items() for s in cluster.sizes(stage))))
        assert dict(size) == {"cpu_request": STAGE_REQUESTS[0], "cpu_limit": "",
                              "memory_request": STAGE_REQUESTS[1], "memory_limit": ""}, stage


def test_measure_off_gives_measuring_pods_the_modest_requests(tmp_path):
    result = compiled(tmp_path, with_changes(kubernetes={"measure_cpus": None},
                                             batch_schedule={"enabled": True}))
    for stage in GPU_STAGES:
        for size in result.sizes(stage):
            assert size == {"cpu_request": STAGE_REQUESTS[0], "cpu_limit": "",
                            "memory_request": STAGE_REQUESTS[1], "memory_limit": ""}, stage
    assert result.gpus("convergence") == [("nvidia.com/gpu", w) for w in CELL_WORKERS]


def test_images_follow_the_gpu_requests(cluster, tmp_path):
    assert cluster.container("throughput-sweep").image == GPU_IMAGE
    assert cluster.container("convergence").image == GPU_IMAGE
    for stage in set(STAGE_NAMES) - set(GPU_STAGES):
        assert cluster.container(stage).image == CPU_IMAGE, stage
    on_cpu = compiled(tmp_path, with_changes(kubernetes={"gpus_per_worker": 0}))
    for stage in STAGE_NAMES:
        assert on_cpu.container(stage).image == CPU_IMAGE, stage


def test_a_cpu_sweep_requests_no_gpu_and_runs_the_cpu_image(tmp_path):
    result = compiled(tmp_path, with_changes(sweep={"device": "cpu"}))
    assert set(result.gpus("throughput-sweep")) == {("", 0)}
    assert result.container("throughput-sweep").image == CPU_IMAGE
    assert "pool" not in result.k8s("throughput-sweep").node_selector.labels
    assert result.gpus("convergence") == [("nvidia.com/gpu", w) for w in CELL_WORKERS]


def test_a_cuda_sweep_without_gpus_is_refused_naming_both_fields(tmp_path):
    cfg = parse_config(with_changes(sweep={"device": "cuda"}, kubernetes={"gpus_per_worker": 0}))
    with pytest.raises(BadInput, match=r"sweep.device is 'cuda' but kubernetes.gpus_per_worker"):
        compile_pipeline(cfg, str(tmp_path / "never-written.yaml"))
    assert not list(tmp_path.iterdir())


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


def test_every_task_pulls_with_the_configured_secrets(cluster, default):
    for stage in STAGE_NAMES:
        assert [s.secret_name for s in cluster.k8s(stage).image_pull_secret] == [
            "regcred", "mirror.creds"], stage
        assert not default.k8s(stage).image_pull_secret, stage


def test_only_lake_stages_get_the_s3_secret_and_settings(cluster):
    for stage in STAGE_NAMES:
        secrets = cluster.k8s(stage).secret_as_env
        # Every task records the image it runs in (test_compile checks that); the rest is S3.
        env = {k: v for k, v in cluster.env(stage).items() if k != IMAGE_REF_ENV}
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
    assert set(cluster.spec.root.input_definitions.parameters) == set()
    for stage in ("throughput-sweep", "convergence", "analysis", "publish"):
        value = cluster.tasks[stage].inputs.parameters["run_id"].runtime_value.constant
        assert value.string_value == dsl.PIPELINE_JOB_ID_PLACEHOLDER


def test_defaults_use_the_kfp_seaweedfs_its_secret_and_a_shared_prefix(default):
    """shared/ is writable by every profile of multi-user Kubeflow (and in standalone KFP)."""
    (secret,) = default.k8s("publish").secret_as_env
    assert secret.secret_name == "mlpipeline-minio-artifact"
    assert {m.secret_key for m in secret.key_to_env} == {"accesskey", "secretkey"}
    env = default.env("publish")
    assert env["BATCHSCALE_S3_ENDPOINT"] == "http://seaweedfs.kubeflow:8333"
    assert env["BATCHSCALE_S3_BUCKET"] == "mlpipeline"
    assert env["BATCHSCALE_S3_PREFIX"] == "shared/batchscale"


@pytest.mark.parametrize(("gpus_per_worker", "trainjob_image"), [(1, GPU_IMAGE), (0, CPU_IMAGE)])
def test_kubeflow_launcher_waits_on_the_cpu_image_and_tells_its_trainjob_what_to_run(
        tmp_path, gpus_per_worker, trainjob_image):
    """The launcher pod only waits for its TrainJob (no GPU, CPU image, modest requests); it
    stages inputs through S3, and gets the TrainJob's image and its own identity and deadline
    (downward API) for the job's image, ownerReference and bounded waits."""
    result = compiled(tmp_path, with_changes(
        convergence={"launcher": "kubeflow"}, kubernetes={"gpus_per_worker": gpus_per_worker}))
    assert set(result.gpus("convergence")) == {("", 0)}
    assert result.container("convergence").image == CPU_IMAGE
    assert {tuple(s.items()) for s in result.sizes("convergence")} == {tuple({
        "cpu_request": STAGE_REQUESTS[0], "cpu_limit": "", "memory_request": STAGE_REQUESTS[1],
        "memory_limit": ""}.items())}
    assert "pool" not in result.k8s("convergence").node_selector.labels
    k8s = result.k8s("convergence")
    assert k8s.secret_as_env[0].secret_name == "lake-creds"
    assert {f.name: f.field_path for f in k8s.field_path_as_env} == {
        "BATCHSCALE_POD_NAME": "metadata.name", "BATCHSCALE_POD_UID": "metadata.uid",
        "BATCHSCALE_POD_NAMESPACE": "metadata.namespace"}
    env = result.env("convergence")
    assert env["BATCHSCALE_TRAINJOB_IMAGE"] == trainjob_image
    assert env["BATCHSCALE_POD_DEADLINE_S"] == str(k8s.active_deadline_seconds) == "1101"
    assert env["BATCHSCALE_S3_BUCKET"] == "bench-lake"
    sweep_gpus = ("nvidia.com/gpu", 1) if gpus_per_worker else ("", 0)
    assert set(result.gpus("throughput-sweep")) == {sweep_gpus}


def test_torchrun_convergence_gets_no_launcher_variables(cluster):
    assert not cluster.k8s("convergence").field_path_as_env
    assert not {"BATCHSCALE_TRAINJOB_IMAGE", "BATCHSCALE_POD_DEADLINE_S"} & set(
        cluster.env("convergence"))


def test_zero_gpus_requests_none(tmp_path):
    result = compiled(tmp_path, with_changes(kubernetes={"gpus_per_worker": 0},
                                             batch_schedule={"enabled": True}))
    for stage in GPU_STAGES:
        assert set(result.gpus(stage)) == {("", 0)}
        assert "pool" not in result.k8s(stage).node_selector.labels
    assert [s["cpu_limit"] for s in result.sizes("convergence")] == [
        str(2 * w) for w in CELL_WORKERS]


def test_no_secret_value_reaches_the_yaml(tmp_path, monkeypatch):
    """Credentials in the compiling environment stay out; the YAML names the Secret only."""
    planted = {"AWS_ACCESS_KEY_ID": "PLANTEDKEYID4242", "AWS_SECRET_ACCESS_KEY": "planted-4242"}
    for name, value in planted.items():
        monkeypatch.setenv(name, value)
    result = compiled(tmp_path, with_changes(convergence={"launcher": "kubeflow"}))
    assert not any(value in result.text for value in planted.values())
    assert "lake-creds" in result.text
    for stage in STAGE_NAMES:
        assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} & set(result.env(stage))


def test_local_pipeline_has_no_cluster_settings(tmp_path):
    """kfp.local ignores kfp-kubernetes settings; the local build does not carry them at all,
    keeps the run id a parameter (reusing it resumes a local run), and its loop items are one
    cell per worker count."""
    local = compiled(tmp_path, CLUSTER, for_cluster=False)
    assert local.platform is None
    assert set(local.spec.root.input_definitions.parameters) == {"run_id"}
    assert json.loads(local.loop().parameter_iterator.items.raw) == \
        parse_config(CLUSTER).convergence.fan_out(one_batch_size_per_cell=False)
    for stage in STAGE_NAMES:
        assert set(local.gpus(stage)) == {("", 0)} and not local.env(stage)
        assert set(map(tuple, (s.values() for s in local.sizes(stage)))) == {("", "", "", "")}
        assert local.container(stage).image == (GPU_IMAGE if stage in GPU_STAGES
                                                else CPU_IMAGE), stage


def test_the_batch_schedule_stage_runs_on_one_accelerator_and_feeds_analysis_and_publish(
        tmp_path):
    """batch_schedule.enabled adds its stage after the dataset check, on one GPU in the GPU
    image; the analysis and publish that take its tables replace the plain ones."""
    result = compiled(tmp_path, with_changes(batch_schedule={"enabled": True}))
    assert set(result.gpus("batch-schedule")) == {("nvidia.com/gpu", 1)}
    assert result.container("batch-schedule").image == GPU_IMAGE
    tasks = result.spec.root.dag.tasks
    assert "validate-dataset" in tasks["batch-schedule"].dependent_tasks
    for stage in ("analysis-with-schedule", "publish-with-schedule"):
        inputs = tasks[stage].inputs.artifacts
        assert {"critical_over_training", "schedule_check"} <= set(inputs), stage
        assert inputs["schedule_check"].task_output_artifact.producer_task == "batch-schedule"
    assert "analysis" not in tasks and "publish" not in tasks
    (tmp_path / "off").mkdir()
    assert "batch-schedule" not in compiled(tmp_path / "off", CLUSTER).spec.root.dag.tasks


def test_a_training_loops_sweep_step_holds_no_gpu_and_its_batch_schedule_is_refused(tmp_path):
    """A TrainingLoop's sweep step only records that it measured nothing (the loop's speed comes
    from its own trials), so it requests no GPU while the loop's convergence cells keep theirs;
    a batch schedule of a loop is refused at compile, as `batchscale run` refuses it. The
    compile imports the loop's module (tests/loop_workloads.py) and calls nothing."""
    loop = {**CLUSTER, "workload": "loop_workloads:good_loop"}
    result = compiled(tmp_path, loop)
    assert set(result.gpus("throughput-sweep")) == {("", 0)}
    assert result.container("throughput-sweep").image == CPU_IMAGE
    assert ("nvidia.com/gpu", 2) in set(result.gpus("convergence"))
    with pytest.raises(BadInput, match=r"loop_workloads:good_loop is a TrainingLoop.*or set "
                                       r"batch_schedule\.enabled: false"):
        compiled(tmp_path, {**loop, "batch_schedule": {"enabled": True}})
    # where the module cannot be imported here, the compile cannot tell: the sweep keeps its GPU
    elsewhere = compiled(tmp_path, {**CLUSTER, "workload": "not_importable_here:loop"})
    assert set(elsewhere.gpus("throughput-sweep")) == {("nvidia.com/gpu", 1)}
