"""The what-if plan of one run: plan rows for worker counts × per-worker batches from
the run's inputs (`inputs`) and an all-reduce model, as `plan` table rows and as printed
lines; and the check of the model against the data-parallel cells the run measured.

Rows at a worker count the run did not measure are marked `extrapolated`: their communication
comes from the model alone (a fitted or stated link), not from a measured step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from batchscale import schemas
from batchscale.conditions import shares_apart
from batchscale.errors import BadInput
from batchscale.fits import ensure_columns, numeric_column
from batchscale.planner.comm import comm_model, parallel_compute_s, with_cells
from batchscale.planner.inputs import STARVED_SHARE, PlanInputs
from batchscale.planner.model import (
    ASSUMED,
    CommModel,
    Objective,
    PlanRow,
    describe,
    format_duration,
    pareto_front,
    plan_rows,
    recommend,
)
from batchscale.schemas import RunStatus

DEFAULT_EXTRA_WORKERS = (4, 8)
"""Worker counts a default plan adds beyond those configured: an extrapolation, marked so."""
DURATION_UNITS = {"s": 1, "min": 60, "h": 3600, "d": 86400}


@dataclass(frozen=True)
class Plan:
    """Plan rows, the front, the chosen row (None without an objective or when none fits) and
    the sentence saying why, with the inputs and the communication model behind them."""

    rows: list[PlanRow]
    front: list[PlanRow]
    chosen: PlanRow | None
    recommendation: str
    inputs: PlanInputs
    comm: CommModel
    measured_workers: list[int]


def make_plan(inputs: PlanInputs, comm: CommModel, workers: Sequence[int],
              objective: Objective | None = None) -> Plan:
    """Rows for every worker count × the per-worker batches the run trained at one worker."""
    if not inputs.per_worker_batches:
        raise BadInput("the run has no convergence trials with one worker: no per-worker "
                       "batch to plan with")
    rows = plan_rows(inputs.step_line, inputs.steps_fit, comm, inputs.gradient_bytes,
                     sorted(set(workers)), inputs.per_worker_batches,
                     inputs.max_per_worker_batch, inputs.measured_step_s)
    # Rows whose S(B) the rule's own trials contradict stay in the table, marked, but are
    # neither on the front nor recommended.
    front = pareto_front(r for r in rows if not contradicted(r, inputs))
    if objective is None:
        chosen, sentence = None, _without_objective(front)
        named = [front[0], front[-1]] if front else []
    else:
        chosen, sentence = recommend([r for r in rows if not contradicted(r, inputs)],
                                     objective)
        named = [chosen] if chosen is not None else []
    if any(past_reach(r, inputs) for r in named):
        sentence += f" — {reach_note(inputs)}"
    measured = sorted({1, *(int(n) for n in inputs.data_parallel["workers"])}) \
        if not inputs.data_parallel.empty else [1]
    # A link stated in full (--link-gbps, --latency-us) takes nothing from the data-parallel
    # trials, so how busy the machine was while they ran says nothing of it.
    stated = all(v == ASSUMED for v in (comm.source.bandwidth, comm.source.latency,
                                        comm.source.hidden_share))
    note = "" if stated else disturbed_note(inputs)
    return Plan(rows, front, chosen, sentence + note, inputs, comm, measured)


def past_reach(row: PlanRow, inputs: PlanInputs) -> bool:
    """Whether the row's global batch lies past the largest at which the rule reached the
    target: its steps are then the fit's extrapolation, not anything the runs measured."""
    return bool(inputs.reached_batches) and row.global_batch > max(inputs.reached_batches)


def contradicted(row: PlanRow, inputs: PlanInputs) -> bool:
    """Whether the row lies past the rule's reach, at or past the smallest batch where its
    trials ran and did not reach the target: the fit's S(B) there is what they contradict."""
    failed = [b for b in inputs.unreached_batches if b > max(inputs.reached_batches, default=0)]
    return past_reach(row, inputs) and bool(failed) and row.global_batch >= min(failed)


def reach_note(inputs: PlanInputs) -> str:
    """Why a row past the rule's reach is marked, with the batches that ran and failed (and how
    many of their trials did reach), and the rules that reached further."""
    largest = max(inputs.reached_batches)
    failed = [b for b in inputs.unreached_batches if b > largest]
    text = (f"past batch {largest:,}, the largest at which the {inputs.lr_rule} rule reached the "
            f"target{_failed_words(inputs, failed)}: S(B) there is the fit's extrapolation")
    if failed:
        text += (f", which those trials contradict from batch {min(failed):,} on, so rows there "
                 "are neither on the front nor recommended")
    others = [f"--lr-rule {rule} reached up to batch {batch:,}"
              for rule, batch in inputs.other_reach]
    return text + (f" ({'; '.join(others)})" if others else "")


