"""What a convergence trial's evaluations mean: which targets they reach, and the runs-table
rows a finished trial leaves. Shared by batchscale's own trainer (train.py) and a user's
training loop (loop_runner.py), so both record the same thing the same way."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from batchscale.metrics import Metric
from batchscale.schemas import RunStatus, StopKind


@dataclass(frozen=True)
class Target:
    """A target the trial trains to."""

    metric: Metric
    value: float

    @property
    def key(self) -> str:
        return f"{self.metric.name}:{self.value!r}"


def note_targets(state, targets: list[Target], row: dict) -> bool:
    """Record in `state` (trialstate.TrialState) the targets `row`, the curve's newest row,
    reaches for the first time, with the step of the evaluation before it (0 at the first): the
    target was crossed somewhere after that step, which a count taken at evaluations cannot
    tell. Returns whether any metric of a target not yet reached improved (else the evaluation
    counts towards a stall). The untrained model (step 0) reaches nothing: a target it already
    meets is counted at the first evaluation after training starts (steps to target are >= 1)."""
    improved = False
    earlier = [r["step"] for r in state.curve[:-1] if "step" in r and r["step"] < row["step"]]
    for target in targets:
        if target.key in state.reached:
            continue
        name, value = target.metric.name, row.get(target.metric.name)
        if row["step"] > 0 and target.metric.reached(value, target.value):
            state.reached[target.key] = {**{k: row[k] for k in
                                            ("step", "examples_seen", "train_time_s")},
                                         "after_step": earlier[-1] if earlier else 0}
        if target.metric.improved(value, state.best.get(name)):
            state.best[name] = value
            improved = True
    return improved


def out_of_steps_or_stalled(state, settings) -> str | None:
    """Why a trial that has not reached every target stops after this evaluation: it ran
    `max_steps`, or no target metric improved for `patience_evals` evaluations in a row (in
    the words the runs table's `stop_reason` keeps); None while it goes on."""
    if state.step >= settings.max_steps:
        return (f"{StopKind.OUT_OF_STEPS} ({settings.max_steps:,} steps) without reaching "
                "every target")
    if state.evals_since_best >= settings.patience_evals:
        best = ", ".join(f"{name} {value:.4g}" for name, value in sorted(state.best.items()))
        return (f"{StopKind.STALLED}: no target metric improved in {settings.patience_evals} "
                "evaluations in a row (convergence.patience_evals; best so far "
                f"{best or 'none'})")
    return None


def diverged_reason(loss: float, first: float | None, factor: float, step: int,
                    what: str) -> str | None:
    """Why `loss` (named `what`) at `step` counts as diverged: non-finite, or above `factor` ×
    its `first` value (convergence.divergence_factor); None when it does not."""
    if not math.isfinite(loss):
        return f"{what} became {loss} by step {step}"
    if first and loss > factor * first:
        return (f"{what} {loss:.4g} by step {step} is more than {factor:g}x its first value "
                f"{first:.4g} (convergence.divergence_factor)")
    return None


def trial_rows(state, trial, workers: int, targets: list[Target],
               status: RunStatus) -> list[dict]:
    """The trial's runs-table rows, one per target (but `cpu_wait_share`, added by the
    caller), of plain values (they are stored in the final checkpoint, which loads only plain
    containers). A target not reached has the trial's status (not_reached, diverged, pruned,
    probed or failed)."""
    last = state.curve[-1]
    common = {
        "trial_id": trial.trial_id, "batch_size": trial.batch_size, "lr_rule": trial.lr_rule,
        "lr": trial.lr, "seed": trial.seed, "workers": workers, "steps_run": state.step,
        "final_val_accuracy": last.get("val_accuracy"), "b_simple": state.noise.b_simple,
        "train_time_s": last["train_time_s"],
    }
    reason = getattr(state, "stop_reason", None)
    kept = (RunStatus.DIVERGED, RunStatus.PRUNED, RunStatus.PROBED, RunStatus.FAILED)
    rows = []
    for target in targets:
        hit = state.reached.get(target.key)
        name = target.metric.name
        rows.append({
            **common, "target_metric": name, "target_value": target.value,
            "target_val_accuracy": target.value if name == "val_accuracy" else None,
            "final_metric_value": finite_or_none(last.get(name)),
            "status": RunStatus.REACHED.value if hit else (
                status.value if status in kept else RunStatus.NOT_REACHED.value),
            "steps_to_target": hit["step"] if hit else None,
            "steps_before_target": hit.get("after_step") if hit else None,
            "examples_to_target": hit["examples_seen"] if hit else None,
            "time_to_target_s": hit["train_time_s"] if hit else None,
            "stop_reason": None if hit else reason,
        })
    return rows


def finite_or_none(value: float | None) -> float | None:
    """A metric as a run row stores it: a broken (diverged) model's NaN/inf is not a value."""
    return value if value is not None and math.isfinite(value) else None


def trial_files(trial_id: str) -> tuple[str, str]:
    """Names of a trial's (curves, run) tables under the output location."""
    return f"trials/{trial_id}.curves.parquet", f"trials/{trial_id}.run.parquet"


def kept_text(out_dir: Path) -> str:
    """Where a stopped launch's finished trials are: its own `trials/` where it finished any,
    else that none had (a folder named then would not exist), with where earlier launches of
    the run keep theirs."""
    trials = Path(out_dir) / "trials"
    if any(trials.glob("*.run.parquet")):
        return f"finished trials are kept in {trials}"
    return (f"no trial of this launch had finished (those of earlier launches are kept under "
            f"{Path(out_dir).parent})")


def summary_run_rows(summary: dict) -> list[dict]:
    """The runs rows of a final checkpoint's summary: a row per target, or (a checkpoint
    written before several targets) the one row it held."""
    if "rows" not in summary:
        return [summary]
    return [{**row, "cpu_wait_share": summary["cpu_wait_share"], **summary.get("allreduce", {})}
            for row in summary["rows"]]
