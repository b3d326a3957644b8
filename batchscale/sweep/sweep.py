"""throughput_sweep core: samples/s, step-time spread, peak memory and MFU per batch size.

One trial = one (input mode, batch size), measured in its own process (isolation.py, trial.py).
Trials run one at a time (measurements never overlap), in ascending batch order or as the
largest-batch search (search.py) asks, and the table is rewritten atomically after every trial
so a sweep interrupted with Ctrl-C keeps every row it measured.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from batchscale.config import SweepConfig
from batchscale.errors import BadInput
from batchscale.schemas import TrialStatus, make_table
from batchscale.storage import write_table_atomic
from batchscale.sweep.isolation import run_isolated
from batchscale.sweep.search import (
    DOES_NOT_FIT,
    FAILED,
    FITS,
    SearchResult,
    search_largest_batch,
)
from batchscale.sweep.trial import (
    TrialResult,
    TrialSpec,
)
from batchscale.workloads import Workload, get_workload

# Square fp32 matmul used to measure a CPU's attainable peak FLOP/s on the spot.
PEAK_MATMUL_SIZE = 2048
PEAK_MATMUL_WARMUP = 2
PEAK_MATMUL_REPEATS = 5
# Declared dense (no sparsity) peak FLOP/s of known accelerators by (name fragment, precision);
# fp32 is the non-tensor-core rate torch uses by default. Longer fragments are matched first.
DECLARED_PEAK_FLOPS = {
    ("H200 NVL", "bf16"): 835e12, ("H200 NVL", "fp32"): 60e12,
    ("H200", "bf16"): 989e12, ("H200", "fp32"): 67e12,
    ("H100", "bf16"): 989e12, ("H100", "fp32"): 67e12,
    ("A100", "bf16"): 312e12, ("A100", "fp32"): 19.5e12,
    ("L40S", "bf16"): 362e12, ("L40S", "fp32"): 91.6e12,
    ("A10G", "bf16"): 70e12, ("A10G", "fp32"): 31.2e12,
    ("L4", "bf16"): 121e12, ("L4", "fp32"): 30.3e12,
    ("T4", "bf16"): 65e12, ("T4", "fp32"): 8.1e12,
}
PHASE_GRID = "grid"
MEMINFO = Path("/proc/meminfo")
CGROUP_MEMORY_MAX = Path("/sys/fs/cgroup/memory.max")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ inputs
def resolve_device(device: str) -> str:
    """'auto' → cuda when present, else cpu; 'cuda' without a GPU is bad input."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise BadInput(f"device {device!r} requested but no CUDA device is available; "
                       "allowed here: auto, cpu")
    return device


def check_real_input(workload: Workload, dataset_dir: str) -> str | None:
    """Why real batches from `dataset_dir` cannot feed `workload`, or None when they can."""
    from batchscale.shards import read_manifest

    manifest = read_manifest(dataset_dir).to_pylist()
    shape = tuple(manifest[0]["feature_shape"]) if manifest else ()
    if math.prod(shape) != math.prod(workload.input_shape) or workload.kind != "classification":
        return (f"dataset examples have shape {shape}; {workload.name} takes "
                f"{workload.input_shape} ({workload.kind})")
    return None


# ------------------------------------------------------------------------------ device facts
@functools.cache
def peak_flops_per_s(device: str, precision: str) -> tuple[float, str]:
    """(peak FLOP/s, how it was obtained): declared for known GPUs, else measured with a large
    matmul (fp32) through the one timing helper."""
    import torch

    from batchscale.timing import time_steps

    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(device)
        for (fragment, prec), peak in sorted(DECLARED_PEAK_FLOPS.items(),
                                             key=lambda kv: -len(kv[0][0])):
            if fragment in name and prec == precision:
                return peak, f"declared {fragment} {prec}"
    a = torch.randn(PEAK_MATMUL_SIZE, PEAK_MATMUL_SIZE, device=device)
    b = torch.randn(PEAK_MATMUL_SIZE, PEAK_MATMUL_SIZE, device=device)
    times = time_steps(lambda: a @ b, device=device, warmup_steps=PEAK_MATMUL_WARMUP,
                       min_steps=PEAK_MATMUL_REPEATS, max_steps=PEAK_MATMUL_REPEATS)
    return 2 * PEAK_MATMUL_SIZE**3 / min(times.seconds), "measured fp32 matmul"