def _failed_words(inputs: PlanInputs, failed: list[int]) -> str:
    """" (its trials at 512 did not reach the target; at 256 only 1 of 2 did)"."""
    if not failed:
        return ""
    counts = {b: (r, n) for b, r, n in inputs.unreached_trials}
    none = [b for b in failed if counts.get(b, (0, 0))[0] == 0]
    some = [f"at {b:,} only {counts[b][0]} of {counts[b][1]} did" for b in failed
            if b not in none]
    parts = ([f"its trials at {_listed(none)} did not reach the target"] if none else []) + some
    if not none:
        parts[0] = f"its median over the seeds did not reach the target: {parts[0]}"
    return f" ({'; '.join(parts)})"


def _listed(batches: list[int]) -> str:
    words = [f"{b:,}" for b in batches]
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def disturbed_note(inputs: PlanInputs) -> str:
    """" — NOT TRUSTED: …" when a data-parallel cell the communication model comes from ran
    with its threads waiting for a CPU STARVED_SHARE of the time or more, else ""."""
    cells = inputs.data_parallel
    if cells.empty or "cpu_wait" not in cells:
        return ""
    waits = numeric_column(cells, "cpu_wait")
    worst = float(np.nanmax(waits)) if np.isfinite(waits).any() else math.nan
    if not worst >= STARVED_SHARE:
        return ""
    worst_text, limit_text = shares_apart(worst, STARVED_SHARE)
    return (f" — NOT TRUSTED: the data-parallel trials behind the communication figures waited "
            f"for a CPU up to {worst_text} of their runnable time (at least {limit_text}: a "
            "busy machine slowed them)")


def _without_objective(front: list[PlanRow]) -> str:
    if not front:
        return "No feasible plan: every row exceeds the per-worker memory."
    if len(front) == 1:
        return f"No objective given; one plan is both fastest and cheapest: {describe(front[0])}."
    return (f"No objective given (a deadline or a device-hour budget). Fastest on the front: "
            f"{describe(front[0])}. Cheapest: {describe(front[-1])}.")


def parse_duration(text: str) -> float:
    """'90', '90s', '30min', '2h', '1.5d' as seconds (a bare number is seconds)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*(s|min|h|d)?\s*", text)
    if not match:
        raise BadInput(f"--deadline: {text!r} is not a duration; use e.g. 90s, 30min, 2h or 1d")
    seconds = float(match.group(1)) * DURATION_UNITS[match.group(2) or "s"]
    if not (0 < seconds < math.inf):
        raise BadInput(f"--deadline: {text!r} must be a positive duration")
    return seconds


def _finite(value: float) -> float | None:
    """An open band end (inf) is stored as null: the suite allows no inf, and null reads as
    'no bound' in every reader."""
    return float(value) if math.isfinite(value) else None


def table_rows(plan: Plan) -> list[dict]:
    """The `plan` table's rows (without the environment columns)."""
    inputs, comm = plan.inputs, plan.comm
    on_front = {id(r) for r in plan.front}
    target = inputs.target or (None, None)
    common = {
        "target_metric": target[0], "target_value": target[1], "lr_rule": inputs.lr_rule,
        "step_time_source": inputs.step_time_source, "gradient_bytes": int(inputs.gradient_bytes),
        "bandwidth_Bps": comm.bandwidth_Bps, "latency_s": comm.latency_s,
        "hidden_share": comm.hidden_share, "bandwidth_source": comm.source.bandwidth,
        "latency_source": comm.source.latency, "hidden_share_source": comm.source.hidden_share,
        "comm_note": comm.note or None, "band_note": inputs.band_note or None,
        "memory_note": inputs.memory_note, "max_per_worker_batch": inputs.max_per_worker_batch,
    }
    out = []
    for r in plan.rows:
        out.append({
            **common, "workers": r.workers, "per_worker_batch": r.per_worker_batch,
            "global_batch": r.global_batch, "accumulation_steps": r.accumulation_steps,
            "extrapolated": r.workers not in plan.measured_workers,
            "compute_s": r.step_time_s - r.comm_s, "compute_source": r.compute_source,
            "comm_s": r.comm_s, "step_time_s": r.step_time_s, "comm_share": r.comm_share,
            "steps": r.steps.value, "steps_low": _finite(r.steps.low),
            "steps_high": _finite(r.steps.high), "time_to_target_s": r.time_to_target_s.value,
            "time_to_target_s_low": _finite(r.time_to_target_s.low),
            "time_to_target_s_high": _finite(r.time_to_target_s.high),
            "device_hours": r.device_hours.value, "device_hours_low": _finite(r.device_hours.low),
            "device_hours_high": _finite(r.device_hours.high), "b_crit": r.b_crit.value,
            "b_crit_low": _finite(r.b_crit.low), "b_crit_high": _finite(r.b_crit.high),
            "feasible": r.feasible, "limit": r.limit or None, "on_pareto_front": id(r) in on_front,
            "recommended": r is plan.chosen,
        })
    return out


