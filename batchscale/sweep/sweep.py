"""throughput_sweep core: samples/s, step-time spread, peak memory and MFU per batch size.

One trial = one (input mode, batch size) timed once, in its own process (isolation.py,
trial.py). Trials run one at a time (measurements never overlap), in interleaved rounds
(rounds.py: ascending, then descending, ...; the first round of an "auto" sweep is the
largest-batch search, search.py), then retries of the rows whose rounds disagree or whose steps
scatter. A row combines its cell's trials (cells.py). The table is rewritten atomically after
every trial, so a sweep interrupted with Ctrl-C keeps every row it measured.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from batchscale.conditions import busy_warning, host_conditions, wait_for_idle_cpus
from batchscale.config import SweepConfig
from batchscale.errors import BadInput, BatchscaleError
from batchscale.schemas import Quality, TrialStatus, make_table, not_measured_table
from batchscale.storage import write_table_atomic
from batchscale.sweep.cells import SweepCell, measured_columns, sweep_floor
from batchscale.sweep.isolation import run_isolated
from batchscale.sweep.rounds import trial_min_time_s, trial_share, visit_order
from batchscale.sweep.search import (
    DOES_NOT_FIT,
    FAILED,
    FITS,
    SearchResult,
    search_largest_batch,
)
from batchscale.sweep.summary import summarize, summary_lines
from batchscale.sweep.trial import SweepTrial
from batchscale.workloads import Workload, get_workload

if TYPE_CHECKING:
    from batchscale.config.stage_inputs import Config

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
PHASE_LISTED = "listed"
"""A batch size the config lists (sweep.batch_sizes), as opposed to one the largest-batch
search (batch_sizes: auto) tried while doubling or bisecting; "grid" in rows written before."""
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
    if math.prod(shape) != math.prod(workload.example_shape):
        return (f"dataset examples have shape {shape}; {workload.name} takes "
                f"{workload.example_shape} ({workload.kind.replace('_', ' ')})")
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
    times = time_steps(lambda: a @ b, device=device, untimed_steps=PEAK_MATMUL_WARMUP,
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
    """One sweep's fixed context and its cells (one table row each, in first-measured order)."""

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
    planned_trials: int | None
    modes: list[str]
    cells: dict[tuple[str, int], SweepCell] = field(default_factory=dict)
    trials_run: int = 0
    gpu_warned: bool = False

    @property
    def rows(self) -> list[dict]:
        """Every cell's row, in `cells` order; each input mode's floor (`sweep_floor`)
        computed once, not once per row: it judges every cell of the mode."""
        cfg, cells = self.cfg, self.cells.values()
        floors = {mode: sweep_floor(cells, mode, cfg.max_round_spread, cfg.max_cv)
                  for mode in {c.input_mode for c in cells}}
        return [self.row(cell, floors[cell.input_mode]) for cell in cells]

    def trial(self, input_mode: str, batch_size: int, phase: str, label: str, *,
              retry: bool = False) -> SweepCell:
        """Measure one trial in its own process, add it to its cell, rewrite the table. Each
        trial gets its row's budget split over the rounds (warm-up is per trial)."""
        cfg = self.cfg
        spec = SweepTrial(self.workload.name, input_mode, batch_size, self.device,
                         trial_share(cfg), self.threads, self.cap_bytes, self.dataset_dir,
                         sys.stderr.isatty(), min_time_s=trial_min_time_s(cfg),
                         own_pids=(os.getpid(),))
        preload = ("torchvision",) if self.workload.uses_torchvision else ()
        before = host_conditions(self.threads)
        result = run_isolated(spec, preload)
        if result.refused:  # before its row is written: a refusal leaves no table behind
            raise BadInput(result.error)
        cell = self.cells.setdefault((input_mode, batch_size),
                                     SweepCell(input_mode, batch_size, phase,
                                          overload_share=_off_as_inf(cfg.overload_cpu_share),
                                          wait_share=_off_as_inf(cfg.max_cpu_wait_share),
                                          between_sweep_cv=cfg.between_sweep_cv))
        cell.add(result, before, label, retry=retry)
        self.trials_run += 1
        rows = self.rows
        row = rows[list(self.cells).index((input_mode, batch_size))]
        write_table_atomic(self.out_path, make_table("sweep", rows, self.env))
        self.log(progress_line(self.trials_run, self.planned_trials, label, row))
        self._warn_gpu_once(row)
        return cell

    def probe(self, batch_size: int, phase: str) -> str:
        """A trial seen by the largest-batch search (the first round)."""
        cell = self.trial(self.modes[0], batch_size, phase, self.round_label(0))
        if cell.timed:
            return FITS
        return DOES_NOT_FIT if cell.failure.status == TrialStatus.OOM else FAILED

    def round_label(self, round_index: int) -> str:
        return f"round {round_index + 1}/{self.cfg.rounds}"

    def ordered_cells(self) -> list[SweepCell]:
        """Every cell, ascending: input mode as configured, then batch size."""
        return sorted(self.cells.values(),
                      key=lambda c: (self.modes.index(c.input_mode), c.batch_size))

    def remeasure_rounds(self, first_round: int) -> None:
        """Rounds `first_round`.. over the cells timed so far (failed ones are not measured
        again), each in its round's order."""
        for r in range(first_round, self.cfg.rounds):
            for cell in visit_order(self.ordered_cells(), r):
                if cell.timed:
                    self.trial(cell.input_mode, cell.batch_size, cell.phase, self.round_label(r))

    def retry_unstable(self) -> None:
        """Re-measure unstable rows, one more trial per pass, at most max_retries passes; the
        passes alternate direction like the rounds, so a burst does not hit one row's retries."""
        cfg = self.cfg
        for attempt in range(1, cfg.max_retries + 1):
            unstable = [c for c in self.ordered_cells()
                        if c.timed and c.quality(cfg.max_round_spread, cfg.max_cv)[0]
                        == Quality.UNSTABLE]
            if unstable and cfg.idle_wait_s > 0:
                self.wait_for_idle(len(unstable))
            for cell in visit_order(unstable, cfg.rounds + attempt - 1):
                self.trial(cell.input_mode, cell.batch_size, cell.phase,
                           f"retry {attempt}/{cfg.max_retries}", retry=True)

    def wait_for_idle(self, unstable: int) -> None:
        """Give a neighbour that disturbed the rows time to go before they are re-measured."""
        self.log(f"sweep: {unstable} unstable row(s) to re-measure; waiting up to "
                 f"{self.cfg.idle_wait_s:g} s for the CPUs to be idle (sweep.idle_wait_s)")
        idle, waited_s, share = wait_for_idle_cpus(self.cfg.idle_wait_s)
        busy = "" if share is None else f" (others kept them {share:.0%} busy)"
        if idle:
            self.log(f"sweep: the CPUs are idle after {waited_s:.0f} s")
        else:
            self.log(f"sweep: the CPUs are still busy after {waited_s:.0f} s{busy}; "
                     f"re-measuring {unstable} unstable row(s) anyway")

    def row(self, cell: SweepCell, floor_log_sd: float) -> dict:
        cfg = self.cfg
        measured = measured_columns(cell, cfg.max_round_spread, cfg.max_cv, self.peak_flops,
                                    floor_log_sd)
        tokens = self.workload.tokens_per_sample
        return {
            # the trials' threads, over the environment's (this process's)
            "threads": self.threads,
            "precision": cfg.precision, "peak_flops_per_s": self.peak_flops,
            "memory_cap_bytes": self.cap_bytes, "channels_last": cfg.channels_last,
            "compiled": cfg.torch_compile,
            "image_size_px": self.workload.input_shape[-1] if self.workload.is_image else None,
            "tokens_per_s": measured["samples_per_s"] * tokens
            if tokens and measured.get("samples_per_s") else None,
            **measured,
        }

    def _warn_gpu_once(self, row: dict) -> None:
        """Other processes on the GPU are only seen from inside a trial: warn at the first."""
        if row.get("gpu_other_processes") and not self.gpu_warned:
            self.gpu_warned = True
            self.log(busy_warning({**row, "load_avg_1m": None,
                                   "threads_oversubscribed": False}, self.threads))


