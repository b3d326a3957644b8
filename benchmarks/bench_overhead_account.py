"""Where the sweep harness's overhead goes: the bare training loop (bareloop.py) with one piece
of the harness put back at a time, against the bare loop and the harness itself.

The pieces a sweep trial adds to a plain loop doing the same work:
- **trial step**: the step as the trial builds it, through the workload contract (its model
  factory, loss and synthetic batch), a batch generator and the precision context;
- **trial timing**: the sweep's timing helper (windows, clock syncs, CPU and run-queue
  readings) in place of a plain clock around each step;
- **memory watch**: the sweep's parent waking every 20 ms to read the trial's resident memory
  (on a 2-core machine it competes with the trial's threads);
- **all three** together; what is left between that and the **harness** (the real trial:
  FLOP count under FlopCounterMode, peak-memory reset, progress bar, parent-death signal) is
  what the pieces do not account for;
- **bare loop again**: a second bare loop in its own process, the A/A comparison: how far two
  identical fresh processes land apart, the resolution no harness figure can beat.

Every round runs all variants at one batch size in a fresh process each, the order rotated
between rounds; each figure is the median of the per-round ratios to the bare loop of the same
round, with a bootstrap 90 % interval (benchmarks/stats.py).

Run: `make bench BENCH=bench_overhead_account` (about 8 minutes on 2 CPU cores).
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

from benchmarks import scaled
from benchmarks.bareloop import BareSpec, run_bare
from benchmarks.bench_sweep import (
    OVERHEAD_GOAL,
    OVERHEAD_WARMUP_STEPS,
    RESNET_IMAGE_PX,
    _fixed_steps_cfg,
    _sps,
    calibrated_steps,
    harness_step_seconds,
    stated_goal_verdict,
)
from benchmarks.stats import Figure, ratio_figure

ROUNDS = scaled(8, 2)
# The batches where the harness ÷ bare ratio was lowest or least certain in bench_sweep.
CASES = (("resnet18", 2), ("resnet18", 16), ("digits-mlp", 64))
# Timed work per run: longer than bench_sweep's, so a run's own median is steadier.
TIMED_S = 1.5
BARE = "bare loop"
HARNESS = "harness"
PIECES = {"trial step": {"trial_step": True}, "trial timing": {"trial_timing": True},
          "memory watch": {}, "all three": {"trial_step": True, "trial_timing": True},
          "bare loop again": {}}
WATCHED = ("memory watch", "all three")
VARIANTS = (BARE, *PIECES, HARNESS)


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _measure(variant: str, workload: str, batch: int, steps: int) -> float:
    """Samples/s (batch over the median step) of one variant in a fresh process."""
    if variant == HARNESS:
        cfg = _fixed_steps_cfg(batch, RESNET_IMAGE_PX, steps)
        return _sps(batch, harness_step_seconds(workload, batch, RESNET_IMAGE_PX, cfg))
    spec = BareSpec(workload, batch, RESNET_IMAGE_PX, torch.get_num_threads(),
                    OVERHEAD_WARMUP_STEPS, steps, **PIECES.get(variant, {}))
    return _sps(batch, run_bare(spec, watch_memory=variant in WATCHED))


def _rotated(r: int) -> list[str]:
    order = list(VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)])
    return order if r % 2 == 0 else order[::-1]


def account(workload: str, batch: int) -> dict:
    """Per variant, samples/s ÷ the bare loop's in the same round; and harness ÷ all three."""
    steps = calibrated_steps(workload, batch, RESNET_IMAGE_PX, TIMED_S)
    rounds: list[dict[str, float]] = []
    for r in range(ROUNDS):
        rounds.append({v: _measure(v, workload, batch, steps) for v in _rotated(r)})
        _log(f"   {workload} B={batch} account round {r + 1}/{ROUNDS} done")
    bare = [r[BARE] for r in rounds]
    figures: dict[str, Figure] = {
        v: ratio_figure([r[v] for r in rounds], bare, OVERHEAD_GOAL if v == HARNESS else None)
        for v in VARIANTS if v != BARE}
    figures["harness ÷ all three"] = ratio_figure([r[HARNESS] for r in rounds],
                                                  [r["all three"] for r in rounds])
    return {"timed_steps": steps, "rounds": ROUNDS,
            "bare_step_s": batch / statistics.median(bare), "ratios": figures,
            "samples_per_s": {v: [r[v] for r in rounds] for v in VARIANTS}}


def _print(workload: str, batch: int, result: dict) -> None:
    print(f"{workload} B={batch} ({result['timed_steps']} timed steps, bare step "
          f"{result['bare_step_s'] * 1e3:.3g} ms), samples/s ÷ bare loop:")
    for name, fig in result["ratios"].items():
        stated = f" (as stated: {stated_goal_verdict(fig)})" if name == HARNESS else ""
        print(f"  {name:20s} {fig.text()}{stated}")


def run() -> dict:
    started = time.perf_counter()
    results = {f"{w} B={b}": account(w, b) for w, b in CASES}
    for (w, b), result in zip(CASES, results.values(), strict=True):
        _print(w, b, result)
    return {"threads": torch.get_num_threads(), "cases": {
        name: {**r, "ratios": {k: f.as_dict() for k, f in r["ratios"].items()}}
        for name, r in results.items()}, "wall_s": time.perf_counter() - started}
