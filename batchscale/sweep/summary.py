"""The sweep's own summary: best throughput, saturation batch, memory model and wall, and how far
the measurements can be trusted (quality flags, rounds, the conditions they ran under).

The throughput figures come from the fits the analysis uses too (batchscale.fits), so the sweep
and the report agree; those fits leave rows flagged unstable out of every timing figure.
"""

from __future__ import annotations

import math

from batchscale.conditions import (
    WHAT_TO_DO,
    cpu_threads_of,
    gc_note,
    gc_rows_of,
    threads_note,
)
from batchscale.fits import mfu_text
from batchscale.schemas import Quality, TrialStatus

MANY_ROUNDS = 3
"""From this many rounds on, the rerun interval's t quantile is small enough that the drift
between sweeps, which rounds in one sweep cannot see, dominates: measured coverage of the next
sweep fell from 0.88 (2 rounds) to 0.56 (3 rounds), docs/benchmarks.md. With sweep.between_sweep_cv
the summary says instead that such an interval's coverage is not measured."""
SHORT_STEP_S = 1e-3
"""Below this median step time the timer, Python's dispatch and the allocator are a large share
of each step, so whole sweeps disagree more than for longer steps (docs/sweep.md, "Rows of
sub-millisecond steps"): such rows are named in the summary."""


def summarize(rows: list[dict], saturation_tolerance: float | None = None,
              between_sweep_cv: float | None = None) -> dict:
    """Saturation batch (within `saturation_tolerance` of the best samples/s: the config's
    `analysis.saturation_tolerance`, its default when None), best throughput with its rerun
    interval (built with `between_sweep_cv`, sweep.between_sweep_cv; None: not known), measured and
    predicted largest batch under the rows' memory cap (the fits the analysis uses too, so
    the sweep and the report agree), and the measurements' quality (quality_summary)."""
    import pandas as pd

    from batchscale.fits import (
        DEFAULT_SATURATION_TOLERANCE,
        b_max_interval,
        find_saturation,
        fit_memory,
        largest_fitting_batch,
        saturation_range,
        throughput_curve,
        timing_mode,
    )

    if saturation_tolerance is None:
        saturation_tolerance = DEFAULT_SATURATION_TOLERANCE
    quality = quality_summary(rows)
    table = pd.DataFrame(rows)
    mode = timing_mode(table)
    if mode is None:
        return {"timed": False, **quality}
    curve = throughput_curve(table, mode)
    best = curve.loc[curve["samples_per_s"].idxmax()]
    # Memory does not depend on how busy the CPU was: unstable rows count for the model.
    memory = throughput_curve(table, mode, include_unstable=True)
    budget = table["memory_cap_bytes"].max()
    fit = fit_memory(memory["batch_size"], memory["peak_memory_bytes"], budget)
    predicted_low, predicted_high = b_max_interval(fit, budget)
    measured, measured_reason = largest_fitting_batch(table)
    oom = pd.to_numeric(table.loc[table["status"] == TrialStatus.OOM, "batch_size"])
    saturation, saturation_reason = find_saturation(table, saturation_tolerance, mode)
    uncertain = saturation_range(table, saturation_tolerance, mode)
    return {
        "timed": True, "input_mode": mode, **quality,
        "saturation_batch": saturation, "saturation_reason": saturation_reason,
        "saturation_tolerance": saturation_tolerance, "saturation_range": uncertain,
        "best_samples_per_s": float(best["samples_per_s"]),
        "best_samples_per_s_low": float(best["samples_per_s_low"]),
        "best_samples_per_s_high": float(best["samples_per_s_high"]),
        "between_sweep_cv": between_sweep_cv,
        "best_batch": int(best["batch_size"]), "best_mfu": float(best["mfu"]),
        "largest_fitting_batch": measured, "largest_fitting_reason": measured_reason,
        "memory_fixed_bytes": fit.fixed_bytes, "memory_per_sample_bytes": fit.per_sample_bytes,
        "memory_fit_r2": fit.r2, "memory_per_sample_clear": fit.per_sample_clear,
        "memory_fixed_se_bytes": fit.fixed_se_bytes,
        "memory_per_sample_se_bytes": fit.per_sample_se_bytes,
        "predicted_largest_batch": fit.b_max,
        "predicted_largest_batch_low": predicted_low,
        "predicted_largest_batch_high": predicted_high,
        "predicted_reason": fit.reason,
        "smallest_oom_batch": float(oom.min()) if len(oom) else math.nan,
    }


