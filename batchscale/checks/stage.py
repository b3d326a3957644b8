"""validate entry points: run the great-expectations suites on a stage's tables, write one JSON
result and one readable HTML page, and stop the pipeline when any check fails."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa

from batchscale.catalog import MASK_DATASETS, TEXT_DATASETS
from batchscale.checks.outcome import validation_page
from batchscale.checks.validate import validate_table
from batchscale.config.stage_inputs import Config, stage_config
from batchscale.errors import BadInput, ValidationFailed
from batchscale.schemacheck import check_schema
from batchscale.schemas import not_measured_reason
from batchscale.storage import read_table_file, write_table_atomic


def check_tables(checks: list[tuple[str, str, pa.Table, dict]], json_path: str,
                 html_path: str) -> None:
    """checks: (label, table kind, table, context). Writes the results, then raises on failure."""
    reports = [(label, validate_table(kind, table, context=ctx))
               for label, kind, table, ctx in checks]
    Path(json_path).write_text(json.dumps(
        [{"table": label, **json.loads(r.to_json())} for label, r in reports], indent=1))
    Path(html_path).write_text(validation_page(reports))
    failed = [(label, r) for label, r in reports if not r.success]
    for label, r in reports:
        print(f"validate {label}: {'passed' if r.success else 'FAILED'} "
              f"({r.statistics.get('successful_expectations', '?')}/"
              f"{r.statistics.get('evaluated_expectations', '?')} expectations)")
        for warning in r.warnings():
            print(f"validate {label}: warning: {warning}")
    if failed:
        raise ValidationFailed("\n".join(f"[{label}] {r.failure_message()}" for label, r in failed))


def _left_empty(kind: str, table: pa.Table, reason: str, json_path: str, html_path: str) -> None:
    """A table its stage left empty on purpose (schemas.not_measured_table): only its schema
    is checked; the results say why it has no rows."""
    check_schema(kind, table)
    Path(json_path).write_text(json.dumps(
        [{"table": kind, "success": True, "rows": 0, "not_measured": reason}], indent=1))
    Path(html_path).write_text(validation_page([], note=f"{kind}: no rows to check: {reason}"))
    print(f"validate {kind}: no rows to check: {reason}")


def validate_dataset(config: str | Config, dataset_dir: str, json_path: str,
                     html_path: str) -> None:
    from batchscale.shards import read_manifest, sha256_file

    cfg = stage_config(config)
    dense = cfg.dataset.name in TEXT_DATASETS + MASK_DATASETS
    root = Path(dataset_dir)
    manifest = read_manifest(root)
    if (reason := not_measured_reason(manifest)) is not None:
        _left_empty("manifest", manifest, reason, json_path, html_path)
        return
    entries = _checkable_entries(manifest)
    checksums = {m["shard"]: sha256_file(root / m["shard"]) for m in entries}
    checks = [("manifest", "manifest", manifest,
               {"shard_checksums": checksums, "dense_targets": dense})]
    for m in entries:
        ctx = {"num_classes": m["num_classes"], "dense_targets": dense,
               "feature_length": math.prod(m["feature_shape"])}
        checks.append((m["shard"], "dataset", read_table_file(root / m["shard"]), ctx))
    check_tables(checks, json_path, html_path)


def _checkable_entries(manifest: pa.Table) -> list[dict]:
    """The manifest rows whose shards can be checked: none when the manifest does not match its
    schema (e.g. a duplicated column; its own validation names the problem), and only rows that
    name their shard, shape and classes (the suite names the nulls)."""
    try:
        rows = check_schema("manifest", manifest, allow_nulls=True).to_pylist()
    except BadInput:
        return []
    needed = ("shard", "feature_shape", "num_classes")
    return [m for m in rows if all(m[key] is not None for key in needed)]


def validate_sweep(config: str | Config, sweep_path: str, json_path: str, html_path: str) -> None:
    cfg = stage_config(config)
    table = read_table_file(sweep_path)
    if (reason := not_measured_reason(table)) is not None:
        _left_empty("sweep", table, reason, json_path, html_path)
        return
    # With `batch_sizes: auto` the search picks the batches: there is no list to check against.
    ctx = {} if cfg.sweep.batch_sizes == "auto" else {"batch_sizes": list(cfg.sweep.batch_sizes)}
    ctx["max_unstable_share"] = cfg.sweep.max_unstable_share
    ctx["unstable_fails"] = cfg.sweep.unstable_fails
    check_tables([("sweep", "sweep", table, ctx)], json_path, html_path)


def validate_runs(config: str | Config, curves_paths: list[str], runs_paths: list[str],
                  merged_curves: str, merged_runs: str, json_path: str, html_path: str,
                  decisions_paths: list[str] = (), merged_decisions: str | None = None) -> None:
    """Merge the fanned-out convergence tables, check them, and pass the merged tables on;
    the adaptive search's decisions too (grid cells leave an empty decisions table)."""
    cfg = stage_config(config)
    curves = pa.concat_tables([read_table_file(p) for p in curves_paths])
    runs = pa.concat_tables([read_table_file(p) for p in runs_paths])
    decisions = pa.concat_tables([read_table_file(p) for p in decisions_paths]) \
        if decisions_paths else None
    batches = list(cfg.convergence.batch_sizes)
    checks = [
        ("curves", "curves", curves, {"batch_sizes": batches}),
        ("runs", "runs", runs, {"batch_sizes": batches, "curves": curves}),
    ]
    if decisions is not None and decisions.num_rows:
        checks.append(("decisions", "decisions", decisions, {}))
    try:
        check_tables(checks, json_path, html_path)
    except ValidationFailed as err:
        raise ValidationFailed(f"{_why_no_curve(curves, runs)}{err}") from None
    write_table_atomic(merged_curves, curves)
    write_table_atomic(merged_runs, runs)
    if merged_decisions is not None and decisions is not None:
        write_table_atomic(merged_decisions, decisions)


