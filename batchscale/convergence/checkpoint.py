"""Trial checkpoints: one immutable file per step, in a local directory or an S3 prefix.

A checkpoint is written once under `<trial_id>/step-<step>.pt` and never overwritten, so the
scheme is the same for a local directory (write aside, rename) and a create-only object store;
resume takes the newest step. A trial that finished writes `<trial_id>/final.pt` (its status,
summary and curve) before its result tables: a group killed between the two writes the very same
tables again instead of retraining. Every checkpoint carries the trial's identity (see
`ConvergenceSpec.identity`), and one that does not match the run's is refused with the
differing fields named (a changed config or worker count must not resume silently); so is one
of another checkpoint format. Loading uses `torch.load(weights_only=True)`: tensors and plain
containers only.
"""

from __future__ import annotations

import io
import pickle
import re
from dataclasses import dataclass, fields
from typing import Any

import torch

from batchscale.errors import BadInput
from batchscale.location import LocalLocation, Location

FINAL_NAME = "final.pt"
STEP_PATTERN = re.compile(r"step-(\d+)\.pt$")
FORMAT = 2
"""Version of the checkpoint layout; 1 (no `format` key) packed the loop state into positional
lists and cannot be resumed."""
START_AGAIN = "use a new output directory or checkpoint location"


@dataclass(frozen=True)
class Checkpoint:
    """What a trial saves at an evaluation step, and once more when it finishes."""

    identity: dict[str, Any]
    """The trial's identity (ConvergenceSpec.identity); must match to resume."""
    trial_state: dict[str, Any]
    """The training loop's state by field name (trialstate.TrialState)."""
    model: dict[str, torch.Tensor]
    """The model's state_dict."""
    optimizer: dict[str, Any]
    """The optimizer's state_dict."""
    rng: torch.Tensor
    """torch's CPU random-number-generator state."""
    summary: dict[str, Any] | None = None
    """The trial's runs-table row, once it finished (final.pt only)."""


def step_name(trial_id: str, step: int) -> str:
    return f"{trial_id}/step-{step:08d}.pt"


def final_name(trial_id: str) -> str:
    return f"{trial_id}/{FINAL_NAME}"


def latest(location: Location, trial_id: str) -> str | None:
    """Name of the checkpoint to resume from: the final one, else the highest step."""
    names = location.names(trial_id)
    if final_name(trial_id) in names:
        return final_name(trial_id)
    steps = [(int(m.group(1)), n) for n in names if (m := STEP_PATTERN.search(n))]
    return max(steps)[1] if steps else None


def save(location: Location, name: str, ckpt: Checkpoint) -> None:
    buf = io.BytesIO()
    torch.save({"format": FORMAT, **{f.name: getattr(ckpt, f.name) for f in fields(ckpt)}}, buf)
    location.put_bytes(name, buf.getvalue())


def load(location: Location, name: str, identity: dict[str, Any],
         device: str = "cpu") -> Checkpoint:
    """The checkpoint `name`, once its format and identity are checked: BadInput naming the
    file (and every field that differs from `identity`) otherwise."""
    where = f"{location.uri}/{name}"
    try:
        payload = torch.load(io.BytesIO(location.get_bytes(name)), map_location=device,
                             weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError):
        raise BadInput(f"checkpoint {where} cannot be read: it is damaged or was written by "
                       f"another version of batchscale; {START_AGAIN}") from None
    found = payload.get("format", 1) if isinstance(payload, dict) else "unknown"
    if found != FORMAT:
        raise BadInput(f"checkpoint {where} has format {found}, this version resumes format "
                       f"{FORMAT} only; {START_AGAIN}")
    check_identity(payload["identity"], identity, where)
    return Checkpoint(**{f.name: payload[f.name] for f in fields(Checkpoint)})


def check_identity(stored: dict[str, Any], expected: dict[str, Any], where: str) -> None:
    """BadInput naming every field where the checkpoint differs from this run's settings."""
    diffs = [f"{k}: checkpoint has {_setting(stored.get(k))}, this run has "
             f"{_setting(expected[k])}" for k in expected if stored.get(k) != expected[k]]
    if diffs:
        hint = ("a change of worker count would change the global batch; "
                if any(d.startswith("workers:") for d in diffs) else "")
        raise BadInput(f"checkpoint {where} does not match this run ({'; '.join(diffs)}); "
                       f"{hint}{START_AGAIN}, or restore the settings it was written with")


def _setting(value: Any) -> str:
    """A setting of a checkpoint's identity in words: settings at their default are recorded as
    None (as checkpoints written before the setting existed hold them)."""
    return "the default" if value is None else repr(value)


def drop_older(location: Location, trial_id: str, keep: str) -> None:
    """Free disk: remove a trial's other local checkpoints. S3 objects are create-only and stay
    (expire them with a bucket lifecycle rule)."""
    if isinstance(location, LocalLocation):
        for name in location.names(trial_id):
            if name != keep:
                location.remove(name)
