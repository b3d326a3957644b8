"""Convergence performance: data-parallel cost on loopback, and the training script's overhead.

1. 2-worker DDP (gloo, loopback) vs 1 worker at the same per-worker batch: the communication
   share of the step (DDP step minus a `no_sync()` compute-only step, over the DDP step) and the
   data-parallel efficiency throughput(2) / (2 x throughput(1)). Every rank runs one thread, so
   the figures show communication and scheduling, not a thread-count change. The step time of
   a group is the maximum over ranks of each rank's median. A sub-millisecond step against a
   loopback all-reduce is noisy: the groups are launched DDP_ROUNDS times (1 and 2 workers
   alternating which goes first) and each figure is the median over rounds with its bootstrap
   90 % interval and range (benchmarks/stats.py); no goal, reported.
2. The training script (batchscale/convergence/train.py, a Trial on one process) vs a bare
   SGD loop on the same model, learning rate, data gather and batch, in the same process with
   the same single thread: samples/s of each, evaluation excluded, with the gradient-noise
   measurement every step, every 10th (the default) and off, at two step sizes (the digits
   MLP at batch 256, a sub-millisecond step, and its 512-wide variant at batch 1024). Paired
   and interleaved: each round runs script and bare loop for every setting, the side going
   first alternating between rounds; the figure is the median of per-round ratios with its
   bootstrap 90 % interval and a verdict against the goal >= 0.97, and where the cost goes:
   the script's extra time per step in microseconds, (1/ratio - 1) x the bare step.

    python -m benchmarks.run bench_convergence
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks import scaled
from benchmarks.stats import Goal, median_figure, paired_round, ratio_figure

BATCH_PER_WORKER = 256
DDP_TIMED_STEPS = 200
DDP_WARMUP_STEPS = 20
# Each launch alternates DDP and no_sync() timings this many times; the launch's figures are
# the medians (one number per launch: rounds, not inner repeats, carry the interval).
DDP_INNER_REPEATS = 3
DDP_ROUNDS = scaled(3, 1)
TRAIN_STEPS = 400
OVERHEAD_ROUNDS = scaled(10, 2)
OVERHEAD_GOAL = Goal(0.97)
GNS_SETTINGS = {"gns_every_step": 1, "gns_every_10_steps_default": 10, "gns_off": TRAIN_STEPS + 1}
WORKLOAD = "digits-mlp"
OVERHEAD_CASES = {"digits-mlp": 256, "digits-mlp-wide": 1024}
"""Workload -> batch of the overhead comparison: a sub-millisecond step and a few-ms one."""
RUN_TIMEOUT_S = 600


# ------------------------------------------------------------------------ DDP, in torchrun
def _timed_median_s(step) -> float:
    """Median step time over a fixed step count (ranks must run the same number of steps:
    every DDP step is a collective)."""
    from batchscale.timing import time_steps

    return time_steps(step, untimed_steps=DDP_WARMUP_STEPS, min_steps=DDP_TIMED_STEPS,
                      max_steps=DDP_TIMED_STEPS, time_budget_s=float("inf")).median_s


def worker(out_path: str) -> None:
    """One rank: time a synchronized DDP step and a no_sync() step, alternating
    DDP_INNER_REPEATS times; rank 0 writes the maxima over ranks."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from batchscale.workloads import get_workload

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
    torch.manual_seed(0)
    workload = get_workload(WORKLOAD)
    model = workload.build()
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rank = int(os.environ.get("RANK", 0))
    x, y = workload.builtin_synthetic_batch(BATCH_PER_WORKER, "cpu", seed=rank)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def compute_only() -> None:
        with model.no_sync():
            step()

    steps, computes = [], []
    for _ in range(DDP_INNER_REPEATS):
        steps.append(_timed_median_s(step))
        computes.append(_timed_median_s(compute_only) if world > 1 else steps[-1])
    if world > 1:
        maxima = torch.tensor(steps + computes, dtype=torch.float64)
        dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
        values = maxima.tolist()
        steps, computes = values[:DDP_INNER_REPEATS], values[DDP_INNER_REPEATS:]
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        Path(out_path).write_text(json.dumps({
            "step_s": statistics.median(steps), "compute_step_s": statistics.median(computes),
            "comm_shares": [max(s - c, 0.0) / s for s, c in zip(steps, computes, strict=True)]}))


