"""The benchmarks' bare training loop and the harness pieces it can put back
(benchmarks/bareloop.py), in this process: each variant times exactly the steps it is asked
for, and both steps really train the workload's model. The memory-watched variant (a
forkserver child the parent polls) runs only in `make bench` (bench_overhead_account), which
also measures how fast they all are."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the benchmarks package
from benchmarks.bareloop import BareSpec, _plain_step, _trial_step, bare_step_seconds  # noqa: E402

VARIANTS = [{}, {"trial_step": True}, {"trial_timing": True},
            {"trial_step": True, "trial_timing": True}]


@pytest.mark.parametrize("pieces", VARIANTS, ids=lambda p: "+".join(p) or "plain")
def test_each_variant_times_the_steps_asked_for(pieces):
    spec = BareSpec("digits-mlp", 8, 32, threads=1, untimed_steps=1, timed_steps=5, **pieces)
    seconds = bare_step_seconds(spec)
    assert len(seconds) == 5
    assert all(s > 0 for s in seconds)


@pytest.mark.parametrize("build", [_plain_step, _trial_step], ids=["plain", "trial"])
def test_both_steps_train_the_model(build):
    """Each step is a real training step on the workload's model: its weights move."""
    spec = BareSpec("digits-mlp", 8, 32, threads=1, untimed_steps=0, timed_steps=1)
    torch.manual_seed(0)
    step, model = build(spec)
    before = [p.detach().clone() for p in model.parameters()]
    step()
    moved = [not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True)]
    assert all(moved)