def _off_as_inf(threshold: float | None) -> float:
    """A quality threshold from the config; off (None) never flags a row."""
    return math.inf if threshold is None else threshold


def progress_line(done: int, planned: int | None, label: str, row: dict) -> str:
    """The row as the table now holds it, after trial `done` (`label`: its round or retry)."""
    counter = f"[{done}/{planned}]" if planned and done <= planned else f"[{done}]"
    head = (f"{counter} {label:11s} {row['input_mode']:9s} batch {row['batch_size']:6d}")
    if row["status"] != TrialStatus.OK:
        return f"{head}  {row['status']}: {row['error']}"
    memory = row["peak_memory_bytes"]
    spread = row["round_spread"]
    spread_text = "  n/a" if spread is None else f"{spread:5.1%}"
    quality = ("ok" if row["quality"] == Quality.OK
               else f"UNSTABLE: {row['quality_reason']}")
    return (f"{head}  {row['samples_per_s']:10.1f} samples/s {rerun_text(row)}  median step "
            f"{row['step_time_median_s'] * 1e3:9.3f} ms  cv {row['step_time_cv']:.3f}  "
            f"spread {spread_text} {_spread_over(row['rounds'] + row['retries'])}  "
            f"peak {memory / 2**20 if memory else float('nan'):8.1f} MiB  {quality}")


