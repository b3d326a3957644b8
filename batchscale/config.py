"""The experiment config: one pydantic model per pipeline stage, loaded from YAML.

Every field is documented and carries its unit in the name. Unknown keys, wrong types and
out-of-range values are refused with a message naming the field (exit status 2).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from batchscale.errors import BadInput

DEFAULT_CONFIG_PATH = Path(__file__).parent / "configs" / "default.yaml"

PositiveInt = Annotated[StrictInt, Field(gt=0)]
BatchSizes = Annotated[list[PositiveInt], Field(min_length=1)]


def known_datasets() -> tuple[str, ...]:
    from batchscale.components.data_prep.datasets import DATASET_NAMES

    return DATASET_NAMES




class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _sorted_unique(values: list[int]) -> list[int]:
    if len(set(values)) != len(values):
        raise ValueError(f"batch sizes must be distinct, got {values}")
    return sorted(values)


class DataPrepConfig(_Strict):
    """Which dataset to turn into Parquet shards, and how to split it."""

    name: str = "digits"
    """Named dataset; see `batchscale datasets` for the allowed names."""
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """Share of rows held out for validation (deterministic split from `split_seed`)."""
    split_seed: StrictInt = 0
    """Seed of the train/validation split."""
    rows_per_shard: PositiveInt = 4096
    """Rows per Parquet shard (one row group each)."""
    synthetic_train_rows: PositiveInt = 20000
    """Training rows generated for synthetic datasets."""
    synthetic_noise: float = Field(0.1, ge=0.0, le=1.0)
    """Label noise of synthetic datasets: the probability that a label is replaced at random."""

    @field_validator("name")
    @classmethod
    def _known_dataset(cls, name: str) -> str:
        allowed = known_datasets()
        if name not in allowed:
            raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(allowed)}")
        return name


class SweepConfig(_Strict):
    """Throughput sweep: samples/s per batch size."""

    batch_sizes: BatchSizes = [1, 4, 16, 64, 256, 1024]
    """Batch sizes to time (per device)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device to measure on; auto picks CUDA when present."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Compute precision (bf16 via autocast)."""
    input_modes: list[Literal["synthetic", "real"]] = ["synthetic", "real"]
    """synthetic: tensors already on the device (pure compute); real: batches from the Parquet
    dataset through the project's loader."""
    warmup_steps: PositiveInt = 5
    """Steps run before timing starts (allocator, caches, autotuning)."""
    min_timed_steps: PositiveInt = 20
    """Timed steps taken at least."""
    max_timed_steps: PositiveInt = 400
    """Timed steps taken at most."""
    target_cv: float = Field(0.05, gt=0.0)
    """Stop timing once the step-time coefficient of variation falls below this."""
    time_budget_s: float = Field(3.0, gt=0.0)
    """Timing budget per batch size and input mode, seconds."""

    @field_validator("batch_sizes")
    @classmethod
    def _distinct(cls, values: list[int]) -> list[int]:
        return _sorted_unique(values)


class ConvergenceConfig(_Strict):
    """Training runs to a target metric per (batch size, LR rule, seed)."""

    batch_sizes: BatchSizes = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    """Global batch sizes (micro-batch x accumulation x workers)."""
    lr_rules: Annotated[list[Literal["constant", "linear", "sqrt"]], Field(min_length=1)] = [
        "linear",
        "sqrt",
    ]
    """Learning-rate scaling rules from the reference batch size."""
    base_lr: float = Field(0.05, gt=0.0)
    """Learning rate at `reference_batch_size` (SGD with momentum)."""
    reference_batch_size: PositiveInt = 32
    """Batch size at which `base_lr` applies."""
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    """SGD momentum."""
    warmup_steps: StrictInt = Field(20, ge=0)
    """Linear learning-rate warm-up, optimizer steps."""
    seeds: Annotated[list[StrictInt], Field(min_length=1)] = [0, 1]
    """Seeds of the model initialization and data order; one trial each."""
    workers: PositiveInt = 1
    """Data-parallel processes per trial (torchrun --nproc-per-node)."""
    scaling_workers: list[PositiveInt] = []
    """Extra worker counts for data-parallel scaling runs, each at every batch size of
    `scaling_batch_sizes` (their trials also appear in the runs table with their worker count)."""
    scaling_batch_sizes: list[PositiveInt] = []
    """Global batch sizes of the data-parallel scaling runs; each must be one of `batch_sizes`
    and divisible by every worker count."""
    target_val_accuracy: float = Field(0.95, gt=0.0, le=1.0)
    """Validation accuracy that counts as reaching the target."""
    max_steps: PositiveInt = 3000
    """Step budget per trial; a trial that spends it is `not_reached`."""
    eval_every_steps: PositiveInt = 10
    """Evaluate on the validation split every this many steps (excluded from train time)."""
    patience_evals: PositiveInt = 50
    """Stop a trial as `not_reached` when validation accuracy has not improved for this many
    evaluations (a collapsed network never recovers; its step budget is better spent elsewhere)."""
    divergence_factor: float = Field(10.0, gt=1.0)
    """A loss above this multiple of the first loss (or non-finite) marks the trial diverged."""
    gns_every_steps: PositiveInt = 1
    """Update the gradient-noise-scale estimate every this many steps."""
    checkpoint_every_steps: PositiveInt = 200
    """Write an atomic checkpoint every this many steps (resume after a restart)."""
    launcher: Literal["torchrun", "kubeflow"] = "torchrun"
    """torchrun locally; a Kubeflow Trainer TrainJob on Kubernetes."""
    timeout_s: float = Field(1800.0, gt=0.0)
    """Wall-clock limit of one batch size's trials."""

    @field_validator("batch_sizes")
    @classmethod
    def _distinct(cls, values: list[int]) -> list[int]:
        return _sorted_unique(values)


    @model_validator(mode="after")
    def _scaling_runs_fit(self) -> ConvergenceConfig:
        for b in self.scaling_batch_sizes:
            if b not in self.batch_sizes:
                raise ValueError(f"scaling_batch_sizes: {b} is not one of batch_sizes")
            for w in self.scaling_workers:
                if b % w:
                    raise ValueError(f"scaling_batch_sizes: {b} is not divisible by {w} workers")
        if bool(self.scaling_workers) != bool(self.scaling_batch_sizes):
            raise ValueError("scaling_workers and scaling_batch_sizes must be given together")
        return self

    def fan_out(self) -> list[dict]:
        """(batch size, workers) of every convergence task: the sweep over batch sizes with
        `workers`, then the scaling runs."""
        cells = [{"batch_size": b, "workers": self.workers} for b in self.batch_sizes]
        cells += [{"batch_size": b, "workers": w}
                  for w in self.scaling_workers for b in self.scaling_batch_sizes
                  if w != self.workers]
        return cells


