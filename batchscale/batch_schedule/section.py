"""What a batch-schedule measurement says, read from its two tables (`critical_over_training`,
`schedule_check`; batchscale/batch_schedule/ writes them): B_simple against B_crit over the
checkpoints, the schedule, its prediction and its check with intervals, what it cost, the
summary Markdown (`batchscale batch-schedule`), the report's section and the answer card's line.
Every figure here comes from the tables, so the command, the report and the lake say the same.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from batchscale.analysis.critical import BOTTOM_CUT, TOP_CUT
from batchscale.analysis.figures import Plot
from batchscale.batch_schedule.check import (
    LEVEL,
    ends,
    final_dominates,
    ranged,
)
from batchscale.batch_schedule.findings import STEP_GOAL, Findings
from batchscale.batch_schedule.plot import plot

SECTION_ID = "critical-over-training"


# -------------------------------------------------------------------------------- the text


def crit_text(row) -> str:
    """B_crit with its interval, an end cut at the range the fit allows marked ≤ / ≥ (B_crit
    may lie beyond it: `cut_note`); a bound; or why there is none."""
    if math.isfinite(row["b_crit"]):
        note = _note(row)
        low = f"{'≤ ' if BOTTOM_CUT in note else ''}{row['b_crit_low']:.3g}"
        high = f"{'≥ ' if TOP_CUT in note else ''}{row['b_crit_high']:.3g}"
        interval = (f" [{low}, {high}]" if math.isfinite(row["b_crit_low"])
                    else " (no interval)")
        return f"{row['b_crit']:.3g}{interval}"
    if isinstance(row["b_crit_bound"], str) and row["b_crit_bound"]:
        return f"{row['b_crit_bound']} {row['b_crit_bound_batch']:g}"
    return f"none: {row['b_crit_reason']}"


def _note(row) -> str:
    note = row.get("b_crit_interval_note") if hasattr(row, "get") else None
    return note if isinstance(note, str) else ""


def cut_note(f: Findings) -> str:
    """What a ≤ / ≥ in the table means, where an interval is cut; "" where none is."""
    if not any(BOTTOM_CUT in _note(r) or TOP_CUT in _note(r)
               for r in f.crit.to_dict("records")):
        return ""
    return ("An interval end marked ≥ (≤) is cut where the fit stops, "
            "analysis.b_crit_range_factor × the largest (÷ the smallest) branch batch that "
            "reached the milestone: the branches say only that B_crit may lie beyond it. "
            "Wider branch_factors would measure it.")


TABLE_HEADINGS = ["checkpoint step", "examples", "val_loss", "milestone",
                  f"B_crit ({LEVEL:.0%})", "B_simple", "scheduled batch"]


def table_rows(f: Findings) -> list[list[str]]:
    return [[f"{r['checkpoint_step']:,}", f"{r['examples']:,}", f"{r['val_loss']:.4f}",
             f"{r['milestone_loss']:.4f}", crit_text(r),
             f"{r['b_simple']:.3g}" if math.isfinite(r["b_simple"]) else "–",
             _scheduled_cell(r)] for r in f.crit.to_dict("records")]


def _scheduled_cell(row: dict) -> str:
    """The scheduled batch, marked where it sits above this checkpoint's B_crit interval: the
    schedule never shrinks the batch, so an earlier checkpoint's larger B_crit (or bound) keeps
    it there."""
    batch = row["scheduled_batch_size"]
    high, bound = row.get("b_crit_high", math.nan), row.get("b_crit_bound")
    if not (isinstance(bound, str) and bound) and math.isfinite(high) and batch > high:
        return f"{batch} (kept from an earlier checkpoint: above this one's B_crit interval)"
    return str(batch)


def sentences(f: Findings) -> list[str]:
    """The section's paragraphs (Markdown), after its table: what a cut interval end in it
    means (where one is), then the findings."""
    paragraphs = [cut_note(f), _tracking_text(f.tracking),
                  f"**Schedule**: {f.schedule_text()}.{_lr_text(f)}", _prediction_text(f),
                  _check_text(f), _cost_text(f)]
    return [p for p in paragraphs if p]


def _lr_text(f: Findings) -> str:
    """How the schedule's learning rates were chosen and applied, so a user can reproduce the
    runs the check trained."""
    if not f.stages or not f.peak_lrs():
        return ""
    return (f" Each batch trains at the {f.rule} rule's peak learning rate for it (from "
            "convergence.base_lr at convergence.reference_batch_size, as in the reference "
            "run); the warm-up runs once, from the first step, and at a switch the learning "
            "rate changes with the batch, as in the check's scheduled runs.")


def markdown(f: Findings, workload: str) -> str:
    lines = [f"# The critical batch over training: {workload}", "",
             f"Reference run at batch {f.base_batch} ({f.rule} LR rule) to {f.target}; B_crit "
             "per checkpoint from branches to the loss the reference reached a fixed number "
             f"of steps later ({LEVEL:.0%} intervals).", "",
             "| " + " | ".join(TABLE_HEADINGS) + " |", "|" + "---|" * len(TABLE_HEADINGS)]
    lines += ["| " + " | ".join(row) + " |" for row in table_rows(f)]
    for paragraph in sentences(f):
        lines += ["", paragraph]
    return "\n".join(lines) + "\n"


def _tracking_text(t: dict) -> str:
    if t["ratio_mean"] is None and not t["points"]:
        return ("**B_simple against B_crit**: no checkpoint has both figures (a B_simple of "
                "– is an estimate that failed or was not yet made there: a ratio of two noisy "
                "terms, it can fall to 0 or below); nothing to compare.")
    if t["ratio_mean"] is None:
        return (f"**B_simple against B_crit**: {t['points']} checkpoint(s) with both figures; "
                "too few to compare.")
    text = (f"**B_simple against B_crit**: B_simple / B_crit {ranged(t['ratio_mean'])} "
            f"(geometric mean over {t['points']} checkpoints)")
    if t["rank"] is None:
        return text + "; too few checkpoints for a rank correlation."
    rho, low, high, p_value = t["rank"]
    interval = (f" [{low:.2f}, {high:.2f}]" if math.isfinite(low) else
                f" (no interval from {t['points']} checkpoints)")
    return (text + f"; Spearman rank correlation over checkpoints {rho:.2f}{interval}, and a "
            f"random order of the checkpoints would correlate as well {p_value:.0%} of the "
            "time.")


def _prediction_text(f: Findings) -> str:
    p = f.prediction
    if not f.stages:
        return ("**Prediction**: no saving — B_crit never passed twice the base batch at a "
                "checkpoint (or was not measured), so the schedule stays constant.")
    if p is None:
        return "**Prediction**: none — the reference run did not reach the target."
    fewer = 1 - p["predicted_steps"] / p["reference_steps"]
    return (f"**Prediction**: {p['predicted_steps']:,.0f} steps [{p['predicted_steps_low']:,.0f},"
            f" {p['predicted_steps_high']:,.0f}] to the target against the reference's "
            f"{p['reference_steps']:,.0f} ({fewer:.0%} fewer), {p['predicted_examples']:,.0f} "
            f"examples{_examples_range(p)} against {p['reference_steps'] * f.base_batch:,.0f}"
            f".{_bound_stages(f)}")


def _examples_range(p: dict) -> str:
    low, high = p.get("predicted_examples_low"), p.get("predicted_examples_high")
    if not all(isinstance(v, float) and math.isfinite(v) for v in (low, high)):
        return " (no range recorded)"
    return f" [{low:,.0f}, {high:,.0f}]"


def _bound_stages(f: Findings) -> str:
    """Why the prediction's point sits at its range's top where a stage rests on a bound: the
    estimate takes B_crit at the bound (the most steps), the range's other end steps falling
    like 1/B."""
    at = {float(r["val_loss"]): r for r in f.crit.to_dict("records")}
    chosen = [at[loss] for loss, _ in f.stages if loss in at]
    bounded = [r for r in chosen if isinstance(r.get("b_crit_bound"), str) and r["b_crit_bound"]]
    if not bounded:
        return ""
    which = ", ".join(f"step {int(r['checkpoint_step']):,} (B_crit {r['b_crit_bound']} "
                      f"{r['b_crit_bound_batch']:g})" for r in bounded)
    return (f" A stage rests on a bound, not a number, at {which}: the estimate takes B_crit "
            "at the bound, the most steps it allows, so it sits at its range's top; the range's "
            "other end has steps falling like 1/B.")


def _check_text(f: Findings) -> str:
    c = f.summary
    if not f.stages:
        return "**Check**: not run (the schedule is the constant batch)."
    if not c["seeds"]:
        return ("**Check**: not run, so the schedule above is untested — the reference run did "
                f"not reach the target within batch_schedule.max_steps{_short_of(f)}, so there "
                "is no constant run to compare with. Raise batch_schedule.max_steps, or set a "
                "target the reference run reaches.")
    diverged = f" ({c['diverged']} run(s) diverged)" if c["diverged"] else ""
    if not c["paired"]:
        return ("**Check**: no seed where both the scheduled and the constant run reached the "
                f"target{diverged}; nothing to compare.")
    steps = c["steps_to_target"]
    one = not math.isfinite(steps[1])  # one paired seed: no interval anywhere, said once

    def r(values, digits):
        return ranged(values, digits, said=one)

    fewer = (1 - steps[0], 1 - steps[2], 1 - steps[1])
    verdict = ("meets" if math.isfinite(fewer[1]) and fewer[1] >= STEP_GOAL else
               "one seed cannot establish" if one else "does not establish")
    saving = r(fewer, ".0%") + " fewer"
    if math.isfinite(fewer[1]) and fewer[1] < 0:  # the interval reaches more steps
        saving = (f"{fewer[0]:.0%} fewer, between {-fewer[1]:.0%} more and "
                  f"{fewer[2]:.0%} fewer")
    sched, const = c["scheduled_final_val_loss"], c["constant_final_val_loss"]
    return (f"**Check** ({c['paired']} of {c['seeds']} seeds with both runs at the target"
            f"{diverged}{'; one seed, so no intervals' if one else ''}): the schedule took "
            f"{r(steps, '.2f')}× the constant run's steps "
            f"({saving}; {verdict} the goal of {STEP_GOAL:.0%} fewer steps that makes a schedule "
            "worth taking), "
            f"{r(c['examples_to_target'], '.2f')}× its examples and "
            f"{r(c['train_time_s_to_target'], '.2f')}× its training time"
            f"{f.timing_flag()}; steps to "
            f"the target: scheduled {r(c['scheduled_steps'], ',.0f')}, constant "
            f"{r(c['constant_steps'], ',.0f')}. Validation loss at the stop: scheduled "
            f"{r(sched, '.4f')}, constant {r(const, '.4f')}.{_missed_prediction(f)}"
            f"{_final_text(c['final'])}")


def _short_of(f: Findings) -> str:
    """" (it stopped at step N with val_accuracy X against 0.95)": how far the reference run
    got; "" where its row does not say."""
    ref = f.reference
    value, steps = ref.get("final_metric"), ref.get("steps_run")
    if not (isinstance(value, float) and math.isfinite(value)) or steps is None:
        return ""
    metric, target = str(ref["target_metric"]), float(ref["target_value"])
    return (f" (it stopped at step {int(steps):,} with {metric} {value:.4g}, the target being "
            f"{target:g}{', after diverging' if ref.get('diverged') else ''})")


def _final_text(final: dict | None) -> str:
    """" Against a constant N from the first step …": the schedule against its own last batch,
    the fixed batch a user would otherwise jump to; "" where the table has no such runs."""
    if final is None:
        return ""
    n, runs, reached = final["batch_size"], final["runs"], final["reached"]
    diverged = f", {final['diverged']} diverged" if final["diverged"] else ""
    if not final["paired"]:
        return (f" A constant {n} from the first step (the schedule's last batch) reached the "
                f"target in {reached} of {runs} seeds{diverged}, none of them beside a "
                "scheduled run that reached it: no ratio to give.")
    said = final["paired"] < 2
    steps, examples = final["steps_to_target"], final["examples_to_target"]
    hedge = "from one seed, with no interval to show it: " if said else ""
    return (f" Against a constant {n} from the first step (the schedule's last batch; "
            f"{reached} of {runs} seeds reached the target{diverged}"
            f"{'; one seed, so no intervals' if said else ''}): the schedule took "
            f"{ranged(steps, '.2f', said)}× its steps and {ranged(examples, '.2f', said)}× its "
            f"examples; {hedge}{_final_verdict(final)}.")


def _final_verdict(final: dict) -> str:
    """What the ratios against the constant last batch mean for a user choosing between the
    two (a ratio is shown above or below 1 only when its whole interval is)."""
    n = final["batch_size"]
    steps, examples = ends(final["steps_to_target"]), ends(final["examples_to_target"])
    more_seeds = "more batch_schedule.check_seeds would tell"
    if final_dominates(final):
        fewer = ("no fewer examples" if examples[0] >= 1 else
                 f"is not shown to need fewer examples ({more_seeds})")
        return (f"the constant {n} needed fewer steps, and the schedule {fewer}: take the "
                f"constant {n} rather than the schedule")
    if steps[0] > 1:  # examples shown fewer, or dominance would hold
        return (f"the constant {n} needed fewer steps and the schedule fewer examples: the "
                f"constant {n} where device time costs most, the schedule where data does")
    if steps[1] < 1:
        return f"the schedule needed fewer steps than the constant {n} too"
    return (f"neither is shown to need fewer steps than the other ({more_seeds}), so the "
            f"simpler constant {n} is as good an answer as far as these seeds show"
            if examples[1] >= 1 else
            "neither is shown to need fewer steps, and the schedule needed fewer examples")


def _fixed_batches_text(f: Findings) -> str:
    """What the schedule was run beside, for the card and the terminal line."""
    final = f.summary["final"]
    if final is None or not final["paired"]:
        return "where it starts; no other fixed batch was run beside it"
    return (f"where it starts, and {ranged(final['steps_to_target'], '.2f')}× the steps and "
            f"{ranged(final['examples_to_target'], '.2f')}× the examples of a constant "
            f"{final['batch_size']}, its last batch")


def _missed_prediction(f: Findings) -> str:
    """" The prediction … did not hold …" where every scheduled run of the check that reached
    the target took steps outside the prediction's interval (the runs themselves: an interval
    for their mean grows wide with few seeds and would hide runs that all missed); "" where
    one lies inside, or either is missing."""
    p = f.prediction
    rows = f.check[(f.check["schedule"] == "scheduled") & f.check["reached"].astype(bool)]
    steps = [float(v) for v in pd.to_numeric(rows["steps_to_target"], errors="coerce")
             if math.isfinite(v)]
    if p is None or not steps or not all(
            math.isfinite(v) for v in (p["predicted_steps_low"], p["predicted_steps_high"])):
        return ""
    if any(p["predicted_steps_low"] <= v <= p["predicted_steps_high"] for v in steps):
        return ""
    runs = ", ".join(f"{v:,.0f}" for v in sorted(steps))
    return (f" The prediction ({p['predicted_steps']:,.0f} steps [{p['predicted_steps_low']:,.0f}"
            f", {p['predicted_steps_high']:,.0f}]) did not hold: the scheduled runs' steps "
            f"({runs}) all lie outside it, so the check, not the prediction, says what the "
            "schedule does.")


def _cost_text(f: Findings) -> str:
    cost = f.cost_s()
    share = cost["branches"] / cost["reference"] if cost["reference"] else math.nan
    return (f"**Cost** (seconds of this device, training and evaluation): reference run "
            f"{cost['reference']:.1f} s, branches {cost['branches']:.1f} s ({share:.2f}× the "
            f"reference run), check {cost['check']:.1f} s. One measurement, no spread"
            f"{f.timing_flag()}.")


def answer_line(f: Findings) -> str | None:
    """The answer card's line when the checked schedule needs fewer steps; None otherwise."""
    if not f.wins:
        return None
    steps, seeds = f.summary["steps_to_target"], f.summary["paired"]
    examples = f.summary["examples_to_target"]
    return (f"**Batch-size schedule: {f.schedule_text()}** — it took {ranged(steps, '.2f')}× "
            f"the steps and {ranged(examples, '.2f')}× the examples of a constant "
            f"{f.base_batch} ({_fixed_batches_text(f)}) to "
            f"{f.target}, checked from {seeds} seeds ([evidence](#{SECTION_ID})).")


