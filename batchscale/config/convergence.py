"""The `convergence:` section of the experiment config: training runs to one or more targets
per (batch size, LR rule, seed), their optimizer, schedule, precision, workers and launcher.
Re-exported by `batchscale.config.models` and `batchscale.config`."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from batchscale.config.fields import (
    BatchSize,
    BatchSizes,
    LearningRate,
    NonNegativeInt,
    PositiveInt,
    Seconds,
    Seed,
    _check_location,
    _sorted_unique,
    _Strict,
    quote_value,
)
from batchscale.metrics import METRICS, target_label
from batchscale.schemas import TUNED_RULE

ADAPTIVE_CELL = "adaptive"
"""The batch_sizes of the convergence cell that runs the adaptive search."""
DEFAULT_TARGET_VAL_ACCURACY = 0.95
"""The target when neither `targets` nor `target_val_accuracy` is given."""
ADAMW_LARGE_LR = 0.01
"""A base_lr at or above this with AdamW gets a note: it is SGD's scale, ~10x AdamW's usual."""


class TargetConfig(_Strict):
    """One target of the convergence runs: a metric and the value that counts as reaching it."""

    metric: str
    """A metric the workload evaluates (batchscale/metrics.py): val_accuracy, val_loss,
    val_perplexity, val_miou, val_pixel_accuracy, val_map50 or train_loss; each knows whether
    higher or lower is better (accuracy, mIoU, mAP: reached at or above `value`; losses,
    perplexity: at or below)."""
    value: float = Field(allow_inf_nan=False)
    """The value that counts as reaching the target (a share for accuracies and mIoU, nats per
    example/token/pixel for losses)."""
    primary: bool = False
    """The target the recommendation is made for (at most one); unset on all: the hardest
    target reached at enough batch sizes for a fit."""

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, name: str) -> str:
        if name not in METRICS:
            raise ValueError(f"unknown metric {quote_value(name)}; allowed: "
                             f"{', '.join(METRICS)}")
        return name

    @model_validator(mode="after")
    def _value_in_range(self) -> TargetConfig:
        share = self.metric in ("val_accuracy", "val_miou", "val_pixel_accuracy", "val_map50")
        if share and not 0.0 < self.value <= 1.0:
            raise ValueError(f"value: {self.metric} is a share; a target must lie in (0, 1], "
                             f"got {self.value:g}")
        if self.metric == "val_perplexity" and self.value < 1.0:
            raise ValueError(f"value: perplexity is at least 1; got {self.value:g}")
        if self.metric.endswith("_loss") and self.value <= 0.0:
            raise ValueError(f"value: a loss target must be above 0, got {self.value:g}")
        return self

    @property
    def label(self) -> str:
        return target_label(self.metric, self.value)


class ConvergenceConfig(_Strict):
    """Training runs to a target metric per (batch size, LR rule, seed)."""

    batch_sizes: BatchSizes = [4, 8, 16, 32, 64, 128, 256, 512, 1024]
    """Global batch sizes (micro-batch x accumulation x workers)."""
    lr_rules: Annotated[
        list[Literal["constant", "linear", "sqrt", "tuned"]], Field(min_length=1)
    ] = ["linear", "sqrt"]
    """Learning-rate rules: constant, linear or sqrt scaling from the reference batch size, or
    tuned (every LR of `lr_candidates` at every batch size; S(B) is the per-batch minimum,
    Shallue et al. 2018; called `grid` before, still read with a note). Each applies to either
    optimizer. The usual rule is linear for SGD (Goyal et al. 2017: k times the batch averages
    k times the gradients, so k times the LR keeps the update per example seen) and sqrt for
    AdamW (Malladi et al. 2022, from the SDE of adaptive methods, whose rule also moves the
    betas and eps, which batchscale keeps; Granziol et al. 2022: Adam's largest stable LR grows
    as sqrt(B)); the default runs both whatever the optimizer."""
    lr_candidates: list[LearningRate] = []
    """Learning rates the `tuned` rule tries at every batch size (required with `tuned`), each
    finite and at most 1e6. Called `lr_grid` before (still read, with a note)."""
    lr_halving_eta: int | None = Field(None, ge=2)
    """Successive halving over `lr_candidates` (the tuned rule only): at each rung, the
    learning rates of one (batch size, seed) still training are ranked by the primary target's
    metric at the rung's step (one batch size, so matched examples) and only the best 1/eta
    continue; the others stop as `pruned` (kept in the tables, left out of the fit). None:
    every learning rate trains to the target."""
    lr_halving_first_rung_steps: PositiveInt = 50
    """Step of the first halving rung; the next ones are eta, eta^2, ... times it. A multiple
    of eval_every_steps (the ranking uses an evaluation at the rung)."""
    accumulation_steps: PositiveInt = 1
    """Micro-batches accumulated per optimizer step: global batch = micro-batch x
    accumulation_steps x workers (each batch size must divide evenly)."""
    base_lr: LearningRate = 0.05
    """Peak learning rate at `reference_batch_size`, at most 1e6. The default suits SGD with
    momentum on digits; AdamW usually wants ~1e-3."""
    reference_batch_size: BatchSize = 32
    """Batch size at which `base_lr` applies."""
    optimizer: Literal["sgd", "adamw"] = "sgd"
    """sgd (torch.optim.SGD with `momentum`) or adamw (torch.optim.AdamW with `adam_beta1`,
    `adam_beta2`, `adam_eps`); both take `weight_decay`."""
    momentum: float = Field(0.9, ge=0.0, lt=1.0)
    """SGD momentum (heavy ball, the fraction of the previous update kept); sgd only."""
    weight_decay: float = Field(0.0, ge=0.0, le=1.0)
    """Weight decay coefficient, applied every optimizer step and scaled by the LR: sgd adds
    weight_decay x weights to the gradient (L2; momentum carries it); adamw multiplies the
    weights by 1 - lr x weight_decay, decoupled from the adaptive step (Loshchilov & Hutter
    2019). 0 (the default, for both) turns it off; torch's AdamW default of 0.01 is not used."""
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0)
    """AdamW: decay rate of the gradient's running mean (Adam's momentum); adamw only."""
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0)
    """AdamW: decay rate of the squared gradient's running mean; adamw only."""
    adam_eps: float = Field(1e-8, gt=0.0, le=1.0)
    """AdamW: added to the root of the squared-gradient average before dividing (in gradient
    units); adamw only."""
    warmup_steps: NonNegativeInt = 20
    """Linear learning-rate warm-up from peak/warmup_steps to the peak, optimizer steps."""
    lr_decay: Literal["none", "cosine", "linear"] = "none"
    """After the warm-up: none (constant peak), or a cosine or linear decay from the peak to
    `min_lr_ratio` x peak at step `decay_steps`, constant after it."""
    decay_steps: PositiveInt | None = None
    """Optimizer step (counted from step 0, warm-up included) at which `lr_decay` reaches its
    minimum; must exceed `warmup_steps`. Unset: `max_steps`. A stated horizon, the same for every
    batch size, so a trial that reaches the target early never sees the end of the decay."""
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    """Learning rate at the end of the decay, as a share of the peak."""
    precision: Literal["fp32", "bf16"] = "fp32"
    """Compute precision of the forward pass and loss (training and evaluation): bf16 runs them
    under torch.autocast; parameters, gradients and optimizer state stay fp32 either way."""
    seeds: Annotated[list[Seed], Field(min_length=1)] = [0, 1]
    """Seeds of the model initialization and data order, 0..2**32-1; one trial each."""
    workers: PositiveInt = 1
    """Data-parallel processes per trial (torchrun --nproc-per-node)."""
    scaling_workers: list[PositiveInt] = []
    """Extra worker counts for data-parallel scaling runs, each at every batch size of
    `scaling_batch_sizes` (their trials also appear in the runs table with their worker count)."""
    scaling_batch_sizes: list[BatchSize] = []
    """Global batch sizes of the data-parallel scaling runs; each must be one of `batch_sizes`
    and divisible by every worker count."""
    target_val_accuracy: float | None = Field(None, gt=0.0, le=1.0)
    """Shorthand for one target, val_accuracy >= this value (null: 0.95); used when `targets`
    is empty (give one or the other)."""
    targets: list[TargetConfig] = []
    """Targets every trial trains to, each {metric, value[, primary]} (in YAML: `targets: [{metric:
    val_loss, value: 0.3, primary: true}, {metric: val_accuracy, value: 0.9}]`): a trial records the
    first step, examples and time at which it reaches each one and trains until it has reached
    all of them (or max_steps, divergence, a stall); the runs table has a row per (trial,
    target) and the analysis fits B_crit per target. Empty: the workload's default target
    (`batchscale workloads`: val_accuracy >= `target_val_accuracy` for classifiers; a
    user's batchscale.Workload names its own in `targets`)."""
    train_eval_rows: PositiveInt = 512
    """train_loss is evaluated on the first this-many rows of the training split (fixed for the
    whole run, the same for every batch size), not on the running average of the batches."""
    gap_epochs: float | None = Field(None, gt=0.0, le=1000.0)
    """Generalization gap: every trial also records every metric after exactly this many
    epochs of training data (the first evaluation at or past gap_epochs x training rows),
    training on past its targets to get there, so the report compares batch sizes at equal data
    seen. null: off."""
    max_steps: PositiveInt = 3000
    """Step budget per trial; a trial that spends it is `not_reached`."""
    eval_every_steps: PositiveInt = 10
    """Evaluate on the validation split every this many steps (excluded from train time). A
    target is counted at the first evaluation that meets it, so keep this a small share of the
    fewest steps a batch size needs: the B_crit interval's note says where it is over a fifth."""
    patience_evals: PositiveInt = 50
    """Stop a trial as `not_reached` when no metric of a target it has not reached improved for
    this many evaluations in a row (a collapsed network never recovers; its step budget is better
    spent elsewhere); its `stop_reason` says so, with the best value so far."""
    divergence_factor: float = Field(10.0, gt=1.0)
    """A loss above this multiple of the first loss (or non-finite) marks the trial diverged."""
    gns_every_steps: PositiveInt | None = 10
    """Update the gradient-noise-scale estimate every this many steps. A measured step costs
    more (on one process it splits the batch in two; under DDP it all-reduces by hand): about
    300 µs per measured step on the digits MLP, so every step cost ~30 % of samples/s at its
    0.7 ms step and every 10th ~4-11 %, while at a 23 ms step no cost was measurable
    (benchmarks/bench_convergence.py). null: never measured, so the loss always sees whole
    batches (a loss that pairs examples within its batch, a model with a fixed batch shape);
    the analysis then has no B_simple."""
    checkpoint_every_steps: PositiveInt = 200
    """Write an atomic checkpoint every this many steps (resume after a restart)."""
    loader_workers: NonNegativeInt = 0
    """Background processes that read and collate the workload's training data (its
    `batchscale.Workload`'s train_data; a built-in's prepared rows) a few steps ahead of
    training, so a slow __getitem__ (decoding, augmentation) overlaps the step instead of adding
    to it. Each item's random draws are then seeded from (seed, step, its place in the global
    batch; once per micro-batch for a dataset read through __getitems__): the batches are the
    same for any worker count and after a resume. 0: items are read in the training process,
    with its random state."""
    checkpoint_uri: str | None = None
    """Where trial checkpoints go: s3://bucket/prefix (keys from the environment, never in the
    URI), or a relative directory inside the trial's work directory (absolute paths and '..'
    are refused, so a config cannot write outside its run); unset: next to the trial results."""
    max_restarts: NonNegativeInt = 2
    """Times torchrun restarts the whole group after a worker dies (trials resume from their
    last checkpoint)."""
    launcher: Literal["torchrun", "kubeflow"] = "torchrun"
    """torchrun locally; a Kubeflow Trainer TrainJob on Kubernetes."""
    trainjob_runtime: str = "torch-distributed"
    """launcher kubeflow: the (Cluster)TrainingRuntime the TrainJob runs on."""
    trainjob_namespace: str | None = None
    """launcher kubeflow: namespace of the TrainJob; unset: the pipeline pod's own namespace."""
    timeout_s: Seconds = 1800.0
    """Wall-clock limit of one batch size's trials, seconds (finite, at most a year; a local
    task that trains several batch sizes gets this much for each). With the
    kubeflow launcher it is the TrainJob's own deadline, counted from its creation (scheduling
    and image pull included)."""

    strategy: Literal["grid", "adaptive"] = "grid"
    """grid: train every batch size x LR rule x seed. adaptive: probe trials at small batch
    sizes measure the gradient noise scale, which predicts B_crit; batch sizes (of
    `batch_sizes`) are placed around the prediction, then the (batch size, seed) that most
    narrows the B_crit interval of the first LR rule and target is added until the interval's
    high/low is at most `target_interval_ratio` or `adaptive_budget_examples` is spent
    (docs/architecture.md, "Adaptive search"). Scaling runs are not part of the search."""
    adaptive_probe_batch_sizes: list[BatchSize] = []
    """Batch sizes of the adaptive search's probe trials (trained to the target like any other,
    with the noise scale measured, unless `adaptive_probe_budget_examples` stops them earlier);
    empty: the two smallest of `batch_sizes`."""
    adaptive_probe_budget_examples: PositiveInt | None = None
    """Training examples (steps x batch size) each probe trial of the adaptive search may use:
    a probe stops (status `probed`) at its first evaluation at or past the budget, or earlier
    once its gradient noise scale B_simple is stable near the primary target (its last 3
    evaluations past 75 % of the way there within a factor 1.5 of each other), whichever comes
    first. Such probes only measure the noise scale that predicts B_crit: they have trial ids
    of their own (ending in -probe), stay out of the fit (their examples and device-seconds
    still count), and a cell placed at a probe's batch size trains anew to the target. None:
    probes train to the target and count in the fit as any cell."""
    adaptive_first_points: int = Field(4, ge=2, le=16)
    """Batch sizes the adaptive search places around the predicted B_crit before refining."""
    target_interval_ratio: float = Field(2.0, gt=1.0, allow_inf_nan=False)
    """The adaptive search stops when its objective's interval (`adaptive_objective`) has
    high/low at most this."""
    adaptive_objective: Literal["b_crit", "b_star"] = "b_crit"
    """What the adaptive search narrows: b_crit (the critical batch), or b_star (the batch
    fastest to the target, B* = sqrt(B_crit x alpha/beta) from S(B) and the step-time line
    t = alpha + beta B of its own trials; the answer when a recommendation, not B_crit, is
    wanted). B*'s interval combines B_crit's (through that square root) with how well the step
    times pin alpha/beta; it stays open until three batch sizes are timed."""
    adaptive_budget_examples: PositiveInt | None = None
    """Training examples (steps x batch size, summed over trials) after which the adaptive
    search stops even if its interval is wider: examples, not seconds, because they cost the
    same on any machine and compare directly with a grid's. None: no budget."""
    adaptive_budget_device_s: Seconds | None = None
    """Device-seconds the adaptive search may hold, probes included, after which it stops even
    if its interval is wider: each cell's launch wall time (process start-up, data loading,
    evaluation and training) times its workers, what an accelerator is held for. None: no
    budget."""
    adaptive_max_cells: PositiveInt = 24
    """Most (batch size, seed) cells the adaptive search runs, probes included."""
    adaptive_futile_chance: float | None = Field(0.10, gt=0.0, lt=1.0, allow_inf_nan=False)
    """The adaptive search (objective b_crit) stops early, saying the grid cannot pin B_crit
    either, when fewer than this share of grids (every batch size x every seed) simulated from
    its trials so far would give a 90 % interval at most `target_interval_ratio` wide (the
    scatter drawn from its own uncertainty, the interval the grid would report:
    adaptive/futility.py). On simulated searches 0.10 stopped 164 of 200 at 45 % seed noise
    (where no grid pinned B_crit), at a median 0.12 of the grid's examples, and 32 of 1,348
    where a grid on the same truth did pin it (13 at 20 % noise, where a grid pins it 65 % of
    the time; 19 at 30 %, where it pins it 1 time in 8) (bench_adaptive_calibration). None:
    never stop for that."""
    adaptive_prune_factor: float | None = Field(3.0, gt=1.0, allow_inf_nan=False)
    """The adaptive search stops a new cell's trials as `pruned` (kept in the tables, left out
    of the fit) when they have not reached the target after this many times the steps its
    current fit allows at their batch size at the B_crit interval's far end,
    S_min x (1 + B_crit_high / B): hopelessly behind. Only with an interval (no bound before
    it). None: never prune."""

    @field_validator("batch_sizes")
    @classmethod
    def _distinct(cls, values: list[int]) -> list[int]:
        return _sorted_unique(values)

    @field_validator("checkpoint_uri")
    @classmethod
    def _inside_the_run(cls, uri: str | None) -> str | None:
        if uri is None:
            return uri
        _check_location(uri, "S3 URI")
        if uri.startswith("s3://"):
            return uri
        path = PurePosixPath(uri)
        if path.is_absolute() or ".." in path.parts or not path.parts:
            raise ValueError(f"{quote_value(uri)} would leave the run directory; use a relative "
                             "directory without '..', or s3://bucket/prefix")
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
        if TUNED_RULE in self.lr_rules and not self.lr_candidates:
            raise ValueError("lr_candidates: the tuned rule needs at least one learning rate")
        if self.lr_halving_eta is not None:
            if TUNED_RULE not in self.lr_rules:
                raise ValueError("lr_halving_eta: successive halving is over lr_candidates; add "
                                 "tuned to lr_rules or leave lr_halving_eta unset")
            if self.lr_halving_first_rung_steps % self.eval_every_steps:
                raise ValueError(f"lr_halving_first_rung_steps: "
                                 f"{self.lr_halving_first_rung_steps} is not a multiple of "
                                 f"eval_every_steps {self.eval_every_steps}")
        horizon = self.decay_steps or self.max_steps
        if self.lr_decay != "none" and horizon <= self.warmup_steps:
            field = "decay_steps" if self.decay_steps else "max_steps"
            unset = "" if self.decay_steps else " (decay_steps is unset, so max_steps)"
            raise ValueError(f"{field}: the {self.lr_decay} decay would end at step {horizon}"
                             f"{unset}, within the {self.warmup_steps} warmup_steps; set "
                             "decay_steps above warmup_steps")
        for b in self.adaptive_probe_batch_sizes:
            if b not in self.batch_sizes:
                raise ValueError(f"adaptive_probe_batch_sizes: {b} is not one of batch_sizes")
        if self.strategy == "adaptive" and len(self.batch_sizes) < 3:
            raise ValueError("strategy: adaptive needs at least 3 batch_sizes to choose from")
        if self.targets and self.target_val_accuracy is not None:
            raise ValueError("target_val_accuracy is shorthand for one val_accuracy target; "
                             "with `targets` set, list that target there instead")
        if sum(t.primary for t in self.targets) > 1:
            raise ValueError("targets: at most one target can be primary")
        seen = [(t.metric, t.value) for t in self.targets]
        if len(set(seen)) != len(seen):
            raise ValueError("targets: the same metric and value are listed twice")
        cells = [(b, self.workers) for b in self.batch_sizes] + [
            (b, w) for w in self.scaling_workers for b in self.scaling_batch_sizes]
        for b, w in cells:
            if b % (w * self.accumulation_steps):
                raise ValueError(f"batch_sizes: {b} is not divisible by {w} workers x "
                                 f"{self.accumulation_steps} accumulation_steps")
        return self

    def lr_text(self) -> str:
        """Where the trials' learning rates come from, in words for a progress line."""
        ruled = [rule for rule in self.lr_rules if rule != "tuned"]
        parts = []
        if ruled:
            parts.append(f"LR rules {', '.join(ruled)} from base_lr {self.base_lr:g} at batch "
                         f"{self.reference_batch_size}")
        if len(ruled) < len(self.lr_rules):
            parts.append("tuned over LRs " + ", ".join(f"{lr:g}" for lr in self.lr_candidates))
        return "; ".join(parts)

    def lr_note(self) -> str | None:
        """A note when base_lr is SGD's scale while the optimizer is AdamW: such a run stalls
        or diverges at every batch size, and the cause is easy to miss."""
        if (self.optimizer != "adamw" or self.base_lr < ADAMW_LARGE_LR
                or self.lr_rules == ["tuned"]):
            return None
        return (f"convergence.base_lr {self.base_lr:g} with adamw: {self.base_lr:g} is an SGD "
                f"learning rate (the default suits SGD with momentum); AdamW usually wants "
                f"about 1e-3 (--base-lr, or convergence.base_lr in the config)")

    def resolved_targets(self) -> list[TargetConfig]:
        """The targets the trials train to: `targets`, or the one `target_val_accuracy`
        stands for."""
        shorthand = self.target_val_accuracy or DEFAULT_TARGET_VAL_ACCURACY
        return list(self.targets) or [TargetConfig(metric="val_accuracy", value=shorthand)]

    def fan_out(self, one_batch_size_per_cell: bool = True) -> list[dict]:
        """The convergence cells, each {"batch_sizes": "16,64", "workers": "2"}: the sweep over
        batch sizes with `workers`, then the scaling runs. One batch size per cell gives each
        its own task (a pod on a cluster); otherwise a worker count's batch sizes share one
        task and one torchrun process group, which saves a process start-up per batch size
        locally (docs/architecture.md). With the adaptive strategy, one cell ("adaptive") runs
        the search, which launches its own trials (TrainJobs on a cluster with the kubeflow
        launcher). Strings: KFP types every field of a loop item by its first field, and its
        driver reads resource fields as strings."""
        pairs = [(b, w) for w in self.scaling_workers for b in self.scaling_batch_sizes
                 if w != self.workers]
        if self.strategy == "adaptive":  # one cell runs the search: it chooses the batch sizes
            search = [{"batch_sizes": ADAPTIVE_CELL, "workers": str(self.workers)}]
            return search + ConvergenceConfig.fan_out(
                self.model_copy(update={"strategy": "grid", "batch_sizes": []}),
                one_batch_size_per_cell)
        pairs = [(b, self.workers) for b in self.batch_sizes] + pairs
        if one_batch_size_per_cell:
            return [{"batch_sizes": str(b), "workers": str(w)} for b, w in pairs]
        grouped: dict[int, list[int]] = {}
        for b, w in pairs:
            grouped.setdefault(w, []).append(b)
        return [{"batch_sizes": ",".join(map(str, sizes)), "workers": str(w)}
                for w, sizes in grouped.items()]
