"""The analysis report: one self-contained HTML page, rendered from `report.html.j2`.

The page is opened from the KFP UI, from object storage or from a laptop, often offline, so it
carries everything inside: plots as base64 PNG `data:` URIs (`plots`), the shared inline
stylesheet, no link to any CDN or web font. The template escapes every value; the prose is the
analysis's own Markdown (`narrative`), turned into HTML by `batchscale.html.markdown_html`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pandas as pd
from markupsafe import Markup

from batchscale import schemas
from batchscale.adaptive.section import ADAPTIVE_HEADINGS, AdaptiveSection
from batchscale.analysis.analyze import AnalysisResult
from batchscale.analysis.gap import NOT_MEASURED, TABLE_METRICS, gap_table
from batchscale.analysis.narrative import (
    b_crit_text,
    narrative_markdown,
    recommendation_list,
    target_interval_text,
)
from batchscale.analysis.plots import Plot, convergence_plots, parallel_plot, throughput_plots
from batchscale.analysis.plots_targets import gap_plots, target_plot
from batchscale.analysis.quality import headline, quality_box_markdown
from batchscale.analysis.summary import AnalysisSummary, TargetCriticalBatch
from batchscale.analysis.targets import same_target, split_by_target
from batchscale.analysis.timetotarget import StepTimeSource, convergence_step_time_ranges
from batchscale.batch_schedule.section import ScheduleSection
from batchscale.fits import ensure_columns
from batchscale.html import environment, markdown_html, render_page
from batchscale.planner.section import plan_plot, what_if_markdown
from batchscale.planner.table import Plan

TEMPLATE = "report.html.j2"
MACROS = "report_macros.j2"
TABLE_COLUMNS = (
    ("lr_rule", "LR rule"),
    ("batch_size", "batch"),
    ("steps_to_target", "steps [trials' range]"),
    ("examples_to_target", "examples"),
    ("step_time_s", "step time (s) [trials' range]"),
    ("time_to_target_s", "time to target (s) [seeds' range]"),
    ("samples_per_s", "samples/s [trials' range]"),
    ("step_time_source", "step time from"),
    ("sweep_step_time_s", "sweep step time (s)"),
    ("timing_flag", "timing"),
    ("regime", "regime"),
    ("fit_slope", "slope (fit)"),
    ("measured_slope", "slope (measured)"),
    ("b_crit", "B_crit"),
    ("b_simple", "B_simple [trials' range]"),
)
"""Columns of the results table. B_crit is shown as `b_crit_text` says it (a number or a
bound, from the b_crit, b_crit_bound and b_crit_bound_batch columns); a timing flag as the
ratio of the two step times (its sentence is in the quality box); steps, time to target and
B_simple with their range over the seeds or trials behind them (`_ranged`); names without
underscores, so they wrap."""
RANGED = {"steps_to_target": ("steps_low", "steps_high"),
          "time_to_target_s": ("time_to_target_s_low", "time_to_target_s_high"),
          "b_simple": ("b_simple_low", "b_simple_high")}
"""Figures shown with their range, and the columns that hold it (analysis layout 9)."""


@dataclass(frozen=True)
class RegressionsSection:
    """The "Regressions" section: the verdicts' Markdown (regression.regressions_markdown) and,
    where the lake's history was read, the cells' history plot. Only a report rendered from the
    published tables has one: the check needs the lake, which the analysis step does not read."""

    markdown: str
    history: Plot | None = None


def render_html(
    result: AnalysisResult,
    sweep: pd.DataFrame | None,
    runs: pd.DataFrame | None,
    curves: pd.DataFrame | None,
    *,
    title: str = "batchscale report",
    plan: Plan | None = None,
    plan_missing: str = "",
    adaptive: AdaptiveSection | None = None,
    schedule: ScheduleSection | None = None,
    regressions: RegressionsSection | None = None,
) -> str:
    """The whole report as one HTML string, with every plot embedded and nothing fetched.
    The "What if" section is there when a `plan` is given, or why there is none
    (`plan_missing`)."""
    sweep = ensure_columns(sweep, schemas.SWEEP)
    runs = ensure_columns(runs, schemas.RUNS)
    curves = ensure_columns(curves, schemas.CURVES)
    summary = result.summary
    table = pd.DataFrame(result.rows, columns=schemas.ANALYSIS.names)
    box = quality_box_markdown(summary.quality)
    gap = gap_table(curves)
    step_ranges = convergence_step_time_ranges(_chosen_runs(runs, summary))
    return render_page(
        TEMPLATE,
        title=title,
        quality_box=markdown_html(box) if box else None,
        quality_line=headline(summary.quality),
        quality_flagged=summary.quality.flagged,
        recommendation=markdown_html(recommendation_list(
            summary.recommendation, summary.target, summary.target_reason,
            evidence_links=True) + (f"\n- {schedule.answer}" if schedule and schedule.answer
                                    else "")),
        narrative=markdown_html(narrative_markdown(summary, with_quality=False)),
        regressions=_regressions_html(regressions),
        throughput_plots=throughput_plots(sweep, summary, table),
        convergence_plots=convergence_plots(table, curves, summary,
                                            _chosen_runs(runs, summary)),
        parallel_plot=parallel_plot(_chosen_runs(runs, summary)),
        table_headings=[heading for _, heading in TABLE_COLUMNS],
        table_rows=[_table_cells(row, step_ranges) for row in result.rows],
        target=summary.target,
        target_headings=[heading for _, heading in TARGET_COLUMNS],
        target_rows=[_target_cells(fit) for fit in summary.targets],
        target_plot=target_plot(summary),
        gap_title=_gap_title(summary),
        gap_missing=None if len(gap) else _sentence(NOT_MEASURED),
        gap_headings=["LR rule", "batch", "seeds", "examples seen",
                      *[m for m in TABLE_METRICS if m in gap.columns]],
        gap_rows=[[(_fmt(v), isinstance(v, str)) for v in row]
                  for row in gap.itertuples(index=False)],
        gap_plots=gap_plots(gap),
        what_if=markdown_html(what_if_markdown(plan, plan_missing))
        if plan is not None or plan_missing else None,
        what_if_plot=plan_plot(plan),
        adaptive=adaptive,
        adaptive_headings=ADAPTIVE_HEADINGS,
        adaptive_rows=[[(str(v), isinstance(v, str)) for v in row.values()]
                       for row in (adaptive.rows if adaptive else ())],
        schedule=schedule,
        schedule_rows=[[(cell, i == 4) for i, cell in enumerate(row)]
                       for row in (schedule.rows if schedule else ())],
        schedule_paragraphs=markdown_html("\n\n".join(schedule.paragraphs))
        if schedule else None,
    )


TARGET_COLUMNS = (
    ("label", "target"), ("rule", "LR rule"), ("b_crit", "B_crit (90% interval) or bound"),
    ("s_min", "S_min (± one standard error)"), ("e_min", "E_min (± one standard error)"),
    ("reached_batches", "batch sizes reached"),
)
"""Columns of the "B_crit vs target" table (a bound in words, as everywhere)."""


def _target_cells(fit: TargetCriticalBatch) -> list[tuple[str, bool]]:
    b_crit = b_crit_text(fit.b_crit, fit.bound, fit.bound_batch)
    if not fit.bound and math.isfinite(fit.b_crit_low):
        b_crit += f" ({target_interval_text(fit)})"
    elif not math.isfinite(fit.b_crit) and not fit.bound and fit.reason:
        b_crit += f": {fit.reason}"
    reached = ", ".join(map(str, fit.reached_batches)) or "none"
    return [(fit.label, True), (fit.rule, True), (b_crit, True),
            (_with_se(fit.s_min, fit.s_min_se), False), (_with_se(fit.e_min, fit.e_min_se), False),
            (reached, True)]


def _with_se(value: float, se: float) -> str:
    """"93.64 ± 4.1", or the value alone, flagged, where no standard error was estimated."""
    if not math.isfinite(value):
        return _fmt(value)
    return f"{_fmt(value)} ± {_fmt(se)}" if math.isfinite(se) else f"{_fmt(value)} (no error)"


def _gap_title(summary: AnalysisSummary) -> str:
    epochs = summary.gap.gap_epochs if summary.gap is not None else None
    return (f"At equal data seen ({epochs:g} epochs)" if epochs is not None
            else "At equal data seen")


def _chosen_runs(runs: pd.DataFrame, summary: AnalysisSummary) -> pd.DataFrame:
    """The runs rows of the recommendation's target (a trial has a row per target)."""
    if summary.target_metric is None:
        return runs
    chosen = (summary.target_metric, summary.target_value)
    return next((frame for target, frame in split_by_target(runs).items()
                 if same_target(target, chosen)), runs)


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:] + "."


