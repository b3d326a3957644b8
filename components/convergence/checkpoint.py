"""Trial checkpoints: one immutable file per step, in a local directory or an S3 prefix.

A checkpoint is written once under `<trial_id>/step-<step>.pt` and never overwritten, so the
scheme is the same for a local directory (write aside, rename) and a create-only object store;
resume takes the newest step. A trial that finished writes `<trial_id>/final.pt` (its status,
summary and curve) before its result tables: a group killed between the two writes the very same
tables again instead of retraining. Every checkpoint carries the trial's identity — the trial
and the settings that shape its training — and one that does not match the run's is refused
with the differing fields named (a changed config or worker count must not resume silently).
Loading uses `torch.load(weights_only=True)`: tensors and plain containers only.
"""

from __future__ import annotations

import io
import re

import torch

from batchscale.components.convergence.location import LocalLocation, Location
from batchscale.errors import BadInput

FINAL_NAME = "final.pt"
STEP_PATTERN = re.compile(r"step-(\d+)\.pt$")
# Spec settings that shape a trial's trajectory; a checkpoint written under other values of any
# of them cannot be resumed. (checkpoint_every_steps and out_dir do not change the result.)
IDENTITY_SPEC_KEYS = (
    "workload", "workers", "accumulation_steps", "momentum", "warmup_steps",
    "target_val_accuracy", "max_steps", "eval_every_steps", "divergence_factor",
    "patience_evals", "gns_every_steps",
)


def trial_identity(spec: dict, trial: dict) -> dict:
    """What a checkpoint must agree on to be resumed by `trial` of `spec`."""
    return {**{k: spec[k] for k in IDENTITY_SPEC_KEYS}, **trial}


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


def save(location: Location, name: str, payload: dict) -> None:
    buf = io.BytesIO()
    torch.save(payload, buf)
    location.put_bytes(name, buf.getvalue())


def load(location: Location, name: str, device: str = "cpu") -> dict:
    return torch.load(io.BytesIO(location.get_bytes(name)), map_location=device,
                      weights_only=True)


def check_identity(payload: dict, expected: dict, where: str) -> None:
    """BadInput naming every field where the checkpoint differs from this run's settings."""
    stored = payload.get("identity", {})
    diffs = [f"{k}: checkpoint has {stored.get(k)!r}, this run has {expected[k]!r}"
             for k in expected if stored.get(k) != expected[k]]
    if diffs:
        hint = ("a change of worker count would change the global batch; "
                if any(d.startswith("workers:") for d in diffs) else "")
        raise BadInput(f"checkpoint {where} does not match this run ({'; '.join(diffs)}); "
                       f"{hint}use a new output directory or checkpoint location, or restore "
                       "the settings it was written with")


def drop_older(location: Location, trial_id: str, keep: str) -> None:
    """Free disk: remove a trial's other local checkpoints. S3 objects are create-only and stay
    (expire them with a bucket lifecycle rule)."""
    if isinstance(location, LocalLocation):
        for name in location.names(trial_id):
            if name != keep:
                location.remove(name)
