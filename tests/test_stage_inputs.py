"""Each component takes the parts of the config its stage reads as typed, named inputs
(`experiment`, `<section>_config`): what a compiled task is given rebuilds the config's values,
after the trip through protobuf (where every number is a double), and a stage that reads a
section its component does not take fails loudly."""

from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from batchscale.config import load_config, parse_config
from batchscale.config.models import section_models
from batchscale.config.stage_inputs import (
    NULL_FIELDS_KEY,
    SectionNotGiven,
    StageConfig,
    component_inputs,
    config_from_input,
    config_input,
)
from batchscale.errors import BadInput
from batchscale.pipelines.batchscale_pipeline import compile_pipeline
from helpers import task_config

CONFIGS = sorted(p for p in (Path(__file__).parents[1] / "batchscale" / "configs").glob("*.yaml")
                 if "study" not in p.name)
NULLS = {"sweep": {"overload_cpu_share": None, "max_cpu_wait_share": None},
         "convergence": {"adaptive_prune_factor": None}}
"""Fields set to null where their default is not: sent by name (KFP compiles no null)."""


def _as_a_backend_reads_it(path: Path) -> list[dict]:
    """Every task of a compiled pipeline, through the PipelineSpec proto (numbers as doubles)."""
    spec = json_format.ParseDict(next(yaml.safe_load_all(path.read_text())),
                                 pipeline_spec_pb2.PipelineSpec())
    data = json_format.MessageToDict(spec)
    dags = [data["root"], *data["components"].values()]
    return [t for d in dags for t in d.get("dag", {}).get("tasks", {}).values()]


def _given(task: dict) -> dict:
    return {name: spec for name, spec in task.get("inputs", {}).get("parameters", {}).items()
            if name == "experiment" or name.endswith("_config")}


@pytest.mark.parametrize("config_path", CONFIGS, ids=lambda p: p.stem)
def test_every_task_is_given_its_configs_values_and_hash(tmp_path, config_path):
    cfg = load_config(config_path)
    path = tmp_path / "pipeline.yaml"
    compile_pipeline(cfg, str(path), for_cluster=True)
    checked = 0
    for task in _as_a_backend_reads_it(path):
        given = task_config(task)
        if given is None:
            continue
        assert (given.name, given.workload, given.variant, given.config_hash) == \
            (cfg.name, cfg.workload, cfg.variant, cfg.config_hash)
        for section in given._sections:
            assert getattr(given, section) == getattr(cfg, section), section
        checked += 1
    assert checked >= 11  # every stage of STAGE_NAMES


def test_a_null_over_a_default_survives_the_trip(tmp_path):
    cfg = parse_config(NULLS)
    inputs = component_inputs(cfg, ["experiment", "sweep_config", "convergence_config"])
    assert sorted(inputs["sweep_config"][NULL_FIELDS_KEY]) == sorted(NULLS["sweep"])
    given = StageConfig(inputs["experiment"], sweep=inputs["sweep_config"],
                        convergence=inputs["convergence_config"])
    assert given.sweep == cfg.sweep and given.convergence == cfg.convergence
    assert given.sweep.overload_cpu_share is None


def test_the_whole_config_input_rebuilds_the_config():
    cfg = parse_config({**NULLS, "name": "whole", "analysis": {"bootstrap_samples": 40}})
    assert config_from_input(config_input(cfg), "test") == cfg


def test_each_section_input_is_only_what_differs_from_the_defaults():
    inputs = component_inputs(load_config(), [f"{key}_config" for key in section_models()])
    assert inputs["dataset_config"] == {}
    assert inputs["sweep_config"] == {"time_budget_s": 2.0}


def test_reading_a_section_the_component_does_not_take_names_it():
    given = StageConfig(component_inputs(load_config(), ["experiment"])["experiment"])
    with pytest.raises(SectionNotGiven, match="'sweep' section: add a `sweep_config: dict`"):
        given.sweep  # noqa: B018  reading it is the test


def test_a_malformed_input_is_refused_naming_it():
    experiment = component_inputs(load_config(), ["experiment"])["experiment"]
    with pytest.raises(BadInput, match="pipeline input sweep_config:\n  time_budget_s"):
        StageConfig(experiment, sweep={"time_budget_s": -1})
    with pytest.raises(BadInput, match="pipeline input experiment:\n  config_hash"):
        StageConfig({"name": "x"})
    with pytest.raises(BadInput, match="unknown config sections \\['sweeps'\\]"):
        StageConfig(experiment, sweeps={})
    with pytest.raises(BadInput, match=f"{NULL_FIELDS_KEY} must list field names"):
        StageConfig(experiment, sweep={NULL_FIELDS_KEY: "overload_cpu_share"})


def test_model_copy_keeps_the_experiments_hash():
    cfg = load_config()
    inputs = component_inputs(cfg, ["experiment", "convergence_config"])
    given = StageConfig(inputs["experiment"], convergence=inputs["convergence_config"])
    one_seed = cfg.convergence.model_copy(update={"seeds": [0]})
    copied = given.model_copy(update={"convergence": one_seed})
    assert copied.convergence.seeds == [0] and copied.config_hash == cfg.config_hash
