"""The compiled IR YAML parses into KFP's PipelineSpec proto and names every stage."""

import yaml
from batchscale.pipelines.batchscale_pipeline import STAGE_NAMES
from google.protobuf import json_format
from helpers import run_cli
from kfp.pipeline_spec import pipeline_spec_pb2


def test_compile_writes_a_pipeline_spec(tmp_path):
    env = {"AWS_SECRET_ACCESS_KEY": "planted-secret-value-123"}
    result = run_cli(["compile", "--output", "p.yaml"], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    text = (tmp_path / "p.yaml").read_text()
    docs = list(yaml.safe_load_all(text))
    spec = json_format.ParseDict(docs[0], pipeline_spec_pb2.PipelineSpec())
    assert spec.pipeline_info.name == "batchscale"
    tasks = set(spec.root.dag.tasks)
    for stage in STAGE_NAMES:
        assert any(stage in t for t in tasks) or any(
            stage in c for c in spec.components), stage
    executors = spec.deployment_spec["executors"]
    assert all("image" in e["container"] for e in executors.values())
    assert "planted-secret-value-123" not in text
