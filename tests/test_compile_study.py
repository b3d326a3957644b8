"""`batchscale compile` of a study config: one cluster pipeline in which every variant is its own
branch of the stages, joined only by `compare-study` after every variant has published.

Only the compiled YAML is checked: running it needs a KFP API server and a cluster, which tests
cannot reach, so what a backend would do with it is read from the IR (the same fields the KFP
driver reads: dependentTasks, componentInputParameter, runtimeValue constants, the platform
spec). The `variant_run_id` step itself runs here, as the function KFP would run in its pod."""

import json
import re

import pytest
import yaml
from google.protobuf import json_format
from kfp import dsl
from kfp.pipeline_spec import pipeline_spec_pb2

from batchscale.components.study.component import compare_study, variant_run_id
from batchscale.config import load_config
from batchscale.config.stage_inputs import config_from_input, config_input
from batchscale.config.variants import expand
from batchscale.errors import BadInput
from batchscale.pipelines.batchscale_pipeline import (
    GPU_STAGES,
    STAGE_NAMES,
    STUDY_STAGE,
    VARIANT_RUN_ID_STAGE,
    build_pipeline,
)
from helpers import TINY_CONFIG, run_cli, task_config

CPU_IMAGE = "registry.example.com/team/batchscale-cpu:t-20261201"
GPU_IMAGE = "registry.example.com/team/batchscale-cuda:t-20261201"
PLANTED = {
    "AWS_ACCESS_KEY_ID": "PLANTEDACCESSKEYID1616",
    "AWS_SECRET_ACCESS_KEY": "planted-secret-access-key-1616",
    "KF_PIPELINES_TOKEN": "planted-bearer-token-1616",
}
STUDY_CONFIG = TINY_CONFIG + "study:\n  axes:\n    dataset_fraction: [0.5, 1.0]\n"
RUN_UUID = "{{$.pipeline_job_uuid}}"
"""KFP's run UUID placeholder (dsl.PIPELINE_JOB_ID_PLACEHOLDER), substituted by the backend."""
DUPLICATE_SUFFIX = re.compile(r"-\d+$")
"""How the SDK tells apart a second task or component of the same name ("publish-2")."""


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict:
    """The study's YAML text and parsed documents, compiled by the real CLI with the images set
    as `make compile` sets them and recognizable secrets planted in the environment, and the
    variants the config expands into."""
    workdir = tmp_path_factory.mktemp("compile-study")
    (workdir / "study.yaml").write_text(STUDY_CONFIG)
    env = {"BATCHSCALE_IMAGE": CPU_IMAGE, "BATCHSCALE_GPU_IMAGE": GPU_IMAGE, **PLANTED}
    result = run_cli(["compile", "--config", "study.yaml", "--output", "p.yaml"], cwd=workdir,
                     env=env)
    assert result.returncode == 0, result.stderr
    text = (workdir / "p.yaml").read_text()
    pipeline_doc, platform_doc = yaml.safe_load_all(text)
    cfg = load_config(workdir / "study.yaml")
    return {"text": text, "spec": pipeline_doc, "platform": platform_doc, "config": cfg,
            "variants": expand(cfg)}


# ------------------------------------------------------------------------------- reading
def _dags(spec: dict) -> dict[str, dict]:
    """Every DAG of the spec by component name: the root and each loop's."""
    found = {"root": spec["root"]}
    found.update({name: comp for name, comp in spec["components"].items() if "dag" in comp})
    return found


def _tasks(spec: dict) -> dict[tuple[str, str], dict]:
    """(DAG, task name) → task, over every DAG."""
    return {(dag, name): task for dag, comp in _dags(spec).items()
            for name, task in comp["dag"]["tasks"].items()}


def _stage(task: dict) -> str:
    """The stage a task runs: its component's name without the `comp-` prefix and the SDK's
    duplicate suffix."""
    return DUPLICATE_SUFFIX.sub("", task["componentRef"]["name"].removeprefix("comp-"))


def _constant(task: dict, parameter: str):
    return task["inputs"]["parameters"][parameter]["runtimeValue"]["constant"]


def _variant_of(task: dict) -> str | None:
    """The variant whose config a stage task was built with (None: no constant config)."""
    cfg = task_config(task)
    return None if cfg is None else cfg.variant


def _by_stage(spec: dict, stage: str) -> list[tuple[str, str, dict]]:
    return [(dag, name, task) for (dag, name), task in _tasks(spec).items()
            if _stage(task) == stage]


def _root_variant(spec: dict, name: str) -> str | None:
    """The variant of a root task; a loop's task takes the variant of the tasks inside it."""
    task = spec["root"]["dag"]["tasks"][name]
    if _stage(task) == VARIANT_RUN_ID_STAGE:
        return _constant(task, "variant")
    inner = spec["components"][task["componentRef"]["name"]].get("dag")
    if inner is None:
        return _variant_of(task)
    found = {_variant_of(t) for t in inner["tasks"].values()}
    assert len(found) == 1, (name, found)
    return found.pop()


