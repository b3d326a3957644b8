"""convergence core: build the trial spec for some batch sizes and run it with torchrun.

Locally the trials of one call run in one `torchrun --standalone` process group, one trial after
another (measurements never overlap). On Kubernetes the same spec and entry point run as a
Kubeflow Trainer TrainJob (see trainjob.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
from batchscale.components.convergence import train

from batchscale.config import ExperimentConfig
from batchscale.errors import BatchscaleError
from batchscale.storage import read_table_file

ENTRY_POINT = Path(train.__file__)
# torchrun restarts the whole group this many times after a worker dies; trials resume from
# their last checkpoint.
MAX_RESTARTS = 2


def trial_id(batch_size: int, rule: str, seed: int, workers: int) -> str:
    return f"b{batch_size}-{rule}-s{seed}-w{workers}"


def build_spec(cfg: ExperimentConfig, batch_sizes: list[int], *, data_dir: str, out_dir: str,
               run_id: str, workers: int | None = None) -> dict:
    c = cfg.convergence
    workers = workers or c.workers
    trials = [
        {"trial_id": trial_id(b, rule, seed, workers), "batch_size": b, "lr_rule": rule,
         "lr": train.scaled_lr(rule, c.base_lr, b, c.reference_batch_size), "seed": seed}
        for b in batch_sizes for rule in c.lr_rules for seed in c.seeds
    ]
    return {
        "run_id": run_id, "config_hash": cfg.config_hash, "experiment": cfg.name,
        "workload": cfg.workload, "data_dir": str(data_dir), "out_dir": str(out_dir),
        "workers": workers, "momentum": c.momentum, "warmup_steps": c.warmup_steps,
        "target_val_accuracy": c.target_val_accuracy, "max_steps": c.max_steps,
        "eval_every_steps": c.eval_every_steps, "divergence_factor": c.divergence_factor,
        "patience_evals": c.patience_evals,
        "gns_every_steps": c.gns_every_steps,
        "checkpoint_every_steps": c.checkpoint_every_steps, "trials": trials,
    }


def torchrun_command(spec_path: Path, workers: int, max_restarts: int = MAX_RESTARTS) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc-per-node={workers}", f"--max-restarts={max_restarts}",
            str(ENTRY_POINT), "--spec", str(spec_path)]


def torchrun_env(workers: int) -> dict:
    env = dict(os.environ)
    # torchrun only sets OMP_NUM_THREADS for nproc > 1; set it always so ranks share the cores
    # evenly instead of oversubscribing them.
    env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    return env


def launch_local(spec: dict, timeout_s: float) -> None:
    out_dir = Path(spec["out_dir"])
    out_dir.mkdir(parents=True, exist_ok=True)
    spec_path = out_dir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    cmd = torchrun_command(spec_path, spec["workers"])
    try:
        proc = subprocess.run(cmd, env=torchrun_env(spec["workers"]), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BatchscaleError(f"convergence trials timed out after {timeout_s:.0f} s; finished "
                              f"trials are kept in {out_dir / 'trials'}") from None
    if proc.returncode != 0:
        raise BatchscaleError(f"torchrun exited with status {proc.returncode}; finished trials "
                              f"are kept in {out_dir / 'trials'}")


def collect(spec: dict) -> tuple[pa.Table, pa.Table]:
    """(curves, runs) of every trial in the spec, read from the trial files."""
    out_dir = Path(spec["out_dir"])
    curves, runs = [], []
    for t in spec["trials"]:
        curves_path, run_path = train.trial_files(out_dir, t["trial_id"])
        curves.append(read_table_file(curves_path))
        runs.append(read_table_file(run_path))
    return pa.concat_tables(curves), pa.concat_tables(runs)


def run_convergence(cfg: ExperimentConfig, batch_sizes: list[int], *, data_dir: str,
                    out_dir: str, run_id: str, workers: int | None = None):
    spec = build_spec(cfg, batch_sizes, data_dir=data_dir, out_dir=out_dir, run_id=run_id,
                      workers=workers)
    launch_local(spec, cfg.convergence.timeout_s)
    return collect(spec)


def work_dir(run_id: str, batch_size: int, workers: int) -> Path:
    """Where trials keep checkpoints and finished results: stable for a run id, so running the
    same run again resumes instead of starting over."""
    root = Path(os.environ.get("BATCHSCALE_WORK_DIR", Path.cwd() / ".batchscale" / "work"))
    return root / run_id / f"convergence-b{batch_size}-w{workers}"


def run_stage(config_json: str, run_id: str, batch_size: int, workers: int, dataset_dir: str,
              curves_path: str, runs_path: str) -> None:
    """Pipeline entry: train every (LR rule, seed) at one batch size; write the two tables."""
    from batchscale.config import config_from_json
    from batchscale.storage import write_table_atomic

    cfg = config_from_json(config_json)
    curves, runs = run_convergence(cfg, [batch_size], data_dir=dataset_dir,
                                   out_dir=str(work_dir(run_id, batch_size, workers)),
                                   run_id=run_id, workers=workers)
    write_table_atomic(curves_path, curves)
    write_table_atomic(runs_path, runs)
