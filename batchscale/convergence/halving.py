"""Successive halving over the tuned rule's learning rates (convergence.lr_halving_eta).

The tuned rule trains every learning rate of `lr_candidates` at every (batch size, seed); most
of them are clearly worse long before the target. With halving, the learning rates of one
(batch size, seed) train together to a rung (a step; one batch size, so the comparison is at
matched examples), are ranked by the primary target's metric there, and only the best 1/eta
continue to the next rung (eta times further); the rest stop as `pruned`. A trial that finishes
before a rung (reached, diverged or out of steps) leaves the halving with its own status.

Every decision is a function of the trials' curves at the rung steps, which the trial files
and checkpoints keep, so a group interrupted at any point and run again takes the same
decisions (the finished trials' curves are read back, not retrained).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from batchscale.convergence.spec import ConvergenceSpec, HalvingSpec, TrialSpec
from batchscale.metrics import METRICS, Metric
from batchscale.schemas import TUNED_RULE


def trial_groups(spec: ConvergenceSpec) -> list[list[TrialSpec]]:
    """The spec's trials in the order they run: with halving, the tuned rule's trials of one
    (batch size, seed) as one group; every other trial alone."""
    groups: list[list[TrialSpec]] = []
    by_cell: dict[tuple[int, int], list[TrialSpec]] = {}
    for trial in spec.trials:
        if spec.halving is None or trial.lr_rule != TUNED_RULE:
            groups.append([trial])
            continue
        key = (trial.batch_size, trial.seed)
        if key not in by_cell:
            by_cell[key] = []
            groups.append(by_cell[key])
        by_cell[key].append(trial)
    return groups


def value_at(curve: list[dict], step: int, metric: Metric) -> float | None:
    """The metric at the first evaluation from `step` on; None if the curve ends before it."""
    row = next((r for r in curve if r["step"] >= step), None)
    if row is None:
        return None
    value = row.get(metric.name)
    if value is None or not math.isfinite(value):
        return -math.inf if metric.higher_is_better else math.inf  # ranks last
    return float(value)


def survivors(values: dict[str, float], metric: Metric, eta: int) -> list[str]:
    """The best ceil(n/eta) trial ids by `metric` (a non-finite value is the worst); ties keep
    the earlier trial (the config's order)."""
    order = sorted(values, key=lambda tid: -values[tid] if metric.higher_is_better
                   else values[tid])
    return order[:math.ceil(len(values) / eta)]


def run_group(trials: list[TrialSpec], halving: HalvingSpec,
              finished_curve: Callable[[TrialSpec], list[dict] | None],
              start: Callable, keep: Callable, log: Callable[[str], None]) -> None:
    """Successive halving over `trials` (one batch size and seed). `finished_curve(trial)`: the
    curve rows of a trial whose results are written, else None; `start(trial)`: a Trial;
    `keep(trial, runner, summary)`: write a finished trial's results."""
    metric = METRICS[halving.metric]
    alive, rung = list(trials), halving.first_rung_steps
    while len(alive) > 1:
        values = {}
        for trial in alive:
            curve = finished_curve(trial)
            if curve is None:
                runner = start(trial)
                summary = runner.run(pause_at_step=rung)
                curve = runner.state.curve
                if summary is not None:
                    keep(trial, runner, summary)
            value = value_at(curve, rung, metric)
            if value is not None:
                values[trial.trial_id] = value
        kept = survivors(values, metric, halving.eta)
        for trial in alive:
            if trial.trial_id in values and trial.trial_id not in kept \
                    and finished_curve(trial) is None:
                runner = start(trial)
                keep(trial, runner, runner.stop_pruned())
        log(rung_words(trials[0], rung, values, kept, metric))
        alive = [t for t in alive if t.trial_id in kept]
        rung *= halving.eta
    for trial in alive:
        if finished_curve(trial) is None:
            runner = start(trial)
            keep(trial, runner, runner.run())


def rung_words(first: TrialSpec, rung: int, values: dict[str, float], kept: list[str],
               metric: Metric) -> str:
    """'halving b64 s0 at step 50 (val_accuracy): b64-tuned-lr0.1-s0-w1 0.93 kept, ...'."""
    ranked = ", ".join(f"{tid} {values[tid]:.4g} {'kept' if tid in kept else 'pruned'}"
                       for tid in values)
    return (f"halving b{first.batch_size} s{first.seed} at step {rung} ({metric.name}): "
            f"{ranked or 'no learning rate left at this rung'}")
