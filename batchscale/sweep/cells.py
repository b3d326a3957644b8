"""One sweep-table row per (input mode, batch size) cell, built from every trial of that cell.

A cell collects its trials (one per round, then any retries, see rounds.py) and the conditions
each ran under. Its row is rebuilt after every trial, so the table written after any trial (and
so after a Ctrl-C) holds each cell as far as it was measured: a cell timed in round 1 only has
`rounds = 1` and no `round_spread`.

A trial that fails (out of memory, an error) ends the cell: it is not measured again, and a cell
that had been timed in earlier rounds becomes that failure (a batch that fits only sometimes
does not fit), its error text saying what the earlier rounds had timed.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from batchscale.conditions import others_load, overloaded, starved
from batchscale.schemas import TIMED_BEFORE, Quality, TrialStatus
from batchscale.sweep.rounds import Combined, Overload, combine, judge, pooled_log_sd
from batchscale.sweep.trial import TrialResult
from batchscale.timing import StepTimes

# How each condition column combines over a cell's trials: the worst any trial saw.
WORST_OF = {"load_avg_1m": max, "usable_cpus": min, "threads_oversubscribed": any,
            "gpu_other_processes": max, "gpu_sm_clock_mhz": min, "gpu_temperature_c": max}


@dataclass
class SweepCell:
    """The trials of one (input mode, batch size)."""

    input_mode: str
    batch_size: int
    phase: str
    """The search phase of its first trial (listed, doubling, bisection)."""
    trials: list[StepTimes] = field(default_factory=list)
    rounds: int = 0
    retries: int = 0
    conditions: list[dict] = field(default_factory=list)
    peak_memory_bytes: int | None = None
    memory_source: str | None = None
    flops_per_sample: float | None = None
    failure: TrialResult | None = None
    failure_label: str = ""
    overload: Overload = Overload()
    overload_share: float | None = None
    """sweep.overload_cpu_share (inf when the check is off); None: conditions' default."""
    wait_share: float | None = None
    """sweep.max_cpu_wait_share (inf when the check is off); None: conditions' default."""
    between_sweep_cv: float = 0.0
    """sweep.between_sweep_cv: the drift between sweeps its rerun interval adds."""

    @property
    def timed(self) -> bool:
        """Timed, and no trial of it failed: it can be measured again."""
        return self.failure is None and bool(self.trials)

    def add(self, result: TrialResult, conditions: dict, label: str, *, retry: bool) -> None:
        """Record one trial (`label` says which: "round 2/2", "retry 1/2")."""
        self.conditions.append({**conditions, **result.gpu_conditions})
        if result.status != TrialStatus.OK:
            self.failure, self.failure_label = result, label
            return
        self.trials.append(result.times)
        self._count_overload(conditions, result.times)
        if retry:
            self.retries += 1
        else:
            self.rounds += 1
        peaks = [p for p in (self.peak_memory_bytes, result.peak_memory_bytes) if p is not None]
        self.peak_memory_bytes = max(peaks) if peaks else None  # a peak is the highest seen
        self.memory_source = result.memory_source
        self.flops_per_sample = result.flops_per_sample

    def _count_overload(self, conditions: dict, times: StepTimes) -> None:
        load, usable = conditions.get("load_avg_1m"), conditions.get("usable_cpus")
        cpu_per_wall, wait = times.cpu_per_wall, times.cpu_wait_share
        if overloaded(load, cpu_per_wall, usable, self.overload_share):
            others = max(self.overload.others_load, others_load(load, cpu_per_wall))
            self.overload = replace(self.overload, trials=self.overload.trials + 1,
                                    others_load=others, usable_cpus=usable)
        if starved(wait, self.wait_share):
            self.overload = replace(self.overload,
                                    starved_trials=self.overload.starved_trials + 1,
                                    cpu_wait_share=max(self.overload.cpu_wait_share, wait))

    def combined(self, floor_log_sd: float = 0.0) -> Combined | None:
        """The row's figures; `floor_log_sd` floors its rerun interval's disagreement
        (`sweep_floor`)."""
        return (combine(self.trials, self.between_sweep_cv, floor_log_sd) if self.timed
                else None)

    def quality(self, max_round_spread: float, max_cv: float) -> tuple[str | None, str | None]:
        """(quality, reason) judged on the trials so far; (None, None) when not timed."""
        combined = self.combined()
        if combined is None:
            return None, None
        return judge(combined, max_round_spread=max_round_spread, max_cv=max_cv,
                     overload=self.overload)