def _regressions_html(regressions: RegressionsSection | None) -> Markup | None:
    """The section's body: the verdicts (their `## ` title line dropped: the section has its
    own) and the history plot when there is one."""
    if regressions is None:
        return None
    body = "\n".join(line for line in regressions.markdown.splitlines()
                     if not line.startswith("## "))
    content = markdown_html(body)
    if regressions.history is not None:
        figure = environment().get_template(MACROS).module.figure(regressions.history)
        content = Markup(f"{content}\n{figure}")
    return content


def _table_cells(row: dict, step_ranges: dict) -> list[tuple[str, bool]]:
    """(shown text, is text) per column of the results table; text cells align left.
    `step_ranges`: batch -> (lowest, highest, trials) of the convergence trials' step times."""
    step, rate = _step_time_cells(row, step_ranges.get(row["batch_size"]))
    cells = dict(row, b_crit=_b_crit_cell(row), timing_flag=_timing_cell(row),
                 sweep_step_time_s=_sweep_time_cell(row))
    for key in ("regime", "step_time_source"):
        if isinstance(cells[key], str):
            cells[key] = cells[key].replace("_", " ")
    shown = {key: _ranged(row, key) for key in RANGED}
    shown.update(step_time_s=_fmt(step), samples_per_s=_fmt(rate))  # numbers: aligned right
    return [
        (shown[key], False) if key in shown
        else (_fmt(cells[key]), isinstance(cells[key], str) or cells[key] is None)
        for key, _ in TABLE_COLUMNS
    ]