def available_memory_bytes() -> int | None:
    """Memory this machine (or container) can still give: MemAvailable, or the cgroup's limit
    when that is lower."""
    available = None
    try:
        for line in MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
        limit = CGROUP_MEMORY_MAX.read_text().strip()
        if limit.isdigit() and (available is None or int(limit) < available):
            available = int(limit)
    except OSError:
        pass
    return available


def memory_cap_bytes(device: str, cfg: SweepConfig) -> int | None:
    """The budget (memory_limit_bytes, else the device's memory) less the safety margin."""
    budget = cfg.memory_limit_bytes
    if budget is None:
        if device.startswith("cuda"):
            import torch

            budget = torch.cuda.get_device_properties(device).total_memory
        else:
            budget = available_memory_bytes()
    return None if budget is None else int(budget * (1.0 - cfg.memory_safety_margin))


# ------------------------------------------------------------------------------ rows
@dataclass
class _Sweep:
    """One sweep's fixed context and the rows measured so far."""

    cfg: SweepConfig
    workload: Workload
    device: str
    env: dict
    out_path: Path
    dataset_dir: str | None
    log: Callable[[str], None]
    threads: int
    cap_bytes: int | None
    peak_flops: float
    expected_trials: int | None
    modes: list[str]
    rows: list[dict] = field(default_factory=list)

    def trial(self, input_mode: str, batch_size: int, phase: str) -> dict:
        """Measure one trial in its own process, record its row, rewrite the table."""
        spec = TrialSpec(self.workload.name, input_mode, batch_size, self.device, self.cfg,
                         self.threads, self.cap_bytes, self.dataset_dir, sys.stderr.isatty())
        preload = ("torchvision",) if self.workload.uses_torchvision else ()
        result = run_isolated(spec, preload)
        if result.refused:  # before its row is written: a refusal leaves no table behind
            raise BadInput(result.error)
        row = self.row(spec, result, phase)
        self.rows.append(row)
        write_table_atomic(self.out_path, make_table("sweep", self.rows, self.env))
        self.log(_progress_line(len(self.rows), self.expected_trials, row))
        return row

    def probe(self, batch_size: int, phase: str) -> str:
        """A trial seen by the largest-batch search."""
        status = self.trial(self.modes[0], batch_size, phase)["status"]
        if status == TrialStatus.OK:
            return FITS
        return DOES_NOT_FIT if status == TrialStatus.OOM else FAILED

    def row(self, spec: TrialSpec, result: TrialResult, phase: str) -> dict:
        row = {
            "input_mode": spec.input_mode, "batch_size": spec.batch_size,
            "status": result.status, "precision": self.cfg.precision, "timed_steps": 0,
            "peak_memory_bytes": result.peak_memory_bytes,
            "train_flops_per_sample": result.flops_per_sample,
            "peak_flops_per_s": self.peak_flops, "error": result.error,
            "memory_source": result.memory_source, "memory_cap_bytes": self.cap_bytes,
            "channels_last": self.cfg.channels_last, "compiled": self.cfg.torch_compile,
            "image_size_px": self.workload.input_shape[-1] if self.workload.is_image else None,
            "search_phase": phase,
        }
        times = result.times
        if times is not None:
            samples_per_s = spec.batch_size / times.median_s
            achieved = result.flops_per_sample * samples_per_s if result.flops_per_sample else None
            row.update({
                "timed_steps": len(times.seconds), "step_time_median_s": times.median_s,
                "step_time_p10_s": times.quantile_s(0.1),
                "step_time_p90_s": times.quantile_s(0.9), "step_time_cv": times.cv,
                "samples_per_s": samples_per_s, "achieved_flops_per_s": achieved,
                "mfu": achieved / self.peak_flops if achieved and self.peak_flops else None,
            })
        return row


