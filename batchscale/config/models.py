"""The experiment config's models: one pydantic model per pipeline stage, strict, with a docstring
per field and the unit in its name. Every default is defined here once; the rest of the code
reads it from the models. Reading files and describing refusals is `loading.py`.

The `convergence:` section is `convergence.py`, the `kubernetes:` section `kubernetes.py`; the
limits, constrained types and the strict base they share are `fields.py`. Most of this module is
the fields' docstrings, which are also the generated config reference and the CLI's help texts.
"""

from __future__ import annotations

import difflib
import hashlib
import json
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from batchscale import names
from batchscale.catalog import DATASET_NAMES, DATASET_TASKS, SOURCE_DATASETS
from batchscale.config.batch_schedule import BatchScheduleConfig, schedule_refusal
from batchscale.config.convergence import (  # noqa: F401  re-exported
    DEFAULT_TARGET_VAL_ACCURACY,
    ConvergenceConfig,
    TargetConfig,
)
from batchscale.config.fields import (  # noqa: F401  re-exported: import from batchscale.config
    _BATCH_SIZES,
    _MEMORY_SIZE_TEXT,
    _URI_SCHEME,
    DEFAULT_CONFIG_PATH,
    INT64_MAX,
    MAX_BATCH_SIZE,
    MAX_BOOTSTRAP_SAMPLES,
    MAX_K8S_ENTRIES,
    MAX_LEARNING_RATE,
    MAX_SECONDS,
    MAX_SEED,
    MAX_SYNTHETIC_ROWS,
    MAX_TEXT_CHARS,
    MEMORY_SIZE_FORMS,
    BatchSize,
    BatchSizes,
    LearningRate,
    MemorySize,
    NonNegativeInt,
    PositiveInt,
    Seconds,
    Seed,
    _check_location,
    _checked,
    _memory_size,
    _sorted_unique,
    _Strict,
    quote_value,
)
from batchscale.config.kubernetes import (  # noqa: F401  re-exported
    S3_CREDENTIAL_ENV,
    KubernetesConfig,
    NodeSelector,
    TolerationConfig,
    Tolerations,
)
from batchscale.config.study import StudyConfig
from batchscale.metrics import TASK_DEFAULT_TARGETS
from batchscale.workloads import (
    DEFAULT_IMAGE_SIZE,
    WORKLOAD_NAMES,
    is_known_workload_name,
    refused_module,
    workload_kind,
    workload_metrics,
)


