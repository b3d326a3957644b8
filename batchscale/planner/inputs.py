"""The what-if planner's inputs read from one run's tables: the steps fit S(B) with
its B_crit interval (analysis table), one device's step time (the convergence runs' own, else
the sweep's line; batchscale.fits), the largest batch that fits (sweep), the gradient bytes,
and the data-parallel cells and all-reduce probes (their model: comm.py). What is missing
for a plan is a BadInput naming it; what is only weak (no interval, no memory limit measured)
is carried as a note.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from batchscale import schemas
from batchscale.analysis.timetotarget import convergence_step_times, step_times
from batchscale.config import AnalysisConfig
from batchscale.errors import BadInput
from batchscale.fits import ensure_columns, fit_step_time, largest_fitting_batch, numeric_column
from batchscale.planner.comm import data_parallel_cells, probe_points, with_cells
from batchscale.planner.model import StepsFit

BYTES_PER_GRADIENT_VALUE = 4
"""The trainer all-reduces fp32 gradients (bf16 autocast keeps fp32 parameters)."""
STEP_SOURCE_CONVERGENCE = "convergence runs, 1 worker (train time per step)"
STARVED_SHARE: float = AnalysisConfig.model_fields["max_cpu_wait_share"].default
"""The analysis's default: trials waiting this share of their runnable time for a CPU ran on a
busy machine."""


@dataclass(frozen=True)
class PlanInputs:
    """Everything `planner.plan_rows` needs, with where each came from."""

    target: tuple[str, float] | None
    lr_rule: str
    steps_fit: StepsFit
    band_note: str
    step_line: tuple[float, float]
    measured_step_s: dict[int, float]
    step_time_source: str
    max_per_worker_batch: int | None
    memory_note: str
    gradient_bytes: float
    shared_host: bool  # the data-parallel workers shared one machine's CPUs
    data_parallel: pd.DataFrame  # batch_size, workers, step_time_s, compute_s, comm_s,
    # trials, cpu_wait (the worst share of time the cell's threads waited for a CPU)
    per_worker_batches: list[int]
    probe: pd.DataFrame = dataclasses.field(default_factory=pd.DataFrame)
    """The data-parallel trials' bare all-reduce probes (convergence/trialenv.py): workers,
    bytes, seconds (a small message and the gradient per trial), cv; empty in older runs."""
    shared_compute_factor: float = 1.0
    """On a shared host: the data-parallel step's compute over one process's at the whole
    batch (comm.shared_compute_factor); 1 elsewhere."""
    shared_compute_note: str = ""
    reached_batches: tuple[int, ...] = ()
    """The batch sizes at which the rule reached the target (S(B) measured: the fit rests on
    them); empty where not known."""
    unreached_batches: tuple[int, ...] = ()
    """The batch sizes the rule ran at without reaching the target (its median over the seeds
    did not)."""
    unreached_trials: tuple[tuple[int, int, int], ...] = ()
    """(batch, trials that reached, trials) of each of `unreached_batches`."""
    other_reach: tuple[tuple[str, int], ...] = ()
    """(rule, largest batch it reached the target at) of the other fitted rules that reached
    past this rule's largest."""

    def compute_s(self, batch: float) -> float:
        """One device's seconds per step at `batch`: measured where it was, else the line."""
        measured = self.measured_step_s.get(int(batch)) if float(batch).is_integer() else None
        return measured if measured is not None else self.step_line[0] + self.step_line[1] * batch


def gradient_bytes(workload: str, num_classes: int | None = None,
                   image_size: int | None = None) -> float:
    """Bytes one all-reduce carries: the trainable parameters × 4 (fp32). Builds the model
    (torch, imported lazily); BadInput naming the workload when it cannot be built."""
    from batchscale.workloads import DEFAULT_IMAGE_SIZE, get_workload

    try:
        model = get_workload(workload, num_classes=num_classes,
                             image_size=image_size or DEFAULT_IMAGE_SIZE).build()
        count = sum(p.numel() for p in model.parameters() if p.requires_grad)
    except BadInput:
        raise
    except Exception as err:  # a user factory's own failure: say whose
        raise BadInput(f"cannot count the parameters of workload {workload!r} for the gradient "
                       f"size: {type(err).__name__}: {err}") from None
    return float(count * BYTES_PER_GRADIENT_VALUE)


