"""What a batch-schedule measurement says, read from its two tables (`critical_over_training`,
`schedule_check`; batchscale/batch_schedule/ writes them): B_simple against B_crit over the
checkpoints, the schedule, its prediction and its check with intervals, what it cost, the
summary Markdown (`batchscale batch-schedule`), the report's section and the answer card's line.
Every figure here comes from the tables, so the command, the report and the lake say the same.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from batchscale.analysis.figures import Plot
from batchscale.batch_schedule.check import (
    LEVEL,
    check_summary,
    ends,
    final_dominates,
    ranged,
    shown_better_than_final,
    t_interval,
)
from batchscale.batch_schedule.plot import plot
from batchscale.conditions import shares_apart
from batchscale.config import AnalysisConfig

STEP_GOAL = 0.25
"""The schedule is worth taking when it needs at least this share fewer optimizer steps."""
MIN_RANK_POINTS = 3
RANK_INTERVAL_POINTS = 6
"""A bootstrap interval of the rank correlation from this many checkpoints on: resamples of
fewer tie so often that the interval would only repeat the estimate."""
RANK_SAMPLES = 2000
MAX_PERMUTATION_POINTS = 8
"""An exact permutation test enumerates n! orders: up to 8 checkpoints (40,320)."""
SECTION_ID = "critical-over-training"
DEFAULT_MAX_CPU_WAIT_SHARE = AnalysisConfig.model_fields["max_cpu_wait_share"].default


# ------------------------------------------------------------------------------ statistics


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def _permutation_p(x: np.ndarray, y: np.ndarray, rho: float, seed: int = 0) -> float:
    """Share of orders of y whose rank correlation with x is at least `rho`: all orders up to
    MAX_PERMUTATION_POINTS checkpoints, else RANK_SAMPLES random ones."""
    if len(y) <= MAX_PERMUTATION_POINTS:
        orders = itertools.permutations(range(len(y)))
    else:
        rng = np.random.default_rng(seed)
        orders = (rng.permutation(len(y)) for _ in range(RANK_SAMPLES))
    values = [_spearman(x, y[list(order)]) for order in orders]
    return float(np.mean([v >= rho - 1e-12 for v in values if math.isfinite(v)]))


def tracking(crit: pd.DataFrame, seed: int = 0) -> dict:
    """B_simple / B_crit per checkpoint (B_crit's interval mapped), their geometric mean with a
    Student-t interval on the log ratios, and Spearman's rank correlation over checkpoints with
    its permutation p-value (how often a random order of the checkpoints correlates as well)
    and, from RANK_INTERVAL_POINTS checkpoints on, a bootstrap interval."""
    both = crit[np.isfinite(crit["b_crit"]) & np.isfinite(crit["b_simple"])
                & (crit["b_simple"] > 0)]
    result = {"points": len(both), "ratio_mean": None, "rank": None}
    if len(both) >= 2:
        logs = np.log(both["b_simple"].to_numpy() / both["b_crit"].to_numpy())
        result["ratio_mean"] = tuple(math.exp(v) for v in t_interval(logs))
    if len(both) >= MIN_RANK_POINTS:
        x, y = both["b_simple"].to_numpy(), both["b_crit"].to_numpy()
        rho, low, high = _spearman(x, y), math.nan, math.nan
        if len(both) >= RANK_INTERVAL_POINTS:
            rng = np.random.default_rng(seed)
            draws = np.array([_spearman(x[i], y[i]) for i in
                              rng.integers(0, len(x), (RANK_SAMPLES, len(x)))])
            tail = (1 - LEVEL) / 2
            low, high = (float(q) for q in np.quantile(draws[np.isfinite(draws)],
                                                       [tail, 1 - tail]))
        result["rank"] = (rho, low, high, _permutation_p(x, y, rho))
    return result


# ------------------------------------------------------------------------------- findings


@dataclass
class Findings:
    """Everything the texts say, from the two tables."""

    crit: pd.DataFrame
    check: pd.DataFrame
    base_batch: int
    rule: str
    target: str
    tracking: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    max_cpu_wait_share: float | None = DEFAULT_MAX_CPU_WAIT_SHARE
    """Above this CPU wait share (analysis.max_cpu_wait_share) the seconds are not trusted."""

    @classmethod
    def from_tables(cls, crit: pd.DataFrame, check: pd.DataFrame,
                    max_cpu_wait_share: float | None = DEFAULT_MAX_CPU_WAIT_SHARE) -> Findings:
        crit = crit.sort_values("checkpoint_step").reset_index(drop=True)
        first = check.iloc[0]
        return cls(crit=crit, check=check, base_batch=int(first["base_batch_size"]),
                   rule=str(first["lr_rule"]),
                   target=f"{first['target_metric']} {first['target_value']:g}",
                   tracking=tracking(crit), summary=check_summary(check),
                   max_cpu_wait_share=max_cpu_wait_share)

    def timing_flag(self) -> str:
        """" (seconds NOT TRUSTED: ...)" when a run waited for a CPU beyond the limit, else
        "": the device-second figures are then the machine's load, not the device's."""
        shares = pd.concat([self.crit.get("cpu_wait_share", pd.Series(dtype=float)),
                            self.check.get("cpu_wait_share", pd.Series(dtype=float))])
        worst = pd.to_numeric(shares, errors="coerce").max()
        limit = self.max_cpu_wait_share
        if limit is None or not math.isfinite(worst) or worst <= limit:
            return ""
        worst_text, limit_text = shares_apart(worst, limit)
        return (f" (seconds NOT TRUSTED: a run waited for a CPU {worst_text} of its runnable "
                f"time, above analysis.max_cpu_wait_share {limit_text})")

    @property
    def stages(self) -> list[tuple[float, int]]:
        """(from val_loss, batch) where the scheduled batch grows."""
        stages, batch = [], self.base_batch
        for row in self.crit.itertuples():
            if row.scheduled_batch_size > batch:
                batch = int(row.scheduled_batch_size)
                stages.append((float(row.val_loss), batch))
        return stages

    @property
    def prediction(self) -> dict | None:
        rows = self.check[(self.check["schedule"] == "scheduled")
                          & np.isfinite(self.check["predicted_steps"].astype(float))]
        return None if rows.empty else rows.iloc[0].to_dict()

    @property
    def reference(self) -> dict:
        return self.check[self.check["reference"]].iloc[0].to_dict()

    @property
    def wins(self) -> bool:
        """The check shows the schedule needs fewer steps than the constant B0 (the interval's
        top below 1) and, where the constant last batch ran beside it, fewer steps or fewer
        examples than that simpler answer too."""
        steps = self.summary.get("steps_to_target")
        return (bool(steps) and math.isfinite(steps[2]) and steps[2] < 1
                and shown_better_than_final(self.summary.get("final")))

    def peak_lrs(self) -> dict[int, float]:
        """The learning rate each batch of the schedule trains at (the LR rule's peak), where
        the table records it (not in rows written before layout 10)."""
        lrs = {}
        for column, batches in (("base_batch_lr", self.crit["base_batch_size"]),
                                ("scheduled_lr", self.crit["scheduled_batch_size"])):
            if column not in self.crit:
                continue
            values = pd.to_numeric(self.crit[column], errors="coerce")
            lrs.update({int(b): float(v) for b, v in zip(batches, values, strict=True)
                        if math.isfinite(v)})
        return lrs

    def schedule_text(self) -> str:
        lrs = self.peak_lrs()

        def at(batch: int) -> str:
            return f" at LR {lrs[batch]:.3g}" if batch in lrs else ""

        if not self.stages:
            return f"constant {self.base_batch}{at(self.base_batch)}"
        return f"{self.base_batch}{at(self.base_batch)}" + "".join(
            f", {b} from val_loss {loss:.3f}{at(b)}" for loss, b in self.stages)

    def cost_s(self) -> dict:
        others = self.check[~self.check["reference"]]
        return {"reference": float(self.reference["device_s"]),
                "branches": float(self.crit["branch_device_s"].sum()),
                "check": float(others["device_s"].sum())}


# -------------------------------------------------------------------------------- the text


def crit_text(row) -> str:
    if math.isfinite(row["b_crit"]):
        interval = (f" [{row['b_crit_low']:.3g}, {row['b_crit_high']:.3g}]"
                    if math.isfinite(row["b_crit_low"]) else " (no interval)")
        return f"{row['b_crit']:.3g}{interval}"
    if isinstance(row["b_crit_bound"], str) and row["b_crit_bound"]:
        return f"{row['b_crit_bound']} {row['b_crit_bound_batch']:g}"
    return f"none: {row['b_crit_reason']}"


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
    """The section's paragraphs (Markdown), after its table."""
    return [_tracking_text(f.tracking), f"**Schedule**: {f.schedule_text()}.{_lr_text(f)}",
            _prediction_text(f), _check_text(f), _cost_text(f)]


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
            f"examples against {p['reference_steps'] * f.base_batch:,.0f}.")


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
               "does not establish")
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
