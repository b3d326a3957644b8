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
    sweep = _read_sweep(sweep_path)
    refuse_failed_batches(sweep, sizes, cfg, workers)
    if batch_sizes != ADAPTIVE_CELL:
        runner.run_stage(config, run_id, batch_sizes, workers, dataset_dir, curves_path,
                         runs_path)
        write_table_atomic(decisions_path, make_table("decisions", [], {}))
        return
    from batchscale.adaptive.driver import run_adaptive

    curves, runs, decisions = run_adaptive(cfg, data_dir=dataset_dir, run_id=run_id,
                                           workers=workers,
                                           largest_batch=largest_batch(sweep))
    write_table_atomic(curves_path, curves)
    write_table_atomic(runs_path, runs)
    write_table_atomic(decisions_path, decisions)


def _read_sweep(sweep_path: str | None):
    """The validated sweep table with every column of its schema; None without one."""
    from batchscale import schemas
    from batchscale.fits import ensure_columns
    from batchscale.storage import read_table_file

    if sweep_path is None:
        return None
    return ensure_columns(read_table_file(sweep_path).to_pandas(), schemas.SWEEP)


def largest_batch(sweep) -> int | None:
    """The largest batch that fitted in the sweep's memory (its OOM boundary); None without a
    sweep or an OOM (every batch the sweep tried fitted: nothing to clip at)."""
    import math

    from batchscale.fits import largest_fitting_batch

    if sweep is None:
        return None
    largest, _ = largest_fitting_batch(sweep)
    return int(largest) if math.isfinite(largest) else None


def refuse_failed_batches(sweep, batch_sizes: list[int], cfg, workers: int) -> None:
    """Raise BadInput, naming the batch sizes and the workload's error, where the sweep (the
    table `_read_sweep` gives; None: none) saw the workload's own code raise on real input at
    the per-device batch a trial of `batch_sizes` trains on (global batch ÷ workers ÷
    accumulation steps): every trial there would raise it again, after the trials before it
    had trained. Only an error that names a line of the user's code (`errors.error_site`), at
    a batch the sweep never timed, measured as the trials train (no torch.compile, no
    channels_last, the trials' precision): anything else (the machine, a library, a path only
    the sweep takes) is left to the trials."""
    from batchscale import schemas
    from batchscale.errors import BadInput
    from batchscale.fits import matches, own_code_errors

    if sweep is None:
        return
    c = cfg.convergence
    timed_before = sweep["error"].map(lambda e: isinstance(e, str)
                                      and schemas.TIMED_BEFORE in e).to_numpy(dtype=bool)
    raised = sweep[own_code_errors(sweep)
                   & matches(sweep, "input_mode", "real")
                   & ~timed_before
                   & (sweep["compiled"] != True)  # noqa: E712 (null: not compiled)
                   & (sweep["channels_last"] != True)  # noqa: E712
                   & matches(sweep, "precision", c.precision)]
    per_device = {b: b // (workers * c.accumulation_steps) for b in batch_sizes
                  if b % (workers * c.accumulation_steps) == 0}
    failed = sorted(b for b, device in per_device.items()
                    if (raised["batch_size"] == device).any())
    if not failed:
        return
    first = raised[raised["batch_size"] == per_device[failed[0]]].iloc[0]
    device = (f" ({int(first['batch_size'])} per device)" if per_device[failed[0]] != failed[0]
              else "")
    left = [b for b in c.batch_sizes if b not in failed]
    keep = (f"leave {_sizes(failed)} out of convergence.batch_sizes ({left})" if left
            else "give convergence.batch_sizes sizes it accepts")
    raise BadInput(
        f"the throughput sweep found the workload's code failing on real input at "
        f"convergence.batch_sizes {_sizes(failed)} (batch {failed[0]}{device}: "
        f"{first['error']}); every trial there would fail the same way, so none was started. "
        f"Fix the workload so it takes those batches, or {keep}.")


def _sizes(sizes: list[int]) -> str:
    return ", ".join(map(str, sizes))