class DataPrepConfig(_Strict):
    """Which dataset to turn into Parquet shards, and how to split it."""

    name: str = "digits"
    """Named dataset; see `batchscale datasets` for the allowed names."""
    val_fraction: float = Field(0.2, gt=0.0, lt=1.0)
    """Share of rows held out for validation (deterministic split from `split_seed`). Data prep
    refuses a split that leaves either side fewer rows than the dataset has classes (one per
    class on average), or fewer than 2."""
    split_seed: Seed = 0
    """Seed of the train/validation split (and of the teacher-student task and `max_rows`),
    0..2**32-1."""
    rows_per_shard: PositiveInt = 4096
    """Rows per Parquet shard; row groups inside hold about 32 MiB of features."""
    synthetic_train_rows: Annotated[PositiveInt, Field(le=MAX_SYNTHETIC_ROWS)] = 20000
    """Training rows generated for synthetic datasets (validation rows are added on top so
    that `val_fraction` holds); with them at most 10,000,000 rows in all (held in memory)."""
    synthetic_noise: float = Field(0.1, ge=0.0, le=1.0)
    """Label noise of synthetic datasets: the probability that a label is replaced at random."""
    source_uri: str | None = Field(None, validate_default=True)
    """Where the files of cifar10, mnist, fashion-mnist or parquet are: a local directory (for
    parquet also one file) or s3://bucket/prefix (a valid bucket name, no credentials in the
    URI), read with the store's credentials
    (BATCHSCALE_S3_ENDPOINT, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY). torchvision layout:
    cifar-10-batches-py/, MNIST/raw/, FashionMNIST/raw/ (idx files raw or .gz)."""
    feature_column: str = "features"
    """parquet: the column of examples, a list of numbers or encoded image bytes (PNG/JPEG)."""
    label_column: str = "label"
    """parquet: the integer class column, values 0..classes-1."""
    feature_shape: list[PositiveInt] | None = None
    """parquet with numeric lists: the shape of one example, e.g. [1, 28, 28]; default flat."""
    sequence_length_tokens: Annotated[PositiveInt, Field(le=512)] = 64
    """python-docs, text: bytes per sequence, the sample of a language model (batch sizes
    count sequences; tokens per batch = batch x this), at most 512 (the models' positions)."""
    text_column: str | None = None
    """text: the string column of Parquet source files; unset: the source is .txt files."""
    shapes_image_size_px: Annotated[PositiveInt, Field(ge=16, le=1024)] = 32
    """shapes: side of the generated square images, pixels (16..1024); rows come from
    `synthetic_train_rows`."""
    max_rows: PositiveInt | None = None
    """Keep at most this many rows, a random subset drawn with `split_seed` before the split;
    null keeps every row. Enough must remain for the split (see `val_fraction`)."""
    train_fraction: float = Field(1.0, gt=0.0, le=1.0)
    """Keep this share of the training rows, a subset drawn with `split_seed` after the split
    (the validation rows stay the same, so variants compare on one validation set): a
    study's dataset-size axis (`dataset_fraction`)."""
    train_label_noise: float = Field(0.0, ge=0.0, le=1.0)
    """Classification datasets: replace this share of the training labels with a random class
    (drawn with `split_seed`; validation labels stay clean, so one target compares across noise
    levels): a study's data-complexity axis (`label_noise`)."""

    @field_validator("name")
    @classmethod
    def _known_dataset(cls, name: str) -> str:
        allowed = DATASET_NAMES
        if name not in allowed:
            raise ValueError(f"unknown dataset {quote_value(name)}; allowed: {', '.join(allowed)}")
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
        if uri:
            _check_location(uri, "S3 URI")
        return uri

    @model_validator(mode="after")
    def _label_noise_needs_labels(self) -> DataPrepConfig:
        if self.train_label_noise and "classification" not in DATASET_TASKS[self.name]:
            raise ValueError(f"train_label_noise: dataset {self.name!r} has no class labels; "
                             "it applies to classification datasets")
        return self

    @model_validator(mode="after")
    def _synthetic_rows_fit(self) -> DataPrepConfig:
        # The same count as data/datasets.py's teacher_student_rows (train + val on top).
        train = self.synthetic_train_rows
        rows = train + round(train * self.val_fraction / (1.0 - self.val_fraction))
        if self.name == "teacher-student" and rows > MAX_SYNTHETIC_ROWS:
            raise ValueError(f"synthetic_train_rows: {train} training rows with val_fraction "
                             f"{self.val_fraction} make {rows} rows; at most "
                             f"{MAX_SYNTHETIC_ROWS} are generated (they are held in memory)")
        return self


