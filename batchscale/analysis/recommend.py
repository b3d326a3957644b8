"""The recommendation: batch size, LR rule, learning rate and worker count, each with a one-line
reason."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from batchscale.analysis.expected import (
    Spread,
    accumulation_text,
    as_fast,
    as_fast_text,
    cell_runs,
    cell_time,
    expected_text,
    lr_versus_current,
    short_number,
    steps_spread,
    versus_current,
)
from batchscale.analysis.parallel import worker_choice, worker_counts
from batchscale.analysis.summary import Recommendation
from batchscale.analysis.timetotarget import BStar, StepTimeSource, optimal_batch_text
from batchscale.analysis.usertables import DEFAULT_LR_RULE
from batchscale.conditions import shares_apart
from batchscale.fits import ensure_columns, matches, numeric_column
from batchscale.schemas import RUNS, TUNED_RULE, RunStatus

MEASURED_IN = {
    # The step time of a batch is pooled over its trials of every LR rule (a step's work does
    # not depend on the learning rate), so the product can fall outside the seeds' own times.
    StepTimeSource.CONVERGENCE: "from the runs' own training time over their steps, the median "
                                "over the batch's trials of every LR rule",
    StepTimeSource.SWEEP: "from the sweep",
    StepTimeSource.SWEEP_FIT: "from the sweep's line t(B)",
}


def recommend(
    table: pd.DataFrame,
    runs: pd.DataFrame,
    b_star: dict[str, tuple] | None = None,
    max_cpu_wait_share: float | None = None,
    learning_rates_given: bool = True,
    current: tuple[int | None, float | None] = (None, None),
    largest_fitting: float = math.inf,
    lr_rule_given: bool = True,
    warmup_steps: int | None = None,
) -> Recommendation:
    """Batch size, LR rule and worker count, each with a one-line reason.

    Batch: the minimum measured time to target (S·t) over reached (rule, batch) cells; the
    model optimum B* of the chosen rule (`b_star`, per rule: a `BStar` or its leading fields,
    B* and its interval) is quoted to
    explain it, not to override the measurement. LR rule: the smallest S at that batch.
    Workers: `worker_choice` at that rule and batch. `table` has lr_rule, batch_size,
    steps_to_target, step_time_s, time_to_target_s (and step_time_source, timing_flag, where
    known). A choice made from flagged timings says so in its reason: a timing flag on the
    chosen cell, or trials that waited for a CPU at least `max_cpu_wait_share` of their
    runnable time behind the workers. `current` (batch size, learning rate trained with today,
    each None when not given): what the expected figures are compared with (expected.py).
    `largest_fitting`: the largest batch one device was measured to hold (the sweep's memory
    wall); a recommended batch above it comes with accumulation steps. `warmup_steps`: the
    runs' learning-rate warm-up (convergence.warmup_steps), said with the learning rate; None
    (tables from elsewhere) says nothing of it.
    """
    timed = (
        table[np.isfinite(numeric_column(table, "time_to_target_s"))] if not table.empty else table
    )
    with_batch = "it goes with the batch size, which could not be chosen (above)"
    if timed.empty:
        workers, workers_reason = worker_choice(runs)
        if not reached_any(runs):  # a worker count that trains nothing to the target is no answer
            workers, workers_reason = None, "no trial reached the target (above)"
        reason = _nothing_timed_reason(runs)
        return Recommendation(None, None, workers, reason,
                              with_batch if lr_rule_given else NO_RULE_GIVEN, workers_reason,
                              learning_rate_reason=with_batch,
                              lr_rule_shown=None if lr_rule_given else "not given")
    # an exact tie in time goes to the fewer steps (the larger batch)
    best = timed.sort_values(["time_to_target_s", "steps_to_target", "batch_size"]).iloc[0]
    batch = int(best["batch_size"])
    at_batch = timed[timed["batch_size"] == batch].sort_values(["steps_to_target", "lr_rule"])
    rule = str(at_batch.iloc[0]["lr_rule"])
    workers, workers_reason = worker_choice(runs, (rule, batch))
    seeds = cell_time(runs, timed, rule, batch, workers)
    batch_reason = fastest_text(best, seeds)
    model = BStar(*(b_star or {}).get(rule, (math.nan,) * 3))
    if math.isfinite(model.value):
        optimum = optimal_batch_text(model.value, model[1:3], model.cap, model.line,
                                     model.why_open)
        batch_reason += f"; the model optimum sqrt(α·B_crit/β) is {optimum}"
    rule_reason = fewest_steps_reason(runs, at_batch, rule, batch, workers)
    shown = None
    if not lr_rule_given and rule == DEFAULT_LR_RULE:
        shown, rule_reason = "not given", NO_RULE_GIVEN
    # the chosen cell's timing flag ends its line, after the cells as fast as it
    batch_reason += as_fast_text(as_fast(runs, timed, rule, batch, workers),
                                 timed["lr_rule"].nunique())
    if seeds is None or seeds.seeds < 2:
        batch_reason += next_fastest_text(timed, best)
    batch_reason += edge_of_grid_text(batch, timed, largest_fitting, model)
    if isinstance(best.get("timing_flag"), str):
        batch_reason += f" — NOT TRUSTED: {best['timing_flag']}"
    else:
        batch_reason += rivals_flagged_text(timed, batch)
    batch_reason += accumulation_text(batch, largest_fitting, workers)
    lr, lr_reason = (learning_rate(runs, rule, batch, workers) if learning_rates_given else
                     (None, "the runs table gives no learning rates (no lr column)"))
    current_batch, current_lr = current
    # The learning rate, expectation and saving all speak of one (rule, batch, workers) cell.
    return Recommendation(batch, rule, workers, batch_reason, rule_reason,
                          workers_reason + _starved_note(runs, max_cpu_wait_share), lr,
                          lr_reason + (warmup_text(lr, warmup_steps) if ran_schedule(runs)
                                       else "")
                          + lr_versus_current(lr, current_lr)
                          + (edge_text(runs, rule, batch, workers) if rule != TUNED_RULE
                             else ""),
                          expected_text(runs, table, rule, batch, workers, lr),
                          versus_current(runs, table, rule, batch, current_batch, workers, lr,
                                         current_lr),
                          shown)


def rivals_flagged_text(timed: pd.DataFrame, batch: int) -> str:
    """" — NOT TRUSTED: …" where the chosen batch's own step times are clean but those of
    batches it beat are flagged: a busy machine that slowed them may have chosen it."""
    if "timing_flag" not in timed:
        return ""
    others = timed[(numeric_column(timed, "batch_size") != batch)
                   & timed["timing_flag"].map(lambda flag: isinstance(flag, str))]
    if others.empty:
        return ""
    batches = ", ".join(str(b) for b in sorted({int(b) for b in others["batch_size"]}))
    return (f" — NOT TRUSTED: the step times of batch {batches}, which it was compared with, "
            "are flagged (see the results table's timing column): a busy machine that slowed "
            "them may have made this batch the fastest; rerun on a quiet machine")


def edge_of_grid_text(batch: int, timed: pd.DataFrame, largest_fitting: float,
                      model: BStar | None = None) -> str:
    """Where the fastest batch is at an end of those trained (the largest one only where one
    device holds more), say that one past it may be faster still and how to find out; "" else.
    Where the model optimum's interval lies wholly on the other side of that end, the two
    disagree, and the text says so rather than leaning either way."""
    batches = numeric_column(timed, "batch_size")
    model = model or BStar(math.nan, math.nan, math.nan)
    if batch <= batches.min() and np.unique(batches).size > 1:
        return (f"; {batch} is the smallest batch trained, so a smaller one may be faster "
                f"still{_model_against(model, batch, above=True)}: add smaller sizes to "
                "convergence.batch_sizes to find where the time turns")
    if batch < batches.max() or batch >= largest_fitting:
        return ""
    fits = (f" (up to {largest_fitting:,.0f}, the largest one device was measured to hold)"
            if math.isfinite(largest_fitting) else "")
    return (f"; {batch} is the largest batch trained, so a larger one may be faster "
            f"still{_model_against(model, batch, above=False)}: add larger sizes to "
            f"convergence.batch_sizes{fits} to find where the time turns")


def _model_against(model: BStar, batch: int, above: bool) -> str:
    """", though the model optimum … lies wholly below it …" where B*'s interval excludes the
    measured end from the side the measurement points away from; "" otherwise."""
    low, high = model.low, model.high
    if not (math.isfinite(low) and math.isfinite(high)):
        return ""
    if (above and low > batch) or (not above and high < batch):
        side = "above" if above else "below"
        return (f", though the model optimum's interval [{low:,.0f}, {high:,.0f}] lies wholly "
                f"{side} it: the measured times and the step-time model disagree here, and "
                "only measuring past it settles which holds")
    return ""


NO_RULE_GIVEN = ("the runs table gives no lr_rule: the steps are the fewest per batch size over "
                 "the learning rates its runs used, and no rule says how to scale the learning "
                 "rate with the batch")


def next_fastest_text(timed: pd.DataFrame, best: pd.Series) -> str:
    """"; one run at this batch, so no spread …: the next fastest, batch 32, took 1.00× this
    time": where the chosen cell has no seeds to compare by, how close the runner-up came."""
    others = timed[timed["batch_size"] != best["batch_size"]].sort_values(
        ["time_to_target_s", "steps_to_target", "batch_size"])
    if others.empty:
        return ""
    runner = others.iloc[0]
    ratio = float(runner["time_to_target_s"]) / float(best["time_to_target_s"])
    return (f"; one run at this batch, so no spread over seeds says how far the others are: the "
            f"next fastest, batch {int(runner['batch_size'])}, took {ratio:.2f}× this time in "
            f"{float(runner['steps_to_target']):,.0f} steps")