def read_plan_inputs(sweep: pd.DataFrame | None, runs: pd.DataFrame | None,
                     analysis: pd.DataFrame | None, grad_bytes: float | None,
                     lr_rule: str | None = None) -> PlanInputs:
    """The planner's inputs from a run's tables; BadInput naming what is missing. The gradient
    bytes the trials recorded win over `grad_bytes` (counted from the workload by the caller,
    for runs from before the trials recorded them)."""
    if analysis is None or analysis.empty:
        raise BadInput("the run has no analysis rows: no S(B) fit to plan with (no convergence "
                       "trial reached the target at enough batch sizes)")
    if runs is None or runs.empty:
        raise BadInput("the run has no runs table: no step times of the training to plan with")
    target = analysis_target(analysis)
    runs = target_rows(ensure_columns(runs, schemas.RUNS), target)
    rule, fit, band_note = steps_fit(analysis, lr_rule)
    measured, line, source = one_device_step_time(sweep, runs)
    max_b, memory_note = memory_limit(sweep)
    single = runs[numeric_column(runs, "workers") == 1]
    batches = sorted({int(b) for b in numeric_column(single, "batch_size") if math.isfinite(b)})
    recorded = recorded_gradient_bytes(runs)
    if recorded is None and grad_bytes is None:
        raise BadInput("the run's trials did not record their gradient bytes (a run from before "
                       "the all-reduce probe) and no workload was given to count them from")
    inputs = PlanInputs(target, rule, fit, band_note, line, measured, source, max_b,
                        memory_note, float(recorded or grad_bytes), shares_host(runs),
                        pd.DataFrame(), batches, probe_points(runs),
                        **rule_reach(analysis, rule, runs))
    return with_cells(inputs, data_parallel_cells(runs))


def rule_reach(analysis: pd.DataFrame, rule: str, runs: pd.DataFrame | None = None) -> dict:
    """The batch sizes of `rule`'s analysis cells with and without a measured S(B); with the
    runs, how many of the trials at each unreached batch did reach, and the other rules that
    reached past this one's largest batch."""
    frame = ensure_columns(analysis, schemas.ANALYSIS)
    fitted = set(_fitted(frame)["lr_rule"]) | {rule}  # only rules a plan can be made for
    reach = {}
    for name in sorted(set(frame["lr_rule"].dropna()) & fitted):
        cells = frame[frame["lr_rule"].eq(name).to_numpy(dtype=bool)]
        steps = numeric_column(cells, "steps_to_target")
        batches = numeric_column(cells, "batch_size").astype(int)
        reach[name] = (sorted(set(batches[np.isfinite(steps)])),
                       sorted(set(batches[~np.isfinite(steps)])))
    reached, unreached = reach.get(rule, ([], []))
    largest = max(reached, default=0)
    return {"reached_batches": tuple(reached), "unreached_batches": tuple(unreached),
            "unreached_trials": _trials_reached(runs, rule, unreached),
            "other_reach": tuple((name, max(done)) for name, (done, _) in reach.items()
                                 if name != rule and done and max(done) > largest)}


def _trials_reached(runs: pd.DataFrame | None, rule: str,
                    batches: list[int]) -> tuple[tuple[int, int, int], ...]:
    """(batch, trials that reached the target, trials) of `rule` at each of `batches`."""
    if runs is None or runs.empty:
        return ()
    runs = ensure_columns(runs, schemas.RUNS)
    mine = runs[runs["lr_rule"].eq(rule).to_numpy(dtype=bool)]
    # pruned and probed trials stopped early by design: not reached, but not tried either
    mine = mine[~mine["status"].isin([schemas.RunStatus.PRUNED, schemas.RunStatus.PROBED])
                .to_numpy(dtype=bool)]
    sizes = numeric_column(mine, "batch_size")
    reached = mine["status"].eq(schemas.RunStatus.REACHED).to_numpy(dtype=bool)
    return tuple((b, int(reached[sizes == b].sum()), int((sizes == b).sum())) for b in batches)


def recorded_gradient_bytes(runs: pd.DataFrame) -> float | None:
    """The gradient bytes the trials recorded (the model they trained, with the dataset's own
    classes and shape); None in runs from before they did."""
    values = numeric_column(runs, "gradient_bytes")
    values = values[np.isfinite(values) & (values > 0)]
    return float(np.median(values)) if len(values) else None


def analysis_target(analysis: pd.DataFrame) -> tuple[str, float] | None:
    """The target the analysis rows are for; None in rows from before targets."""
    frame = ensure_columns(analysis, schemas.ANALYSIS)
    metric, value = frame["target_metric"].iloc[0], numeric_column(frame, "target_value")[0]
    if not isinstance(metric, str) or not math.isfinite(value):
        return None
    return metric, float(value)


def target_rows(runs: pd.DataFrame, target: tuple[str, float] | None) -> pd.DataFrame:
    """The runs rows of `target` (a trial has a row per target); all rows for old tables."""
    if target is None or runs["target_metric"].isna().all():
        return runs
    keep = runs["target_metric"].eq(target[0]) & np.isclose(
        numeric_column(runs, "target_value"), target[1])
    return runs[keep.to_numpy(dtype=bool)]


def _fitted(frame: pd.DataFrame) -> pd.DataFrame:
    s_min, e_min = numeric_column(frame, "s_min"), numeric_column(frame, "e_min")
    return frame[np.isfinite(s_min) & np.isfinite(e_min) & (s_min > 0) & (e_min > 0)]


def fitted_rules(analysis: pd.DataFrame) -> list[str]:
    """The LR rules the analysis fitted S(B) for."""
    return sorted(set(_fitted(ensure_columns(analysis, schemas.ANALYSIS))["lr_rule"]))