def _progress_line(done: int, total: int | None, row: dict) -> str:
    head = (f"[{done}/{total if total else '?'}] {row['input_mode']:9s} batch "
            f"{row['batch_size']:6d}")
    if row["status"] != TrialStatus.OK:
        return f"{head}  {row['status']}: {row['error']}"
    memory = row["peak_memory_bytes"]
    return (f"{head}  {row['samples_per_s']:10.1f} samples/s  median step "
            f"{row['step_time_median_s'] * 1e3:9.3f} ms  cv {row['step_time_cv']:.3f}  "
            f"peak {memory / 2**20 if memory else float('nan'):8.1f} MiB")


# ------------------------------------------------------------------------------ the sweep
def input_modes(cfg: SweepConfig, workload: Workload, dataset_dir: str | None,
                log: Callable[[str], None]) -> list[str]:
    """The configured modes that can run: real needs a dataset whose examples fit the model."""
    modes = []
    for mode in cfg.input_modes:
        if mode == "real":
            reason = "no dataset given" if not dataset_dir else check_real_input(workload,
                                                                                dataset_dir)
            if reason:
                log(f"real input not timed: {reason}")
                continue
        modes.append(mode)
    if not modes:
        raise BadInput(f"sweep.input_modes {cfg.input_modes}: none can run here (real input "
                       "needs a prepared dataset matching the workload)")
    return modes


def sweep(cfg: SweepConfig, workload_name: str, env: dict, out_path: str | Path, *,
          dataset_dir: str | None = None, log: Callable[[str], None] = _stderr) -> list[dict]:
    """Measure every (input mode, batch size), or search for the largest batch when
    cfg.batch_sizes is "auto"; rewrite `out_path` after each trial. Bad input (unknown
    workload, unavailable device, unusable dataset) is refused before anything is written."""
    import torch

    workload = get_workload(workload_name, image_size=cfg.image_size_px)
    device = resolve_device(cfg.device)
    modes = input_modes(cfg, workload, dataset_dir, log)
    peak, peak_source = peak_flops_per_s(device, cfg.precision)
    cap = memory_cap_bytes(device, cfg)
    grid = cfg.batch_sizes != "auto"
    run = _Sweep(cfg, workload, device, env, Path(out_path), dataset_dir, log,
                 torch.get_num_threads(), cap, peak,
                 len(modes) * len(cfg.batch_sizes) if grid else None, modes)
    log(f"sweep {workload.name} on {device} ({cfg.precision}, {run.threads} threads); peak "
        f"{peak / 1e9:.1f} GFLOP/s ({peak_source}); memory cap "
        f"{'none' if cap is None else f'{cap / 2**30:.2f} GiB'}")
    if grid:
        for mode in modes:
            for batch_size in cfg.batch_sizes:
                run.trial(mode, batch_size, PHASE_GRID)
        return run.rows
    result = search_largest_batch(run.probe, max_batch=cfg.max_batch_size,
                                  tolerance=cfg.search_tolerance)
    log(search_line(result))
    fitting = sorted(r["batch_size"] for r in run.rows if r["status"] == TrialStatus.OK)
    for mode in modes[1:]:
        for batch_size in fitting:
            run.trial(mode, batch_size, PHASE_GRID)
    return run.rows


def search_line(result: SearchResult) -> str:
    return (f"largest batch that fits: {result.largest_fitting} (smallest failing: "
            f"{result.smallest_failing}); {result.trials} trials of at most "
            f"{result.trial_budget}; stopped: {result.stopped_by}")