def fastest_text(best: pd.Series, seeds: Spread | None) -> str:
    """"fastest time to target: 0.054 s [0.0434, 0.0645] over 2 seeds (75 steps × 0.72 ms per
    step …)": the cell's median steps × its step time, as the results table has it, with its
    seeds' measured spread around it (`expected.cell_time`), so the figure carries its spread."""
    source = MEASURED_IN.get(best.get("step_time_source"), "")
    ranged = seeds is not None and seeds.seeds >= 2
    band = (f" [{seeds.low:.3g}, {seeds.high:.3g}] over {seeds.seeds} {seeds.counted}s"
            if ranged and seeds.on_table else "")
    gap = (", its low end reaching back over the gap between evaluations"
           if seeds is not None and seeds.evaluation_gap > 1 else "")
    said = (f"; the band is its seeds' measured times to target, as shares of their median{gap}"
            if band else "")
    if ranged and not seeds.on_table:  # their clocks, at the worker count chosen
        said = f"; its {seeds.seeds} {seeds.counted}s took {seeds.low:.3g}–{seeds.high:.3g} s"
    steps = short_number(best["steps_to_target"], 3)
    return (f"fastest time to target: {best['time_to_target_s']:.3g} s{band} ({steps} steps × "
            f"{1e3 * best['step_time_s']:.3g} ms per step{' ' + source if source else ''}{said})"
            f"{extrapolated_text(best)}")