def _spread_over(trials: int) -> str:
    """Which trials the spread is over: all of them, or after a re-measurement their closest
    majority (sweep/rounds.py: one disturbed trial is outvoted; the rerun interval keeps it)."""
    closest = trials // 2 + 1
    return (f"over {trials} trial(s)" if trials <= 2 or closest == trials
            else f"(closest {closest} of {trials} trials)")


def rerun_text(row: dict) -> str:
    """The row's rerun interval, "[low, high]", or why it has none."""
    low, high = row.get("samples_per_s_low"), row.get("samples_per_s_high")
    if low is None or high is None:
        return "[no rerun interval: too few steps, or its or its sweep's trials over 10x apart]"
    return f"[{low:.1f}, {high:.1f}]"


# ------------------------------------------------------------------------------ the sweep
def input_modes(cfg: SweepConfig, workload: Workload, dataset_dir: str | None,
                log: Callable[[str], None]) -> list[str]:
    """The configured modes that can run: real needs a dataset whose examples fit the model."""
    modes = []
    for mode in cfg.input_modes:
        if mode == "real" and not workload.has_own_data:
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

    from batchscale.contract_check import check_workload

    workload = get_workload(workload_name, image_size=cfg.image_size_px,
                            seq_len=cfg.sequence_length_tokens)
    device = resolve_device(cfg.device)
    check_workload(workload, batch_sizes=cfg.batch_sizes if "real" in cfg.input_modes else (),
                   probe_synthetic=True)
    modes = input_modes(cfg, workload, dataset_dir, log)
    peak, peak_source = peak_flops_per_s(device, cfg.precision)
    cap = memory_cap_bytes(device, cfg)
    grid = cfg.batch_sizes != "auto"
    run = _Sweep(cfg, workload, device, env, Path(out_path), dataset_dir, log,
                 cfg.threads or torch.get_num_threads(), cap, peak,
                 len(modes) * len(cfg.batch_sizes) * cfg.rounds if grid else None, modes)
    threads = f"{run.threads} thread{'s' if run.threads != 1 else ''}"
    log(f"sweep {workload.name} on {device} ({cfg.precision}, {threads}); peak "
        f"{peak / 1e9:.1f} GFLOP/s ({peak_source}); memory cap "
        f"{'none' if cap is None else f'{cap / 2**30:.2f} GiB'}; {cfg.rounds} round(s) per "
        f"row of at most {trial_share(cfg).time_budget_s:g} s each, up to {cfg.max_retries} "
        f"retries of rows "
        f"whose rounds disagree by more than {cfg.max_round_spread:.0%} or whose CV exceeds "
        f"{cfg.max_cv:g}")
    warning = busy_warning(host_conditions(run.threads), run.threads)
    if warning:
        log(warning)
    if grid:
        for mode, batch_size in [(m, b) for m in modes for b in cfg.batch_sizes]:
            run.trial(mode, batch_size, PHASE_LISTED, run.round_label(0))
    else:
        _search_first_round(run)
    run.remeasure_rounds(1)
    run.retry_unstable()
    return run.rows


def _search_first_round(run: _Sweep) -> None:
    """Round 1 of an "auto" sweep: the search (within its trial bound) on the first input mode,
    then the batches that fit in the other modes. Later rounds re-measure what fit; they never
    search again."""
    cfg = run.cfg
    result = search_largest_batch(run.probe, max_batch=cfg.max_batch_size,
                                  tolerance=cfg.search_tolerance)
    run.log(search_line(result))
    fitting = sorted(c.batch_size for c in run.cells.values() if c.timed)
    for mode in run.modes[1:]:
        sizes = fitting
        if mode == "real":
            rows = _training_rows(run)
            sizes = [b for b in fitting if b <= rows]
            if beyond := [b for b in fitting if b > rows]:
                run.log(f"real input not timed at batch {', '.join(map(str, beyond))}: the "
                        f"training split has {rows:,} examples, fewer than one batch")
        for batch_size in sizes:
            run.trial(mode, batch_size, PHASE_LISTED, run.round_label(0))