def plan_lines(plan: Plan) -> list[str]:
    """The plan as printed: its inputs and where they came from, one line per row with bands,
    the front and the recommendation."""
    inputs, comm = plan.inputs, plan.comm
    fit = inputs.steps_fit
    target = f"{inputs.target[0]} {inputs.target[1]:g}" if inputs.target else "the run's target"
    lines = [
        f"plan for {target} (LR rule {inputs.lr_rule}): S(B) = {fit.s_min:.4g} + "
        f"{fit.e_min:.4g}/B, B_crit interval {fit.b_crit_low:.4g}-{fit.b_crit_high:.4g}"
        + (f" ({inputs.band_note})" if inputs.band_note else ""),
        f"  step time of one device: {inputs.step_time_source}; line "
        f"{1e3 * inputs.step_line[0]:.3g} ms + {1e6 * inputs.step_line[1]:.3g} µs/sample "
        "(measured where a batch was trained)",
        f"  memory: {inputs.memory_note}{_accumulation_note(plan)}",
        f"  all-reduce of {inputs.gradient_bytes / 1e6:.3g} MB: bandwidth "
        f"{8 * comm.bandwidth_Bps / 1e9:.3g} Gbit/s ({comm.source.bandwidth}), latency "
        f"{1e6 * comm.latency_s:.3g} µs per hop ({comm.source.latency}), hidden share "
        f"{comm.hidden_share:.0%} ({comm.source.hidden_share})"
        + (f"; {comm.note}" if comm.note else ""),
        f"  workers measured: {', '.join(map(str, plan.measured_workers))}; the others are "
        "extrapolated (marked *)" + (f"; the measured workers shared one machine's CPUs "
                                     f"({inputs.shared_compute_note}), so their communication "
                                     "is taken beyond that compute, and the plan gives each "
                                     "worker its own device" if inputs.shared_host else ""),
        f"  {'N':>4s} {'b':>6s} {'B':>7s} {'step ms':>9s} {'comm':>6s} "
        f"{'time to target [band]':>30s} {'device-h [band]':>28s}  front  limit",
    ]
    on_front = {id(r) for r in plan.front}
    for r in plan.rows:
        star = " " if r.workers in plan.measured_workers else "*"
        dagger = "†" if past_reach(r, inputs) else " "
        time, hours = r.time_to_target_s, r.device_hours
        band = f"{format_duration(time.value)} [{format_duration(time.low)}, " \
               f"{format_duration(time.high)}]"
        hband = f"{hours.value:.3g} [{hours.low:.3g}, {_hours(hours.high)}]"
        lines.append(
            f"  {r.workers:>3d}{star} {r.per_worker_batch:>6d} {r.global_batch:>7d}{dagger}"
            f"{1e3 * r.step_time_s:>9.3g} {r.comm_share:>6.0%} {band:>30s} {hband:>28s}  "
            f"{'yes' if id(r) in on_front else '':5s}  {r.limit or '-'}{_accumulated(r)}")
    if any(past_reach(r, inputs) for r in plan.rows):
        lines.append(f"  † {reach_note(inputs)}")
    lines.append(f"recommendation: {plan.recommendation}")
    unmeasured = comm.source.unmeasured_names()
    disturbed = " (on a busy machine: NOT TRUSTED, above)" if disturbed_note(inputs) else ""
    lines.append(f"not measured: {unmeasured}" if unmeasured else
                 f"every communication parameter was measured{disturbed}")
    return lines


