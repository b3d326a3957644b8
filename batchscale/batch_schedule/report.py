"""What a batch-schedule measurement says: its table (schemas.CRITICAL_OVER_TRAINING), a
Markdown summary whose every figure carries its interval or says why it has none, and the
B_crit(t) plot with B_simple(t) beside it."""

from __future__ import annotations

import math

import pyarrow as pa

from batchscale.batch_schedule.fit import LEVEL
from batchscale.batch_schedule.stage import Outcome, crit_text, schedule_text
from batchscale.schemas import make_table

STEP_GOAL = 0.25
"""The schedule is worth taking when it needs at least this share fewer optimizer steps."""


def table(outcome: Outcome, rule: str, env: dict) -> pa.Table:
    scheduled = _scheduled_batches(outcome)
    cost = {}
    for row in outcome.branches:
        step = row["checkpoint_step"]
        cost[step] = cost.get(step, 0.0) + row["train_time_s"] + row["eval_time_s"]
    rows = []
    for f in outcome.fits:
        row = f.as_row()
        rows.append({
            "checkpoint_step": f.checkpoint_step, "examples": f.examples, "val_loss": f.val_loss,
            "milestone_loss": f.milestone_loss, "base_batch_size": outcome.base_batch,
            "lr_rule": rule, "batches_reached": f.batches_reached, "b_crit": f.b_crit,
            "b_crit_low": f.b_crit_low, "b_crit_high": f.b_crit_high,
            "b_crit_bound": f.bound or None, "b_crit_bound_batch": row["bound_batch"],
            "b_crit_reason": f.reason or None, "s_min": f.s_min, "e_min": f.e_min,
            "b_simple": f.b_simple, "scheduled_batch_size": scheduled[f.checkpoint_step],
            "branch_device_s": cost.get(f.checkpoint_step, 0.0)})
    return make_table("critical_over_training", rows, env)


def _scheduled_batches(outcome: Outcome) -> dict[int, int]:
    """The schedule's batch from each checkpoint on."""
    by_loss = {s.from_loss: s.batch_size for s in outcome.stages}
    batch, result = outcome.base_batch, {}
    for f in sorted(outcome.fits, key=lambda f: f.checkpoint_step):
        batch = by_loss.get(f.val_loss, batch)
        result[f.checkpoint_step] = batch
    return result


def _range(values, digits: str = ".3g") -> str:
    value, low, high = values
    if not math.isfinite(low):
        return f"{value:{digits}} (one seed: no interval)"
    return f"{value:{digits}} [{low:{digits}}, {high:{digits}}]"


def markdown(outcome: Outcome, workload: str, rule: str) -> str:
    t = outcome.target
    lines = [f"# The critical batch over training: {workload}", "",
             f"Reference run at batch {outcome.base_batch} ({rule} LR rule) to {t.metric} "
             f"{t.value:g}; B_crit per checkpoint from branches to the loss the reference "
             f"reached a fixed number of steps later ({LEVEL:.0%} intervals).", "",
             "| checkpoint step | examples | val_loss | milestone | B_crit | B_simple | "
             "scheduled batch |", "|---|---|---|---|---|---|---|"]
    scheduled = _scheduled_batches(outcome)
    for f in outcome.fits:
        simple = f"{f.b_simple:.3g}" if math.isfinite(f.b_simple) else "–"
        lines.append(f"| {f.checkpoint_step:,} | {f.examples:,} | {f.val_loss:.4f} | "
                     f"{f.milestone_loss:.4f} | {crit_text(f).removeprefix('B_crit ')} | "
                     f"{simple} | {scheduled[f.checkpoint_step]} |")
    lines += ["", _tracking_text(outcome.tracking), "",
              f"**Schedule**: {schedule_text(outcome.stages, outcome.base_batch)}."]
    lines += ["", _prediction_text(outcome), "", _check_text(outcome), "", _cost_text(outcome)]
    return "\n".join(lines) + "\n"


def _tracking_text(tracking: dict) -> str:
    if tracking["ratio_mean"] is None:
        return (f"**B_simple against B_crit**: {tracking['points']} checkpoint(s) with both "
                "figures; too few to compare.")
    text = (f"**B_simple against B_crit**: B_simple / B_crit "
            f"{_range(tracking['ratio_mean'])} (geometric mean over {tracking['points']} "
            "checkpoints)")
    if tracking["rank"] is None:
        return text + "; too few checkpoints for a rank correlation."
    rho, low, high, p_value = tracking["rank"]
    interval = (f" [{low:.2f}, {high:.2f}]" if math.isfinite(low) else
                f" (no interval from {tracking['points']} checkpoints)")
    return (text + f"; Spearman rank correlation over checkpoints {rho:.2f}{interval}, and a "
            f"random order of the checkpoints would correlate as well {p_value:.0%} of the "
            "time.")


