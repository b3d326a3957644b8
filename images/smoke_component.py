"""Runs one pipeline component inside a built image the way KFP's launcher runs it.

images/check.sh copies this file into a container of the image and runs it there as the image's
own (non-root) user:

    python3 smoke_component.py data_prep

It compiles the pipeline with the image's own `batchscale compile` (batchscale.cli), takes the
component's container `command` and `args` from the compiled IR YAML, replaces the `{{$}}`
placeholder with an ExecutorInput JSON, and runs the result. That is what the KFP v2 launcher does
(kubeflow/pipelines backend/src/v2/component/launcher_v2.go, compileCmdAndArgs: `{{$}}` becomes
the protojson ExecutorInput, then the command runs); for our lightweight components the command
is kfp 2.17's `sh -ec ... python3 -m kfp.dsl.executor_main --component_module_path ...`
(kfp/dsl/component_factory.py). The differences from a cluster: the output artifact URI is a
local directory (the launcher would give minio://... or s3://... and upload it afterwards) and
the config is the compiled default (digits, which scikit-learn ships, so no download), given as
the task's compiled constants (`experiment`, `dataset_config`), as the launcher resolves them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

# Components this smoke test knows how to feed: their input parameters are compiled constants
# (their config) and their one output is a Dataset artifact.
SUPPORTED = {"data_prep": "dataset"}
RUN_TIMEOUT_S = 600


def fail(message: str) -> None:
    print(f"smoke_component: FAILED: {message}", file=sys.stderr)
    sys.exit(1)


def compile_pipeline(out_dir: Path) -> dict:
    """The PipelineSpec document of `batchscale compile` (the PlatformSpec follows it)."""
    path = out_dir / "pipeline.yaml"
    subprocess.run([sys.executable, "-m", "batchscale.cli", "compile", "--output", str(path)],
                   check=True, timeout=RUN_TIMEOUT_S)
    return next(iter(yaml.safe_load_all(path.read_text())))


def task_constants(spec: dict, component: str) -> dict:
    """The constant input parameters the pipeline gives the component's task (its config)."""
    task = spec["root"]["dag"]["tasks"][component.replace("_", "-")]
    return {name: value["runtimeValue"]["constant"]
            for name, value in task.get("inputs", {}).get("parameters", {}).items()
            if "runtimeValue" in value}


def executor_input(parameters: dict, output_name: str, out_dir: Path) -> dict:
    """An ExecutorInput (kfp pipeline_spec.proto) with the parameters and one Dataset output."""
    return {
        "inputs": {"parameterValues": parameters},
        "outputs": {
            "artifacts": {output_name: {"artifacts": [{
                "name": output_name,
                "type": {"schemaTitle": "system.Dataset", "schemaVersion": "0.0.1"},
                "uri": str(out_dir / output_name),
                "metadata": {},
            }]}},
            "outputFile": str(out_dir / "executor_output.json"),
        },
    }


def component_argv(spec: dict, component: str, executor_json: str) -> list[str]:
    executor = spec["components"][f"comp-{component.replace('_', '-')}"]["executorLabel"]
    container = spec["deploymentSpec"]["executors"][executor]["container"]
    print(f"smoke_component: {executor} image {container['image']} (compiled), "
          f"command {container['command'][:2]} ... {container['args']}")
    return [part.replace("{{$}}", executor_json)
            for part in container["command"] + container["args"]]


def check_executor_output(payload: dict) -> None:
    """The executor reports the output artifact at the URI it was given, as the launcher
    expects before it uploads the artifact."""
    path = Path(payload["outputs"]["outputFile"])
    if not path.is_file():
        fail(f"the executor wrote no {path.name}")
    wanted = payload["outputs"]["artifacts"]
    reported = json.loads(path.read_text()).get("artifacts", {})
    for name, artifacts in wanted.items():
        uri = artifacts["artifacts"][0]["uri"]
        found = [a.get("uri") for a in reported.get(name, {}).get("artifacts", [])]
        if found != [uri]:
            fail(f"{path.name} reports output {name!r} at {found}, expected [{uri!r}]")


def check_dataset(dataset_dir: Path) -> int:
    """Every shard the manifest lists exists with its recorded sha256; returns the row count."""
    import pyarrow.parquet as pq

    manifest_path = dataset_dir / "manifest.parquet"
    if not manifest_path.is_file():
        fail(f"{manifest_path} was not written")
    rows = pq.read_table(manifest_path).to_pylist()
    if not rows:
        fail("the manifest lists no shard")
    for row in rows:
        shard = dataset_dir / row["shard"]
        digest = hashlib.sha256(shard.read_bytes()).hexdigest() if shard.is_file() else None
        if digest != row["sha256"]:
            fail(f"shard {shard.name}: missing or its sha256 differs from the manifest")
    return sum(row["rows"] for row in rows)


def run_component(component: str, out_dir: Path) -> int:
    """Compile, run `component` as the launcher would, check its outputs; returns the rows
    the dataset holds."""
    spec = compile_pipeline(out_dir)
    payload = executor_input(task_constants(spec, component), SUPPORTED[component], out_dir)
    argv = component_argv(spec, component, json.dumps(payload))
    subprocess.run(argv, check=True, timeout=RUN_TIMEOUT_S)
    check_executor_output(payload)
    return check_dataset(out_dir / SUPPORTED[component])


def main(argv: list[str]) -> int:
    component = argv[1] if len(argv) > 1 else "data_prep"
    if component not in SUPPORTED:
        fail(f"component {component!r}: allowed {sorted(SUPPORTED)}")
    if os.getuid() == 0:
        fail("running as root; the image must run its components as its non-root USER")
    with tempfile.TemporaryDirectory(prefix="batchscale-smoke-") as tmp:
        rows = run_component(component, Path(tmp))
    print(f"smoke_component: {component} ran as uid {os.getuid()} through "
          f"kfp.dsl.executor_main and wrote {rows} rows with a matching manifest: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
