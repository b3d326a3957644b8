"""What Python's garbage collector costs a training loop that makes Python objects every step
(benchmarks/tabular_workload.py: a tuple of tensors per item, batch 256 read through the
workload contract each step, as the sweep's real input and a trial without loader workers
read it), over STEPS steps: as it is, and with `gc.freeze()` after set-up. Each variant runs in
a fresh process (its objects are what a trial's are), paired and interleaved over ROUNDS
rounds; per variant the wall time of the steps, the collector's share of it and the full
collections (timing.time_steps records them), and the ratio of wall times frozen ÷ as it is.
Reported, no goal: the figures behind docs/sweep.md, "Garbage-collection pauses".

    python -m benchmarks.run bench_gc
"""

from __future__ import annotations

import gc
import multiprocessing
import statistics

from benchmarks import scaled
from benchmarks.stats import median_figure, paired_round, ratio_figure

BATCH = 256
STEPS = scaled(3000, 300)
ROUNDS = scaled(5, 2)


def measure(frozen: bool) -> dict:
    """One variant in this process: set up the workload, then time STEPS steps."""
    import torch

    from batchscale.contract_check import load_split
    from batchscale.timing import time_steps
    from batchscale.workloads import get_workload

    torch.set_num_threads(1)
    gc.collect()  # what the imports left, as the sweep's trial server does (sweep/settle_gc.py)
    contract = get_workload("benchmarks.tabular_workload:workload").contract_for(None)
    split = load_split(contract, "train")
    model = contract.model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    order = torch.Generator().manual_seed(0)

    def batches():
        while True:
            for idx in torch.randperm(len(split), generator=order).split(BATCH):
                if len(idx) == BATCH:
                    yield split.batch(idx, "cpu")

    stream = batches()

    def step() -> None:
        loss = contract.loss(model, next(stream))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    if frozen:
        gc.collect()
        gc.freeze()
    times = time_steps(step, untimed_steps=20, min_steps=STEPS, max_steps=STEPS,
                       time_budget_s=600.0)
    return {"steps_s": sum(times.seconds), "gc_share": times.gc_share,
            "full_collections": len(times.gc_steps or ()),
            "longest_step_s": max(times.seconds), "median_step_s": times.median_s,
            "objects": len(gc.get_objects())}


def _child(frozen: bool, conn) -> None:
    conn.send(measure(frozen))
    conn.close()


def fresh(frozen: bool) -> dict:
    """`measure` in a fresh spawned process."""
    ctx = multiprocessing.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(frozen, sender))
    proc.start()
    result = receiver.recv()
    proc.join()
    return result


def _summary(runs: list[dict]) -> dict:
    return {
        "steps_s": median_figure([r["steps_s"] for r in runs]),
        "gc_share": median_figure([r["gc_share"] for r in runs]),
        "full_collections": [r["full_collections"] for r in runs],
        "longest_step_ms": [round(1e3 * r["longest_step_s"], 1) for r in runs],
        "median_step_ms": statistics.median(1e3 * r["median_step_s"] for r in runs),
        "objects": statistics.median(r["objects"] for r in runs),
    }


def run() -> dict:
    plain, frozen = [], []
    for r in range(ROUNDS):
        a, b = paired_round(r, lambda: fresh(False), lambda: fresh(True))
        plain.append(a)
        frozen.append(b)
    result = {"as_it_is": _summary(plain), "gc_freeze": _summary(frozen),
              "wall_frozen_over_as_it_is": ratio_figure([b["steps_s"] for b in frozen],
                                                        [a["steps_s"] for a in plain])}
    print(f"{STEPS} steps of the tabular loop at batch {BATCH}, {ROUNDS} paired rounds, a "
          "fresh process each:")
    for name in ("as_it_is", "gc_freeze"):
        s = result[name]
        print(f"  {name:10s} steps {s['steps_s'].text()} s; collector share "
              f"{s['gc_share'].text()}; full collections per run {s['full_collections']}; "
              f"longest step (ms) {s['longest_step_ms']}; median step {s['median_step_ms']:.3f}"
              f" ms; objects the collector scans {s['objects']:,.0f}")
    print(f"  wall time, gc.freeze() ÷ as it is: {result['wall_frozen_over_as_it_is'].text()}")
    return result
