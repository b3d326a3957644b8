"""The short summary `batchscale run` prints, read back from the results lake (so what is
printed is what was published)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow as pa

from batchscale.storage import ObjectStore


def _fmt(value, spec: str = ".0f") -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "-"
    return format(value, spec)


def load_run(store: ObjectStore, run_id: str) -> tuple[dict, dict[str, pa.Table]]:
    """The run manifest and its tables, keyed by lake table name."""
    from batchscale.components.publish.publish import run_manifest_key

    manifest = json.loads(store.get_bytes(run_manifest_key(store, run_id)))
    tables = {}
    for obj in manifest["objects"]:
        if obj["key"].endswith(".parquet"):
            name = obj["key"][len(store.key()) + 1:].split("/")[0]
            tables[name] = store.get_table(obj["key"])
    return manifest, tables


def throughput_lines(sweep: pa.Table) -> list[str]:
    lines = ["throughput (samples/s; median step; CV):",
             f"  {'input':9s} {'batch':>6s} {'samples/s':>11s} {'step ms':>9s} {'cv':>6s}"]
    for r in sorted(sweep.to_pylist(), key=lambda r: (r["input_mode"], r["batch_size"])):
        if r["status"] != "ok":
            lines.append(f"  {r['input_mode']:9s} {r['batch_size']:6d}  {r['status']}")
            continue
        lines.append(f"  {r['input_mode']:9s} {r['batch_size']:6d} {r['samples_per_s']:11.0f} "
                     f"{r['step_time_median_s'] * 1e3:9.3f} {r['step_time_cv']:6.3f}")
    return lines


def convergence_lines(analysis: pa.Table) -> list[str]:
    rows = analysis.to_pylist()
    rules = sorted({r["lr_rule"] for r in rows})
    batches = sorted({r["batch_size"] for r in rows})
    cell = {(r["lr_rule"], r["batch_size"]): r for r in rows}
    lines = ["steps to target S(B) (Shallue: median over seeds, best LR):",
             f"  {'batch':>6s} " + " ".join(f"{rule:>10s}" for rule in rules)]
    for b in batches:
        lines.append(f"  {b:6d} " + " ".join(
            f"{_fmt(cell.get((rule, b), {}).get('steps_to_target')):>10s}" for rule in rules))
    for rule in rules:
        fit = next(r for r in rows if r["lr_rule"] == rule)
        lines.append(f"  B_crit ({rule}): {_fmt(fit['b_crit'], '.1f')} "
                     f"[{_fmt(fit['b_crit_low'], '.1f')}, {_fmt(fit['b_crit_high'], '.1f')}] "
                     f"(S_min {_fmt(fit['s_min'], '.1f')}, E_min {_fmt(fit['e_min'], '.0f')})")
    sat = rows[0]["saturation_batch"] if rows else None
    lines.append(f"  saturation batch (throughput within tolerance of best): {_fmt(sat, 'd')}")
    return lines


def print_run_summary(store: ObjectStore, run_id: str, local_dir: Path) -> None:
    manifest, tables = load_run(store, run_id)
    local_dir.mkdir(parents=True, exist_ok=True)
    report_key = next((o["key"] for o in manifest["objects"] if o["key"].endswith(".html")), None)
    lines = [f"\nbatchscale run {run_id}"]
    if "sweep" in tables:
        lines += throughput_lines(tables["sweep"])
    if "analysis" in tables:
        lines += convergence_lines(tables["analysis"])
    bucket = store.settings.bucket
    lines.append("tables:")
    lines += [f"  s3://{bucket}/{o['key']}" for o in manifest["objects"]
              if o["key"].endswith(".parquet")]
    if report_key:
        local_report = local_dir / "report.html"
        local_report.write_bytes(store.get_bytes(report_key))
        lines.append(f"report: {local_report} (s3://{bucket}/{report_key})")
    print("\n".join(lines))
