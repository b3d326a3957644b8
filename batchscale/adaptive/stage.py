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
    fitted in the sweep (`sweep_path`, the validated sweep table), where it found one. A
    batch size at which the sweep saw the workload's own code raise on real input is refused
    before any trial trains (`refuse_failed_batches`)."""
    cfg = stage_config(config)
    sizes = (cfg.convergence.batch_sizes if batch_sizes == ADAPTIVE_CELL
             else runner.parse_batch_sizes(batch_sizes))
    refuse_failed_batches(sweep_path, sizes)
    if batch_sizes != ADAPTIVE_CELL:
        runner.run_stage(config, run_id, batch_sizes, workers, dataset_dir, curves_path,
                         runs_path)
        write_table_atomic(decisions_path, make_table("decisions", [], {}))
        return
    from batchscale.adaptive.driver import run_adaptive

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


def refuse_failed_batches(sweep_path: str | None, batch_sizes: list[int]) -> None:
    """Raise BadInput, naming the batch sizes and the workload's error, where the sweep's real
    input rows at any of `batch_sizes` raised in the workload's code: every trial there would
    raise it again, after the trials before it had trained. A trial process that died without
    a result (the machine, not the code) is left to the trials."""
    from batchscale import schemas
    from batchscale.errors import BadInput
    from batchscale.fits import ensure_columns, matches
    from batchscale.storage import read_table_file

    if sweep_path is None:
        return
    sweep = ensure_columns(read_table_file(sweep_path).to_pandas(), schemas.SWEEP)
    died = schemas.DIED_WITHOUT_RESULT
    raised = sweep[matches(sweep, "status", schemas.TrialStatus.ERROR)
                   & matches(sweep, "input_mode", "real")
                   & sweep["batch_size"].isin(batch_sizes)
                   & ~sweep["error"].fillna(died).str.contains(died, regex=False)]
    if raised.empty:
        return
    failed = sorted(int(b) for b in raised["batch_size"].unique())
    first = raised.sort_values("batch_size").iloc[0]
    left = [b for b in batch_sizes if b not in failed]
    keep = (f"leave {_sizes(failed)} out (convergence.batch_sizes, --batch-sizes "
            f"{' '.join(map(str, left))})" if left else "use batch sizes it accepts")
    raise BadInput(
        f"the throughput sweep found the workload's code failing at batch size "
        f"{_sizes(failed)} on real input (batch {int(first['batch_size'])}: {first['error']}); "
        f"every convergence trial there would fail the same way, so none was started. Fix the "
        f"workload so it takes those batches, or {keep}.")


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes))