def _training_rows(run: _Sweep) -> int:
    """Examples in the training split that real input reads (a search finds batches past it,
    which real input cannot fill): a prepared dataset's from its manifest, without reading its
    shards; a workload's own dataset's from its length."""
    from batchscale.contract_check import load_split
    from batchscale.shards import read_manifest

    if run.workload.has_own_data:
        return len(load_split(run.workload.contract_for(), "train"))
    return sum(int(entry["rows"]) for entry in read_manifest(run.dataset_dir).to_pylist()
               if entry["split"] == "train")


def search_line(result: SearchResult) -> str:
    failing = (f"smallest failing: {result.smallest_failing}"
               if result.smallest_failing is not None else "none failed")
    return (f"largest batch that fits: {result.largest_fitting} ({failing}); {result.trials} "
            f"trials of at most {result.trial_budget}; stopped: {result.stopped_by}")


def run_stage(config: str | Config, run_id: str, dataset_dir: str | None,
              out_path: str) -> list[dict]:
    """CLI entry (`batchscale sweep`): sweep the configured workload, real input from
    `dataset_dir`; a TrainingLoop is refused (BadInput), as there is nothing to time."""
    from batchscale.config.stage_inputs import stage_config

    cfg = stage_config(config)
    env = _environment(cfg, run_id)
    rows = sweep(cfg.sweep, cfg.workload, env, out_path, dataset_dir=dataset_dir)
    for line in summary_lines(summarize(rows, cfg.analysis.saturation_tolerance,
                                        cfg.sweep.between_sweep_cv)):
        _stderr(line)
    if rows and not any(row["status"] == TrialStatus.OK for row in rows):
        raise BatchscaleError(f"no batch size of {cfg.workload} was timed: "
                              f"{_failure_reasons(rows)} (rows written to {out_path})")
    return rows


def pipeline_stage(config: str | Config, run_id: str, dataset_dir: str | None,
                   out_path: str) -> list[dict]:
    """The pipeline's sweep stage: `run_stage`, except that a TrainingLoop gets an empty
    sweep table saying why, so the stages after it run on its trials alone."""
    from batchscale.config.stage_inputs import stage_config

    cfg = stage_config(config)
    workload = get_workload(cfg.workload, image_size=cfg.sweep.image_size_px,
                            seq_len=cfg.sweep.sequence_length_tokens)
    if workload.loop is not None:
        return _no_sweep_of_a_loop(workload, _environment(cfg, run_id), out_path)
    return run_stage(cfg, run_id, dataset_dir, out_path)


def _environment(cfg, run_id: str) -> dict:
    from batchscale.envinfo import environment

    return environment(run_id=run_id, config_hash=cfg.config_hash, experiment=cfg.name,
                       workload=cfg.workload, device=resolve_device(cfg.sweep.device),
                       variant=cfg.variant)


LOOP_NOT_SWEPT = ("no throughput sweep: {name} is a TrainingLoop, whose steps batchscale "
                  "never sees to time; the analysis takes t(B) from the trials' own step times")
"""What a pipeline's sweep stage says, and writes an empty table, for a user's own loop."""


def _no_sweep_of_a_loop(workload: Workload, env: dict, out_path: str) -> list[dict]:
    """The pipeline's sweep stage for a TrainingLoop: an empty sweep table (the stages after it
    read no rows as "no sweep given") and one line saying why."""
    reason = LOOP_NOT_SWEPT.format(name=workload.name)
    write_table_atomic(out_path, not_measured_table("sweep", env, reason))
    _stderr(reason)
    return []


def _failure_reasons(rows: list[dict]) -> str:
    """What kept the rows from being timed, each distinct reason once with its batch sizes."""
    reasons: dict[str, list[int]] = {}
    for row in rows:
        why = row.get("error") or row["status"]
        reasons.setdefault(str(why), []).append(row["batch_size"])
    return "; ".join(f"batch {', '.join(map(str, sorted(set(sizes))))}: {why}"
                     for why, sizes in reasons.items())