def extrapolated_text(cell: pd.Series) -> str:
    """" — EXTRAPOLATED: …" where the cell's step time is the sweep's line t(B) outside the
    batches the sweep timed (the results table's sweep_timed_low/high), else ""."""
    low, high = cell.get("sweep_timed_low", math.nan), cell.get("sweep_timed_high", math.nan)
    if cell.get("step_time_source") != StepTimeSource.SWEEP_FIT or not (
            math.isfinite(low) and math.isfinite(high)):
        return ""
    batch = float(cell["batch_size"])
    if low <= batch <= high:
        return ""
    factor = batch / high if batch > high else low / batch
    return (f" — EXTRAPOLATED: the sweep timed batches {low:,.0f}–{high:,.0f} only, so this "
            f"step time is its line t(B) {factor:.2g}× past them; time this batch (sweep."
            "batch_sizes) to trust it")


def fewest_steps_reason(runs: pd.DataFrame, at_batch: pd.DataFrame, rule: str, batch: int,
                        workers: int | None) -> str:
    """Why `rule` at `batch`: its steps beside the other rules', each with its range over the
    seeds (and evaluation gaps) at the learning rate the card would give it, and the rules whose
    range overlaps the chosen one's: there the seeds cannot tell the rules apart."""
    spreads = {r: steps_spread(runs, r, batch, workers, learning_rate(runs, r, batch, workers)[0])
               for r in at_batch["lr_rule"]}
    listing = ", ".join(
        f"{r} {s:.0f}{_band(spreads[r])}"
        for r, s in zip(at_batch["lr_rule"], at_batch["steps_to_target"], strict=True)
    )
    text = f"fewest steps to target at batch {batch} ({listing})"
    mine = spreads.get(rule)
    tied = [r for r, spread in spreads.items() if r != rule and mine and mine.overlaps(spread)]
    if tied:
        text += (f"; {' and '.join(tied)} within its range: the seeds cannot tell the rules "
                 "apart at this batch")
    return text