def summary_lines(summary: dict) -> list[str]:
    if not summary["timed"]:
        if summary.get("timed_rows"):
            return ["every timed row was flagged unstable: no throughput figure is given",
                    *_failed_lines(summary), *quality_lines(summary)]
        return ["no batch size was timed successfully", *_failed_lines(summary)]
    mfu = summary["best_mfu"]
    saturation = (f"the device saturates at batch ≈ {summary['saturation_batch']} (smallest "
                  f"batch within {summary['saturation_tolerance']:.0%} of the best, "
                  f"{summary['input_mode']} input{_also(summary.get('saturation_range'))})"
                  if summary["saturation_batch"] is not None
                  else f"no saturation batch: {summary['saturation_reason']}")
    return [
        f"best: {summary['best_samples_per_s']:,.1f} samples/s {_rerun_text(summary)} at batch "
        f"{summary['best_batch']} ({mfu_text(mfu, _shares_of_best(summary))}); {saturation}",
        _memory_line(summary),
        _measured_wall_line(summary),
        *_failed_lines(summary),
        *quality_lines(summary),
    ]


def _failed_lines(summary: dict) -> list[str]:
    """The rows whose trial raised (not an out-of-memory): named, with their error, because
    every figure above leaves them out and would otherwise read as if they were never run."""
    failed = summary.get("failed_rows") or []
    if not failed:
        return []
    rows = "; ".join(f"{mode} batch {batch}: {error}" for mode, batch, error in failed)
    return [f"FAILED: {len(failed)} row(s) raised an error and are left out of every figure "
            f"(status error in the table): {rows}"]


def _shares_of_best(summary: dict) -> tuple[float, float] | None:
    """The best row's rerun range as shares of its samples/s (what MFU moves with)."""
    low, high = summary.get("best_samples_per_s_low"), summary.get("best_samples_per_s_high")
    if not (_finite(low) and _finite(high)):
        return None
    return low / summary["best_samples_per_s"], high / summary["best_samples_per_s"]


def _rerun_text(summary: dict) -> str:
    low, high = summary.get("best_samples_per_s_low"), summary.get("best_samples_per_s_high")
    if not (_finite(low) and _finite(high)):
        return "(no rerun interval: too few steps)"
    drift = summary.get("between_sweep_cv")
    basis = ("this sweep's rounds give" if not drift else "this sweep's rounds and a drift "
             f"between sweeps of {drift * 100:g} % (sweep.between_sweep_cv) give")
    text = (f"{basis} {low:,.1f}-{high:,.1f}, 90 %; another sweep may land outside it "
            "(docs/sweep.md)")
    if max(summary.get("rounds") or [0]) >= MANY_ROUNDS:
        text += (f"; with {MANY_ROUNDS}+ rounds this interval misses the drift between sweeps and "
                 "covered the next sweep only about half the time in our measurements "
                 "(docs/sweep.md)" if not drift else
                 f"; with {MANY_ROUNDS}+ rounds it rests mostly on sweep.between_sweep_cv, and "
                 "how often it then holds the next sweep is not measured (docs/sweep.md)")
    return f"({text})"


def _finite(value) -> bool:
    return value is not None and math.isfinite(value)


