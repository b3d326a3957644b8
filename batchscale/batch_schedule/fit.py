"""From the branches to a schedule: B_crit(t) per checkpoint (the S(B) fit and interval of
`analysis.critical`), the step warm-up of the batch it suggests, and its predicted saving. What
the tables then say (B_simple against B_crit, the check) is `batch_schedule/section.py`."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from batchscale.analysis.critical import (
    bootstrap_critical_batch,
    fit_critical_batch,
    interval_note,
)
from batchscale.batch_schedule.measure import Stage
from batchscale.schemas import RunStatus


@dataclass(frozen=True)
class CheckpointFit:
    """B_crit at one checkpoint of the reference run, from its branches."""

    checkpoint_step: int
    examples: int
    val_loss: float
    milestone_loss: float
    b_crit: float
    b_crit_low: float
    b_crit_high: float
    bound: str
    """"above"/"below" `bound_batch` where the branches support only a bound; "" otherwise."""
    bound_batch: float
    reason: str
    s_min: float
    e_min: float
    b_simple: float
    """The gradient noise scale of the reference run at the checkpoint (its EMA)."""
    batches_reached: int
    interval_note: str = ""
    """Where the interval leaves the branch batches (cut at the range the fit allows, or
    extrapolated) and what it rests on (`analysis.critical.interval_note`); "" without one."""

    def as_row(self) -> dict:
        return asdict(self)

    def table_row(self) -> dict:
        """Its B_crit columns as the critical_over_training table names them."""
        return {"b_crit": self.b_crit, "b_crit_low": self.b_crit_low,
                "b_crit_high": self.b_crit_high, "b_crit_bound": self.bound,
                "b_crit_bound_batch": self.bound_batch, "b_crit_reason": self.reason}


def fit_checkpoint(step: int, rows: list[dict], curve_row: dict, rule: str, samples: int,
                   range_factor: float) -> CheckpointFit:
    """The S(B) fit of one checkpoint's branches (one run per batch: Fieller's interval)."""
    batch = np.array([r["batch_size"] for r in rows], dtype=float)
    steps = np.array([r["steps_to_milestone"] if r["reached"] else math.nan for r in rows],
                     dtype=float)
    fit = fit_critical_batch(batch, steps, range_factor=range_factor)
    runs = pd.DataFrame({"lr_rule": rule, "batch_size": batch.astype(int),
                         "lr": [r["lr"] for r in rows], "seed": 0, "steps_to_target": steps,
                         "status": [RunStatus.REACHED if r["reached"] else RunStatus.NOT_REACHED
                                    for r in rows]})
    low, high = bootstrap_critical_batch(runs, rule, samples, range_factor=range_factor)
    note = (interval_note(runs, rule, (low, high), range_factor=range_factor)
            if math.isfinite(fit.b_crit) else "")
    b_simple = curve_row.get("b_simple")
    return CheckpointFit(
        checkpoint_step=step, examples=int(curve_row["examples"]),
        val_loss=float(curve_row["val_loss"]), milestone_loss=float(rows[0]["milestone_loss"]),
        b_crit=fit.b_crit, b_crit_low=low, b_crit_high=high, bound=fit.bound,
        bound_batch=fit.bound_batch, reason=fit.reason, s_min=fit.s_min, e_min=fit.e_min,
        b_simple=math.nan if b_simple is None else float(b_simple),
        batches_reached=int(np.isfinite(steps).sum()), interval_note=note)


MILESTONE_DROP_Z = 1.2816
"""A milestone must lie below its checkpoint's loss by more than this many standard errors of
a difference of two evaluations (sqrt(2)·scatter; one-sided 90 %): a smaller drop could be the
curve's own noise, and branches "reaching" it would time that noise, not the batch's speed."""


def branchable(loss: float, milestone_loss: float, scatter: float) -> bool:
    """Whether the milestone lies clearly below the checkpoint's loss (`scatter`: the
    reference's scatter between evaluations there, measure.loss_scatter; NaN: unknown, so any
    fall counts)."""
    noise = MILESTONE_DROP_Z * math.sqrt(2) * scatter if math.isfinite(scatter) else 0.0
    return loss - milestone_loss > noise


def unbranched(step: int, curve_row: dict, milestone_loss: float,
               milestone_steps: int, scatter: float = math.nan) -> CheckpointFit:
    """A checkpoint whose milestone (the reference's loss `milestone_steps` later) is not
    clearly below its own loss (`branchable`): a branch would "reach" it at once or by
    noise, so none runs, and it says why."""
    loss = float(curve_row["val_loss"])
    span = (f"from step {step} ({loss:.4g}) to step {step + milestone_steps} "
            f"({milestone_loss:.4g})")
    why = (f"did not fall {span}, so there is no milestone below the checkpoint to branch to"
           if milestone_loss >= loss else
           f"fell only {loss - milestone_loss:.2g} {span}, within its own scatter between "
           f"evaluations there (σ ≈ {scatter:.2g}), so branches would time noise")
    reason = (f"the reference run's val_loss {why}; choose batch_schedule.checkpoint_steps "
              "where the loss still falls, or a longer batch_schedule.milestone_steps")
    b_simple = curve_row.get("b_simple")
    return CheckpointFit(
        checkpoint_step=step, examples=int(curve_row["examples"]), val_loss=loss,
        milestone_loss=milestone_loss, b_crit=math.nan, b_crit_low=math.nan,
        b_crit_high=math.nan, bound="", bound_batch=math.nan, reason=reason, s_min=math.nan,
        e_min=math.nan, b_simple=math.nan if b_simple is None else float(b_simple),
        batches_reached=0)


# ----------------------------------------------------------------------------- the schedule


def plan_schedule(fits: list[CheckpointFit], base_batch: int,
                  batch_sizes: list[int]) -> list[Stage]:
    """A step warm-up of the batch: from each checkpoint on, the largest measured batch not
    above that checkpoint's B_crit (so the batch doubles once B_crit passes twice the batch;
    where B_crit is only bounded above the largest batch, that bound), never smaller than
    before; a checkpoint with B_crit below its batches or without a fit changes nothing. A
    stage starts where the validation loss reaches the reference's loss at that checkpoint.
    At B = B_crit a run takes twice the fewest steps and twice the fewest examples (McCandlish
    et al.'s balance point); past it, examples buy few steps."""
    stages, current = [], base_batch
    for fit in sorted(fits, key=lambda f: f.checkpoint_step):
        usable = fit.b_crit if math.isfinite(fit.b_crit) else (
            fit.bound_batch if fit.bound == "above" else math.nan)
        if not math.isfinite(usable):
            continue
        choice = max((b for b in batch_sizes if b <= usable), default=base_batch)
        if choice > current:
            stages.append(Stage(from_loss=fit.val_loss, batch_size=choice))
            current = choice
    return stages


def step_ratio(b_crit: float, batch: int, base_batch: int) -> float:
    """S(batch) / S(base_batch) under S = S_min (1 + B_crit/B)."""
    if math.isinf(b_crit):
        return base_batch / batch
    return (1 + b_crit / batch) / (1 + b_crit / base_batch)


def predicted(fits: list[CheckpointFit], stages: list[Stage], base_batch: int,
              reference_steps: float) -> dict:
    """The schedule's steps and examples to the target predicted from the fits: the reference's
    steps in each stage's stretch (from its checkpoint to the next stage's, the last to the
    reference's steps to target) times S(b)/S(B0) at the B_crit that chose the stage, with the
    range from that B_crit's interval (a bound: up to 1/B scaling)."""
    by_loss = {f.val_loss: f for f in fits}
    starts = [by_loss[s.from_loss].checkpoint_step for s in stages] + [reference_steps]
    steps = [starts[0] if stages else reference_steps] * 3
    examples = [steps[0] * base_batch] * 3
    for stage, begin, end in zip(stages, starts, starts[1:], strict=False):
        fit = by_loss[stage.from_loss]
        span = max(0.0, end - begin)
        ends = ((fit.b_crit, fit.b_crit_low, fit.b_crit_high) if math.isfinite(fit.b_crit)
                else (fit.bound_batch, fit.bound_batch, math.inf))
        for i, b_crit in enumerate(ends):
            b_crit = ends[0] if math.isnan(b_crit) else b_crit  # no interval: the estimate
            value = span * step_ratio(b_crit, stage.batch_size, base_batch)
            steps[i] += value
            examples[i] += value * stage.batch_size
    # index 0: the estimate; a larger B_crit (index 2) saves more steps.
    return {"steps": steps[0], "steps_low": steps[2], "steps_high": steps[1],
            "examples": examples[0], "examples_low": examples[2],
            "examples_high": examples[1], "reference_steps": reference_steps,
            "reference_examples": reference_steps * base_batch}
