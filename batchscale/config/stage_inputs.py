"""What one pipeline step is given of the experiment's config: its identity and the sections
its stage reads, each a typed input of its component (docs/architecture.md, "Component
interfaces").

A component declares what it reads by its input names: `experiment` (name, workload, variant
and the whole config's hash, which every row records) and `<section>_config` for each section
(`sweep_config`, `convergence_config`, ...). The pipeline fills them from the config it is built
for (`component_inputs`); the step validates each by its section's model (`StageConfig`). A
stage that reads a section its component was not given fails loudly, so a component's inputs
cannot drift from what its stage reads unseen.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ValidationError

from batchscale.config.loading import config_from_json, describe_invalid, parse_config
from batchscale.config.models import ExperimentConfig, ExperimentIdentity, section_models
from batchscale.errors import BadInput

EXPERIMENT_INPUT = "experiment"
SECTION_INPUT_SUFFIX = "_config"
NULL_FIELDS_KEY = "null_fields"
"""A section input names here its fields set to null where their default is not: KFP compiles
no null inside a struct constant (kfp.compiler's to_protobuf_value refuses None)."""


class StageIdentity(ExperimentIdentity):
    """The experiment a step's rows belong to: its identity and the hash of its whole config."""

    config_hash: str
    """sha256 (first 16 hex digits) of the whole config the pipeline was built from."""


class SectionNotGiven(RuntimeError):
    """A stage read a config section its component does not take: a bug in the component's
    inputs, not in the user's config."""


class StageConfig:
    """The config as one step sees it: `name`, `workload`, `variant`, `config_hash` and the
    sections it was given, read like an ExperimentConfig's (`cfg.sweep.batch_sizes`)."""

    def __init__(self, experiment: dict, **sections: dict | BaseModel):
        identity = _validated(StageIdentity, _as_sent(experiment), EXPERIMENT_INPUT)
        self.name, self.workload = identity.name, identity.workload
        self.variant, self.config_hash = identity.variant, identity.config_hash
        models = section_models()
        unknown = sorted(set(sections) - set(models))
        if unknown:
            raise BadInput(f"unknown config sections {unknown}; allowed: {', '.join(models)}")
        self._sections = {key: value if isinstance(value, models[key]) else
                          _validated(models[key], _with_nulls(value), key + SECTION_INPUT_SUFFIX)
                          for key, value in sections.items()}

    def __getattr__(self, key: str):
        sections = self.__dict__.get("_sections", {})
        if key in sections:
            return sections[key]
        if key in section_models():
            raise SectionNotGiven(f"this step's component does not take the config's {key!r} "
                                  f"section: add a `{key}{SECTION_INPUT_SUFFIX}: dict` input")
        raise AttributeError(key)

    def model_copy(self, update: dict) -> StageConfig:
        """The same step's config with some sections replaced (as pydantic's model_copy: the
        identity, hash included, stays that of the experiment the rows belong to)."""
        return StageConfig(self._identity(), **{**self._sections, **update})

    def _identity(self) -> dict:
        return {"name": self.name, "workload": self.workload, "variant": self.variant,
                "config_hash": self.config_hash}


Config = ExperimentConfig | StageConfig


def stage_config(config: str | Config) -> Config:
    """A stage's config from what its caller has: a whole config as JSON (the CLI and the
    tests), or the part a pipeline step was given."""
    return config_from_json(config) if isinstance(config, str) else config


def component_inputs(cfg: ExperimentConfig, input_names: Iterable[str]) -> dict:
    """The config inputs of a component whose inputs are named `input_names`: `experiment`,
    and each `<section>_config` as the section's values (JSON types)."""
    sections = section_models()
    inputs = {}
    for name in input_names:
        section = name.removesuffix(SECTION_INPUT_SUFFIX)
        if name == EXPERIMENT_INPUT:
            inputs[name] = {**_identity(cfg), "config_hash": cfg.config_hash}
        elif name.endswith(SECTION_INPUT_SUFFIX) and section in sections:
            inputs[name] = section_input(getattr(cfg, section))
    return inputs


def config_input(cfg: ExperimentConfig) -> dict:
    """A whole config as one component input (a study's comparison, which expands the study
    into its variants): the identity's values and each section's `section_input`."""
    return {**_identity(cfg),
            **{key: section_input(getattr(cfg, key)) for key in section_models()}}


def config_from_input(data: object, source: str) -> ExperimentConfig:
    """The config `config_input` passed, validated as a config file is."""
    if not isinstance(data, dict):
        raise BadInput(f"{source}: expected a mapping, got {type(data).__name__}")
    sections = section_models()
    return parse_config({key: _with_nulls(value) if key in sections else value
                         for key, value in data.items()}, source)


def section_input(section: BaseModel) -> dict:
    """A section as a component's input: the values that differ from the defaults (what the
    config file set, as `to_compact_json`), those set to null named under NULL_FIELDS_KEY."""
    values = section.model_dump(mode="json", exclude_defaults=True)
    nulls = sorted(key for key, value in values.items() if value is None)
    values = {key: value for key, value in values.items() if value is not None}
    return {**values, NULL_FIELDS_KEY: nulls} if nulls else values


def _identity(cfg: ExperimentConfig) -> dict:
    """name, workload and variant; a variant of null (a single run, the default) left out."""
    identity = {key: getattr(cfg, key) for key in ExperimentIdentity.model_fields}
    return {key: value for key, value in identity.items() if value is not None}


def _as_sent(data: object) -> object:
    """Numbers as the config had them: a struct constant holds every number as a double
    (protobuf's Struct), and the config's integer fields take integers only."""
    if isinstance(data, float) and data.is_integer():
        return int(data)
    if isinstance(data, dict):
        return {key: _as_sent(value) for key, value in data.items()}
    if isinstance(data, list):
        return [_as_sent(value) for value in data]
    return data


def _with_nulls(data: object) -> object:
    data = _as_sent(data)
    if not isinstance(data, dict) or NULL_FIELDS_KEY not in data:
        return data
    values = {key: value for key, value in data.items() if key != NULL_FIELDS_KEY}
    nulls = data[NULL_FIELDS_KEY]
    if not isinstance(nulls, list) or not all(isinstance(key, str) for key in nulls):
        raise BadInput(f"pipeline input: {NULL_FIELDS_KEY} must list field names")
    return {**values, **dict.fromkeys(nulls)}


def _validated(model: type[BaseModel], data: object, source: str):
    if not isinstance(data, dict):
        raise BadInput(f"pipeline input {source}: expected a mapping, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise BadInput(describe_invalid(err, f"pipeline input {source}")) from None