def _why_no_curve(curves: pa.Table, runs: pa.Table) -> str:
    """Where every trial ended before its first evaluation (a user's training that raises),
    what they stopped with, as a first line: the empty curves table is only the consequence."""
    if curves.num_rows or not runs.num_rows or "stop_reason" not in runs.column_names:
        return ""
    reasons = sorted({r for r in runs.column("stop_reason").to_pylist() if r})
    if not reasons:
        return ""
    more = f" (and {len(reasons) - 3} more)" if len(reasons) > 3 else ""
    return (f"no trial recorded an evaluation: all {runs.num_rows} ended first, with: "
            f"{'; '.join(reasons[:3])}{more}\n")


def validate_analysis(config: str | Config, analysis_path: str, json_path: str,
                      html_path: str, plan_path: str | None = None) -> None:
    """The analysis table and, when given and not empty, the what-if plan table (empty: the
    run lacked a measurement the planner needs, and the report says which)."""
    cfg = stage_config(config)
    ctx = {}
    if cfg.sweep.batch_sizes != "auto":
        ctx["batch_sizes"] = sorted(set(cfg.convergence.batch_sizes) | set(cfg.sweep.batch_sizes))
    checks = [("analysis", "analysis", read_table_file(analysis_path), ctx)]
    plan = read_table_file(plan_path) if plan_path is not None else None
    if plan is not None and plan.num_rows:
        checks.append(("plan", "plan", plan, {}))
    check_tables(checks, json_path, html_path)


def validate_regressions(config: str | Config, regressions_path: str, json_path: str,
                         html_path: str) -> None:
    """Check the regression verdicts publish wrote (and stored beside the run's tables)
    before the gate reads them: a malformed verdict must not page anyone, nor hide a
    regression."""
    stage_config(config)  # the same refusal of a bad config as every other stage
    table = read_table_file(regressions_path)
    if (reason := not_measured_reason(table)) is not None:
        _left_empty("regressions", table, reason, json_path, html_path)
        return
    check_tables([("regressions", "regressions", table, {})], json_path, html_path)