class AnalysisConfig(_Strict):
    """Fits and recommendation."""

    saturation_tolerance: float = Field(0.10, gt=0.0, lt=1.0)
    """A batch is saturated when its throughput is within this share of the best."""
    bootstrap_samples: PositiveInt = 200
    """Bootstrap resamples over seeds for the B_crit interval."""


class PublishConfig(_Strict):
    """Results lake and regression check."""

    history_runs: PositiveInt = 10
    """Trailing runs compared against for regressions."""
    fail_on_regression: bool = False
    """Fail the publish step when a throughput regression is flagged."""


class ExperimentConfig(_Strict):
    """A whole batchscale experiment: one pipeline run."""

    name: str = "digits-default"
    """Name of the experiment, recorded in every row."""
    workload: str = "digits-mlp"
    """Named workload (model + input + loss); see `batchscale workloads`."""
    dataset: DataPrepConfig = DataPrepConfig()
    sweep: SweepConfig = SweepConfig()
    convergence: ConvergenceConfig = ConvergenceConfig()
    analysis: AnalysisConfig = AnalysisConfig()
    publish: PublishConfig = PublishConfig()

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, name: str) -> str:
        from batchscale.workloads import WORKLOAD_NAMES, is_known_workload_name

        if not is_known_workload_name(name):
            raise ValueError(
                f"unknown workload {name!r}; allowed: {', '.join(WORKLOAD_NAMES)} "
                "or 'package.module:factory'"
            )
        return name

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]


def _describe(err: ValidationError, source: str) -> str:
    lines = [f"invalid config {source}:"]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        lines.append(f"  {field}: {msg} (got {e.get('input')!r})")
    return "\n".join(lines)


def parse_config(data: object, source: str = "<dict>") -> ExperimentConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise BadInput(f"invalid config {source}: expected a mapping at top level")
    try:
        return ExperimentConfig.model_validate(data)
    except ValidationError as err:
        raise BadInput(_describe(err, source)) from None


def load_config(path: str | Path | None = None) -> ExperimentConfig:
    path = Path(path) if path else DEFAULT_CONFIG_PATH
    try:
        text = path.read_text()
    except OSError as err:
        raise BadInput(f"cannot read config {path}: {err.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise BadInput(f"config {path} is not valid YAML: {err}") from None
    return parse_config(data, str(path))


def config_from_json(text: str) -> ExperimentConfig:
    return parse_config(json.loads(text), "<pipeline parameter>")


def reference_markdown() -> str:
    """The config reference (README "Config reference"), generated from the models' docs."""
    sections = [("(top level)", ExperimentConfig)] + [
        (name, field.annotation) for name, field in ExperimentConfig.model_fields.items()
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
    ]
    lines = []
    for title, model in sections:
        lines += [f"### `{title}` — {model.__doc__.strip().splitlines()[0]}", "",
                  "| key | default | meaning |", "|---|---|---|"]
        for name, field in model.model_fields.items():
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
                continue
            desc = " ".join((field.description or "").split())
            lines.append(f"| `{name}` | `{json.dumps(field.default)}` | {desc} |")
        lines.append("")
    return "\n".join(lines)