def _band(spread: Spread | None) -> str:
    return f" [{spread.low:.0f}, {spread.high:.0f}]" if spread and spread.ranged else ""


def ran_schedule(runs: pd.DataFrame) -> bool:
    """Whether batchscale's trainer ran the trials' learning-rate schedule (and so the config's
    warm-up): its runs record the optimizer it built. A TrainingLoop's record none: its schedule
    is its own (`trial.lr_at` if it asks, or its framework's, as a Hugging Face Trainer's linear
    decay with no warm-up), which batchscale does not see."""
    return "optimizer" in runs and runs["optimizer"].notna().any()


def warmup_text(lr: float | None, warmup_steps: int | None) -> str:
    """The warm-up that goes with the learning rate, as the runs had it; None: the runs ran
    batchscale's schedule but the warm-up is not known here (a runs table read alone)."""
    if lr is None:
        return ""
    if warmup_steps is None:
        return (", with the warm-up the runs had, which the runs table does not record "
                "(convergence.warmup_steps: give the config they ran with)")
    if warmup_steps == 0:
        return ", with no warm-up, as the runs had (convergence.warmup_steps)"
    return (f", reached by a linear warm-up over the first {warmup_steps} steps, as the runs had "
            "(convergence.warmup_steps)")


def learning_rate(runs: pd.DataFrame, rule: str, batch: int,
                  workers: int | None = None) -> tuple[float | None, str]:
    """The learning rate to use with `rule` at `batch` (and `workers`: `cell_runs`): the one
    its reached runs there used (the tuned rule: the LR of the run with the fewest steps), and
    why, with what became of the other learning rates tried there."""
    if "lr" not in runs.columns or runs.empty:
        return None, "the runs do not record their learning rate"
    if "status" not in runs.columns:  # a table without statuses lists runs that reached
        runs = runs.assign(status=RunStatus.REACHED)
    cell = cell_runs(runs, rule, batch, workers)
    cell = cell.assign(lr=numeric_column(cell, "lr"))
    cell = cell[np.isfinite(cell["lr"])]
    finite = cell[matches(cell, "status", RunStatus.REACHED)]
    if finite.empty:
        return None, f"no reached run at batch {batch} with the {rule} rule records its LR"
    # The runs that did not reach the target say which learning rates were tried and failed.
    others = _other_lrs_text(cell[~cell["lr"].isin(set(finite["lr"]))])
    tried = finite["lr"].nunique()
    if rule == TUNED_RULE and tried == 1:
        if not others:
            return float(finite["lr"].iloc[0]), (f"the one learning rate the runs at batch "
                                                 f"{batch} used (none other was tried there)")
        return float(finite["lr"].iloc[0]), (f"the only one that reached the target at batch "
                                             f"{batch}{others}")
    if rule == TUNED_RULE or tried > 1:
        best = finite.sort_values(["steps_to_target", "lr"]).iloc[0]
        among = f"among the {tried} that reached the target" if others else f"among {tried} tried"
        return float(best["lr"]), (f"the learning rate of the fewest steps at batch {batch} "
                                   f"{among}{others}")
    runs_n = len(finite)
    return float(finite["lr"].iloc[0]), (f"what the {rule} rule gave at batch {batch} in "
                                         f"{'all ' if runs_n > 1 else ''}{runs_n} reached "
                                         f"run{'s' if runs_n > 1 else ''}{others}")


def edge_text(runs: pd.DataFrame, rule: str, batch: int, workers: int | None) -> str:
    """"; at batch 256, the next the rule ran (learning rate 0.4), 1 of 2 runs did not reach
    the target: …" where runs failed there, else "": the rule's next, larger learning rate
    did not train every seed, so the recommended one sits near its edge."""
    every = ensure_columns(runs, RUNS)
    sizes = numeric_column(every[matches(every, "lr_rule", rule)], "batch_size")
    larger = sorted({int(b) for b in sizes if np.isfinite(b) and b > batch})
    if not larger:
        return ""
    cell = cell_runs(runs, rule, larger[0], workers)
    failed = cell[~matches(cell, "status", RunStatus.REACHED)]
    here = numeric_column(cell_runs(runs, rule, batch, workers), "lr")
    there = numeric_column(cell, "lr")
    # Only a rule whose learning rate grows with the batch (not the constant rule) has a
    # "next learning rate" to speak of.
    if failed.empty or not (np.nanmin(there, initial=np.inf) > np.nanmax(here, initial=-np.inf)):
        return ""
    rates = sorted({f"{lr:.4g}" for lr in there if np.isfinite(lr)})
    said = f" (learning rate {', '.join(rates)})" if rates else ""
    return (f"; at batch {larger[0]}, the next the rule ran{said}, {len(failed)} of {len(cell)} "
            "runs did not reach the target: the rule's next learning rate did not train "
            "every seed, so this one sits near its edge")