def _accumulation_note(plan: Plan) -> str:
    if not any(r.accumulation_steps > 1 for r in plan.rows):
        return ""
    return (f"; a per-worker batch above {plan.inputs.max_per_worker_batch} accumulates "
            "micro-batches that fit (k passes, one all-reduce per step: slower per example)")


def _accumulated(row: PlanRow) -> str:
    """'  b 512 = 4×128 accumulated' for an accumulated row, else ''."""
    if row.accumulation_steps == 1:
        return ""
    return f"  b {row.per_worker_batch} = {row.accumulation_steps}×{row.micro_batch} accumulated"


def _hours(value: float) -> str:
    return f"{value:.3g}" if math.isfinite(value) else "unbounded"


# ------------------------------------------------------------------ prediction vs measurement


def measured_cells(runs: pd.DataFrame, lr_rule: str) -> pd.DataFrame:
    """Per (batch, workers) of `lr_rule`: measured time to target as the analysis takes S(B)
    (per learning rate the median over seeds, a seed that missed counting as never; then the
    best learning rate), with the seeds reached / run, the seeds' range (low, high; a seed that
    missed is inf) and the worst share of time its threads waited for a CPU. Cells no learning
    rate reached drop out."""
    runs = runs[runs["lr_rule"].eq(lr_rule).to_numpy(dtype=bool)]
    time = numeric_column(runs, "time_to_target_s")
    reached = runs["status"].eq(RunStatus.REACHED).to_numpy(dtype=bool) & np.isfinite(time)
    frame = pd.DataFrame({"batch_size": numeric_column(runs, "batch_size"),
                          "workers": numeric_column(runs, "workers"),
                          "lr": numeric_column(runs, "lr"),
                          "time": np.where(reached, time, np.inf), "reached": reached,
                          "wait": numeric_column(runs, "cpu_wait_share")})
    keys = ["batch_size", "workers"]
    per_lr = frame.groupby([*keys, "lr"]).agg(time=("time", "median"), reached=("reached", "sum"),
                                              seeds=("time", "size"), cpu_wait=("wait", "max"),
                                              low=("time", "min"), high=("time", "max"))
    best = per_lr.reset_index().sort_values("time").groupby(keys).first().reset_index()
    return best[np.isfinite(best["time"])].drop(columns="lr")


def check_rows(inputs: PlanInputs, runs: pd.DataFrame, link_gbps: float | None = None,
               latency_us: float | None = None) -> list[dict]:
    """Predicted vs measured time to target at every (batch, workers) cell with a data-parallel
    run, for one worker and more. With several data-parallel cells the communication model of
    each is fitted without it (leave one out), so its prediction is out of sample; with one it
    is in sample and says so. The LR rule is the inputs' (its S(B) fit)."""
    runs = runs[runs["target_metric"].eq(inputs.target[0]).to_numpy(dtype=bool)] \
        if inputs.target and runs["target_metric"].notna().any() else runs
    measured = measured_cells(runs, inputs.lr_rule)
    parallel = inputs.data_parallel
    batches = set(parallel["batch_size"])
    out = []
    for cell in measured[measured["batch_size"].isin(batches)].itertuples():
        batch, n = int(cell.batch_size), int(cell.workers)
        comm_s, how, fitted = 0.0, "one worker: no communication", inputs
        if n > 1:
            model, how, fitted = _cell_comm_model(inputs, batch, n, link_gbps, latency_us)
            comm_s = (1 - model.hidden_share) * model.comm_time_s(n, inputs.gradient_bytes)
        step_s = parallel_compute_s(fitted, batch, n) + comm_s
        steps = inputs.steps_fit.steps(batch)
        predicted = steps.value * step_s
        if float(cell.cpu_wait) >= STARVED_SHARE:
            how += f"; disturbed: threads waited for a CPU up to {float(cell.cpu_wait):.0%}"
        out.append({"lr_rule": inputs.lr_rule, "workers": n, "batch_size": batch,
                    "per_worker_batch": batch / n,
                    "predicted_s": predicted, "predicted_low_s": steps.low * step_s,
                    "predicted_high_s": steps.high * step_s, "measured_s": float(cell.time),
                    "measured_low_s": float(cell.low), "measured_high_s": float(cell.high),
                    "error": predicted / float(cell.time) - 1,
                    "seeds": f"{int(cell.reached)}/{int(cell.seeds)}", "how": how})
    return out