def summary_line(f: Findings) -> str:
    """One plain line for a terminal summary: the answer card's line when the schedule won its
    check, else what the check (or its absence) says."""
    if f.wins:
        steps = f.summary["steps_to_target"]
        examples = f.summary["examples_to_target"]
        return (f"batch-size schedule: {f.schedule_text()} — {ranged(steps, '.2f')}x the "
                f"steps and {ranged(examples, '.2f')}x the examples of a constant "
                f"{f.base_batch} ({_fixed_batches_text(f).replace('×', 'x')}; checked from "
                f"{f.summary['paired']} seeds)")
    check = _check_text(f).replace("**", "")
    return f"batch-size schedule: {f.schedule_text()} — {check}"


# ----------------------------------------------------------------------------- the section


@dataclass(frozen=True)
class ScheduleSection:
    """What the analysis report shows of a batch-schedule measurement."""

    intro: str
    headings: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    paragraphs: tuple[str, ...]
    """Markdown, one per paragraph."""
    plot: Plot
    answer: str | None
    """The answer card's line (Markdown), when the checked schedule needs fewer steps."""


def section(f: Findings) -> ScheduleSection:
    intro = (f"Reference run at batch {f.base_batch} ({f.rule} LR rule) to {f.target}; B_crit "
             "per checkpoint from branches to the loss the reference reached a fixed number "
             f"of steps later ({LEVEL:.0%} intervals).")
    return ScheduleSection(intro, tuple(TABLE_HEADINGS), tuple(map(tuple, table_rows(f))),
                           tuple(sentences(f)), plot(f), answer_line(f))


def read_section(crit_path: str, check_path: str,
                 max_cpu_wait_share: float | None) -> ScheduleSection | None:
    """The section from the stage's two table files; None when the measurement has no rows."""
    from batchscale.storage import read_table_file

    return table_section(read_table_file(crit_path).to_pandas(),
                         read_table_file(check_path).to_pandas(), max_cpu_wait_share)


def table_section(crit: pd.DataFrame | None, check: pd.DataFrame | None,
                  max_cpu_wait_share: float | None) -> ScheduleSection | None:
    """The section from the two tables (None when either is missing or empty)."""
    if crit is None or check is None or crit.empty or check.empty:
        return None
    return section(Findings.from_tables(crit, check, max_cpu_wait_share))