class SweepConfig(_Strict):
    """Throughput sweep: samples/s per batch size."""

    batch_sizes: BatchSizes | Literal["auto"] = [1, 4, 16, 64, 256, 1024]
    """Batch sizes to time (per device; each at most 2**31), or "auto": double from 1 until a
    batch does not fit in memory (or `max_batch_size` is reached), then bisect for the largest
    batch that fits."""
    max_batch_size: BatchSize = 65536
    """Upper bound of the "auto" search, samples per step (at most 2**31)."""
    search_tolerance: float = Field(0.05, gt=0.0, lt=1.0)
    """The "auto" search stops bisecting once the gap between the largest fitting and the
    smallest failing batch is at most this share of the former."""
    memory_limit_bytes: MemorySize | None = None
    """Memory budget of a trial: bytes, or a size with a unit such as 512MB or 2GiB (KB, MB, GB:
    powers of 1000; KiB, MiB, GiB: powers of 1024; at most 2**63-1 bytes), stored as bytes.
    CPU: a trial process whose resident memory exceeds (1 - memory_safety_margin) of it is
    stopped and recorded as oom (default: the memory available when the sweep starts). CUDA:
    the allocator is capped at that share of it (default: the device's total memory)."""
    memory_safety_margin: float = Field(0.1, ge=0.0, lt=1.0)
    """Share of the memory budget kept free, so a batch found to fit does not run out of memory
    later (fragmentation, a slightly larger input)."""
    image_size_px: PositiveInt = DEFAULT_IMAGE_SIZE
    """Side of the square input images of torchvision workloads, pixels (vit_b_16: a multiple
    of 16)."""
    sequence_length_tokens: Annotated[PositiveInt, Field(le=512)] = 64
    """Language models: bytes per sequence (the sample) of the sweep's batches; real input needs
    the dataset's `sequence_length_tokens` to match."""
    channels_last: bool = False
    """Convert the model and image inputs to the channels_last memory format."""
    torch_compile: bool = False
    """Wrap the model in torch.compile (compilation happens in the untimed steps)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Device to measure on; auto picks CUDA when present."""
    threads: Annotated[PositiveInt, Field(le=1024)] | None = None
    """torch intra-op threads of each trial (torch.set_num_threads; the rows' `threads`).
    null: torch's default, one per usable CPU (or OMP_NUM_THREADS). On a shared virtual
    machine, steps of a few milliseconds or less on two or more threads swing with whether the
    other virtual CPUs are running: on our 2-core machine digits-mlp's rows scattered 10-22 %
    between sweeps on 2 threads in 6 of 8 (batch size, run) pairs over two runs, and 0.6-2.8 %
    on 1 in 7 of 8 (docs/sweep.md).
    1 measures one CPU, not the machine, but repeatably: for runs whose point is to compare."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Compute precision (bf16 via autocast)."""
    input_modes: list[Literal["synthetic", "real"]] = ["synthetic", "real"]
    """synthetic: tensors already on the device (pure compute); real: batches from the Parquet
    dataset through the project's loader."""
    untimed_steps: PositiveInt = 5
    """Steps run before timing starts (allocator, caches, autotuning); not the learning-rate
    warm-up, which is convergence.warmup_steps. Called `warmup_steps` before: that key is still
    read, with a note, until the next release."""
    min_timed_steps: PositiveInt = 20
    """Timed steps taken at least."""
    max_timed_steps: PositiveInt = 2000
    """Timed steps taken at most (with sub-millisecond steps, the timing window's length: long
    enough that a burst of load from other processes cannot move the median)."""
    target_cv: float = Field(0.05, gt=0.0)
    """Stop timing once the step-time coefficient of variation falls below this."""
    time_budget_s: Seconds = 3.0
    """Timing budget per batch size and input mode, seconds (finite, at most a year)."""
    rounds: Annotated[PositiveInt, Field(le=10)] = 2
    """Measurement rounds; each visits the batch sizes in a different order (ascending, then
    descending, ...) so drift and bursts of load hit every batch size alike. A row's figures
    combine its rounds (median)."""
    between_sweep_cv: float = Field(0.02, ge=0.0, lt=1.0)
    """How far whole sweeps of the same row drift apart (a coefficient of variation of samples/s
    between sweeps minutes or hours apart), which one sweep's rounds, seconds apart, cannot
    show; each row's rerun interval adds it to its rounds' disagreement. 0.02 is the median
    over 30 rows of quiet one-thread sweeps on our 2-core CPU host (docs/sweep.md); set it from
    your own repeated sweeps or the lake's next-run interval, 0 for the rounds alone."""
    max_round_spread: float = Field(0.15, gt=0.0)
    """A row whose rounds' median step times differ by more than this share of their median is
    re-measured, then flagged unstable."""
    max_cv: float = Field(0.5, gt=0.0)
    """A row whose step-time coefficient of variation exceeds this is re-measured, then flagged
    unstable. Judged without the steps a full garbage collection ran in, where the clock can
    tell them (CPU): those pauses come with the training loop (docs/sweep.md)."""
    max_retries: Annotated[NonNegativeInt, Field(le=10)] = 2
    """Re-measurements of a disagreeing or scattered row before it is kept as unstable."""
    idle_wait_s: Annotated[float, Field(ge=0.0, le=3600.0)] = 0.0
    """Before each pass of re-measurements, wait up to this long for the sweep's CPUs to be
    idle (other processes busy under 25 % of their time over a second): a neighbour that has
    gone by then leaves the re-measurement undisturbed. Re-measures anyway when the wait ends.
    0 (an ad-hoc run: the answer now) turns the wait off; a recurring run (`batchscale
    schedule`) waits at least 120 s, since no one waits for it."""
    overload_cpu_share: float | None = Field(1.0, gt=0.0)
    """A row is also unstable when most of its trials ran while other processes' load (the
    load average less the trial's own CPUs) reached this share of the usable CPUs: steady but
    slow steps that agree across rounds. null turns this check off."""
    max_cpu_wait_share: float | None = Field(0.1, gt=0.0, lt=1.0)
    """A row is also unstable when, in most of its trials, the trial's threads spent at least
    this share of their runnable time waiting for a CPU (the kernel's run-queue delay; Linux
    only): the trial's own view of a busy neighbour, which the load average sees late. null
    turns this check off."""
    max_unstable_share: float = Field(0.25, ge=0.0, le=1.0)
    """The sweep's validation fails when more than this share of timed rows are unstable (and
    warns below it)."""
    unstable_fails: bool = False
    """Whether more than max_unstable_share unstable rows fail the sweep's validation (exit 3,
    the run stops). false: it passes with a "MEASUREMENT DISTURBED" warning, the analysis
    leaves the unstable rows out (a recommendation made from flagged cells says NOT TRUSTED)
    and the regression check leaves the run unjudged: a busy laptop still gets an answer, and a
    busy node pages no one (recurring runs, `batchscale schedule`, always use false). true: for
    a run whose figures must not be published from a disturbed machine."""

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