def _prediction_text(outcome: Outcome) -> str:
    p = outcome.prediction
    if not outcome.stages:
        return ("**Prediction**: no saving — B_crit never passed twice the base batch at a "
                "checkpoint (or was not measured), so the schedule stays constant.")
    if not math.isfinite(p["reference_steps"]):
        return "**Prediction**: none — the reference run did not reach the target."
    fewer = 1 - p["steps"] / p["reference_steps"]
    return (f"**Prediction**: {p['steps']:,.0f} steps [{p['steps_low']:,.0f}, "
            f"{p['steps_high']:,.0f}] to the target against the reference's "
            f"{p['reference_steps']:,.0f} ({fewer:.0%} fewer), {p['examples']:,.0f} examples "
            f"[{p['examples_low']:,.0f}, {p['examples_high']:,.0f}] against "
            f"{p['reference_examples']:,.0f}.")


def _check_text(outcome: Outcome) -> str:
    c = outcome.check
    if not outcome.stages:
        return "**Check**: not run (the schedule is the constant batch)."
    if not c:
        return ("**Check**: not run — the reference run did not reach the target within "
                "batch_schedule.max_steps, so there is no constant run to compare with.")
    if not c.get("paired"):
        return ("**Check**: no seed where both the scheduled and the constant run reached the "
                "target; nothing to compare.")
    steps = c["steps_to_target"]
    fewer = (1 - steps[0], 1 - steps[2], 1 - steps[1])
    verdict = ("meets" if math.isfinite(fewer[1]) and fewer[1] >= STEP_GOAL else
               "does not establish")
    sched, const = c["scheduled_final_val_loss"], c["constant_final_val_loss"]
    return (f"**Check** ({c['paired']} of {c['seeds']} seeds with both runs at the target): the "
            f"schedule took {_range(steps, '.2f')}× the constant run's steps "
            f"({_range(fewer, '.0%')} fewer; {verdict} the {STEP_GOAL:.0%} goal), "
            f"{_range(c['examples_to_target'], '.2f')}× its examples and "
            f"{_range(c['train_time_s_to_target'], '.2f')}× its training time; steps to "
            f"the target: scheduled {_range(c['scheduled_steps'], ',.0f')}, constant "
            f"{_range(c['constant_steps'], ',.0f')}. Validation loss at the stop: scheduled "
            f"{_range(sched, '.4f')}, constant {_range(const, '.4f')}.")


def _cost_text(outcome: Outcome) -> str:
    cost = outcome.cost_s
    share = cost["branches"] / cost["reference"] if cost["reference"] else math.nan
    return (f"**Cost** (seconds of this device, training and evaluation): reference "
            f"run {cost['reference']:.1f} s, branches {cost['branches']:.1f} s "
            f"({share:.2f}× the reference run), check {cost['check']:.1f} s. One measurement, "
            "no spread.")


def plot_png(outcome: Outcome, path) -> None:
    """B_crit(t) with its interval at each checkpoint and B_simple(t) along the reference run,
    against examples seen (log y)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    curve = [r for r in outcome.curve if r.get("b_simple") and r["b_simple"] > 0]
    ax.plot([r["examples"] for r in curve], [r["b_simple"] for r in curve], color="tab:gray",
            label="B_simple (reference run)")
    for f in outcome.fits:
        if math.isfinite(f.b_crit):
            low = f.b_crit - f.b_crit_low if math.isfinite(f.b_crit_low) else 0
            high = f.b_crit_high - f.b_crit if math.isfinite(f.b_crit_high) else 0
            ax.errorbar(f.examples, f.b_crit, yerr=[[low], [high]], fmt="o", color="tab:blue",
                        capsize=4)
        elif f.bound:
            ax.plot(f.examples, f.bound_batch, marker="^" if f.bound == "above" else "v",
                    color="tab:blue", linestyle="none")
    ax.plot([], [], "o", color="tab:blue", label=f"B_crit ({LEVEL:.0%}); triangles: bounds")
    scheduled = _scheduled_batches(outcome)
    if outcome.stages:
        steps = sorted(outcome.fits, key=lambda f: f.checkpoint_step)
        xs = [0] + [f.examples for f in steps] + [outcome.curve[-1]["examples"]]
        ys = [outcome.base_batch] + [scheduled[f.checkpoint_step] for f in steps]
        ax.step(xs, ys + ys[-1:], where="post", color="tab:orange",
                label="scheduled batch (from the checkpoint's loss on)")
    ax.set_yscale("log")
    ax.set_xlabel("examples seen by the reference run")
    ax.set_ylabel("batch size (examples)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, format="png", metadata={"Software": None})
    plt.close(fig)
