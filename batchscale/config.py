"""The experiment config: one pydantic model per pipeline stage, loaded from YAML.

Every field is documented and carries its unit in the name. Unknown keys, wrong types and
out-of-range values are refused with a message naming the field (exit status 2). Every default
is defined here once; the rest of the code reads it from the models.

One concern, hence over ~400 lines: most of the module is the models' field docstrings, which
are also the generated config reference and the CLI's help texts.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

import yaml
from pydantic import (
    BaseModel,
    ByteSize,
    ConfigDict,
    Field,
    StrictInt,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    field_validator,
    model_validator,
)

from batchscale.catalog import DATASET_NAMES, SOURCE_DATASETS
from batchscale.errors import BadInput
from batchscale.workloads import DEFAULT_IMAGE_SIZE, WORKLOAD_NAMES, is_known_workload_name

DEFAULT_CONFIG_PATH = Path(__file__).parent / "configs" / "default.yaml"

PositiveInt = Annotated[StrictInt, Field(gt=0)]
BatchSizes = Annotated[list[PositiveInt], Field(min_length=1)]
_BATCH_SIZES = TypeAdapter(BatchSizes)
MEMORY_SIZE_FORMS = ("a positive number of bytes, or a size with a unit such as 512MB or 2GiB "
                     "(KB, MB, GB, TB: powers of 1000; KiB, MiB, GiB, TiB: powers of 1024)")


def _memory_size(value: object, handler: ValidatorFunctionWrapHandler) -> int:
    """pydantic's ByteSize, kept strict: no bools or floats (a fraction of a byte is a typo),
    more than 0 bytes, stored as a plain int."""
    try:
        size = None if isinstance(value, bool | float) else handler(value)
    except ValidationError:
        size = None
    if size is None or size <= 0:
        raise ValueError(f"expected {MEMORY_SIZE_FORMS}")
    return int(size)


MemorySize = Annotated[ByteSize, WrapValidator(_memory_size)]


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
    """Seed of the train/validation split (and of the teacher-student task and `max_rows`)."""
    rows_per_shard: PositiveInt = 4096
    """Rows per Parquet shard; row groups inside hold about 32 MiB of features."""
    synthetic_train_rows: PositiveInt = 20000
    """Training rows generated for synthetic datasets (validation rows are added on top so
    that `val_fraction` holds)."""
    synthetic_noise: float = Field(0.1, ge=0.0, le=1.0)
    """Label noise of synthetic datasets: the probability that a label is replaced at random."""
    source_uri: str | None = Field(None, validate_default=True)
    """Where the files of cifar10, mnist, fashion-mnist or parquet are: a local directory (for
    parquet also one file) or s3://bucket/prefix, read with the store's credentials
    (BATCHSCALE_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY). torchvision layout:
    cifar-10-batches-py/, MNIST/raw/, FashionMNIST/raw/ (idx files raw or .gz)."""
    feature_column: str = "features"
    """parquet: the column of examples, a list of numbers or encoded image bytes (PNG/JPEG)."""
    label_column: str = "label"
    """parquet: the integer class column, values 0..classes-1."""
    feature_shape: list[PositiveInt] | None = None
    """parquet with numeric lists: the shape of one example, e.g. [1, 28, 28]; default flat."""
    max_rows: PositiveInt | None = None
    """Keep at most this many rows, a random subset drawn with `split_seed` before the split;
    null keeps every row."""

    @field_validator("name")
    @classmethod
    def _known_dataset(cls, name: str) -> str:
        allowed = DATASET_NAMES
        if name not in allowed:
            raise ValueError(f"unknown dataset {name!r}; allowed: {', '.join(allowed)}")
        return name

    @field_validator("source_uri")
    @classmethod
    def _source_matches_dataset(cls, uri: str | None, info: ValidationInfo) -> str | None:
        name = info.data.get("name")  # absent when the name itself was refused
        needs_source = name in SOURCE_DATASETS
        if needs_source and not uri:
            raise ValueError(f"dataset {name!r} is read from files; set source_uri to a local "
                             "directory or s3://bucket/prefix")
        if name is not None and not needs_source and uri:
            raise ValueError(f"dataset {name!r} is built in and reads no files; source_uri "
                             f"applies to {', '.join(SOURCE_DATASETS)}")
        return uri


class SweepConfig(_Strict):
    """Throughput sweep: samples/s per batch size."""

    batch_sizes: BatchSizes | Literal["auto"] = [1, 4, 16, 64, 256, 1024]
    """Batch sizes to time (per device), or "auto": double from 1 until a batch does not fit in
    memory (or `max_batch_size` is reached), then bisect for the largest batch that fits."""
    max_batch_size: PositiveInt = 65536
    """Upper bound of the "auto" search, samples per step."""
    search_tolerance: float = Field(0.05, gt=0.0, lt=1.0)
    """The "auto" search stops bisecting once the gap between the largest fitting and the
    smallest failing batch is at most this share of the former."""
    memory_limit_bytes: MemorySize | None = None
    """Memory budget of a trial: bytes, or a size with a unit such as 512MB or 2GiB (KB, MB, GB:
    powers of 1000; KiB, MiB, GiB: powers of 1024), stored as bytes. CPU: a trial process whose
    resident memory exceeds (1 - memory_safety_margin) of it is stopped and recorded as oom
    (default: the memory available when the sweep starts). CUDA: the allocator is capped at that
    share of it (default: the device's total memory)."""
    memory_safety_margin: float = Field(0.1, ge=0.0, lt=1.0)
    """Share of the memory budget kept free, so a batch found to fit does not run out of memory
    later (fragmentation, a slightly larger input)."""
    image_size_px: PositiveInt = DEFAULT_IMAGE_SIZE
    """Side of the square input images of torchvision workloads, pixels (vit_b_16: a multiple
    of 16)."""
    channels_last: bool = False
    """Convert the model and image inputs to the channels_last memory format."""
    torch_compile: bool = False
    """Wrap the model in torch.compile (compilation happens in the warm-up steps, untimed)."""
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
    max_timed_steps: PositiveInt = 2000
    """Timed steps taken at most (with sub-millisecond steps, the timing window's length: long
    enough that a burst of load from other processes cannot move the median)."""
    target_cv: float = Field(0.05, gt=0.0)
    """Stop timing once the step-time coefficient of variation falls below this."""
    time_budget_s: float = Field(3.0, gt=0.0)
    """Timing budget per batch size and input mode, seconds."""

    @field_validator("batch_sizes", mode="plain")
    @classmethod
    def _auto_or_distinct(cls, values: object) -> list[int] | str:
        """Plain mode keeps error locations like `sweep.batch_sizes.1` (a union would add its
        member's name to them)."""
        if values == "auto":
            return values
        if isinstance(values, str):
            raise ValueError('expected a list of positive integers or "auto"')
        return _sorted_unique(_BATCH_SIZES.validate_python(values))


class ConvergenceConfig(_Strict):
    """Training runs to a target metric per (batch size, LR rule, seed)."""

    batch_sizes: BatchSizes = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    """Global batch sizes (micro-batch x accumulation x workers)."""
    lr_rules: Annotated[
        list[Literal["constant", "linear", "sqrt", "grid"]], Field(min_length=1)
    ] = ["linear", "sqrt"]
    """Learning-rate rules: constant, linear or sqrt scaling from the reference batch size, or
    grid (every LR of `lr_grid` at every batch size; S(B) is the per-batch minimum, Shallue et
    al. 2018)."""
    lr_grid: list[Annotated[float, Field(gt=0.0)]] = []
    """Learning rates the `grid` rule tries at every batch size (required with `grid`)."""
    accumulation_steps: PositiveInt = 1
    """Micro-batches accumulated per optimizer step: global batch = micro-batch x
    accumulation_steps x workers (each batch size must divide evenly)."""
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
    gns_every_steps: PositiveInt = 10
    """Update the gradient-noise-scale estimate every this many steps. A measured step costs
    more (on one process it splits the batch in two; under DDP it all-reduces by hand): every
    step cost ~30 % of samples/s on the digits MLP, every 10th ~5-9 %
    (benchmarks/bench_convergence.py)."""
    checkpoint_every_steps: PositiveInt = 200
    """Write an atomic checkpoint every this many steps (resume after a restart)."""
    checkpoint_uri: str | None = None
    """Where trial checkpoints go: s3://bucket/prefix (keys from the environment), or a relative
    directory inside the trial's work directory (absolute paths and '..' are refused, so a
    config cannot write outside its run); unset: next to the trial results."""
    max_restarts: StrictInt = Field(2, ge=0)
    """Times torchrun restarts the whole group after a worker dies (trials resume from their
    last checkpoint)."""
    launcher: Literal["torchrun", "kubeflow"] = "torchrun"
    """torchrun locally; a Kubeflow Trainer TrainJob on Kubernetes."""
    trainjob_runtime: str = "torch-distributed"
    """launcher kubeflow: the (Cluster)TrainingRuntime the TrainJob runs on."""
    trainjob_namespace: str | None = None
    """launcher kubeflow: namespace of the TrainJob; unset: the pipeline pod's own namespace."""
    timeout_s: float = Field(1800.0, gt=0.0)
    """Wall-clock limit of one batch size's trials."""

    @field_validator("batch_sizes")
    @classmethod
    def _distinct(cls, values: list[int]) -> list[int]:
        return _sorted_unique(values)

    @field_validator("checkpoint_uri")
    @classmethod
    def _inside_the_run(cls, uri: str | None) -> str | None:
        if uri is None or uri.startswith("s3://"):
            return uri
        path = PurePosixPath(uri)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise ValueError(f"{uri!r} would leave the run directory; use a relative directory "
                             "without '..', or s3://bucket/prefix")
        return uri

    @model_validator(mode="after")
    def _scaling_runs_fit(self) -> ConvergenceConfig:
        for b in self.scaling_batch_sizes:
            if b not in self.batch_sizes:
                raise ValueError(f"scaling_batch_sizes: {b} is not one of batch_sizes")
            for w in self.scaling_workers:
                if b % w:
                    raise ValueError(f"scaling_batch_sizes: {b} is not divisible by {w} workers")
        if bool(self.scaling_workers) != bool(self.scaling_batch_sizes):
            raise ValueError("scaling_workers: must be given together with scaling_batch_sizes")
        if "grid" in self.lr_rules and not self.lr_grid:
            raise ValueError("lr_grid: the grid rule needs at least one learning rate")
        cells = [(b, self.workers) for b in self.batch_sizes] + [
            (b, w) for w in self.scaling_workers for b in self.scaling_batch_sizes]
        for b, w in cells:
            if b % (w * self.accumulation_steps):
                raise ValueError(f"batch_sizes: {b} is not divisible by {w} workers x "
                                 f"{self.accumulation_steps} accumulation_steps")
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
    """Trailing runs compared against for regressions: per (workload, device, precision, input
    mode, batch), the median and MAD of the last this-many complete runs in the lake."""
    fail_on_regression: bool = False
    """Fail the run (the regression-gate step, after publish; exit 4 locally) when a throughput
    regression is flagged; the run's tables are published either way."""


S3_CREDENTIAL_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


class TolerationConfig(_Strict):
    """One Kubernetes toleration of a node taint."""

    key: str = ""
    """Taint key; empty (with operator Exists) tolerates every taint."""
    operator: Literal["Equal", "Exists"] = "Equal"
    """Equal matches `value`; Exists matches any value of `key`."""
    value: str = ""
    """Taint value (operator Equal only)."""
    effect: Literal["", "NoSchedule", "PreferNoSchedule", "NoExecute"] = ""
    """Taint effect tolerated; empty tolerates every effect."""

    @model_validator(mode="after")
    def _consistent(self) -> TolerationConfig:
        if self.operator == "Exists" and self.value:
            raise ValueError("value must be empty when operator is Exists")
        if not self.key and self.operator != "Exists":
            raise ValueError("an empty key needs operator Exists")
        return self


class KubernetesConfig(_Strict):
    """Cluster settings of the compiled pipeline (compile, submit, schedule); kfp.local ignores
    them."""

    gpu_resource: str = "nvidia.com/gpu"
    """Extended resource the GPU stages request (throughput_sweep; convergence with the
    torchrun launcher; a kubeflow-launched convergence asks for GPUs in its TrainJob instead)."""
    gpus_per_worker: StrictInt = Field(1, ge=0)
    """GPUs per process: the sweep requests this many, a torchrun convergence task this many per
    worker of the largest worker count; 0 requests none and runs those stages on CPU."""
    gpu_node_selector: dict[str, str] = {}
    """Node labels the GPU stages must match, e.g.
    {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}."""
    gpu_tolerations: list[TolerationConfig] = []
    """Taints of the GPU node pool that the GPU stages tolerate."""
    node_selector: dict[str, str] = {}
    """Node labels every stage must match."""
    tolerations: list[TolerationConfig] = []
    """Taints every stage tolerates."""
    stage_timeout_s: PositiveInt = 7200
    """Pod deadline (activeDeadlineSeconds, image pull included) of every stage but convergence."""
    convergence_timeout_margin_s: PositiveInt = 900
    """A convergence pod's deadline is `convergence.timeout_s` plus this, so the stage's own
    timeout fires first and reports which trial ran over."""
    s3_endpoint_url: str = "http://seaweedfs.kubeflow:8333"
    """S3 endpoint of the results lake (default: the KFP deployment's SeaweedFS)."""
    s3_bucket: str = Field("mlpipeline", min_length=3)
    """Bucket of the results lake."""
    s3_prefix: str = "batchscale"
    """Key prefix of the results lake inside the bucket."""
    s3_secret_name: str = "mlpipeline-minio-artifact"
    """Kubernetes Secret, in the run's namespace, holding the S3 credentials."""
    s3_secret_env: dict[str, str] = {"accesskey": "AWS_ACCESS_KEY_ID",
                                     "secretkey": "AWS_SECRET_ACCESS_KEY"}
    """Key of `s3_secret_name` -> environment variable it fills (both AWS variables)."""
    service_account: str = ""
    """Kubernetes service account of the run's pods (with the kubeflow launcher it needs the
    RBAC in manifests/rbac-trainjob.yaml); empty: the KFP default, pipeline-runner."""

    @field_validator("s3_endpoint_url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"must start with http:// or https://, got {url!r}")
        return url

    @field_validator("s3_secret_env")
    @classmethod
    def _both_credentials(cls, mapping: dict[str, str]) -> dict[str, str]:
        if sorted(mapping.values()) != sorted(S3_CREDENTIAL_ENV):
            raise ValueError(f"must map one Secret key to each of {', '.join(S3_CREDENTIAL_ENV)}")
        return mapping


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
    kubernetes: KubernetesConfig = KubernetesConfig()

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, name: str) -> str:
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


_UNION_TAG = re.compile(r"[a-z_-]+\[.*\]")  # pydantic's union-branch labels, e.g. literal['auto']


def _describe(err: ValidationError, source: str) -> str:
    """One line per bad field, `section.field: problem (got value)`. Union branches (a batch
    list or 'auto') are folded into their field, the most specific error winning."""
    entries: dict[str, list[str]] = {}
    for e in err.errors():
        loc = [str(p) for p in e["loc"] if not _UNION_TAG.fullmatch(str(p))]
        field = ".".join(loc) or "(top level)"
        msg = e["msg"].removeprefix("Value error, ")
        # Model-level checks say "field: problem"; report them as section.field like the rest.
        named = re.match(r"^([a-z_]+): (.*)", msg, re.S)
        if named and e["loc"]:
            field, msg = f"{field}.{named[1]}", named[2]
        if e["type"] == "extra_forbidden":
            msg = "unknown key"
        entries.setdefault(field, []).append(f"{msg} (got {e.get('input')!r})")
    fields = [f for f in entries if not any(o.startswith(f + ".") for o in entries)]
    return "\n".join([f"invalid config {source}:"]
                     + [f"  {f}: {' or '.join(entries[f])}" for f in fields])


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


def with_overrides(cfg: ExperimentConfig, overrides: dict, source: str) -> ExperimentConfig:
    """`cfg` with some values replaced, validated as a config file is (errors name the field).
    `overrides` maps a top-level key to its value, or a section to {field: value}."""
    if not overrides:
        return cfg
    data = cfg.model_dump(mode="json")
    sections = section_models()
    for key, value in overrides.items():
        data[key] = {**data[key], **value} if key in sections else value
    return parse_config(data, source)


def section_models() -> dict[str, type[BaseModel]]:
    """The config's sections by key: {"dataset": DataPrepConfig, "sweep": SweepConfig, ...}."""
    return {name: field.annotation for name, field in ExperimentConfig.model_fields.items()
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)}


def reference_markdown() -> str:
    """The config reference (README "Config reference"), generated from the models' docs."""
    sections = section_models()
    lines = []
    for title, model in [("(top level)", ExperimentConfig), *sections.items()]:
        lines += [f"### `{title}` — {model.__doc__.strip().splitlines()[0]}", "",
                  "| key | default | meaning |", "|---|---|---|"]
        for name, field in model.model_fields.items():
            if title == "(top level)" and name in sections:
                continue
            desc = " ".join((field.description or "").split())
            lines.append(f"| `{name}` | `{json.dumps(field.default)}` | {desc} |")
        lines.append("")
    return "\n".join(lines)
