"""The convergence spec: everything the training script needs, written by the launcher to
`spec.json` (`ConvergenceSpec.to_json`) and parsed back by every rank (`ConvergenceSpec.parse`).

The settings that shape a trial's trajectory are grouped in `TrainingSettings`; with the trial
itself they are the trial's checkpoint identity (`ConvergenceSpec.identity`), so a checkpoint
written under any other value of them is refused instead of resumed. Paths, run labels and the
checkpoint interval sit outside that group: they do not change the result.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from batchscale.errors import BadInput
from batchscale.location import open_file

# Counts the trainer divides by or takes a step modulo of; the config checks every other range.
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]


class _StrictModel(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True,
                              use_attribute_docstrings=True)


class ProbeSpec(_StrictModel):
    """What makes a trial an adaptive search's probe: it measures the gradient noise scale and
    stops once that is measured (convergence/probe.py), or at its budget, whichever comes
    first, instead of training to the targets."""

    budget_examples: PositiveInt
    """Stop as probed at the first evaluation at or past this many training examples
    (steps x batch size): config `adaptive_probe_budget_examples`."""
    metric: str
    """The primary target's metric, whose progress says where "near the target" begins."""
    value: float
    """The primary target's value."""


class TrialSpec(_StrictModel):
    """One trial: a global batch size trained at one learning rate from one seed."""

    trial_id: str
    """Unique within the spec; names the trial's result files and checkpoints."""
    batch_size: PositiveInt
    """Global batch size in examples (micro-batch x accumulation_steps x workers)."""
    lr_rule: str
    """The rule that chose `lr`: constant, linear, sqrt, or tuned (one LR of lr_candidates)."""
    lr: float
    """Peak learning rate, reached after the warm-up."""
    seed: int
    """Seed of the model initialization and of the data order."""
    prune_at_step: PositiveInt | None = None
    """Stop as pruned at the first evaluation from this step on while a target is still
    unreached (the adaptive search's bound from its fit); None: never. Not part of the
    checkpoint identity: it changes where a trial stops, not its trajectory."""
    probe: ProbeSpec | None = None
    """A probe of the adaptive search, stopped as probed at its budget or once B_simple is
    stable near the primary target; None: trains to the targets. Not part of the checkpoint
    identity, for the reason `prune_at_step` is not (a probe has a trial id of its own)."""


class TwinSpec(_StrictModel):
    """A trial that would repeat another's training exactly: another LR rule giving the same
    learning rate at the same batch size and seed (the rules agree at their reference batch).
    It is not trained; its results are the other trial's, recorded under its own id and rule."""

    trial_id: str
    lr_rule: str
    same_as: str
    """The trained trial whose results it takes."""


class TargetSpec(_StrictModel):
    """A target: the metric (batchscale/metrics.py) and the value that counts as reaching it."""

    metric: str
    """Metric name, a column of the curves table."""
    value: float
    """Reached at or above it (higher-is-better metrics) or at or below it (losses)."""


class TrainingSettings(_StrictModel):
    """What shapes a trial's trajectory: a checkpoint written under other values of any of
    these cannot be resumed."""

    workload: str
    """Registered workload (model) name."""
    workers: PositiveInt
    """Data-parallel processes; the group's world size must equal it."""
    accumulation_steps: PositiveInt
    """Micro-batches accumulated per optimizer step."""
    momentum: float
    """SGD momentum."""
    warmup_steps: int
    """Optimizer steps of linear learning-rate warm-up."""
    # Settings added after checkpoint format 2. Their defaults are what every trial did before
    # they existed, and the identity records a default as None (the value a checkpoint written
    # before them lacks), so such a checkpoint still resumes with the defaults, and only then.
    optimizer: Literal["sgd", "adamw"] = "sgd"
    """sgd (with `momentum`) or adamw (with the adam_* settings)."""
    weight_decay: float = 0.0
    """Weight decay (L2 for sgd, decoupled for adamw)."""
    adam_beta1: float = 0.9
    """AdamW's first-moment decay rate."""
    adam_beta2: float = 0.999
    """AdamW's second-moment decay rate."""
    adam_eps: float = 1e-8
    """AdamW's denominator epsilon."""
    lr_decay: Literal["none", "cosine", "linear"] = "none"
    """LR decay after the warm-up."""
    decay_steps: PositiveInt | None = None
    """Step at which the decay reaches its minimum (set whenever lr_decay is not none)."""
    min_lr_ratio: float = 0.0
    """LR at the end of the decay, as a share of the peak."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Compute precision of the forward pass and loss (bf16: autocast)."""
    targets: list[TargetSpec] | None = None
    """Every target the trial trains to; None: the one `target_val_accuracy` names."""
    train_eval_rows: PositiveInt = 512
    """train_loss is evaluated on the first this-many training rows."""
    gap_epochs: float | None = None
    """Record every metric at the first evaluation at or past this many epochs of training
    rows, training on past the targets to get there (the generalization gap); None: off."""
    target_val_accuracy: float | None
    """The one target val_accuracy >= this value; None when `targets` lists them."""
    max_steps: PositiveInt
    """Step budget; a trial that spends it is not_reached."""
    eval_every_steps: PositiveInt
    """Optimizer steps between validation evaluations."""
    divergence_factor: float
    """A loss above this multiple of the first loss (or non-finite) is diverged."""
    patience_evals: PositiveInt
    """Evaluations without improvement after which a trial stops as not_reached."""
    gns_every_steps: PositiveInt | None
    """Optimizer steps between gradient-noise-scale measurements; None: never measured."""


    def all_targets(self) -> list[TargetSpec]:
        """The targets the trial trains to, the shorthand included."""
        if self.targets:
            return list(self.targets)
        return [TargetSpec(metric="val_accuracy", value=self.target_val_accuracy)]