def _upstream(tasks: dict[str, dict], name: str) -> set[str]:
    seen, todo = set(), list(tasks[name].get("dependentTasks", []))
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo += tasks[current].get("dependentTasks", [])
    return seen


# --------------------------------------------------------------------------------- tests
def test_yaml_parses_into_pipeline_and_platform_spec(study):
    spec = json_format.ParseDict(study["spec"], pipeline_spec_pb2.PipelineSpec())
    platform = json_format.ParseDict(study["platform"], pipeline_spec_pb2.PlatformSpec())
    assert spec.pipeline_info.name == "batchscale"
    executors = platform.platforms["kubernetes"].deployment_spec.executors
    assert set(executors) == set(spec.deployment_spec["executors"])


def test_the_study_pipeline_takes_no_parameter(study):
    """Its config is compiled in, as its fan-out is: a run submitted with another config would
    not match the branches built from this one."""
    assert "inputDefinitions" not in study["spec"]["root"] or \
        not study["spec"]["root"]["inputDefinitions"].get("parameters")


def test_every_stage_runs_once_per_variant_with_that_variants_config(study):
    names = sorted(v.name for v in study["variants"])
    assert len(names) == 2
    configs = {v.name: v.config for v in study["variants"]}
    for stage in STAGE_NAMES:
        found = _by_stage(study["spec"], stage)
        assert sorted(_variant_of(task) for _, _, task in found) == names, stage
        for _, _, task in found:
            # Each section it is given is the variant's, and the hash is the variant's whole
            # config's (sent as the values that differ from the defaults).
            given = task_config(task)
            variant = configs[given.variant]
            assert given.config_hash == variant.config_hash, stage
            for section in given._sections:
                assert getattr(given, section) == getattr(variant, section), (stage, section)
    fractions = {v.name: v.config.dataset.train_fraction for v in study["variants"]}
    assert sorted(fractions.values()) == [0.5, 1.0]


def test_each_variant_publishes_under_the_run_uuid_and_its_own_name(study):
    """Every stage that takes a run id gets it from its own variant's `variant-run-id` step,
    which takes KFP's run UUID whole (never formatted into a string) and the variant's name."""
    spec = study["spec"]
    run_id_tasks = {name: task for _, name, task in _by_stage(spec, VARIANT_RUN_ID_STAGE)}
    assert sorted(_constant(t, "variant") for t in run_id_tasks.values()) == \
        sorted(v.name for v in study["variants"])
    assert {_constant(t, "study_id") for t in run_id_tasks.values()} == {RUN_UUID}
    producer_of = {_constant(t, "variant"): name for name, t in run_id_tasks.items()}
    checked = 0
    for (dag, name), task in _tasks(spec).items():
        run_id = task.get("inputs", {}).get("parameters", {}).get("run_id")
        if run_id is None:
            continue
        producer = producer_of[_variant_of(task)]
        if dag == "root":
            assert run_id == {"taskOutputParameter": {"outputParameterKey": "Output",
                                                      "producerTask": producer}}, name
        else:  # inside a loop: the loop's input, wired from the same step
            assert run_id["componentInputParameter"] == f"pipelinechannel--{producer}-Output"
        checked += 1
    assert checked == 2 * 4  # sweep, convergence, analysis and publish of each variant
    assert RUN_UUID not in json.dumps([t for t in _tasks(spec).values()
                                       if _stage(t) not in (VARIANT_RUN_ID_STAGE, STUDY_STAGE)])


def test_the_variant_run_id_step_names_the_variants_run():
    assert variant_run_id.python_func(study_id="0d5c7a52-uuid", variant="fraction0.5") == \
        "0d5c7a52-uuid-fraction0.5"
    with pytest.raises(BadInput):
        variant_run_id.python_func(study_id="../up", variant="fraction0.5")


def test_the_compare_study_step_hands_its_config_to_the_study_stage(tmp_path, capsys):
    """The wrapper's own body, run as KFP would run it, up to the stage's first check: a config
    without a study is refused before the lake is reached, as a task refuses (one line, exit 2,
    no traceback). What the stage does with a study is tested with the stage (it needs every
    variant's run published first)."""
    outputs = {name: cls(name=name, uri=str(tmp_path / name)) for name, cls in (
        ("study", dsl.Dataset), ("study_axes", dsl.Dataset), ("report", dsl.HTML),
        ("answer", dsl.Markdown))}
    with pytest.raises(SystemExit) as stop:
        compare_study.python_func(config=config_input(load_config()), study_id="s", **outputs)
    assert stop.value.code == BadInput.exit_code
    assert capsys.readouterr().err.startswith(
        "batchscale: error: the config has no study.axes: there is nothing to compare")
    assert not any((tmp_path / name).exists() for name in outputs)