def _group_step_times(workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={workers}", "-m",
                               "benchmarks.bench_convergence", "--worker", str(out)],
                              env=env, timeout=RUN_TIMEOUT_S, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{workers}-worker group failed ({done.returncode}): "
                               f"{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def ddp_figures() -> dict:
    """DDP_ROUNDS launches of 1 and of 2 workers, alternating which goes first."""
    pairs = [paired_round(r, lambda: _group_step_times(1), lambda: _group_step_times(2))
             for r in range(DDP_ROUNDS)]
    one = [p[0]["step_s"] for p in pairs]
    two = [p[1]["step_s"] for p in pairs]
    shares = [statistics.median(p[1]["comm_shares"]) for p in pairs]
    efficiency = ratio_figure(one, two)
    return {
        "batch_per_worker": BATCH_PER_WORKER, "rounds": DDP_ROUNDS,
        "step_1_worker_s": median_figure(one),
        "step_2_workers_ddp_s": median_figure(two),
        "step_2_workers_no_sync_s": median_figure([p[1]["compute_step_s"] for p in pairs]),
        "communication_share": median_figure(shares),
        "data_parallel_efficiency": efficiency,
        "range": {"communication_share": [min(shares), max(shares)],
                  "data_parallel_efficiency": [min(a / b for a, b in zip(one, two, strict=True)),
                                               max(a / b for a, b in zip(one, two, strict=True))]},
    }


# ---------------------------------------------------------------- script vs a bare loop
def _digits(tmp: Path):
    from batchscale.config import parse_config
    from batchscale.convergence.train import load_data
    from batchscale.data.prep import prepare
    from batchscale.workloads import get_workload

    prepare(parse_config({}).dataset, tmp)
    return load_data(str(tmp), get_workload(WORKLOAD))


def _spec(tmp: Path, gns_every_steps: int, workload: str = WORKLOAD,
          batch: int = BATCH_PER_WORKER):
    from batchscale.config import parse_config
    from batchscale.convergence import runner

    cfg = parse_config({"workload": workload, "convergence": {
        "batch_sizes": [batch], "lr_rules": ["constant"], "seeds": [0],
        "target_val_accuracy": 1.0, "max_steps": TRAIN_STEPS, "eval_every_steps": TRAIN_STEPS,
        "checkpoint_every_steps": TRAIN_STEPS, "gns_every_steps": gns_every_steps}})
    return runner.build_spec(cfg, [batch], data_dir="unused", out_dir=str(tmp), run_id="bench")


def script_samples_per_s(data, tmp: Path, gns_every_steps: int, workload: str = WORKLOAD,
                         batch: int = BATCH_PER_WORKER) -> float:
    """A Trial of the training script on one process; its own train time excludes evaluation."""
    from batchscale.convergence import train
    from batchscale.convergence.distributed import Dist
    from batchscale.location import LocalLocation
    from batchscale.workloads import get_workload

    spec = _spec(tmp, gns_every_steps, workload, batch)
    trial = train.Trial(spec, spec.trials[0], data, Dist(0, 1, "cpu"),
                        LocalLocation(tmp / f"ckpt-{time.monotonic_ns()}"),
                        get_workload(workload))
    summary = train.summary_run_rows(trial.run())[0]
    return summary["steps_run"] * batch / summary["train_time_s"]