class AnalysisConfig(_Strict):
    """Fits and recommendation."""

    saturation_tolerance: float = Field(0.10, gt=0.0, lt=1.0)
    """A batch is saturated when its throughput is within this share of the best."""
    bootstrap_samples: Annotated[PositiveInt, Field(le=MAX_BOOTSTRAP_SAMPLES)] = 200
    """Bootstrap resamples over seeds for the B_crit interval (at most 100,000)."""
    b_crit_range_factor: float = Field(2.0, ge=1.0)
    """B_crit is reported as a number only inside the measured batch range widened by this
    factor on each side; outside it, as a bound ("above 1,024")."""
    b_crit_read_level: float | None = Field(None, gt=0.5, lt=1.0)
    """Nominal level at which the B_crit interval is read, so that it holds the truth 90 % of
    the time. null: 0.90 for a grid of trials, 0.98 for trials an adaptive search chose (it
    stops once its interval is narrow: on simulated searches an interval read at 0.90 then held
    the truth 79-88.5 % of the time, read at 0.98 95-98.5 %; docs/benchmarks.md,
    bench_adaptive_calibration)."""
    step_time_disagreement_factor: float = Field(2.0, gt=1.0)
    """Flag a cell whose step time measured in the convergence runs lies outside the sweep's by
    more than this factor: above its real-input time (a trial reads its data in the step, as
    real input does; the device's time where real input was not timed), or below the device's
    own time (synthetic input)."""
    max_cpu_wait_share: float | None = Field(0.1, gt=0.0, lt=1.0)
    """Flag a cell's time to target, and the worker recommendation, when its convergence
    trials' threads waited for a CPU at least this share of their runnable time (a busy machine;
    Linux only). null turns the check off."""
    current_batch_size: PositiveInt | None = None
    """The batch size you train with today: the recommendation then quotes the expected saving
    in steps and time to target against it (where that batch size was measured). null: not
    given."""
    current_lr: float | None = Field(None, gt=0.0)
    """The learning rate you train with today: the recommendation then says how the learning
    rate it gives compares with it. null: not given."""


class PublishConfig(_Strict):
    """Results lake and regression check."""

    history_runs: PositiveInt = 10
    """Trailing runs compared against for regressions: per (workload, device, precision, input
    mode, batch), the median and MAD of the last this-many complete runs in the lake."""
    fail_on_regression: bool = False
    """Fail the run (the regression-gate step, after publish; exit 4 locally) when a throughput
    regression is confirmed (two runs in a row below the baseline; a suspected one never
    fails); the run's tables are published either way."""



class ExperimentIdentity(_Strict):
    """What every row records of its experiment: its name, workload and variant."""

    name: str = "digits-default"
    """Name of the experiment, recorded in every row: letters, digits, '.', '_' or '-' (at most
    128, starting with a letter or digit, no '..')."""
    workload: str = "digits-mlp"
    """Named workload (model + input + loss); see `batchscale workloads`."""
    variant: str | None = None
    """Set by a study on each of its variants' configs: the variant's name, recorded in every
    row (the `variant` column, and `study_id` from the run id). null: a single run."""

    @field_validator("name")
    @classmethod
    def _safe_name(cls, name: str) -> str:
        return _checked(names.check_name, name, "experiment name")

    @field_validator("variant")
    @classmethod
    def _safe_variant(cls, name: str | None) -> str | None:
        return None if name is None else _checked(names.check_name, name, "variant name")

    @field_validator("workload")
    @classmethod
    def _known_workload(cls, name: str) -> str:
        if not is_known_workload_name(name):
            close = difflib.get_close_matches(name, WORKLOAD_NAMES, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"unknown workload {quote_value(name)}{hint}; allowed: "
                f"{', '.join(WORKLOAD_NAMES)} or 'package.module:factory'"
            )
        refused = refused_module(name) if name not in WORKLOAD_NAMES else None
        if refused:  # every command, `compile` included, which imports nothing of it
            raise ValueError(f"workload {quote_value(name)}: {refused}")
        return name


