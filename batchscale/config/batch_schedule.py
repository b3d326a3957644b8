"""The `batch_schedule:` section: the critical batch measured over training, and the batch-size
schedule it suggests, checked by training it (`batchscale batch-schedule`,
docs/batch-schedule.md). Training settings (optimizer, LR rule, base LR and its batch, warm-up,
target, precision) come from the `convergence:` section."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from batchscale.config.fields import BatchSize, PositiveInt, Seed, _Strict
from batchscale.schemas import TUNED_RULE

MIN_BRANCH_BATCHES = 3
"""A checkpoint's S(B) fit needs three batch sizes: B0 and at least two branch factors."""


class BatchScheduleConfig(_Strict):
    """The critical batch over training and a batch-size schedule (`batchscale batch-schedule`)."""

    enabled: bool = False
    """Also run the measurement as a stage of the pipeline (`batchscale run`, `compile`), on
    the accelerator after the dataset is checked: its two tables go to the report (a section,
    and the answer card when the checked schedule needs fewer steps) and to the lake.
    `batchscale batch-schedule` runs it on its own whatever this says."""
    base_batch_size: BatchSize = 8
    """B0, in examples: the reference run's batch size and the schedule's first batch."""
    branch_factors: Annotated[list[PositiveInt], Field(min_length=2, max_length=8)] = [2, 4, 8, 16]
    """From every checkpoint, branches train at B0 and at B0 x each factor (2 to 8 factors,
    each above 1, ascending); with B0 they are the batch sizes of that checkpoint's S(B) fit."""
    checkpoint_steps: Annotated[list[PositiveInt], Field(min_length=1, max_length=16)] = [
        40, 120, 250, 400]
    """Steps of the reference run (at B0) at which branches start, ascending. The reference run
    trains past the last one to the target or to `max_steps`."""
    milestone_steps: PositiveInt = 40
    """A checkpoint's milestone: the validation loss the reference run reaches this many steps
    after the checkpoint. Each branch trains from the checkpoint until it reaches that loss;
    its steps to it, per batch size, are the checkpoint's S(B). A milestone not clearly below
    the checkpoint's loss (within the reference's own scatter between evaluations) is not
    branched."""
    branch_step_factor: float = Field(3.0, gt=1.0, le=100.0)
    """A branch that has not reached its milestone after this many times `milestone_steps`
    stops as not reached (it then drops out of its checkpoint's fit)."""
    branch_eval_every_steps: PositiveInt = 5
    """Steps between a branch's validation-loss evaluations; the step the milestone is crossed
    is interpolated linearly between two evaluations."""
    eval_every_steps: PositiveInt = 25
    """Steps between the validation evaluations of the reference run and the check's runs."""
    val_rows: PositiveInt = 256
    """Validation examples (the split's first rows) behind every evaluation."""
    max_steps: PositiveInt = 3000
    """Optimizer steps after which the reference run and each run of the check stop, target
    reached or not."""
    check_seeds: Annotated[list[Seed], Field(min_length=1, max_length=16)] = [0, 1, 2]
    """Seeds of the check: from each, the scheduled run and the constant-B0 run train to the
    convergence target (the first seed's constant run is the reference run itself)."""

    @field_validator("branch_factors")
    @classmethod
    def _factors_above_one(cls, factors: list[int]) -> list[int]:
        if any(f < 2 for f in factors) or factors != sorted(set(factors)):
            raise ValueError(f"branch factors must be distinct, ascending and above 1, got "
                             f"{factors}")
        return factors

    @field_validator("checkpoint_steps")
    @classmethod
    def _ascending(cls, steps: list[int]) -> list[int]:
        if steps != sorted(set(steps)):
            raise ValueError(f"checkpoint steps must be distinct and ascending, got {steps}")
        return steps

    @model_validator(mode="after")
    def _room_for_the_last_milestone(self) -> BatchScheduleConfig:
        last = self.checkpoint_steps[-1] + self.milestone_steps
        if last > self.max_steps:
            raise ValueError(
                f"the last of batch_schedule.checkpoint_steps ({self.checkpoint_steps[-1]}) plus "
                f"batch_schedule.milestone_steps ({self.milestone_steps}) is step {last}, past "
                f"batch_schedule.max_steps {self.max_steps}")
        return self

    @property
    def branch_batch_sizes(self) -> list[int]:
        """B0 and B0 x each branch factor."""
        return [self.base_batch_size] + [self.base_batch_size * f for f in self.branch_factors]


def schedule_refusal(convergence) -> str | None:
    """Why the batch schedule cannot train with these convergence settings (None: it can): the
    batch grows during a run, so the LR must follow a rule, and a decay over a fixed step count
    would end elsewhere once the schedule changes the count."""
    if not [rule for rule in convergence.lr_rules if rule != TUNED_RULE]:
        return ("batch_schedule: the batch grows during a run, so its LR must follow a rule; "
                "convergence.lr_rules has only tuned (allowed: constant, linear, sqrt)")
    if convergence.lr_decay != "none":
        return (f"batch_schedule: convergence.lr_decay {convergence.lr_decay!r} decays over a "
                "fixed step count that a schedule changes; use lr_decay: none")
    return None