def bare_samples_per_s(data, lr: float, workload: str = WORKLOAD,
                       batch: int = BATCH_PER_WORKER) -> float:
    """The same model, optimizer, learning rate, data gather and batch in the plainest loop."""
    import torch
    import torch.nn.functional as F

    from batchscale.workloads import get_workload

    train, _ = data
    x, y = train.dataset.x, train.dataset.y  # the prepared rows, gathered directly
    torch.manual_seed(0)
    model = get_workload(workload).build()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    order = torch.randperm(len(y)).repeat(TRAIN_STEPS * batch // len(y) + 1)
    start = time.perf_counter()
    for step in range(TRAIN_STEPS):
        idx = order[step * batch:(step + 1) * batch]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return TRAIN_STEPS * batch / (time.perf_counter() - start)


def overhead_case(tmp: Path, data, workload: str, batch: int) -> dict:
    """OVERHEAD_ROUNDS rounds at one (workload, batch); in each, every gns setting is paired
    with its own bare run."""
    lr = _spec(tmp, 1, workload, batch).trials[0].lr
    script: dict[str, list[float]] = {name: [] for name in GNS_SETTINGS}
    bare: dict[str, list[float]] = {name: [] for name in GNS_SETTINGS}
    for r in range(OVERHEAD_ROUNDS):
        for name, every in GNS_SETTINGS.items():
            s, b = paired_round(r, lambda every=every: script_samples_per_s(
                data, tmp, every, workload, batch),
                lambda: bare_samples_per_s(data, lr, workload, batch))
            script[name].append(s)
            bare[name].append(b)
    bare_rate = median_figure([v for b in bare.values() for v in b])
    bare_step_us = batch / bare_rate.value * 1e6
    ratios = {name: ratio_figure(script[name], bare[name], OVERHEAD_GOAL) for name in GNS_SETTINGS}
    return {"workload": workload, "batch": batch, "steps": TRAIN_STEPS,
            "rounds": OVERHEAD_ROUNDS, "bare_samples_per_s": bare_rate,
            "bare_step_us": bare_step_us,
            **{f"script_vs_bare_{name}": ratios[name] for name in GNS_SETTINGS},
            **{f"extra_us_per_step_{name}": (1 / ratios[name].value - 1) * bare_step_us
               for name in GNS_SETTINGS},
            "script_runs": script, "bare_runs": bare}


def overhead_figures() -> dict:
    import torch

    torch.set_num_threads(1)  # as one torchrun rank; also steadier on a shared machine
    with tempfile.TemporaryDirectory() as tmp:
        data = _digits(Path(tmp) / "data")
        return {workload: overhead_case(Path(tmp), data, workload, batch)
                for workload, batch in OVERHEAD_CASES.items()}


def _plain(value):
    return value.as_dict() if hasattr(value, "as_dict") else value


def run() -> dict:
    ddp = ddp_figures()
    overhead = overhead_figures()
    print(f"DDP on loopback, digits-mlp at {BATCH_PER_WORKER} per worker, {DDP_ROUNDS} launches "
          "each (median [90 % interval]; no goal, reported):")
    for key in ("communication_share", "data_parallel_efficiency", "step_1_worker_s",
                "step_2_workers_ddp_s", "step_2_workers_no_sync_s"):
        digits = 5 if key.endswith("_s") else 3
        print(f"   {key:26s} {ddp[key].text(digits)}")
    print(f"   ranges over launches: {ddp['range']}")
    for case in overhead.values():
        print(f"training script ÷ bare loop, {case['workload']} at batch {case['batch']} (bare "
              f"step {case['bare_step_us']:.0f} µs), {TRAIN_STEPS} steps, paired over "
              f"{OVERHEAD_ROUNDS} rounds; extra µs per step:")
        for name in GNS_SETTINGS:
            print(f"   {name:28s} {case[f'script_vs_bare_{name}'].text()}   "
                  f"{case[f'extra_us_per_step_{name}']:+.0f} µs")
    return {"ddp_loopback": {k: _plain(v) for k, v in ddp.items()},
            "script_overhead": {w: {k: _plain(v) for k, v in case.items()}
                                for w, case in overhead.items()}}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2])
    else:
        run()
