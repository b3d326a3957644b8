"""What `batchscale run` and `batchscale report` print, read back from the results lake (so what
is printed is what was published), and the report rebuilt from the published tables."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa

from batchscale.config import AnalysisConfig
from batchscale.errors import BadInput
from batchscale.schemas import current_lr_rules, not_measured_reason
from batchscale.storage import ObjectStore

PARQUET_SUFFIX = ".parquet"
HTML_SUFFIX = ".html"


def _fmt(value, spec: str = ".0f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def load_run(store: ObjectStore, run_id: str) -> tuple[dict, dict[str, pa.Table]]:
    """The run manifest and its tables, keyed by lake table name (LR rules under their
    current names)."""
    manifest = read_manifest(store, run_id)
    tables = {}
    for obj in manifest["objects"]:
        if obj["key"].endswith(PARQUET_SUFFIX):
            name = obj["key"][len(store.key()) + 1:].split("/")[0]
            tables[name] = current_lr_rules(store.get_table(obj["key"]))
    return manifest, tables


def read_manifest(store: ObjectStore, run_id: str) -> dict:
    """A published run's manifest; BadInput naming its key when it is not a JSON object with
    a list of objects, each with a string key (a damaged or foreign file, never a traceback)."""
    from batchscale.lake.publish import run_manifest_key

    key = run_manifest_key(store, run_id)
    if not store.exists(key):
        raise BadInput(f"no published run {run_id!r} in the lake (no manifest at "
                       f"s3://{store.settings.bucket}/{key}); `batchscale history --workload "
                       "NAME` lists the published runs")
    try:
        manifest = json.loads(store.get_bytes(key))
    except ValueError as err:  # not JSON, or not UTF-8
        raise BadInput(f"the manifest of run {run_id}, s3://{store.settings.bucket}/{key}, is "
                       f"not JSON ({err}); the run's publication is damaged: publish it again "
                       "under a new run id") from None
    objects = manifest.get("objects") if isinstance(manifest, dict) else None
    if not isinstance(objects, list) or not all(
            isinstance(o, dict) and isinstance(o.get("key"), str) for o in objects):
        raise BadInput(f"the manifest of run {run_id}, s3://{store.settings.bucket}/{key}, is "
                       "not a JSON object listing the run's objects (each with a \"key\"); the "
                       "run's publication is damaged: publish it again under a new run id")
    return manifest


def analysis_config(manifest: dict) -> AnalysisConfig:
    """The analysis settings the run used (recorded by publish), defaults for older runs."""
    from pydantic import ValidationError

    recorded = manifest.get("analysis_config", {})
    try:
        return AnalysisConfig(**recorded)
    except (TypeError, ValidationError) as err:
        raise BadInput(f"the manifest of run {manifest.get('run_id')!r} records analysis "
                       f"settings this version cannot use: {str(err).splitlines()[0]}") from None


def rebuilt_primary_target(manifest: dict, tables: dict[str, pa.Table]):
    """The config's primary target as the manifest keeps it (None: the config marked none, and
    the analysis chooses again from the same tables, as it did); runs published before the
    manifest kept it are rebuilt for the target their analysis was made for."""
    if "primary_target" in manifest:
        recorded = manifest["primary_target"]
        return tuple(recorded) if recorded else None
    return published_target(tables.get("analysis"))


def published_target(analysis: pa.Table | None) -> tuple[str, float] | None:
    """The target the run's published analysis was made for, so a rebuilt report is made for
    the same one; None for runs from before targets (their one target is val_accuracy)."""
    if analysis is None or "target_metric" not in analysis.column_names or not len(analysis):
        return None
    metric, value = analysis.column("target_metric")[0].as_py(), \
        analysis.column("target_value")[0].as_py()
    return (metric, value) if metric is not None and value is not None else None


def throughput_lines(sweep: pa.Table) -> list[str]:
    """One line per sweep row; a row flagged unstable says so (it is left out of the fits).
    A sweep left empty on purpose (a TrainingLoop's) is one line saying why."""
    if not sweep.num_rows:
        return [f"throughput: none: {not_measured_reason(sweep) or 'the sweep has no rows'}"]
    lines = ["throughput (samples/s with its 90 % rerun interval, from this sweep's rounds and "
             "sweep.between_sweep_cv, which another sweep may leave; median step; CV):",
             f"  {'input':9s} {'batch':>6s} {'samples/s':>11s} {'rerun range':>21s} "
             f"{'step ms':>9s} {'cv':>6s}"]
    for r in sorted(sweep.to_pylist(), key=lambda r: (r["input_mode"], r["batch_size"])):
        if r["status"] != "ok":
            lines.append(f"  {r['input_mode']:9s} {r['batch_size']:6d}  {r['status']}")
            continue
        flag = "  unstable: left out" if r.get("quality") == "unstable" else ""
        lines.append(f"  {r['input_mode']:9s} {r['batch_size']:6d} "
                     f"{_fmt(r['samples_per_s'], '11.0f'):>11s} {_rerun_range(r):>21s} "
                     f"{_fmt(_ms(r['step_time_median_s']), '9.3f'):>9s} "
                     f"{_fmt(r['step_time_cv'], '6.3f'):>6s}{flag}")
    return lines


def _rerun_range(row: dict) -> str:
    """"[9,826, 16,568]", or "not recorded" (too few steps, trials over 10x apart, or a table
    from before the column)."""
    low, high = row.get("samples_per_s_low"), row.get("samples_per_s_high")
    if low is None or high is None:
        return "not recorded"
    return f"[{low:,.0f}, {high:,.0f}]"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1e3 * seconds


def quality_lines(tables: dict[str, pa.Table]) -> list[str]:
    """The measurement quality, as the report's box says it (from the published sweep and
    analysis tables; tables from before quality flags read as "not recorded")."""
    import pandas as pd

    from batchscale.analysis.quality import measurement_quality
    from batchscale.analysis.quality import quality_lines as lines_of

    analysis = tables["analysis"].to_pandas() if "analysis" in tables else pd.DataFrame()
    return lines_of(measurement_quality(tables["sweep"].to_pandas(), analysis))


def saturation_line(sweep: pa.Table, tolerance: float) -> str:
    """From the sweep itself, so it is there even when no convergence trial reached the target
    (the analysis table then has no rows to carry it)."""
    from batchscale.fits import find_saturation

    batch, reason = find_saturation(sweep.to_pandas(), tolerance)
    if batch is None:
        return f"  saturation batch: none ({reason})"
    return (f"  saturation batch (throughput within {tolerance:.0%} of best): "
            f"{_fmt(batch, 'd')}")


def convergence_lines(analysis: pa.Table, runs: pa.Table | None = None) -> list[str]:
    """S(B) per rule and batch, then B_crit per rule as the report states it: a number with its
    interval, a bound ("above 1,024: steps still fall like 1/B"), or why there is none (the
    edge cases, from the published `runs`)."""
    rows = analysis.to_pylist()
    if not rows:
        return ["steps to target S(B): no convergence results"]
    rules = sorted({r["lr_rule"] for r in rows})
    batches = sorted({r["batch_size"] for r in rows})
    cell = {(r["lr_rule"], r["batch_size"]): r for r in rows}
    lines = ["steps to target S(B) (Shallue: median over seeds, best LR; [fewest, most] over "
             "its trials that reached it, and reached/ran where not all did; -: the median "
             "did not reach):",
             f"  {'batch':>6s} " + " ".join(f"{rule:>20s}" for rule in rules)]
    for b in batches:
        lines.append(f"  {b:6d} " + " ".join(
            f"{_steps_cell(cell.get((rule, b), {})):>20s}" for rule in rules))
    for rule in rules:
        fit = next(r for r in rows if r["lr_rule"] == rule)
        lines.append(f"  B_crit ({rule}): {_b_crit_line(fit, rule, rows, runs)}")
    return lines


def _steps_cell(row: dict) -> str:
    """"90 [81, 90]", "165 (one trial)", "70 [60, 70] 2/3" (2 of 3 trials reached), "-" where
    the median did not reach; the figure alone in rows before layout 9."""
    steps = row.get("steps_to_target")
    trials, reached = row.get("trials_at_lr"), row.get("reached_at_lr")
    if steps is None or not math.isfinite(steps):
        return f"- {reached}/{trials}" if trials and reached else "-"
    low, high = row.get("steps_low"), row.get("steps_high")
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return _steps_number(steps)
    if reached == 1 and low == high:
        return f"{_steps_number(steps)} (one trial)"
    text = f"{_steps_number(steps)} [{_steps_number(low)}, {_steps_number(high)}]"
    return text + (f" {reached}/{trials}" if trials and reached is not None
                   and reached < trials else "")


def _steps_number(value: float) -> str:
    """Whole steps as such, a median between two seeds with its half: "90", "72.5"."""
    return f"{value:,.0f}" if float(value).is_integer() else f"{value:,.1f}"


def _b_crit_line(fit: dict, rule: str, rows: list[dict], runs: pa.Table | None) -> str:
    from batchscale.analysis.narrative import b_crit_text

    if fit.get("b_crit_bound"):
        return b_crit_text(math.nan, fit["b_crit_bound"], fit["b_crit_bound_batch"])
    if fit["b_crit"] is not None and math.isfinite(fit["b_crit"]):
        return (f"{_fmt(fit['b_crit'], '.1f')} {_interval(fit, rule, rows, runs)} "
                f"({_fit_terms(fit)}){_coarse_note(rule, runs)}")
    reason = fit.get("b_crit_reason")  # the fit's own words (tables of layout 10 on)
    return f"not estimated ({reason if reason else _no_fit_reason(rule, rows, runs)})"


def _fit_terms(fit: dict) -> str:
    """"S_min 56.6 ± 4.1, E_min 2667 ± 380 (± one standard error)", or without the errors in
    tables from before they were recorded (layout 8)."""
    s_se, e_se = fit.get("s_min_se"), fit.get("e_min_se")
    known = all(v is not None and math.isfinite(v) for v in (s_se, e_se))
    if not known:
        return f"S_min {_fmt(fit['s_min'], '.1f')}, E_min {_fmt(fit['e_min'], '.0f')}"
    return (f"S_min {_fmt(fit['s_min'], '.1f')} ± {_two_digits(s_se)}, E_min "
            f"{_fmt(fit['e_min'], '.0f')} ± {_two_digits(e_se)}; ± one standard error")


def _two_digits(value: float) -> str:
    """Two significant digits, never in exponent form: 0.57, 11, 320, 4,100."""
    if not value > 0:
        return "0"
    places = 1 - math.floor(math.log10(value))
    return f"{round(value, places):,.{max(0, places)}f}"


def _coarse_note(rule: str, runs: pa.Table | None) -> str:
    """"; steps to target are counted at evaluations: …" where they are coarse (as the
    report's interval note says), else ""."""
    from batchscale.analysis.evaluations import coarse_evaluations

    note = "" if runs is None else coarse_evaluations(runs.to_pandas(), rule)
    return f"; {note}" if note else ""


def _interval(fit: dict, rule: str, rows: list[dict], runs: pa.Table | None) -> str:
    """[low, high]; in words where an end lies at or beyond the batches that reached the target
    (there it is the fit range's cut, not an estimate); why there is none where there is none."""
    from batchscale.analysis.narrative import interval_words

    low, high = fit["b_crit_low"], fit["b_crit_high"]
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        return f"(no interval: {_no_interval_reason(rule, runs)})"
    reached = [r["batch_size"] for r in rows if r["lr_rule"] == rule
               and r.get("steps_to_target") is not None and math.isfinite(r["steps_to_target"])]
    if (reached and low is not None and high is not None and math.isfinite(low)
            and math.isfinite(high) and (low <= min(reached) or high >= max(reached))):
        return f"({interval_words(low, high, min(reached), max(reached))})"
    return f"[{_fmt(low, '.1f')}, {_fmt(high, '.1f')}]"


def _no_interval_reason(rule: str, runs: pa.Table | None) -> str:
    if runs is not None and {"seed", "lr_rule", "batch_size"} <= set(runs.column_names):
        trials = runs.select(["lr_rule", "batch_size", "seed"]).to_pandas()
        seeds = trials[trials["lr_rule"] == rule].groupby("batch_size")["seed"].nunique()
        if len(seeds) and seeds.max() <= 1:
            return "one seed per batch size: nothing to resample"
    return "the bootstrap did not give one; see the report"


def _no_fit_reason(rule: str, rows: list[dict], runs: pa.Table | None) -> str:
    """The edge case that left `rule` without a fit, read from the published runs."""
    import pandas as pd

    from batchscale.analysis.critical_summary import edge_case_reason
    from batchscale.fits import ensure_columns, matches
    from batchscale.schemas import RUNS

    if runs is None:
        return "see the report"
    frame = ensure_columns(runs.to_pandas(), RUNS)
    target = rows[0].get("target_metric") if rows else None
    if target is not None:  # the rows of the target the analysis was made for
        frame = frame[frame["target_metric"].eq(target)
                      & frame["target_value"].eq(rows[0]["target_value"])]
    cells = pd.DataFrame([r for r in rows if r["lr_rule"] == rule])
    return edge_case_reason(frame[matches(frame, "lr_rule", rule)], cells) or "see the report"


def regression_lines(regressions: pa.Table) -> list[str]:
    from batchscale.lake.regression import verdict_lines

    return verdict_lines(regressions.to_pandas())


def summary_lines(store: ObjectStore, run_id: str, manifest: dict,
                  tables: dict[str, pa.Table], summary=None) -> list[str]:
    """The run in a few lines: throughput, S(B) and B_crit, the recommendation (from
    `summary`, the analysis of these tables, when given), quality, regressions, tables."""
    lines = [f"\nbatchscale run {run_id}"]
    if summary is not None:
        lines += recommendation_lines(summary)
    lines += schedule_lines(tables, analysis_config(manifest).max_cpu_wait_share)
    swept = "sweep" in tables and tables["sweep"].num_rows > 0
    if "sweep" in tables:
        lines += throughput_lines(tables["sweep"])
    if "analysis" in tables:
        lines += convergence_lines(tables["analysis"], tables.get("runs"))
        lines += level_lines(analysis_config(manifest), "decisions" in tables)
    if swept:
        lines.append(saturation_line(tables["sweep"],
                                     analysis_config(manifest).saturation_tolerance))
    if "sweep" in tables:
        lines += quality_lines(tables)
    if "regressions" in tables:
        lines += regression_lines(tables["regressions"])
    lines.append("tables:")
    lines += [f"  s3://{store.settings.bucket}/{o['key']}" for o in manifest["objects"]
              if o["key"].endswith(PARQUET_SUFFIX)]
    return lines


def level_lines(settings: AnalysisConfig, adaptive: bool) -> list[str]:
    """Where the B_crit intervals above are read above their claimed 90 % (an adaptive search's
    trials: critical.read_level), the line saying so, as the report does."""
    from batchscale.analysis.critical import BOOTSTRAP_CONFIDENCE, read_level, read_level_reason

    level = read_level(settings, adaptive)
    why = read_level_reason(level)
    return [f"  (B_crit intervals: {BOOTSTRAP_CONFIDENCE:.0%}, read at the {level:.0%} level: "
            f"{why})"] if why else []


def schedule_lines(tables: dict[str, pa.Table], max_cpu_wait_share: float | None) -> list[str]:
    """The batch-size schedule's line, for a run that measured one."""
    from batchscale.batch_schedule.findings import Findings
    from batchscale.batch_schedule.section import summary_line

    if not {"critical_over_training", "schedule_check"} <= set(tables):
        return []
    crit, check = (tables[n].to_pandas() for n in ("critical_over_training", "schedule_check"))
    if crit.empty or check.empty:
        return []
    return ["  " + summary_line(Findings.from_tables(crit, check, max_cpu_wait_share))]


def recommendation_lines(summary) -> list[str]:
    """The recommendation as the report's box says it, one line per choice with its reason."""
    from batchscale.analysis.narrative import recommendation_list

    listed = recommendation_list(summary.recommendation, summary.target, summary.target_reason)
    return ["recommendation:"] + ["  " + line.removeprefix("- ").replace("**", "")
                                  for line in listed.splitlines()]


def analyzed(manifest: dict, tables: dict[str, pa.Table]):
    """The analysis of a published run's tables, as the pipeline made it."""
    from batchscale.analysis.analyze import analyze
    from batchscale.analysis.stage import settings_for

    frames = {name: tables[name].to_pandas() if name in tables else None
              for name in ("sweep", "runs", "curves")}
    settings = settings_for(analysis_config(manifest), "decisions" in tables)
    return frames, analyze(frames["sweep"], frames["runs"], frames["curves"], settings,
                           primary_target=rebuilt_primary_target(manifest, tables),
                           gap_epochs=manifest.get("gap_epochs"),
                           warmup_steps=manifest.get("warmup_steps"))


def print_run_summary(store: ObjectStore, run_id: str, local_dir: Path) -> dict[str, pa.Table]:
    """Print the run's summary and save its published report under `local_dir`; the run's
    tables, as published."""
    manifest, tables = load_run(store, run_id)
    summary = analyzed(manifest, tables)[1].summary if "runs" in tables else None
    lines = summary_lines(store, run_id, manifest, tables, summary)
    report_key = next((o["key"] for o in manifest["objects"]
                       if o["key"].endswith(HTML_SUFFIX)), None)
    if report_key:
        local_dir.mkdir(parents=True, exist_ok=True)
        local_report = local_dir / "report.html"
        local_report.write_bytes(store.get_bytes(report_key))
        lines.append(f"report: {local_report} (s3://{store.settings.bucket}/{report_key})")
    print("\n".join(lines))
    return tables


def _adaptive(manifest: dict, tables: dict, runs):
    """The adaptive search's section of a rebuilt report, when the run published decisions;
    its cost is compared with the grid the run's config described (older manifests: the grid
    its decisions record, `search_grid`)."""
    from batchscale.adaptive.section import adaptive_section
    from batchscale.analysis.critical import read_level

    if "decisions" not in tables:
        return None
    grid = manifest.get("convergence_grid") or {}
    settings = analysis_config(manifest)
    return adaptive_section(tables["decisions"].to_pandas(), runs, grid.get("batch_sizes"),
                            grid.get("seeds"), settings.b_crit_range_factor,
                            read_level(settings, adaptive=True))


def _what_if(manifest: dict, frames: dict, analysis_rows: list[dict]):
    """The "What if: more workers" section's plan, made as the pipeline's analysis made it
    (`default_plan` on the same tables, the re-run analysis's rows): for the workload the
    manifest names (older manifests: the runs'), the worker counts the run's trials ran (the
    configured ones) and the sweep's image size. (plan, why there is none)."""
    import pandas as pd

    from batchscale.fits import ensure_columns, numeric_column
    from batchscale.planner.table import default_plan
    from batchscale.schemas import schema_for

    runs, sweep = frames["runs"], frames["sweep"]
    if runs is None or runs.empty:
        return None, "the run published no convergence runs: nothing to plan from"
    trials = ensure_columns(runs, schema_for("runs"))  # older tables: missing columns null
    runs_workloads = trials["workload"].dropna().astype(str).tolist()
    workload = manifest.get("workload") or next(iter(runs_workloads), None)
    if not workload:
        return None, "neither the run's manifest nor its runs name the workload"
    workers = sorted({int(n) for n in numeric_column(trials, "workers") if n >= 1})
    sizes = numeric_column(ensure_columns(sweep, schema_for("sweep")), "image_size_px")
    image_size = next((int(v) for v in sizes if v > 0), None)
    return default_plan(sweep, runs, pd.DataFrame(analysis_rows), workload=workload,
                        configured_workers=workers, image_size=image_size)


def assemble_report(manifest: dict, tables: dict[str, pa.Table], history=None):
    """The run's whole report from its tables and manifest: the analysis re-run as the pipeline
    ran it, the what-if plan, the adaptive search, the batch schedule and the regression
    verdicts with `history` (the cells' history plot, where the lake was read). The one place a
    published report is put together: publish renders it from the tables it publishes and
    `batchscale report` from the tables it reads back. (page, the analysis result)."""
    from batchscale.batch_schedule.section import table_section
    from batchscale.lake.regression import regressions_markdown
    from batchscale.report.render import RegressionsSection, render_html

    frames, result = analyzed(manifest, tables)
    experiment = manifest.get("experiment", manifest.get("workload", "run"))
    plan, plan_missing = _what_if(manifest, frames, result.rows)
    schedule = table_section(*(tables[name].to_pandas() if name in tables else None
                               for name in ("critical_over_training", "schedule_check")),
                             analysis_config(manifest).max_cpu_wait_share)
    regressions = (RegressionsSection(regressions_markdown(tables["regressions"].to_pandas()),
                                      history) if "regressions" in tables else None)
    page = render_html(result, frames["sweep"], frames["runs"], frames["curves"],
                       title=f"batchscale: {experiment} ({manifest['run_id']})", plan=plan,
                       plan_missing=plan_missing,
                       adaptive=_adaptive(manifest, tables, frames["runs"]), schedule=schedule,
                       regressions=regressions)
    return page, result


def rebuild_report(store: ObjectStore, run_id: str, out: Path) -> list[str]:
    """Re-run the analysis on the run's published tables and write the HTML report to `out`
    (assemble_report, without the history plot: the lake has moved on since); returns the
    summary lines."""
    manifest, tables = load_run(store, run_id)
    page, result = assemble_report({"run_id": run_id, **manifest}, tables)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    return [*summary_lines(store, run_id, manifest, tables, result.summary),
            f"report: {out} (rebuilt from the lake)"]
