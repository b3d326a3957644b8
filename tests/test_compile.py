"""`batchscale compile`: the IR YAML parses into KFP's PipelineSpec and PlatformSpec protos, points
at the images named by the one image setting, and carries no secret value from the environment
it was compiled in."""

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from batchscale.images import IMAGE_REF_ENV
from batchscale.pipelines.batchscale_pipeline import GPU_STAGES, STAGE_NAMES
from helpers import run_cli

CPU_IMAGE = "registry.example.com/team/batchscale-cpu:t-20261130"
GPU_IMAGE = "registry.example.com/team/batchscale-cuda:t-20261130"
PLANTED = {
    "AWS_ACCESS_KEY_ID": "PLANTEDACCESSKEYID7777",
    "AWS_SECRET_ACCESS_KEY": "planted-secret-access-key-7777",
    "KF_PIPELINES_TOKEN": "planted-bearer-token-7777",
}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> tuple[str, str]:
    """The YAML text and the command's stdout, compiled with the images set as `make compile`
    sets them and with recognizable secrets planted in the environment."""
    workdir = tmp_path_factory.mktemp("compile")
    env = {"BATCHSCALE_IMAGE": CPU_IMAGE, "BATCHSCALE_GPU_IMAGE": GPU_IMAGE, **PLANTED}
    result = run_cli(["compile", "--output", "p.yaml"], cwd=workdir, env=env)
    assert result.returncode == 0, result.stderr
    return (workdir / "p.yaml").read_text(), result.stdout


def test_yaml_parses_into_pipeline_and_platform_spec(compiled):
    pipeline_doc, platform_doc = yaml.safe_load_all(compiled[0])
    spec = json_format.ParseDict(pipeline_doc, pipeline_spec_pb2.PipelineSpec())
    platform = json_format.ParseDict(platform_doc, pipeline_spec_pb2.PlatformSpec())
    assert spec.pipeline_info.name == "batchscale"
    tasks = {name for comp in [spec.root, *spec.components.values()] for name in comp.dag.tasks}
    assert set(STAGE_NAMES) <= tasks
    executors = platform.platforms["kubernetes"].deployment_spec.executors
    assert set(executors) == set(spec.deployment_spec["executors"])


def test_images_come_from_the_image_setting(compiled):
    pipeline_doc = next(yaml.safe_load_all(compiled[0]))
    components, executors = pipeline_doc["components"], pipeline_doc["deploymentSpec"]["executors"]
    for stage in STAGE_NAMES:
        container = executors[components[f"comp-{stage}"]["executorLabel"]]["container"]
        expected = GPU_IMAGE if stage in GPU_STAGES else CPU_IMAGE
        assert container["image"] == expected, stage
        # Every result row records the image its task ran: a container cannot see its own.
        env_vars = {e["name"]: e["value"] for e in container.get("env", [])}
        assert env_vars[IMAGE_REF_ENV] == expected, stage
    assert CPU_IMAGE in compiled[1] and GPU_IMAGE in compiled[1]


@pytest.mark.parametrize(("gpus_per_worker", "trainjob_image"), [(1, GPU_IMAGE), (0, CPU_IMAGE)])
def test_a_kubeflow_launched_trainjob_runs_the_image_setting(tmp_path, gpus_per_worker,
                                                             trainjob_image):
    """The TrainJob's image is written at compile time from the image setting, not the default
    tag; the pod that only waits for it runs the CPU image."""
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({
        "convergence": {"launcher": "kubeflow"},
        "kubernetes": {"gpus_per_worker": gpus_per_worker}}))
    env = {"BATCHSCALE_IMAGE": CPU_IMAGE, "BATCHSCALE_GPU_IMAGE": GPU_IMAGE}
    result = run_cli(["compile", "--config", "c.yaml", "--output", "p.yaml"], cwd=tmp_path,
                     env=env)
    assert result.returncode == 0, result.stderr
    pipeline_doc = next(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))
    label = pipeline_doc["components"]["comp-convergence"]["executorLabel"]
    container = pipeline_doc["deploymentSpec"]["executors"][label]["container"]
    env_vars = {e["name"]: e["value"] for e in container["env"]}
    assert env_vars["BATCHSCALE_TRAINJOB_IMAGE"] == trainjob_image
    assert container["image"] == CPU_IMAGE and env_vars[IMAGE_REF_ENV] == CPU_IMAGE


def test_no_secret_value_reaches_the_yaml(compiled):
    text = compiled[0]
    for value in PLANTED.values():
        assert value not in text
    assert "mlpipeline-minio-artifact" in text  # the Secret is referenced by name only