def _cell_comm_model(inputs: PlanInputs, batch: int, workers: int, link_gbps: float | None,
                     latency_us: float | None) -> tuple[CommModel, str, PlanInputs]:
    """The communication model a cell's prediction uses, how it was made, and the inputs fitted
    with it (on a shared host they carry the compute factor): fitted without the cell where the
    other cells allow it (out of sample), else with it (in sample, said so)."""
    if link_gbps is not None:
        return (comm_model(inputs, link_gbps, latency_us), "communication from the stated link",
                inputs)
    parallel = inputs.data_parallel
    others = parallel[(parallel["batch_size"] != batch) | (parallel["workers"] != workers)]
    if len(others):
        try:
            without = with_cells(inputs, others)
            return (comm_model(without, None, latency_us),
                    "communication fitted without this cell", without)
        except BadInput as err:
            why = f" (the other cells alone: {err})"
    else:
        why = ""
    return (comm_model(inputs, None, latency_us),
            f"in sample: the communication model was fitted to this cell{why}", inputs)


def check_lines(checks: list[dict], goal: float = 0.25) -> list[str]:
    """The comparison as a Markdown table, with the goal and the worst error."""
    if not checks:
        return ["prediction vs measurement: no batch size was run with one worker and more "
                "that reached the target; nothing to compare"]
    lines = ["| LR rule | workers | global batch | predicted time to target [band] | measured "
             "[seeds' range] | error | seeds reached | how |", "|---|---|---|---|---|---|---|---|"]
    for c in checks:
        lines.append(
            f"| {c['lr_rule']} | {c['workers']} | {c['batch_size']} | "
            f"{format_duration(c['predicted_s'])} "
            f"[{format_duration(c['predicted_low_s'])}, {format_duration(c['predicted_high_s'])}]"
            f" | {format_duration(c['measured_s'])} [{format_duration(c['measured_low_s'])}, "
            f"{format_duration(c['measured_high_s'])}] | {c['error']:+.0%} | {c['seeds']} | "
            f"{c['how']} |")
    worst = max(abs(c["error"]) for c in checks)
    verdict = "met" if worst <= goal else "missed"
    multi = [c for c in checks if c["workers"] > 1]
    if verdict == "met" and multi and all(c["how"].startswith("in sample") for c in multi):
        # a model judged only on the cells it was fitted to has not been tested
        verdict = ("met in sample only: the communication model was fitted to every "
                   "multi-worker cell judged here, so it is not tested (data-parallel trials at a "
                   "second batch size would test it)")
    lines.append(f"worst error {worst:.0%}: goal ±{goal:.0%} {verdict}")
    calm = [abs(c["error"]) for c in checks if "disturbed" not in c["how"]]
    if len(calm) < len(checks):
        lines.append(f"{len(checks) - len(calm)} of {len(checks)} cells disturbed (their "
                     f"threads waited for a CPU {STARVED_SHARE:.0%} of the time or more: other "
                     "processes, or workers sharing one machine's cores); "
                     + (f"worst error of the others {max(calm):.0%}" if calm else
                        "no undisturbed cell to judge the model by"))
    return lines



def default_plan(sweep: pd.DataFrame | None, runs: pd.DataFrame | None,
                 analysis: pd.DataFrame | None, *, workload: str | None,
                 configured_workers: Sequence[int], image_size: int | None = None
                 ) -> tuple[Plan | None, str]:
    """The pipeline's plan: the configured worker counts and DEFAULT_EXTRA_WORKERS (marked
    extrapolated), the measured communication, no objective. None and the reason when the run
    lacks a measurement the planner needs (the report says so; the run goes on). The gradient
    bytes are those the trials recorded; the `workload` is built to count them only for runs
    from before the trials did (a TrainingLoop's model cannot be built: its trials record them
    when the loop calls `trial.prepare` or `trial.measure_noise`)."""
    from batchscale.planner.inputs import (
        gradient_bytes,
        read_plan_inputs,
        recorded_gradient_bytes,
    )

    try:
        recorded = runs is not None and recorded_gradient_bytes(
            ensure_columns(runs, schemas.RUNS)) is not None
        grad = gradient_bytes(workload, image_size=image_size) if workload and not recorded \
            else None
        inputs = read_plan_inputs(sweep, runs, analysis, grad)
        workers = sorted({1, *configured_workers, *DEFAULT_EXTRA_WORKERS})
        return make_plan(inputs, comm_model(inputs), workers), ""
    except BadInput as err:
        return None, str(err)
    except ValueError as err:  # a planner check on the numbers: the run's analysis goes on
        return None, f"the planner could not use this run's measurements: {err}"
