"""publish core: append a run's tables to the results lake, create-only and idempotent.

Layout under the store prefix (Hive partitions, readable with pyarrow.dataset or DuckDB):

    <table>/date=YYYY-MM-DD/run_id=<id>/part-0.parquet     for every table
    reports/date=YYYY-MM-DD/run_id=<id>/report.html
    _runs/run_id=<id>/manifest.json                         written last: the run is complete

Every object is uploaded with its SHA-256 under If-None-Match, so running publish again for the
same run re-sends identical bytes and changes nothing, and no object is ever overwritten.

Before uploading, the run's throughput is checked against the lake's history (regression.py);
the verdicts become the `regressions` table and the report's "Regressions" section. A retry
reuses the verdicts already stored for the run, so it re-sends the same bytes even when other
runs were published in between. Failing on a regression is a separate step (`gate_stage`)
after publish: the data is in the lake first, and publish's retries (meant for a flaky store)
never repeat a deterministic failure.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import tempfile
from pathlib import Path

import pandas as pd

from batchscale.analysis.stage import primary_target
from batchscale.config.stage_inputs import Config, stage_config
from batchscale.errors import BadInput, ObjectExists
from batchscale.lake.history_chart import history_plot
from batchscale.lake.regression import (
    RegressionFound,
    check_regressions,
    read_history,
    regressed_cells,
    regressions_markdown,
    regressions_table,
    verdict_lines,
)
from batchscale.names import check_run_id
from batchscale.schemas import not_measured_reason, not_measured_table
from batchscale.storage import (
    ObjectStore,
    S3Settings,
    read_table_file,
    sha256_b64,
    write_table_atomic,
)

LAKE_TABLES = ("dataset_manifest", "sweep", "curves", "runs", "analysis", "regressions")
OPTIONAL_LAKE_TABLES = ("decisions", "plan", "study", "study_axes", "critical_over_training",
                        "schedule_check")
"""Published only by the runs that have them (decisions: an adaptive search's; plan: the what-if
plan, absent when the run lacked a measurement it needs; study, study_axes: a study's
comparison, published as a run of its own under the study id; critical_over_training,
schedule_check: the batch-schedule stage's, when the config enables it)."""
_RUN_DATE = re.compile(r"^(\d{4})(\d{2})(\d{2})T")


def run_date(run_id: str, today: dt.date | None = None) -> str:
    """The date partition: the one in a timestamped run id (so a re-publish on another day lands
    in the same place), otherwise today."""
    m = _RUN_DATE.match(run_id)
    if m:
        return f"{m[1]}-{m[2]}-{m[3]}"
    return (today or dt.datetime.now(dt.UTC).date()).isoformat()


def run_manifest_key(store: ObjectStore, run_id: str) -> str:
    return store.key("_runs", f"run_id={run_id}", "manifest.json")


def table_key(store: ObjectStore, table: str, date: str, run_id: str) -> str:
    return store.key(table, f"date={date}", f"run_id={run_id}", "part-0.parquet")


def report_key(store: ObjectStore, date: str, run_id: str) -> str:
    return store.key("reports", f"date={date}", f"run_id={run_id}", "report.html")


def published_manifest(store: ObjectStore, run_id: str) -> dict | None:
    """The run's manifest if it was published (None if not); BadInput naming its key when the
    file is damaged (not a JSON object with a string `date`), never a traceback."""
    key = run_manifest_key(store, run_id)
    if not store.exists(key):
        return None
    try:
        manifest = json.loads(store.get_bytes(key))
    except ValueError as err:  # not JSON, or not UTF-8
        manifest, why = None, f"is not JSON ({err})"
    else:
        why = "is not a JSON object with a string \"date\""
    if isinstance(manifest, dict) and isinstance(manifest.get("date"), str):
        return manifest
    raise BadInput(f"the manifest of run {run_id}, s3://{store.settings.bucket}/{key}, {why}; "
                   "the run's publication is damaged: publish it under a new run id (nothing "
                   "was overwritten)")


def publish_date(store: ObjectStore, run_id: str) -> str:
    """The run's date partition: the one already published, else `run_date`."""
    manifest = published_manifest(store, run_id)
    return manifest["date"] if manifest else run_date(run_id)


def publish_run(store: ObjectStore, run_id: str, files: dict[str, str | Path],
                report_path: str | Path | None = None, extra: dict | None = None) -> dict:
    """Upload `files` (lake table name -> local Parquet path) and the report; returns the run
    manifest. A repeat for the same run id uploads nothing new."""
    check_run_id(run_id)
    unknown = set(files) - set(LAKE_TABLES) - set(OPTIONAL_LAKE_TABLES)
    if unknown:
        raise ValueError(f"not lake tables: {sorted(unknown)}")
    manifest_key = run_manifest_key(store, run_id)
    date = publish_date(store, run_id)
    uploads = {table_key(store, name, date, run_id): Path(path) for name, path in files.items()}
    if report_path:
        uploads[report_key(store, date, run_id)] = Path(report_path)
    objects = []
    for key, path in uploads.items():
        data = path.read_bytes()
        created = _create_only(store, run_id, key, data)
        objects.append({"key": key, "bytes": len(data), "sha256": sha256_b64(data)})
        print(f"publish: {'wrote' if created else 'already there'} "
              f"s3://{store.settings.bucket}/{key}")
    manifest = {"run_id": run_id, "date": date, "objects": objects, **(extra or {})}
    _create_only(store, run_id, manifest_key,
                 json.dumps(manifest, indent=1, sort_keys=True).encode())
    return manifest


def _create_only(store: ObjectStore, run_id: str, key: str, data: bytes) -> bool:
    """put_bytes, with a refusal that says which run was already published differently."""
    try:
        return store.put_bytes(key, data)
    except ObjectExists as err:
        raise ObjectExists(f"publish of run {run_id} refused: {err}. Publish changed results "
                           "under a new run id.") from None


def write_regressions(store: ObjectStore, run_id: str, sweep: pd.DataFrame,
                      history_runs: int, path: str | Path,
                      quality_limits: tuple[float | None, float | None] | None = None,
                      no_sweep: str | None = None) -> pd.DataFrame:
    """Judge `sweep` against the lake's history and write the verdicts to `path`; when this
    run's verdicts are already stored (a retried publish), copy those bytes instead.
    `quality_limits`: the sweep's (max_unstable_share, max_cpu_wait_share), which decide
    whether a run was too disturbed to judge, a None in it turning that check off, as in the
    config (None for both: the regression check's defaults).
    `no_sweep`: why the run has no sweep rows (a TrainingLoop): the verdicts table is left
    empty, saying so."""
    date = publish_date(store, run_id)
    key = table_key(store, "regressions", date, run_id)
    if store.exists(key):
        Path(path).write_bytes(store.get_bytes(key))
    elif no_sweep is not None:
        write_table_atomic(path, not_measured_table(
            "regressions", None, f"no throughput to judge: {no_sweep}"))
    else:
        workloads = sorted(sweep["workload"].unique())
        history = read_history(store, run_id, workloads)
        limits = ({} if quality_limits is None else
                  dict(zip(("max_unstable_share", "max_cpu_wait_share"), quality_limits,
                           strict=True)))
        write_table_atomic(path, regressions_table(check_regressions(sweep, history,
                                                                     history_runs, **limits)))
    return read_table_file(path).to_pandas()


def run_stage(config: str | Config, run_id: str, manifest_path: str, sweep_path: str,
              curves_path: str, runs_path: str, analysis_path: str,
              regressions_path: str, markdown_path: str,
              decisions_path: str | None = None, plan_path: str | None = None,
              schedule_paths: tuple[str, str] | None = None) -> dict:
    """Pipeline entry: check for regressions, then publish a validated run (tables, the report
    with its "Regressions" section, the verdicts; the adaptive search's decisions where there
    are any) to the store named by the environment."""
    cfg = stage_config(config)
    store = ObjectStore(S3Settings.from_env())
    store.check()
    check_run_id(run_id)
    sweep_table = read_table_file(sweep_path)
    sweep = sweep_table.to_pandas()
    verdicts = write_regressions(store, run_id, sweep,
                                 cfg.publish.history_runs, regressions_path,
                                 (cfg.sweep.max_unstable_share, cfg.sweep.max_cpu_wait_share),
                                 not_measured_reason(sweep_table))
    markdown = regressions_markdown(verdicts)
    Path(markdown_path).write_text(markdown)
    print(markdown)
    files = {"dataset_manifest": manifest_path, "sweep": sweep_path, "curves": curves_path,
             "runs": runs_path, "analysis": analysis_path, "regressions": regressions_path}
    if decisions_path and read_table_file(decisions_path).num_rows:
        files["decisions"] = decisions_path
    if plan_path and read_table_file(plan_path).num_rows:
        files["plan"] = plan_path
    if schedule_paths:
        files.update(zip(("critical_over_training", "schedule_check"), schedule_paths,
                         strict=True))
    extra = {"workload": cfg.workload, "experiment": cfg.name, "config_hash": cfg.config_hash,
             "analysis_config": cfg.analysis.model_dump(mode="json"),
             "gap_epochs": cfg.convergence.gap_epochs,
             "warmup_steps": cfg.convergence.warmup_steps,
             # a rebuilt card names the target as the pipeline's did ("marked primary" or why not)
             "primary_target": primary_target(cfg),
             # what an adaptive search's report compares its cost with (batchscale report)
             "convergence_grid": {"batch_sizes": list(cfg.convergence.batch_sizes),
                                  "seeds": len(cfg.convergence.seeds)},
             "regressions": regressed_cells(verdicts)}
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.html"
        report.write_bytes(_published_report(store, cfg, run_id, files, extra, sweep, verdicts))
        return publish_run(store, run_id, files, report, extra)


def run_task(manifest_out: str, config: str | Config, run_id: str, dataset_dir: str,
             sweep_path: str, curves_path: str, runs_path: str, analysis_path: str,
             regressions_path: str, markdown_path: str, decisions_path: str,
             plan_path: str, schedule_paths: tuple[str, str] | None = None) -> None:
    """The publish components' body: `run_stage` (a refusal is one line and its exit status,
    errors.task_refusals), then the lake manifest written to `manifest_out`."""
    from batchscale.errors import task_refusals

    with task_refusals():
        manifest = run_stage(config, run_id, str(Path(dataset_dir) / "manifest.parquet"),
                             sweep_path, curves_path, runs_path, analysis_path,
                             regressions_path, markdown_path, decisions_path,
                             plan_path=plan_path, schedule_paths=schedule_paths)
    Path(manifest_out).write_text(json.dumps(manifest, indent=1))


def _published_report(store: ObjectStore, cfg, run_id: str, files: dict[str, str],
                      extra: dict, sweep: pd.DataFrame, verdicts: pd.DataFrame) -> bytes:
    """The report rendered from the tables being published (summary.assemble_report, as
    `batchscale report` renders it) with the cells' history plot; on a retried publish the
    stored report's bytes (the plot depends on the lake's state and the time, and publish
    re-sends identical bytes or nothing)."""
    from batchscale.lake.summary import assemble_report

    date = publish_date(store, run_id)  # reads the run's manifest, if published: once
    key = report_key(store, date, run_id)
    if store.exists(key):
        return store.get_bytes(key)
    tables = {name: read_table_file(path) for name, path in files.items()}
    plot = history_plot(store, cfg.workload, run_id, date, sweep, verdicts,
                        tables["analysis"].to_pandas(), last_runs=2 * cfg.publish.history_runs)
    page, _ = assemble_report({"run_id": run_id, **extra}, tables, history=plot)
    return page.encode()


def gate_stage(config: str | Config, regressions_path: str) -> None:
    """Fail (RegressionFound, naming the cells) when publish flagged a throughput regression
    and `publish.fail_on_regression` is on; otherwise only report it."""
    cfg = stage_config(config)
    verdicts = read_table_file(regressions_path).to_pandas()
    cells = regressed_cells(verdicts)
    if not cells:
        print("\n".join(verdict_lines(verdicts)))
        return
    message = regression_message(cells)
    if cfg.publish.fail_on_regression:
        raise RegressionFound(message)
    print(f"{message}\n(not failing: publish.fail_on_regression is off)")


def published_regressions(store: ObjectStore, run_id: str) -> list[str]:
    """The regressed cells recorded in a published run's manifest (none if unpublished)."""
    manifest = published_manifest(store, run_id)
    cells = manifest.get("regressions", []) if manifest else []
    return [c for c in cells if isinstance(c, str)] if isinstance(cells, list) else []


def regression_message(cells: list[str]) -> str:
    return (f"{len(cells)} throughput regression(s) against the lake's history (the run's "
            "tables are published):\n  " + "\n  ".join(cells))