def summarize(rows: list[dict], saturation_tolerance: float | None = None) -> dict:
    """Saturation batch (within `saturation_tolerance` of the best samples/s: the config's
    `analysis.saturation_tolerance`, its default when None), best throughput, measured and
    predicted largest batch under the rows' memory cap (the fits the analysis uses too, so
    the sweep and the report agree)."""
    import pandas as pd

    from batchscale.fits import (
        DEFAULT_SATURATION_TOLERANCE,
        fit_memory,
        largest_fitting_batch,
        saturation_batch,
        throughput_curve,
        timing_mode,
    )

    if saturation_tolerance is None:
        saturation_tolerance = DEFAULT_SATURATION_TOLERANCE
    table = pd.DataFrame(rows)
    mode = timing_mode(table)
    if mode is None:
        return {"timed": False}
    curve = throughput_curve(table, mode)
    best = curve.loc[curve["samples_per_s"].idxmax()]
    fit = fit_memory(curve["batch_size"], curve["peak_memory_bytes"],
                     table["memory_cap_bytes"].max())
    measured, measured_reason = largest_fitting_batch(table)
    return {
        "timed": True, "input_mode": mode,
        "saturation_batch": saturation_batch(table, saturation_tolerance, mode),
        "saturation_tolerance": saturation_tolerance,
        "best_samples_per_s": float(best["samples_per_s"]),
        "best_batch": int(best["batch_size"]), "best_mfu": float(best["mfu"]),
        "largest_fitting_batch": measured, "largest_fitting_reason": measured_reason,
        "memory_fixed_bytes": fit.fixed_bytes, "memory_per_sample_bytes": fit.per_sample_bytes,
        "memory_fit_r2": fit.r2, "predicted_largest_batch": fit.b_max,
        "predicted_reason": fit.reason,
    }


def summary_lines(summary: dict) -> list[str]:
    if not summary["timed"]:
        return ["no batch size was timed successfully"]
    mfu = summary["best_mfu"]
    return [
        f"best: {summary['best_samples_per_s']:.1f} samples/s at batch {summary['best_batch']} "
        f"({f'MFU {mfu:.2%}' if _finite(mfu) else 'MFU not known'}); the device saturates at "
        f"batch ≈ {summary['saturation_batch']} (smallest batch within "
        f"{summary['saturation_tolerance']:.0%} of the best, {summary['input_mode']} input)",
        _memory_line(summary),
        _measured_wall_line(summary),
    ]


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


def _memory_line(summary: dict) -> str:
    """The memory model, or why there is none (one batch size, no measured peaks) instead of
    NaN figures."""
    if not (_finite(summary["memory_fixed_bytes"])
            and _finite(summary["memory_per_sample_bytes"])):
        return f"memory: no model fitted ({summary['predicted_reason']})"
    line = (f"memory: peak ≈ {summary['memory_fixed_bytes'] / 2**20:.1f} MiB + "
            f"{summary['memory_per_sample_bytes'] / 2**10:.1f} KiB × batch "
            f"(r² {summary['memory_fit_r2']:.3f}); predicted largest batch under the cap: ")
    predicted = summary["predicted_largest_batch"]
    if not _finite(predicted):
        return line + f"none ({summary['predicted_reason']})"
    return (line + f"{predicted:.0f} {summary['predicted_reason']}").rstrip()


def _measured_wall_line(summary: dict) -> str:
    measured, reason = summary["largest_fitting_batch"], summary["largest_fitting_reason"]
    if measured == math.inf:
        return f"largest batch measured to fit: no wall found ({reason})"
    if not _finite(measured):
        return f"largest batch measured to fit: none ({reason})"
    return f"largest batch measured to fit: {measured:.0f} ({reason})"


def run_stage(config_json: str, run_id: str, dataset_dir: str | None, out_path: str) -> list[dict]:
    """Pipeline/CLI entry: sweep the configured workload, real input from `dataset_dir`."""
    from batchscale.config import config_from_json
    from batchscale.envinfo import environment

    cfg = config_from_json(config_json)
    device = resolve_device(cfg.sweep.device)
    env = environment(run_id=run_id, config_hash=cfg.config_hash, experiment=cfg.name,
                      workload=cfg.workload, device=device)
    rows = sweep(cfg.sweep, cfg.workload, env, out_path, dataset_dir=dataset_dir)
    for line in summary_lines(summarize(rows, cfg.analysis.saturation_tolerance)):
        _stderr(line)
    return rows
