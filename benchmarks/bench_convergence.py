"""Convergence performance: data-parallel cost on loopback, and the training script's overhead.

1. 2-worker DDP (gloo, loopback) vs 1 worker at the same per-worker batch: the communication
   share of the step (DDP step minus a `no_sync()` compute-only step, over the DDP step) and the
   data-parallel efficiency throughput(2) / (2 x throughput(1)). Every rank runs one thread, so
   the figures show communication and scheduling, not a thread-count change. The step time of
   a group is the maximum over ranks of each rank's median.
2. The training script (batchscale/convergence/train.py, a Trial on one process) vs a bare
   SGD loop on the same model, data and batch: samples/s of each, evaluation excluded, with the
   gradient-noise measurement every step, every 10th (the default) and off. Target: >= 0.95x.

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

BATCH_PER_WORKER = 256
DDP_TIMED_STEPS = 200
DDP_WARMUP_STEPS = 20
TRAIN_STEPS = 400
REPEATS = 5  # interleaved script/bare runs; the median ratio is reported
GNS_SETTINGS = {"gns_every_step": 1, "gns_every_10_steps_default": 10, "gns_off": TRAIN_STEPS + 1}
WORKLOAD = "digits-mlp"
RUN_TIMEOUT_S = 600


# ------------------------------------------------------------------------ DDP, in torchrun
def _timed_median_s(step) -> float:
    """Median step time over a fixed step count (ranks must run the same number of steps:
    every DDP step is a collective)."""
    from batchscale.timing import time_steps

    return time_steps(step, warmup_steps=DDP_WARMUP_STEPS, min_steps=DDP_TIMED_STEPS,
                      max_steps=DDP_TIMED_STEPS, time_budget_s=float("inf")).median_s


def worker(out_path: str) -> None:
    """One rank: time a synchronized DDP step and a no_sync() step; rank 0 writes the maxima."""
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
    x, y = workload.synthetic_batch(BATCH_PER_WORKER, "cpu", seed=int(os.environ.get("RANK", 0)))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        opt.step()

    def compute_only() -> None:
        with model.no_sync():
            step()

    times = [_timed_median_s(step)]
    if world > 1:
        times.append(_timed_median_s(compute_only))
        maxima = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(maxima, op=dist.ReduceOp.MAX)
        times = maxima.tolist()
        dist.destroy_process_group()
    if int(os.environ.get("RANK", "0")) == 0:
        Path(out_path).write_text(json.dumps({"step_s": times[0], "compute_step_s": times[-1]}))


def _group_step_times(workers: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "times.json"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={workers}", "-m", "benchmarks.bench_convergence",
                        "--worker", str(out)], env=env, check=True, timeout=RUN_TIMEOUT_S,
                       capture_output=True)
        return json.loads(out.read_text())


def ddp_figures() -> dict:
    one, two = _group_step_times(1), _group_step_times(2)
    comm_s = max(two["step_s"] - two["compute_step_s"], 0.0)
    return {
        "batch_per_worker": BATCH_PER_WORKER,
        "step_1_worker_s": one["step_s"],
        "step_2_workers_ddp_s": two["step_s"],
        "step_2_workers_no_sync_s": two["compute_step_s"],
        "communication_share": comm_s / two["step_s"],
        "samples_per_s_1_worker": BATCH_PER_WORKER / one["step_s"],
        "samples_per_s_2_workers": 2 * BATCH_PER_WORKER / two["step_s"],
        "data_parallel_efficiency": one["step_s"] / two["step_s"],
    }


# ---------------------------------------------------------------- script vs a bare loop
def _digits(tmp: Path):
    from batchscale.config import parse_config
    from batchscale.convergence.train import load_data
    from batchscale.data.prep import prepare
    from batchscale.workloads import get_workload

    prepare(parse_config({}).dataset, tmp)
    return load_data(str(tmp), get_workload(WORKLOAD).input_shape)


def script_samples_per_s(data, tmp: Path, gns_every_steps: int) -> float:
    """A Trial of the training script on one process; its own train time excludes evaluation."""
    from batchscale.config import parse_config
    from batchscale.convergence import runner, train
    from batchscale.convergence.distributed import Dist
    from batchscale.location import LocalLocation

    cfg = parse_config({"convergence": {
        "batch_sizes": [BATCH_PER_WORKER], "lr_rules": ["constant"], "seeds": [0],
        "target_val_accuracy": 1.0, "max_steps": TRAIN_STEPS, "eval_every_steps": TRAIN_STEPS,
        "checkpoint_every_steps": TRAIN_STEPS, "gns_every_steps": gns_every_steps}})
    spec = runner.build_spec(cfg, [BATCH_PER_WORKER], data_dir="unused", out_dir=str(tmp),
                             run_id="bench")
    trial = train.Trial(spec, spec.trials[0], data, Dist(0, 1, "cpu"),
                        LocalLocation(tmp / f"ckpt-{time.monotonic_ns()}"))
    summary = trial.run()
    return summary["steps_run"] * BATCH_PER_WORKER / summary["train_time_s"]


def bare_samples_per_s(data) -> float:
    """The same model, optimizer, data gather and batch in the plainest loop."""
    import torch
    import torch.nn.functional as F

    from batchscale.workloads import get_workload

    (x, y), _ = data
    torch.manual_seed(0)
    model = get_workload(WORKLOAD).build()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    order = torch.randperm(len(y)).repeat(TRAIN_STEPS * BATCH_PER_WORKER // len(y) + 1)
    start = time.perf_counter()
    for step in range(TRAIN_STEPS):
        idx = order[step * BATCH_PER_WORKER:(step + 1) * BATCH_PER_WORKER]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    return TRAIN_STEPS * BATCH_PER_WORKER / (time.perf_counter() - start)


def overhead_figures() -> dict:
    import torch

    torch.set_num_threads(1)  # as one torchrun rank; also steadier on a shared machine
    with tempfile.TemporaryDirectory() as tmp:
        data = _digits(Path(tmp) / "data")
        ratios: dict[str, list[float]] = {name: [] for name in GNS_SETTINGS}
        bare = []
        for _ in range(REPEATS):
            bare.append(bare_samples_per_s(data))
            for name, every in GNS_SETTINGS.items():
                ratios[name].append(script_samples_per_s(data, Path(tmp), every) / bare[-1])
    return {"batch": BATCH_PER_WORKER, "steps": TRAIN_STEPS,
            "bare_samples_per_s": statistics.median(bare),
            **{f"script_vs_bare_{name}": statistics.median(r) for name, r in ratios.items()},
            "ratios": ratios}


def run() -> dict:
    figures = {"ddp_loopback": ddp_figures(), "script_overhead": overhead_figures()}
    print(json.dumps(figures, indent=1))
    return figures


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2])
    else:
        run()