def steps_fit(analysis: pd.DataFrame, lr_rule: str | None) -> tuple[str, StepsFit, str]:
    """(rule, S(B) fit, band note) of `lr_rule`, or of the rule with the fewest large-batch
    steps S_min among those fitted. The band is the B_crit interval; without one it is the
    point, and the note says so."""
    frame = ensure_columns(analysis, schemas.ANALYSIS)
    fitted = _fitted(frame)
    rules = sorted(set(fitted["lr_rule"]))
    if lr_rule is not None and lr_rule not in rules:
        raise BadInput(f"no S(B) fit for LR rule {lr_rule!r} in the run's analysis; fitted: "
                       f"{', '.join(rules) or 'none'}")
    if fitted.empty:
        bounds = sorted({f"{b} {x:g}" for b, x in zip(frame["b_crit_bound"],
                         numeric_column(frame, "b_crit_bound_batch"), strict=True)
                         if isinstance(b, str)})
        why = f" (B_crit {', '.join(bounds)})" if bounds else ""
        raise BadInput("the run's analysis has no S(B) = S_min + E_min/B fit for any LR rule"
                       f"{why}: steps to target cannot be predicted at other batch sizes")
    by_rule = fitted.groupby("lr_rule").first()
    rule = lr_rule or str(by_rule["s_min"].astype(float).idxmin())
    row = by_rule.loc[rule]
    s_min, e_min = float(row["s_min"]), float(row["e_min"])
    low, high = float(row["b_crit_low"]), float(row["b_crit_high"])
    note = ""
    if not (math.isfinite(low) and not math.isnan(high) and 0 <= low <= high):  # inf: open
        low = high = e_min / s_min
        note = "no B_crit interval in the run (e.g. one seed): the band is the point estimate"
    return rule, StepsFit(s_min, e_min, low, high), note


def one_device_step_time(sweep: pd.DataFrame | None, runs: pd.DataFrame
                         ) -> tuple[dict[int, float], tuple[float, float], str]:
    """(measured seconds per step by batch, line (α, β), source). The convergence runs with one
    worker are the steps whose time to target is measured, so they come first (as for the
    analysis's T(B)), without the trials whose threads waited for a CPU STARVED_SHARE of their
    runnable time or more (a busy machine slowed them) while two batches are left; the sweep's
    line stands in where fewer than two batches were trained."""
    single = runs[numeric_column(runs, "workers") == 1]
    source = STEP_SOURCE_CONVERGENCE
    calm = single[~(numeric_column(single, "cpu_wait_share") >= STARVED_SHARE)]
    if calm["batch_size"].nunique() >= 2:
        if len(calm) < len(single):
            source += (f"; {len(single) - len(calm)} trial(s) left out: their threads waited "
                       f"for a CPU >= {STARVED_SHARE:.0%} of the time")
        single = calm
    elif len(calm) < len(single):
        source += f"; busy machine: threads waited for a CPU >= {STARVED_SHARE:.0%}, kept"
    measured = {int(b): float(t) for b, t in convergence_step_times(single).items()
                if math.isfinite(t) and t > 0}
    fit = fit_step_time(list(measured), list(measured.values()))
    if not (math.isfinite(fit.alpha_s) and math.isfinite(fit.beta_s)):
        _, fit, source = step_times(ensure_columns(sweep, schemas.SWEEP),
                                    runs.iloc[0:0], [])
    if not (math.isfinite(fit.alpha_s) and math.isfinite(fit.beta_s)):
        raise BadInput("the run has no step-time line t(B) = α + βB: fewer than two batch sizes "
                       "timed with one worker in the convergence runs, and no stable sweep")
    # A negative intercept or slope (noise at few batches) would predict times below zero.
    line = (max(fit.alpha_s, 0.0), max(fit.beta_s, 0.0))
    if sum(line) <= 0:
        raise BadInput(f"the step-time line from {source} does not grow with the batch "
                       f"(α {fit.alpha_s:.3g} s, β {fit.beta_s:.3g} s): nothing to plan with")
    return measured, line, source


def memory_limit(sweep: pd.DataFrame | None) -> tuple[int | None, str]:
    """The largest per-worker batch that fits (the sweep's OOM boundary), or None and why."""
    largest, reason = largest_fitting_batch(ensure_columns(sweep, schemas.SWEEP))
    if math.isfinite(largest):
        return int(largest), f"largest batch that fits: {int(largest)} ({reason})"
    if math.isinf(largest):
        return None, f"no memory limit measured ({reason}): larger batches are unchecked"
    return None, f"no memory limit: {reason}"


def shares_host(runs: pd.DataFrame) -> bool:
    """Whether the data-parallel trials ran on CPUs: then (torchrun, gloo) their workers are
    processes sharing one machine's cores, not a device each."""
    parallel = runs[numeric_column(runs, "workers") > 1]
    names = parallel["device_name"].dropna().astype(str) if "device_name" in parallel else []
    return len(names) > 0 and bool(names.str.startswith("cpu").all())