def test_compare_study_runs_after_every_publish_with_the_study_config(study):
    spec = study["spec"]
    (dag, _, compare), = _by_stage(spec, STUDY_STAGE)
    assert dag == "root"
    publishes = {name for _, name, _ in _by_stage(spec, "publish")}
    assert len(publishes) == 2 and publishes <= set(compare["dependentTasks"])
    assert config_from_input(_constant(compare, "config"), "compare") == study["config"]
    assert _constant(compare, "study_id") == RUN_UUID
    outputs = spec["components"][compare["componentRef"]["name"]]["outputDefinitions"]
    assert set(outputs["artifacts"]) == {"study", "study_axes", "report", "answer"}
    roots = spec["root"]["dag"]["tasks"]
    assert not [n for n, t in roots.items() if STUDY_STAGE in t.get("dependentTasks", [])]


def test_compare_study_reaches_the_lake_as_publish_does(study):
    """Endpoint, bucket and prefix as plain variables, the credentials from the Secret."""
    executors = study["spec"]["deploymentSpec"]["executors"]
    platform = study["platform"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    components = study["spec"]["components"]
    label = {_stage(t): components[t["componentRef"]["name"]]["executorLabel"]
             for t in _tasks(study["spec"]).values()
             if "executorLabel" in components[t["componentRef"]["name"]]}
    compare, publish = label[STUDY_STAGE], label["publish"]
    env = {e["name"] for e in executors[compare]["container"]["env"]}
    assert env == {e["name"] for e in executors[publish]["container"]["env"]}
    assert {"BATCHSCALE_S3_ENDPOINT", "BATCHSCALE_S3_BUCKET", "BATCHSCALE_S3_PREFIX"} <= env
    assert platform[compare]["secretAsEnv"] == platform[publish]["secretAsEnv"]
    assert executors[compare]["container"]["image"] == CPU_IMAGE
    assert "secretAsEnv" not in platform[label[VARIANT_RUN_ID_STAGE]]


def test_no_secret_value_reaches_the_yaml(study):
    for value in PLANTED.values():
        assert value not in study["text"]
    assert "mlpipeline-minio-artifact" in study["text"]  # the Secret is referenced by name only


def test_variant_branches_do_not_depend_on_each_other(study):
    """Every root task before `compare-study` waits only on tasks of its own variant, so a
    cluster with the GPUs runs the variants side by side."""
    spec = study["spec"]
    tasks = spec["root"]["dag"]["tasks"]
    variant_of = {name: _root_variant(spec, name) for name in tasks if name != STUDY_STAGE}
    assert set(variant_of.values()) == {v.name for v in study["variants"]}
    for name, variant in variant_of.items():
        crossing = {up: variant_of[up] for up in _upstream(tasks, name)
                    if variant_of[up] != variant}
        assert not crossing, f"{name} ({variant}) waits on {crossing}"


def test_images_follow_the_stage_in_every_branch(study):
    executors = study["spec"]["deploymentSpec"]["executors"]
    for stage in STAGE_NAMES:
        for _, _, task in _by_stage(study["spec"], stage):
            label = study["spec"]["components"][task["componentRef"]["name"]]["executorLabel"]
            expected = GPU_IMAGE if stage in GPU_STAGES else CPU_IMAGE
            assert executors[label]["container"]["image"] == expected, stage


def test_every_input_a_task_names_is_defined_in_its_dag(study):
    """Each variant has its own convergence loop whose cells' requests ride in the loop items
    (TINY_CONFIG has two worker counts); the SDK leaves those fields undefined in the loop's
    DAG and `wire_loop_fields` must wire them in every loop, not just the first."""
    loops = 0
    for dag_name, comp in _dags(study["spec"]).items():
        defined = set(comp.get("inputDefinitions", {}).get("parameters", {}))
        for name, task in comp["dag"]["tasks"].items():
            for parameter, spec in task.get("inputs", {}).get("parameters", {}).items():
                source = spec.get("componentInputParameter")
                assert source is None or source in defined, (dag_name, name, parameter)
        loops += dag_name != "root"
    assert loops == 2


def test_a_study_has_no_local_pipeline(tmp_path):
    (tmp_path / "study.yaml").write_text(STUDY_CONFIG)
    with pytest.raises(BadInput, match="batchscale study"):
        build_pipeline(load_config(tmp_path / "study.yaml"), for_cluster=False)


def test_a_dataset_axis_is_refused_for_a_workload_with_its_own_data(tmp_path, capsys):
    """dataset_fraction varies the config's dataset; a Workload with its own Dataset never
    reads it, so the study would compare identical trainings under that name: `study`, `run`
    and `compile` refuse it (exit 2) before anything starts."""
    from batchscale.cli import main

    config = tmp_path / "own.yaml"
    config.write_text("workload: contract_workloads:good\n"
                      "study:\n  axes:\n    dataset_fraction: [0.5, 1.0]\n")
    for command in (["study", "--config", str(config)], ["run", "--config", str(config)],
                    ["compile", "--config", str(config), "--output", str(tmp_path / "p.yaml")]):
        assert main(command) == 2
        assert ("study axis dataset_fraction changes the config's dataset (digits), which "
                "workload contract_workloads:good does not read") in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["own.yaml"]
