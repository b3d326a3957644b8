"""Pipeline entry of a convergence cell: the grid's batch sizes (convergence.runner) or the
adaptive search (driver.py), writing curves, runs and the search's decisions (empty for a grid
cell, so every cell has the same outputs)."""

from __future__ import annotations

from batchscale.config.convergence import ADAPTIVE_CELL
from batchscale.config.stage_inputs import Config, stage_config
from batchscale.convergence import runner
from batchscale.schemas import make_table
from batchscale.storage import write_table_atomic


def run_stage(config: str | Config, run_id: str, batch_sizes: str, workers: int, dataset_dir: str,
              curves_path: str, runs_path: str, decisions_path: str,
              sweep_path: str | None = None) -> None:
    """One convergence cell; the adaptive search places its batch sizes within the largest that
    fitted in the sweep (`sweep_path`, the validated sweep table), where it found one."""
    if batch_sizes != ADAPTIVE_CELL:
        runner.run_stage(config, run_id, batch_sizes, workers, dataset_dir, curves_path,
                         runs_path)
        write_table_atomic(decisions_path, make_table("decisions", [], {}))
        return
    from batchscale.adaptive.driver import run_adaptive

    cfg = stage_config(config)
    curves, runs, decisions = run_adaptive(cfg, data_dir=dataset_dir, run_id=run_id,
                                           workers=workers,
                                           largest_batch=largest_batch(sweep_path))
    write_table_atomic(curves_path, curves)
    write_table_atomic(runs_path, runs)
    write_table_atomic(decisions_path, decisions)


def largest_batch(sweep_path: str | None) -> int | None:
    """The largest batch that fitted in the sweep's memory (its OOM boundary); None without a
    sweep or an OOM (every batch the sweep tried fitted: nothing to clip at)."""
    import math

    from batchscale import schemas
    from batchscale.fits import ensure_columns, largest_fitting_batch
    from batchscale.storage import read_table_file

    if sweep_path is None:
        return None
    sweep = ensure_columns(read_table_file(sweep_path).to_pandas(), schemas.SWEEP)
    largest, _ = largest_fitting_batch(sweep)
    return int(largest) if math.isfinite(largest) else None
