"""A convergence trial's loop state and its checkpoints: what a restarted torchrun group (or a
paused successive-halving rung) needs to continue at exactly the step it stopped at."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from batchscale.convergence import checkpoint
from batchscale.convergence.distributed import barrier
from batchscale.convergence.noise import NoiseScale


@dataclass
class TrialState:
    """The training loop's state: everything a resumed trial needs besides the model, the
    optimizer and the RNG (checkpoints store it by field name)."""

    step: int = 0
    train_time_s: float = 0.0
    first_loss: float | None = None
    loss_sum: float = 0.0
    loss_count: int = 0
    best_accuracy: float = -1.0  # checkpoints before several targets; unused since
    evals_since_best: int = 0
    curve: list[dict] = field(default_factory=list)
    noise: NoiseScale = field(default_factory=NoiseScale)
    best: dict[str, float] = field(default_factory=dict)
    """Best value so far of each metric a target is on (the stall check)."""
    reached: dict[str, dict] = field(default_factory=dict)
    """Target key -> the step, examples and train time at which it was first reached."""
    stop_reason: str | None = None
    """Why the trial stopped short of a target (the runs table's `stop_reason`); None while it
    runs, once it reached every target, and in checkpoints from before it was recorded."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> TrialState:
        return cls(**{**values, "noise": NoiseScale(**values["noise"])})


def save(trial, summary: dict | None = None) -> None:
    """Rank 0 writes the trial's (train.Trial) step checkpoint, or the final one with the
    summary; all ranks wait, so no rank runs ahead of the newest durable state."""
    if trial.d.is_main:
        tid = trial.t.trial_id
        name = (checkpoint.final_name(tid) if summary
                else checkpoint.step_name(tid, trial.state.step))
        checkpoint.save(trial.checkpoints, name, checkpoint.Checkpoint(
            identity=trial.identity, trial_state=trial.state.to_dict(),
            model=trial.bare_model().state_dict(), optimizer=trial.opt.state_dict(),
            rng=torch.get_rng_state(), summary=summary))
        checkpoint.drop_older(trial.checkpoints, tid, keep=name)
    barrier(trial.d)


def resume(trial) -> None:
    """Load the trial's newest checkpoint into it (model, optimizer, RNG, loop state and, for a
    finished trial, its summary); nothing when it has none."""
    name = checkpoint.latest(trial.checkpoints, trial.t.trial_id)
    if name is None:
        return
    ckpt = checkpoint.load(trial.checkpoints, name, trial.identity, trial.d.device)
    trial.bare_model().load_state_dict(ckpt.model)
    trial.opt.load_state_dict(ckpt.optimizer)
    torch.set_rng_state(ckpt.rng)
    trial.state = TrialState.from_dict(ckpt.trial_state)
    trial.finished = ckpt.summary
    trial.log(f"resumed from {name} (step {trial.state.step})")