LATER_SETTINGS = {name: f.default for name, f in TrainingSettings.model_fields.items()
                  if not f.is_required()}
"""The settings added after checkpoint format 2, with the defaults older trials trained with."""


class HalvingSpec(_StrictModel):
    """Successive halving over the learning rates of one (batch size, seed), tuned rule only
    (convergence.lr_halving_eta): where trials stop, not how they train, so outside
    `TrainingSettings` and the checkpoint identity."""

    eta: Annotated[int, Field(ge=2)]
    """The best 1/eta of the learning rates still training continue past each rung."""
    first_rung_steps: PositiveInt
    """The first rung's step; the next ones are eta, eta^2, ... times it."""
    metric: str
    """The metric the rungs rank by (the primary target's)."""


class ConvergenceSpec(_StrictModel):
    """The trials of one launch and where their inputs and outputs live (paths or s3:// URIs)."""

    run_id: str
    """The pipeline run (or CLI run) the trials belong to."""
    config_hash: str
    """Hash of the experiment config, recorded in every result row."""
    experiment: str
    """Experiment name, recorded in every result row."""
    variant: str | None = None
    """The study variant the run is (config `variant`), recorded in every result row."""
    data_dir: str
    """Prepared dataset: a directory or an s3://bucket/prefix."""
    out_dir: str
    """Where each trial writes `trials/<trial_id>.{curves,run}.parquet`."""
    checkpoint_dir: str
    """Where each trial writes `<trial_id>/step-<step>.pt` and `<trial_id>/final.pt`."""
    checkpoint_every_steps: PositiveInt
    """Optimizer steps between checkpoints (at an evaluation step)."""
    loader_workers: NonNegativeInt = 0
    """Background processes reading the workload's training data ahead of the step: how the
    batches are read, not what they are, so outside `TrainingSettings` and the checkpoint
    identity."""
    training: TrainingSettings
    """The settings every trial trains under."""
    trials: list[TrialSpec] = Field(min_length=1)
    """The trials, run one after another."""
    twins: list[TwinSpec] = []
    """Trials not trained because one of `trials` trains the same thing (TwinSpec)."""
    halving: HalvingSpec | None = None
    """Successive halving of the tuned rule's learning rates; None: off."""

    def identity(self, trial: TrialSpec) -> dict[str, object]:
        """What a checkpoint of `trial` must agree on to be resumed: the training settings and
        the trial, as one flat mapping of plain values; a later setting at its default is None
        (see TrainingSettings), as in a checkpoint written before the setting existed."""
        settings = self.training.model_dump(mode="json")
        for name, default in LATER_SETTINGS.items():
            if settings[name] == default:
                settings[name] = None
        return {**settings, **trial.model_dump(mode="json", exclude={"prune_at_step", "probe"})}

    def to_json(self) -> bytes:
        return self.model_dump_json(indent=1).encode()

    @classmethod
    def parse(cls, data: bytes | str, where: str) -> ConvergenceSpec:
        """The spec in `data` (JSON); BadInput naming every bad field and the file `where`."""
        try:
            return cls.model_validate_json(data)
        except ValidationError as err:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or '(top level)'}: {e['msg']}"
                for e in err.errors(include_url=False))
            raise BadInput(f"spec {where} is not a valid convergence spec ({problems}); write "
                           "it again with this version of batchscale") from None


def read_spec(uri: str) -> ConvergenceSpec:
    """The spec from a local path or an S3 URI; BadInput naming a malformed field."""
    location, name = open_file(uri)
    return ConvergenceSpec.parse(location.get_bytes(name), uri)