def _step_time_cells(row: dict, spread: tuple | None) -> tuple[object, object]:
    """The step time and samples/s as shown: with the range over the convergence trials
    behind the median where those trials timed it, else flagged as the sweep's figure (no
    trials behind it)."""
    step, rate, batch = row.get("step_time_s"), row.get("samples_per_s"), row["batch_size"]
    if not isinstance(step, float) or math.isnan(step):
        return step, rate
    if row.get("step_time_source") != StepTimeSource.CONVERGENCE.value or spread is None:
        return (f"{_fmt(step)} (the sweep's figure: no trials' range)",
                f"{_fmt(rate)} (the sweep's figure)")
    low, high, trials = spread
    if trials < 2:
        return f"{_fmt(step)} (one trial)", f"{_fmt(rate)} (one trial)"
    return (f"{_fmt(step)} [{_fmt(low)}, {_fmt(high)}]",
            f"{_fmt(rate)} [{_fmt(batch / high)}, {_fmt(batch / low)}]")


def _ranged(row: dict, key: str) -> str:
    """"100 [90, 120]"; "100 (one seed)" where one figure is behind it; with the seeds that did
    not reach counted ("70 [60, 70], 2 of 3 reached"), and where the median did not reach but
    some seeds did, "not reached (1 of 2 did)". Rows before layout 9 show the figure alone, as
    they recorded it."""
    value = row.get(key)
    trials, reached = row.get("trials_at_lr"), row.get("reached_at_lr")
    if not isinstance(value, float) or math.isnan(value):
        steps_row = key == "steps_to_target" and trials and reached is not None
        return f"not reached ({reached} of {trials} did)" if steps_row else ""
    low, high = (row.get(name) for name in RANGED[key])
    count = row.get("b_simple_trials" if key == "b_simple" else "reached_at_lr")
    if low is None or high is None or math.isnan(low) or math.isnan(high):
        return _fmt(value) + (" (range not measured)" if count else "")
    one = "trial" if key in ("b_simple", "steps_to_target") else "seed"
    text = (f"{_fmt(value)} (one {one})" if count == 1 and low == high
            else f"{_fmt(value)} [{_fmt(low)}, {_fmt(high)}]")
    if count == 1 and low != high:  # one run: the range is the gap between evaluations
        text += f" (one {one}: the gap between evaluations)"
    if key == "steps_to_target" and trials and count is not None and count < trials:
        text += f", {count} of {trials} reached"
    return text


def _b_crit_cell(row: dict) -> str | float:
    """The number where there is one (a float cell), else the bound in words."""
    if row["b_crit_bound"]:
        return b_crit_text(row["b_crit"], row["b_crit_bound"], row["b_crit_bound_batch"])
    return row["b_crit"]


def _sweep_time_cell(row: dict) -> str | float:
    """The sweep's step time, marked "(line)" where the sweep did not time this batch and its
    line α + βB stands in: a modelled figure must not read as a measured one."""
    value = row["sweep_step_time_s"]
    if row.get("sweep_step_time_source") == "sweep_fit" and math.isfinite(value):
        return f"{_fmt(value)} (line)"
    return value


_FLAG_RATIO = re.compile(r"([\d.]+× (?:less than )?)the sweep's [^(]*\((\w+)-input ")


def _timing_cell(row: dict) -> str | None:
    """A flagged cell as "10× the sweep (real input)", the ratio its flag's sentence gives (the
    full sentence is in the quality box): the flag judges the slow side against the real-input
    time where the sweep timed it, which the table's own sweep column does not show."""
    if not row["timing_flag"]:
        return None
    said = _FLAG_RATIO.search(row["timing_flag"])
    if said:
        return f"{said[1]}the sweep ({said[2]} input)"
    ratio = row["step_time_s"] / row["sweep_step_time_s"]
    if not math.isfinite(ratio):  # one of the two step times is missing
        return "flagged (see the quality box)"
    return f"{ratio:.2g}× the sweep"


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return "" if value is None else str(value)
