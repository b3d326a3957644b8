"""The three kinds of run of a batch-schedule measurement, each resumable from its work
directory (a finished unit is a JSON file, skipped on a rerun; the reference run also resumes
from its newest checkpoint):

- the reference run: B0 from the first check seed, saving its state at every checkpoint step;
- branches: from each checkpoint, one short run per batch size to the checkpoint's milestone
  (the loss the reference reached `milestone_steps` later), all on one fresh data stream;
- the check: the scheduled run, the constant-B0 run and a constant run at the schedule's last
  batch, from each check seed, to the target.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchscale.batch_schedule.training import Run, Setup, crossing, reached
from batchscale.errors import BatchscaleError

VAL_LOSS = "val_loss"
BRANCH_SEED_OFFSET = 1_000_003
"""Branch data streams are seeded apart from every run's own (seed x offset + step)."""


@dataclass(frozen=True)
class Target:
    metric: str
    value: float


@dataclass(frozen=True)
class Stage:
    """From the first evaluation whose validation loss is at or below `from_loss`, train at
    `batch_size`."""

    from_loss: float
    batch_size: int


def _read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def _write_json(path: Path, value: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    aside = path.with_suffix(".part")
    aside.write_text(json.dumps(value, sort_keys=True))
    aside.replace(path)


def _eval_row(run: Run, batch_size: int) -> dict:
    metrics = run.evaluate()
    return {"step": run.step, "examples": run.examples, "train_time_s": run.train_time_s,
            "eval_time_s": run.eval_time_s, "batch_size": batch_size,
            "b_simple": run.noise.b_simple, "cpu_wait_share": run.cpu_wait_share(), **metrics}


def _check_finite(loss: float, what: str, run: Run) -> None:
    if not math.isfinite(loss):
        raise BatchscaleError(f"{what} diverged at step {run.step} (training loss {loss}): "
                              "lower convergence.base_lr (the reference run trains at "
                              "batch_schedule.base_batch_size with the LR rule's rate)")


# ------------------------------------------------------------------------ the reference run


def reference_run(setup: Setup, cfg, target: Target, seed: int, work: Path,
                  echo: Callable[[str], None]) -> list[dict]:
    """The reference run's curve (an evaluation row per evaluated step), training at B0 from
    `seed` until it has passed the last milestone and reached `target`, or `max_steps`; its
    state at each checkpoint step is saved under `work/reference`."""
    folder = work / "reference"
    done = _read_json(folder / "final.json")
    if done is not None:
        return done["curve"]
    run, b0 = Run(setup, seed), cfg.base_batch_size
    saved = sorted((int(m.group(1)) for p in folder.glob("step-*.pt")
                    if (m := re.fullmatch(r"step-(\d+)\.pt", p.name))), reverse=True)
    if saved:
        curve = run.load(str(folder), f"step-{saved[0]}.pt")["curve"]
        echo(f"reference run: resumed at step {saved[0]}")
    else:
        curve = [_eval_row(run, b0)]
    checkpoints = set(cfg.checkpoint_steps)
    milestones = {t + cfg.milestone_steps for t in cfg.checkpoint_steps}
    last_needed = max(milestones)
    while run.step < cfg.max_steps:
        _check_finite(run.train_step(b0), "the reference run", run)
        if run.step % cfg.eval_every_steps and run.step not in checkpoints | milestones:
            continue
        curve.append(_eval_row(run, b0))
        if run.step in checkpoints:
            run.save(str(folder), f"step-{run.step}.pt", {"curve": curve})
            echo(f"reference run: checkpoint at step {run.step}, {VAL_LOSS} "
                 f"{curve[-1][VAL_LOSS]:.4f}")
        # the target is judged on the regular grid alone, as in every run of the check: the
        # extra evaluations at checkpoints and milestones would give this run alone more
        # chances to cross it, and fewer steps
        if (run.step >= last_needed and not run.step % cfg.eval_every_steps
                and reached(target.metric, curve[-1][target.metric], target.value)):
            break
    _write_json(folder / "final.json", {"curve": curve})
    return curve


def on_grid(curve: list[dict], eval_every_steps: int) -> list[dict]:
    """The evaluations of a reference curve at the steps every check run evaluates (multiples
    of `eval_every_steps`), without those added at checkpoints and milestones."""
    return [row for row in curve if row["step"] % eval_every_steps == 0]


def value_at(curve: list[dict], step: int, column: str = VAL_LOSS) -> float:
    """`column` of the curve's evaluation at `step` (the reference evaluates every checkpoint
    and milestone step)."""
    for row in curve:
        if row["step"] == step:
            return float(row[column])
    raise BatchscaleError(f"the reference run has no evaluation at step {step}")


def loss_scatter(curve: list[dict], step: int, span: int) -> float:
    """How far the reference's val_loss scatters between evaluations near `step` (within
    `span` steps either side): each evaluation's distance from the straight line through its
    two neighbours, scaled to one evaluation's noise, and their robust standard deviation
    (1.4826 x the median distance); NaN with fewer than four such distances. Neighbours are
    close, so the curve's bend adds little, and the median ignores the few places where it
    bends fast (the first steps from random weights)."""
    near = [(r["step"], float(r[VAL_LOSS])) for r in curve if abs(r["step"] - step) <= span]
    if len(near) < 6:
        return math.nan
    steps, losses = (np.array(v, dtype=float) for v in zip(*near, strict=True))
    after = (steps[2:] - steps[1:-1]) / (steps[2:] - steps[:-2])  # the earlier neighbour's weight
    between = after * losses[:-2] + (1 - after) * losses[2:]
    distances = (losses[1:-1] - between) / np.sqrt(1 + after**2 + (1 - after) ** 2)
    return float(1.4826 * np.median(np.abs(distances)))


# ------------------------------------------------------------------------------ branches


def branch(setup: Setup, cfg, checkpoint: dict, batch_size: int, milestone_loss: float,
           seed: int, work: Path) -> dict:
    """One branch from the reference's evaluation row `checkpoint`: steps at `batch_size` to
    `milestone_loss` (interpolated between evaluations, the first from the checkpoint's own
    loss; NaN when not reached within branch_step_factor x milestone_steps), with its cost."""
    checkpoint_step = checkpoint["step"]
    path = work / "branches" / f"step-{checkpoint_step}-batch-{batch_size}.json"
    done = _read_json(path)
    if done is not None:
        return done
    run = Run(setup, seed)
    run.load(str(work / "reference"), f"step-{checkpoint_step}.pt")
    run.branch(seed * BRANCH_SEED_OFFSET + checkpoint_step)
    start_examples, start_time, start_eval = run.examples, run.train_time_s, run.eval_time_s
    cap = math.ceil(cfg.branch_step_factor * cfg.milestone_steps)
    before, steps, diverged = (0.0, float(checkpoint[VAL_LOSS])), math.nan, False
    while run.step - checkpoint_step < cap:
        if not math.isfinite(run.train_step(batch_size)):
            diverged = True  # infeasible at this batch and LR (Shallue et al.), not an error
            break
        taken = run.step - checkpoint_step
        if taken % cfg.branch_eval_every_steps and taken != cap:
            continue
        loss = run.evaluate()[VAL_LOSS]
        if loss <= milestone_loss:
            steps = crossing(before, (taken, loss), milestone_loss)
            break
        before = (taken, loss)
    row = {"checkpoint_step": checkpoint_step, "batch_size": batch_size,
           "lr": setup.peak_lr(batch_size), "milestone_loss": milestone_loss,
           "steps_to_milestone": steps, "reached": math.isfinite(steps), "diverged": diverged,
           "examples": run.examples - start_examples,
           "train_time_s": run.train_time_s - start_time,
           "eval_time_s": run.eval_time_s - start_eval, "cpu_wait_share": run.cpu_wait_share()}
    _write_json(path, row)
    return row


# ------------------------------------------------------------------------------- the check


def check_run(setup: Setup, cfg, target: Target, stages: list[Stage], seed: int,
              name: str, work: Path, start_batch: int | None = None) -> dict:
    """One run of the check from `seed`: `start_batch` (default B0), then each stage's batch
    once the validation loss has reached the stage's `from_loss`, until `target` or
    max_steps."""
    path = work / "check" / f"{name}-seed-{seed}.json"
    done = _read_json(path)
    if done is not None:
        return done
    batch = cfg.base_batch_size if start_batch is None else start_batch
    run, todo = Run(setup, seed), list(stages)
    curve, diverged = [_eval_row(run, batch)], False
    while run.step < cfg.max_steps and not reached(target.metric, curve[-1][target.metric],
                                                   target.value):
        if not math.isfinite(run.train_step(batch)):
            diverged = True  # not reached; the check compares seeds where both runs reached
            break
        if run.step % cfg.eval_every_steps:
            continue
        curve.append(_eval_row(run, batch))
        while todo and curve[-1][VAL_LOSS] <= todo[0].from_loss:
            batch = todo.pop(0).batch_size
    row = {"schedule": name, "seed": seed, **to_target(curve, target), "diverged": diverged,
           "device_s": run.train_time_s + run.eval_time_s}
    _write_json(path, row)
    return row


def to_target(curve: list[dict], target: Target) -> dict:
    """Steps, examples and training seconds to `target` along a curve (interpolated between
    the evaluations around the first that reached it), the batch sizes trained at, and the
    last evaluation's metrics."""
    found = next((i for i, row in enumerate(curve)
                  if reached(target.metric, row[target.metric], target.value)), None)
    figures = {"steps_to_target": math.nan, "examples_to_target": math.nan,
               "train_time_s_to_target": math.nan}
    if found is not None:
        before, after = curve[max(found - 1, 0)], curve[found]
        point = crossing((0.0, before[target.metric]), (1.0, after[target.metric]),
                         target.value)
        for key, column in (("steps_to_target", "step"), ("examples_to_target", "examples"),
                            ("train_time_s_to_target", "train_time_s")):
            figures[key] = before[column] + point * (after[column] - before[column])
    batches = list(dict.fromkeys(row["batch_size"] for row in curve[:None if found is None
                                                                    else found + 1]))
    last = curve[found if found is not None else -1]
    return {"reached": found is not None, **figures,
            "batch_sizes": ">".join(map(str, batches)),
            "final_val_loss": float(last[VAL_LOSS]),
            "final_metric": float(last[target.metric]), "steps_run": int(curve[-1]["step"]),
            "cpu_wait_share": curve[-1].get("cpu_wait_share")}
