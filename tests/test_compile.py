"""`batchscale compile`: the IR YAML parses into KFP's PipelineSpec and PlatformSpec protos, points
at the images named by the one image setting, and carries no secret value from the environment
it was compiled in."""

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

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
        image = executors[components[f"comp-{stage}"]["executorLabel"]]["container"]["image"]
        assert image == (GPU_IMAGE if stage in GPU_STAGES else CPU_IMAGE), stage
    assert CPU_IMAGE in compiled[1] and GPU_IMAGE in compiled[1]


def test_no_secret_value_reaches_the_yaml(compiled):
    text = compiled[0]
    for value in PLANTED.values():
        assert value not in text
    assert "mlpipeline-minio-artifact" in text  # the Secret is referenced by name only