OUTCOMES = {
    RunStatus.DIVERGED: "diverged",
    RunStatus.NOT_REACHED: "did not reach the target",
    RunStatus.PRUNED: "was pruned by the adaptive search",
    RunStatus.PROBED: "was only probed by the adaptive search",
    RunStatus.FAILED: "failed (its training loop raised)",
}


def _other_lrs_text(failed: pd.DataFrame) -> str:
    """"; 200 was tried and diverged" for each learning rate of `failed` (runs of LRs none of
    whose runs reached the target), per status where its runs ended differently; "" if none."""
    parts = []
    for lr, rows in failed.groupby("lr", sort=True):
        statuses = rows["status"].fillna("unknown").astype(str).value_counts(sort=False)
        said = {status: OUTCOMES.get(status, f"ended {status}") for status in statuses.index}
        if len(statuses) == 1:
            n = len(rows)
            parts.append(f"{lr:.4g} was tried and {next(iter(said.values()))}"
                         + (f" (all {n} runs)" if n > 1 else ""))
        else:
            parts.append(f"{lr:.4g} was tried: " + ", ".join(
                f"{n} run{'s' if n > 1 else ''} {said[status]}" for status, n in statuses.items()))
    return "".join(f"; {part}" for part in parts)


def _starved_note(runs: pd.DataFrame, max_share: float | None) -> str:
    """" — NOT TRUSTED: …" when any convergence trial waited for a CPU at least `max_share` of
    its runnable time (the worker comparison's times come from all of them), else "". With
    one worker count nothing was compared on time, so there is nothing to distrust."""
    runs = ensure_columns(runs, RUNS)
    waits = numeric_column(runs, "cpu_wait_share")
    known = np.isfinite(waits)
    if (max_share is None or not known.any() or waits[known].max() < max_share
            or len(worker_counts(runs)) < 2):
        return ""
    starved = known & (waits >= max_share)
    counts = numeric_column(runs, "workers")[starved]
    which = ", ".join(f"{c}-worker" for c in sorted({int(c) for c in counts if np.isfinite(c)}))
    worst_text, limit_text = shares_apart(float(waits[known].max()), max_share)
    return (
        f" — NOT TRUSTED: {int(starved.sum())} of {int(known.sum())} convergence trials "
        f"({which or 'of unknown worker count'}) waited for a CPU up to {worst_text} of their "
        f"runnable time (at least {limit_text}: a busy machine slowed them)"
    )


def _reached(runs: pd.DataFrame) -> pd.DataFrame:
    """The trials that reached the target with a step count."""
    runs = ensure_columns(runs, RUNS)
    return runs[matches(runs, "status", RunStatus.REACHED)
                & np.isfinite(numeric_column(runs, "steps_to_target"))]


def reached_any(runs: pd.DataFrame) -> bool:
    return not _reached(runs).empty


def _nothing_timed_reason(runs: pd.DataFrame) -> str:
    """Why there is no batch to recommend: every trial diverged, or none reached the target."""
    runs = ensure_columns(runs, RUNS)
    if len(runs) and matches(runs, "status", RunStatus.DIVERGED).all():
        return f"every convergence trial diverged ({len(runs)} trials): nothing reached the target"
    reached = _reached(runs)
    if reached.empty:
        return "no trial reached the target"
    fewest = reached.sort_values(["steps_to_target", "batch_size"]).iloc[0]
    runs_word = "1 run" if len(reached) == 1 else f"{len(reached)} runs"
    return (f"{runs_word} reached the target (fewest steps: "
            f"{fewest['steps_to_target']:,.0f} at batch {int(fewest['batch_size'])}), but choosing "
            "a batch size needs the time per step: give a sweep table (`--sweep FILE`) or a "
            "time_to_target_s or train_time_s column with the runs")
