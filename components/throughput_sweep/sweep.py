"""throughput_sweep core: samples/s, step-time spread, peak memory and MFU per batch size.

One trial = one (input mode, batch size): build a fresh model and optimizer, time training
steps with batchscale.timing, record a row. Trials run in ascending batch order, one at a time
(measurements never overlap), and the table is rewritten after every trial so an interrupted
sweep keeps what it measured.
"""

from __future__ import annotations

import ctypes
import gc
import sys
from dataclasses import dataclass
from pathlib import Path

from batchscale.config import SweepConfig
from batchscale.schemas import make_table
from batchscale.storage import write_table_atomic
from batchscale.timing import StepTimes, time_steps
from batchscale.workloads import Workload

# Square fp32 matmul size used to measure a CPU's attainable peak FLOP/s on the spot.
PEAK_MATMUL_SIZE = 2048
PEAK_MATMUL_REPEATS = 5
# Declared dense peak FLOP/s of known accelerators, by (name fragment, precision).
DECLARED_PEAK_FLOPS = {
    ("H200", "bf16"): 989e12, ("H200", "fp32"): 67e12,
    ("H100", "bf16"): 989e12, ("H100", "fp32"): 67e12,
    ("A100", "bf16"): 312e12, ("A100", "fp32"): 19.5e12,
    ("L4", "bf16"): 121e12, ("L4", "fp32"): 30.3e12,
    ("T4", "bf16"): 65e12, ("T4", "fp32"): 8.1e12,
}


def resolve_device(device: str) -> str:
    import torch

    from batchscale.errors import BadInput

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise BadInput("device 'cuda' requested but no CUDA device is available; "
                       "allowed here: auto, cpu")
    return device


def peak_flops_per_s(device: str, precision: str) -> tuple[float, str]:
    """(peak FLOP/s, how it was obtained): declared for known GPUs, measured on CPU."""
    import torch

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(device)
        for (fragment, prec), peak in DECLARED_PEAK_FLOPS.items():
            if fragment in name and prec == precision:
                return peak, f"declared {fragment} {prec}"
    a = torch.randn(PEAK_MATMUL_SIZE, PEAK_MATMUL_SIZE, device=device)
    b = torch.randn(PEAK_MATMUL_SIZE, PEAK_MATMUL_SIZE, device=device)
    times = time_steps(lambda: a @ b, device=device, warmup_steps=2,
                       min_steps=PEAK_MATMUL_REPEATS, max_steps=PEAK_MATMUL_REPEATS)
    return 2 * PEAK_MATMUL_SIZE**3 / min(times.seconds), "measured fp32 matmul"