def _memory_line(summary: dict) -> str:
    """The memory model, or why there is none (one batch size, no measured peaks) instead of
    NaN figures."""
    if not (_finite(summary["memory_fixed_bytes"])
            and _finite(summary["memory_per_sample_bytes"])):
        return f"memory: no model fitted ({summary['predicted_reason']})"
    if not summary.get("memory_per_sample_clear", True):
        return (f"memory: peak ≈ {summary['memory_fixed_bytes'] / 2**20:.1f} MiB; "
                f"{summary['predicted_reason']}: no largest batch predicted")
    fixed_se = summary.get("memory_fixed_se_bytes", math.nan)
    per_sample_se = summary.get("memory_per_sample_se_bytes", math.nan)
    errors = (f" ± {fixed_se / 2**20:.2g}", f" ± {per_sample_se / 2**10:.2g}",
              "± one standard error; ") if _finite(fixed_se) and _finite(per_sample_se) else (
        "", "", "two batch sizes: no error estimate; ")
    line = (f"memory: peak ≈ {summary['memory_fixed_bytes'] / 2**20:.1f}{errors[0]} MiB + "
            f"{summary['memory_per_sample_bytes'] / 2**10:.1f}{errors[1]} KiB × batch "
            f"({errors[2]}r² {summary['memory_fit_r2']:.3f}); predicted largest batch under the "
            "cap: ")
    predicted = summary["predicted_largest_batch"]
    if not _finite(predicted):
        return line + f"none ({summary['predicted_reason']})"
    low = summary.get("predicted_largest_batch_low", math.nan)
    high = summary.get("predicted_largest_batch_high", math.nan)
    span = (f" [{low:.0f}, {high:.0f}] (90 %, from the terms' standard errors)"
            if _finite(low) and _finite(high) else " (no range: no standard errors)")
    oom = summary.get("smallest_oom_batch", math.nan)
    against = (f"; contradicted: batch {oom:.0f} ran out of memory under the same cap, so peak "
               "memory grows faster than the line near the cap and the measured wall below "
               "stands" if _finite(oom) and oom <= predicted else "")
    return (line + f"{predicted:.0f}{span} {summary['predicted_reason']}").rstrip() + against


def _also(text: str | None) -> str:
    return f"; {text}" if text else ""


def _measured_wall_line(summary: dict) -> str:
    measured, reason = summary["largest_fitting_batch"], summary["largest_fitting_reason"]
    if measured == math.inf:
        return f"largest batch measured to fit: no wall found ({reason})"
    if not _finite(measured):
        return f"largest batch measured to fit: none ({reason})"
    return f"largest batch measured to fit: {measured:.0f} ({reason})"


# ------------------------------------------------------------------------------ quality
def quality_summary(rows: list[dict]) -> dict:
    """How far the timed rows can be trusted: unstable rows with their reasons, rounds and
    retries, the largest round spread and CV among the stable rows, the worst conditions."""
    timed = [r for r in rows if r["status"] == TrialStatus.OK]
    stable = [r for r in timed if r.get("quality") != Quality.UNSTABLE]
    return {
        "timed_rows": len(timed),
        "failed_rows": [(r["input_mode"], r["batch_size"], r.get("error"))
                        for r in rows if r["status"] == TrialStatus.ERROR],
        "unstable": [(r["input_mode"], r["batch_size"], r.get("quality_reason"))
                     for r in timed if r.get("quality") == Quality.UNSTABLE],
        "rounds": sorted({r["rounds"] for r in timed if r.get("rounds") is not None}),
        "retried_rows": sum(bool(r.get("retries")) for r in timed),
        "largest_round_spread": _largest(r.get("round_spread") for r in stable),
        "largest_cv": _largest(_judged_cv(r) for r in stable),
        "cv_outside_gc": any(_finite(r.get("step_time_cv_outside_gc"))
                             and _finite(r.get("step_time_cv"))
                             and r["step_time_cv_outside_gc"] < r["step_time_cv"]
                             for r in stable),
        "short_step_batches": sorted({r["batch_size"] for r in stable
                                      if _finite(r.get("step_time_median_s"))
                                      and r["step_time_median_s"] < SHORT_STEP_S}),
        "load_avg_max": _largest(r.get("load_avg_1m") for r in rows),
        "usable_cpus": min((r["usable_cpus"] for r in rows if r.get("usable_cpus")),
                           default=None),
        "cpu_per_wall_min": min((r["process_cpu_per_wall"] for r in timed
                                 if _finite(r.get("process_cpu_per_wall"))), default=None),
        "cpu_wait_share_max": _largest(r.get("cpu_wait_share") for r in timed),
        "oversubscribed": any(r.get("threads_oversubscribed") for r in rows),
        "cpu_threads": cpu_threads_of(rows),
        "gc_rows": gc_rows_of(timed),
    }


