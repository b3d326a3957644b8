"""publish core: append a run's tables to the results lake, create-only and idempotent.

Layout under the store prefix (Hive partitions, readable with pyarrow.dataset or DuckDB):

    <table>/date=YYYY-MM-DD/run_id=<id>/part-0.parquet     for every table
    reports/date=YYYY-MM-DD/run_id=<id>/report.html
    _runs/run_id=<id>/manifest.json                         written last: the run is complete

Every object is uploaded with its SHA-256 under If-None-Match, so running publish again for the
same run re-sends identical bytes and changes nothing, and no object is ever overwritten.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import json
import re
from pathlib import Path

from batchscale.errors import BadInput
from batchscale.storage import ObjectStore

LAKE_TABLES = ("dataset_manifest", "sweep", "curves", "runs", "analysis")
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_RUN_DATE = re.compile(r"^(\d{4})(\d{2})(\d{2})T")


def check_run_id(run_id: str) -> str:
    if not RUN_ID_PATTERN.match(run_id):
        raise BadInput(f"run id {run_id!r} is not allowed; use letters, digits, '.', '_' or '-' "
                       "(at most 128, starting with a letter or digit)")
    return run_id


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


def publish_run(store: ObjectStore, run_id: str, files: dict[str, str | Path],
                report_path: str | Path | None = None, extra: dict | None = None) -> dict:
    """Upload `files` (lake table name -> local Parquet path) and the report; returns the run
    manifest. A repeat for the same run id uploads nothing new."""
    check_run_id(run_id)
    unknown = set(files) - set(LAKE_TABLES)
    if unknown:
        raise ValueError(f"not lake tables: {sorted(unknown)}")
    manifest_key = run_manifest_key(store, run_id)
    date = run_date(run_id)
    if store.exists(manifest_key):
        date = json.loads(store.get_bytes(manifest_key))["date"]
    uploads = {table_key(store, name, date, run_id): Path(path) for name, path in files.items()}
    if report_path:
        uploads[store.key("reports", f"date={date}", f"run_id={run_id}", "report.html")] = \
            Path(report_path)
    objects = []
    for key, path in uploads.items():
        data = path.read_bytes()
        created = store.put_bytes(key, data)
        objects.append({"key": key, "bytes": len(data), "sha256": _b64_sha256(data),
                        "created": created})
        print(f"publish: {'wrote' if created else 'already there'} s3://{store.settings.bucket}/{key}")
    manifest = {"run_id": run_id, "date": date,
                "objects": [{k: o[k] for k in ("key", "bytes", "sha256")} for o in objects],
                **(extra or {})}
    store.put_bytes(manifest_key, json.dumps(manifest, indent=1, sort_keys=True).encode())
    return manifest


def _b64_sha256(data: bytes) -> str:
    return base64.b64encode(hashlib.sha256(data).digest()).decode()


def run_stage(run_id: str, manifest_path: str, sweep_path: str, curves_path: str,
              runs_path: str, analysis_path: str, report_path: str) -> dict:
    """Pipeline entry: publish a validated run to the store named by the environment."""
    from batchscale.storage import S3Settings

    store = ObjectStore(S3Settings.from_env())
    store.check()
    files = {"dataset_manifest": manifest_path, "sweep": sweep_path, "curves": curves_path,
             "runs": runs_path, "analysis": analysis_path}
    return publish_run(store, run_id, files, report_path)