def sweep_floor(cells: Iterable[SweepCell], input_mode: str, max_round_spread: float,
                max_cv: float) -> float:
    """The floor of the rerun interval of `input_mode`'s rows (rounds.pooled_log_sd): the
    disagreement of every trial of the timed rows of that mode not judged unstable. An unstable
    row is left out, as the analysis leaves it out: one burst of load there should not widen
    every row. A re-measured row that became stable keeps all its trials, the outvoted one
    too: it ran in this sweep, and its own interval keeps it as well."""
    return pooled_log_sd(c.trials for c in cells
                         if c.input_mode == input_mode and c.timed
                         and c.quality(max_round_spread, max_cv)[0] != Quality.UNSTABLE)


def worst_conditions(conditions: list[dict]) -> dict:
    """Each condition column over the trials: the worst value any of them saw (None where no
    trial could tell)."""
    out = {}
    for column, worst in WORST_OF.items():
        known = [c[column] for c in conditions if c.get(column) is not None]
        out[column] = worst(known) if known else None
    return out


def _failure_text(cell: SweepCell) -> str:
    error = cell.failure.error or cell.failure.status
    if not cell.trials:
        return error
    earlier = combine(cell.trials).median_s
    return (f"{cell.failure_label}: {error} ({TIMED_BEFORE} at "
            f"{earlier * 1e3:.3f} ms per step; a batch that fails once is not counted as "
            "fitting)")


def rerun_columns(batch_size: int, timing: Combined) -> dict:
    """The row's rerun interval (rounds.rerun_interval) as samples/s: the slow end of the step
    time is the low end of the throughput."""
    if timing.rerun_low_s is None or timing.rerun_high_s is None:
        return {"samples_per_s_low": None, "samples_per_s_high": None}
    return {"samples_per_s_low": batch_size / timing.rerun_high_s,
            "samples_per_s_high": batch_size / timing.rerun_low_s}


def measured_columns(cell: SweepCell, max_round_spread: float, max_cv: float,
                     peak_flops: float, floor_log_sd: float = 0.0) -> dict:
    """The columns of `cell`'s row that come from its trials: status, timing, memory, FLOPs,
    rounds, quality and the conditions; `floor_log_sd` as in `SweepCell.combined`."""
    row = {"input_mode": cell.input_mode, "batch_size": cell.batch_size,
           "search_phase": cell.phase, "timed_steps": 0, "rounds": 0, "retries": 0,
           **worst_conditions(cell.conditions)}
    if cell.failure is not None:
        failure = cell.failure
        return {**row, "status": failure.status, "error": _failure_text(cell),
                "peak_memory_bytes": failure.peak_memory_bytes,
                "memory_source": failure.memory_source,
                "train_flops_per_sample": failure.flops_per_sample or cell.flops_per_sample}
    timing = cell.combined(floor_log_sd)
    quality, reason = cell.quality(max_round_spread, max_cv)
    samples_per_s = cell.batch_size / timing.median_s
    achieved = cell.flops_per_sample * samples_per_s if cell.flops_per_sample else None
    return {
        **row, "status": TrialStatus.OK, "error": None,
        "peak_memory_bytes": cell.peak_memory_bytes, "memory_source": cell.memory_source,
        "train_flops_per_sample": cell.flops_per_sample,
        "timed_steps": timing.timed_steps, "step_time_median_s": timing.median_s,
        "step_time_p10_s": timing.p10_s, "step_time_p90_s": timing.p90_s,
        "step_time_cv": timing.cv, "step_time_cv_outside_gc": timing.cv_outside_gc,
        "samples_per_s": samples_per_s,
        **rerun_columns(cell.batch_size, timing),
        "achieved_flops_per_s": achieved,
        "mfu": achieved / peak_flops if achieved and peak_flops else None,
        "rounds": cell.rounds, "retries": cell.retries, "round_spread": timing.round_spread,
        "trial_log_sd": timing.trial_log_sd,
        "quality": quality, "quality_reason": reason,
        "process_cpu_per_wall": timing.cpu_per_wall,
        "cpu_wait_share": timing.cpu_wait_share,
        "gc_share": timing.gc_share,
    }