def train_flops_per_sample(workload: Workload, model, batch, batch_size: int) -> float:
    """Forward + backward FLOPs of one step, counted by torch's FlopCounterMode."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        workload.loss(model, batch).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops() / batch_size


class PeakMemory:
    """Peak memory of one trial: CUDA allocator stats on GPU; on CPU the process's peak RSS,
    reset through /proc/self/clear_refs (Linux) so each trial gets its own high-water mark."""

    def __init__(self, device: str):
        self.device = device

    def reset(self) -> None:
        release_memory(self.device)
        if self.device.startswith("cuda"):
            import torch

            torch.cuda.reset_peak_memory_stats(self.device)
            return
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass

    def peak_bytes(self) -> int | None:
        if self.device.startswith("cuda"):
            import torch

            return int(torch.cuda.max_memory_allocated(self.device))
        try:
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return None


def release_memory(device: str) -> None:
    """Drop what a finished (or OOM-ed) trial held so it cannot poison the next one."""
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()
    elif sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:
            pass


def is_oom(err: BaseException) -> bool:
    import torch

    if isinstance(err, torch.OutOfMemoryError | MemoryError):
        return True
    text = str(err)
    return "out of memory" in text or "can't allocate memory" in text


@dataclass
class Trial:
    workload: Workload
    input_mode: str
    batch_size: int
    device: str
    cfg: SweepConfig


def _batches(trial: Trial, real_data):
    """A step's input: a fixed on-device tensor batch, or the next slice of the real dataset
    copied to the device each step (the input pipeline is then part of the step)."""
    if trial.input_mode == "synthetic":
        batch = trial.workload.synthetic_batch(trial.batch_size, trial.device)
        while True:
            yield batch
    import torch

    x_all, y_all = real_data
    gen = torch.Generator().manual_seed(0)
    while True:
        for idx in torch.randperm(len(y_all), generator=gen).split(trial.batch_size):
            if len(idx) == trial.batch_size:
                yield (x_all[idx].to(trial.device, non_blocking=True),
                       y_all[idx].to(trial.device, non_blocking=True))


def run_trial(trial: Trial, real_data=None) -> tuple[StepTimes, float, int | None]:
    """Time one trial; returns (step times, train FLOPs per sample, peak bytes)."""
    import torch

    torch.manual_seed(0)
    memory = PeakMemory(trial.device)
    memory.reset()
    model = trial.workload.build().to(trial.device)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    batches = _batches(trial, real_data)
    autocast = torch.autocast(device_type=trial.device.split(":")[0], dtype=torch.bfloat16,
                              enabled=trial.cfg.precision == "bf16")

    def step():
        batch = next(batches)
        with autocast:
            loss = trial.workload.loss(model, batch)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    with autocast:
        flops = train_flops_per_sample(trial.workload, model, next(batches), trial.batch_size)
    times = time_steps(step, device=trial.device, warmup_steps=trial.cfg.warmup_steps,
                       min_steps=trial.cfg.min_timed_steps, max_steps=trial.cfg.max_timed_steps,
                       target_cv=trial.cfg.target_cv, time_budget_s=trial.cfg.time_budget_s)
    return times, flops, memory.peak_bytes()  # model and optimizer are freed on return


def trial_row(trial: Trial, times: StepTimes | None, flops: float | None, peak: int | None,
              peak_flops: float, status: str = "ok", error: str | None = None) -> dict:
    row = {"input_mode": trial.input_mode, "batch_size": trial.batch_size, "status": status,
           "precision": trial.cfg.precision, "timed_steps": 0, "peak_memory_bytes": peak,
           "train_flops_per_sample": flops, "peak_flops_per_s": peak_flops, "error": error}
    if times is not None:
        samples_per_s = trial.batch_size / times.median_s
        achieved = flops * samples_per_s if flops else None
        row.update({
            "timed_steps": len(times.seconds), "step_time_median_s": times.median_s,
            "step_time_p10_s": times.quantile_s(0.1), "step_time_p90_s": times.quantile_s(0.9),
            "step_time_cv": times.cv, "samples_per_s": samples_per_s,
            "achieved_flops_per_s": achieved,
            "mfu": achieved / peak_flops if achieved and peak_flops else None,
        })
    return row


def sweep(workload: Workload, cfg: SweepConfig, env: dict, out_path: str | Path,
          real_data=None, log=print) -> list[dict]:
    """Measure every (input mode, batch size); rewrite `out_path` after each trial."""
    device = resolve_device(cfg.device)
    peak, peak_source = peak_flops_per_s(device, cfg.precision)
    log(f"sweep {workload.name} on {device} ({cfg.precision}); peak {peak / 1e9:.1f} GFLOP/s "
        f"({peak_source})")
    rows: list[dict] = []
    modes = [m for m in cfg.input_modes if m == "synthetic" or real_data is not None]
    for mode in modes:
        for batch_size in cfg.batch_sizes:
            trial = Trial(workload, mode, batch_size, device, cfg)
            try:
                times, flops, peak_bytes = run_trial(trial, real_data)
                row = trial_row(trial, times, flops, peak_bytes, peak)
            except Exception as err:  # an OOM or a model failure is a row, not a crash
                status = "oom" if is_oom(err) else "error"
                row = trial_row(trial, None, None, None, peak, status, f"{type(err).__name__}: "
                                f"{str(err)[:300]}")
            finally:
                release_memory(device)
            rows.append(row)
            write_table_atomic(out_path, make_table("sweep", rows, env))
            log(_progress_line(len(rows), len(modes) * len(cfg.batch_sizes), row))
    return rows


def _progress_line(done: int, total: int, row: dict) -> str:
    head = f"[{done}/{total}] {row['input_mode']:9s} batch {row['batch_size']:6d}"
    if row["status"] != "ok":
        return f"{head}  {row['status']}: {row['error']}"
    return (f"{head}  {row['samples_per_s']:10.0f} samples/s  median step "
            f"{row['step_time_median_s'] * 1e3:8.3f} ms  cv {row['step_time_cv']:.3f}")


def run_stage(config_json: str, run_id: str, dataset_dir: str | None, out_path: str) -> list[dict]:
    """Pipeline/CLI entry: sweep the configured workload, real input from `dataset_dir`."""
    from batchscale.components.data_prep.loader import load_split

    from batchscale.config import config_from_json
    from batchscale.envinfo import environment
    from batchscale.workloads import get_workload

    cfg = config_from_json(config_json)
    workload = get_workload(cfg.workload)
    device = resolve_device(cfg.sweep.device)
    real = None
    if dataset_dir and "real" in cfg.sweep.input_modes:
        real = load_split(dataset_dir, "train", input_shape=workload.input_shape)
    env = environment(run_id=run_id, config_hash=cfg.config_hash, experiment=cfg.name,
                      workload=cfg.workload, device=device)
    return sweep(workload, cfg.sweep, env, out_path, real_data=real)