def _judged_cv(row: dict) -> float | None:
    """The CV the scatter check judged: outside garbage-collection steps where recorded."""
    outside = row.get("step_time_cv_outside_gc")
    return outside if _finite(outside) else row.get("step_time_cv")


def _largest(values) -> float | None:
    return max((v for v in values if _finite(v)), default=None)


def quality_lines(summary: dict) -> list[str]:
    """The quality flags in plain words (and what to do about them), the rounds, then the
    conditions the trials ran under."""
    if not summary.get("timed_rows"):
        return []
    timed, unstable = summary["timed_rows"], summary["unstable"]
    lines = [f"measurement quality: all {timed} timed rows ok"]
    if unstable:
        rows = "; ".join(f"{mode} batch {batch} ({reason})" for mode, batch, reason in unstable)
        lines = [f"measurement quality: {len(unstable)} of {timed} timed rows UNSTABLE, left "
                 f"out of the throughput figures: {rows}", f"  what to do: {WHAT_TO_DO}"]
    rounds = "/".join(str(r) for r in summary["rounds"]) or "?"
    spread, cv = summary["largest_round_spread"], summary["largest_cv"]
    stable = ("no stable rows" if spread is None and cv is None else
              f"stable rows: rounds agree (their closest majority, after a re-measurement) "
              "within "
              f"{'n/a' if spread is None else f'{spread:.1%}'}, CV at most "
              f"{'n/a' if cv is None else f'{cv:.2f}'}"
              f"{' outside garbage-collection steps' if summary.get('cv_outside_gc') else ''}")
    lines.append(f"rounds: {rounds} per row, {summary['retried_rows']} row(s) re-measured; "
                 f"{stable}")
    if short := summary.get("short_step_batches"):
        lines.append(f"sub-millisecond steps at batch {', '.join(map(str, short))}: the timer "
                     "and dispatch weigh on each step, so another sweep of these rows may land "
                     "further away than of slower ones, and on a noisy host even outside their "
                     "rerun intervals more often than the 10 % these claim; compare such rows "
                     "through the lake's next-run interval, or time them longer"
                     f"{' or on one thread' if (summary.get('cpu_threads') or 0) > 1 else ''} "
                     "(docs/sweep.md)")
    if hint := threads_note(summary.get("cpu_threads")):
        lines.append(f"threads: {hint}")
    if gc_rows := summary.get("gc_rows"):
        lines.append(f"garbage collection: {gc_note(gc_rows)}")
    return [*lines, _conditions_line(summary)]


def _conditions_line(summary: dict) -> str:
    load, cpus, cpu = (summary["load_avg_max"], summary["usable_cpus"],
                       summary["cpu_per_wall_min"])
    parts = [f"load average up to {'unknown' if load is None else f'{load:.2f}'} on "
             f"{cpus or '?'} usable CPUs",
             f"trial CPU time / wall time down to {'unknown' if cpu is None else f'{cpu:.2f}'}"]
    wait = summary.get("cpu_wait_share_max")
    if wait is not None:
        parts.append(f"threads waited for a CPU up to {wait:.1%} of their runnable time")
    if summary["oversubscribed"]:
        parts.append("torch threads oversubscribed the usable CPUs")
    return "conditions: " + "; ".join(parts)