class ExperimentConfig(ExperimentIdentity):
    """A whole batchscale experiment: one pipeline run."""

    dataset: DataPrepConfig = DataPrepConfig()
    sweep: SweepConfig = SweepConfig()
    convergence: ConvergenceConfig = ConvergenceConfig()
    analysis: AnalysisConfig = AnalysisConfig()
    publish: PublishConfig = PublishConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    study: StudyConfig = StudyConfig()
    batch_schedule: BatchScheduleConfig = BatchScheduleConfig()

    @model_validator(mode="before")
    @classmethod
    def _workload_default_targets(cls, data):
        """A built-in workload that does not measure val_accuracy gets its own default target
        (metrics.TASK_DEFAULT_TARGETS) when the config names none but the built-in
        `target_val_accuracy` default; a user's batchscale.Workload gets its `targets` when
        its module is imported (contract_check.with_workload_targets)."""
        if not isinstance(data, dict):
            return data
        workload = data.get("workload", cls.model_fields["workload"].default)
        conv = data.get("convergence", {})
        if (not isinstance(workload, str) or workload not in WORKLOAD_NAMES
                or not isinstance(conv, dict) or conv.get("targets")
                or conv.get("target_val_accuracy") not in (None, DEFAULT_TARGET_VAL_ACCURACY)):
            return data
        metric, value = TASK_DEFAULT_TARGETS[workload_kind(workload)]
        if metric == "val_accuracy":
            return data
        return {**data, "convergence": {**conv, "target_val_accuracy": None,
                                        "targets": [{"metric": metric, "value": value}]}}

    @model_validator(mode="after")
    def _dataset_suits_the_workload(self) -> ExperimentConfig:
        kind, tasks = workload_kind(self.workload), DATASET_TASKS[self.dataset.name]
        if kind not in tasks:
            fitting = [n for n, t in DATASET_TASKS.items() if kind in t]
            raise ValueError(f"dataset {self.dataset.name!r} is for {' or '.join(tasks)}; "
                             f"{self.workload} is {kind.replace('_', ' ')}: use "
                             f"{', '.join(fitting)}")
        return self

    @model_validator(mode="after")
    def _targets_the_workload_measures(self) -> ExperimentConfig:
        measured = workload_metrics(self.workload)
        for target in self.convergence.resolved_targets():
            if target.metric not in measured:
                raise ValueError(f"convergence.targets: {self.workload} does not measure "
                                 f"{target.metric}; its metrics: {', '.join(measured)}")
        return self

    @model_validator(mode="after")
    def _schedule_can_run(self) -> ExperimentConfig:
        """A pipeline with the batch-schedule stage would otherwise refuse these only after
        its data prep."""
        if not self.batch_schedule.enabled:
            return self
        refusal = schedule_refusal(self.convergence)
        if refusal:
            raise ValueError(refusal)
        return self

    @model_validator(mode="after")
    def _variants_are_valid(self) -> ExperimentConfig:
        """Every variant of a study is checked as a whole experiment when the config loads."""
        from batchscale.config.variants import expand
        from batchscale.errors import BadInput

        if self.study.is_study and self.variant is not None:
            raise ValueError("study: a study's variant cannot itself be a study")
        try:
            expand(self)
        except BadInput as err:
            raise ValueError(str(err)) from None
        return self

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), sort_keys=True)

    def to_compact_json(self) -> str:
        """Only what differs from the defaults: the same config when read back (and the same
        `config_hash`), in a tenth of the bytes; a study's compiled pipeline carries one per
        task of every variant."""
        return json.dumps(self.model_dump(mode="json", exclude_defaults=True), sort_keys=True)

    @property
    def config_hash(self) -> str:
        return hashlib.sha256(self.to_json().encode()).hexdigest()[:16]



def section_models() -> dict[str, type[BaseModel]]:
    """The config's sections by key: {"dataset": DataPrepConfig, "sweep": SweepConfig, ...}."""
    return {name: field.annotation for name, field in ExperimentConfig.model_fields.items()
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)}


def reference_markdown() -> str:
    """The config reference (docs/config.md), generated from the models' docs."""
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
