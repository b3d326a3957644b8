"""Reading the results lake back with pyarrow.dataset (Hive partitions `date=` / `run_id=`).

Only complete runs count: publish writes a run's manifest (`_runs/run_id=<id>/manifest.json`)
after all its tables, so a run without one (still publishing, or interrupted) is left out of
history and regression baselines instead of showing up with half its tables. Runs are ordered
by when their manifest was written (create-only, so that time never changes), then by run id:
run ids need not sort by time (on a cluster they are KFP's run UUIDs).

A stray object must not poison the lake (every later history and regression read would fail):
a manifest that is not a JSON object makes its run incomplete, and an object under a table that
is not Parquet, or does not fit the table's columns, is skipped; each with a warning on stderr
naming its key.
"""

from __future__ import annotations

import functools
import json
import sys
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from batchscale.schemas import TABLES, current_lr_rules, schema_for
from batchscale.storage import ObjectStore

RUNS_FOLDER = "_runs"
MANIFEST_NAME = "manifest.json"
RUN_PARTITION = "run_id="
PUBLISHED_AT = "published_at"
LAKE_TABLE_KINDS = {"dataset_manifest": "manifest"}
"""Lake table name -> its table kind in batchscale/schemas, where the two differ."""
PARTITIONING = ds.partitioning(
    pa.schema([("date", pa.string()), ("run_id", pa.string())]), flavor="hive"
)
"""Explicit string types: inferred ones would turn a run id like `20261129` into an integer
and clash with the `run_id` column every result file also carries."""
IGNORED_PREFIXES = (".", "_")
"""Files and folders pyarrow's own discovery skips (temporary and metadata files)."""
MANIFEST_READERS = 8
"""Manifests read at once: one small GET per complete run."""

_warned: set[str] = set()


def warn(message: str) -> None:
    """A warning on stderr, once per process (history reads the lake several times)."""
    if message not in _warned:
        _warned.add(message)
        print(f"warning: {message}", file=sys.stderr)


def lake_path(store: ObjectStore, table: str) -> str:
    """The pyarrow filesystem path of one lake table ("<bucket>/<prefix>/<table>")."""
    return f"{store.settings.bucket}/{store.key(table)}"


def complete_runs(store: ObjectStore) -> pd.DataFrame:
    """Runs whose manifest is in the lake and is a JSON object: columns run_id, published_at
    (UTC), in order."""
    selector = pafs.FileSelector(lake_path(store, RUNS_FOLDER), recursive=True,
                                 allow_not_found=True)
    found = []
    for info in _file_infos(store, selector):
        folder, name = info.path.split("/")[-2:]
        if name == MANIFEST_NAME and folder.startswith(RUN_PARTITION):
            found.append((folder[len(RUN_PARTITION):], info))
    with ThreadPoolExecutor(MANIFEST_READERS) as pool:
        readable = list(pool.map(lambda item: _manifest_is_an_object(store, item[1].path),
                                 found))
    rows = [{"run_id": run_id, PUBLISHED_AT: info.mtime}
            for (run_id, info), ok in zip(found, readable, strict=True) if ok]
    runs = pd.DataFrame(rows, columns=["run_id", PUBLISHED_AT])
    return runs.sort_values([PUBLISHED_AT, "run_id"], ignore_index=True)


def _manifest_is_an_object(store: ObjectStore, path: str) -> bool:
    key = path.split("/", 1)[1]
    try:
        manifest = json.loads(store.get_bytes(key))
    except ValueError as err:  # not JSON, or not UTF-8
        reason = f"is not JSON ({err})"
    else:
        if isinstance(manifest, dict):
            return True
        reason = f"is a JSON {type(manifest).__name__}, not an object"
    warn(f"s3://{path} {reason}: that run counts as incomplete and is left out")
    return False


def read_lake_table(
    store: ObjectStore,
    table: str,
    filter: pc.Expression | None = None,
    columns: list[str] | None = None,
) -> pd.DataFrame | None:
    """Rows of `table` from every complete run, with `date` and `run_id` (the partitions) and
    `published_at`, in publication order; None when no complete run has that table."""
    runs = complete_runs(store)
    if runs.empty:
        return None
    files = _run_files(store, table, set(runs["run_id"]))
    if not files:
        return None
    complete = ds.field("run_id").isin(runs["run_id"].tolist())
    where = complete if filter is None else complete & filter
    try:
        rows = _scan(store, table, files, where, columns)
    except pa.ArrowInvalid:  # a stray object: find it and go on without it
        rows = _scan_skipping_strays(store, table, files, where, columns)
    if rows is None or not rows.num_rows:
        return None
    frame = current_lr_rules(rows.to_pandas()).merge(runs, on="run_id", how="left")
    return frame.sort_values([PUBLISHED_AT, "run_id"], kind="stable", ignore_index=True)


def _run_files(store: ObjectStore, table: str, run_ids: set[str]) -> list[str]:
    """The table's files in complete runs' partitions, sorted; a file outside any run_id=
    partition is named in a warning, files of incomplete runs are left out quietly."""
    base = lake_path(store, table)
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    files = []
    for info in _file_infos(store, selector):
        parts = info.path[len(base) + 1:].split("/")
        if info.type != pafs.FileType.File or any(p.startswith(IGNORED_PREFIXES) for p in parts):
            continue
        run_id = next((p[len(RUN_PARTITION):] for p in parts if p.startswith(RUN_PARTITION)),
                      None)
        if run_id is None:
            warn(f"s3://{info.path} is not in a run_id= partition of lake table {table!r}: "
                 "skipped")
        elif run_id in run_ids:
            files.append(info.path)
    return sorted(files)


def _file_infos(store: ObjectStore, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
    """The listing, within the store's total deadline (pyarrow has only per-request timeouts)."""
    return store.pyarrow_read(lambda: store.pyarrow_filesystem().get_file_info(selector),
                              f"the listing of s3://{selector.base_dir}")


def _scan(store: ObjectStore, table: str, files: list[str], where: pc.Expression,
          columns: list[str] | None) -> pa.Table:
    """`_scan_now` within the store's total deadline."""
    return store.pyarrow_read(lambda: _scan_now(store, table, files, where, columns),
                              f"lake table {table!r}")


def _scan_now(store: ObjectStore, table: str, files: list[str], where: pc.Expression,
              columns: list[str] | None) -> pa.Table:
    """The files as one table under the union of the first file's schema and today's schema of
    the table: a dataset alone takes the first file's, so columns added since an old partition
    was written would be dropped from every newer one; old rows get nulls there."""
    options = {"filesystem": store.pyarrow_filesystem(), "format": "parquet",
               "partitioning": PARTITIONING, "partition_base_dir": lake_path(store, table)}
    dataset = ds.dataset(files, **options)
    current = current_schema(table)
    if current is not None:
        try:
            unified = pa.unify_schemas([dataset.schema, current])
        except (pa.ArrowInvalid, pa.ArrowTypeError):
            unified = None  # a column changed type: the checks that read it will say so
        if unified is not None:
            dataset = ds.dataset(files, schema=unified, **options)
    return dataset.to_table(columns=columns, filter=where)


def current_schema(table: str) -> pa.Schema | None:
    """Today's schema of a lake table (with its partition columns); None for a table whose
    schema lives outside batchscale/schemas."""
    kind = LAKE_TABLE_KINDS.get(table, table)
    if kind not in TABLES:
        return None
    schema = schema_for(kind)
    for partition in PARTITIONING.schema:
        if partition.name not in schema.names:
            schema = schema.append(partition)
    return schema


def _scan_skipping_strays(store: ObjectStore, table: str, files: list[str],
                          where: pc.Expression, columns: list[str] | None) -> pa.Table | None:
    """File by file: each one is downloaded through the store (so a network failure stays a
    StoreError, not a skipped file) and skipped with a warning if it is not Parquet or does not
    fit the columns of the files before it."""
    parts: list[pa.Table] = []
    schema: pa.Schema | None = None
    for path in files:
        try:
            pq.ParquetFile(pa.BufferReader(store.get_bytes(path.split("/", 1)[1])))  # footer
            part = store.bounded(functools.partial(_scan_now, store, table, [path], where,
                                                   columns))
            schema = part.schema if schema is None else pa.unify_schemas([schema, part.schema])
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as err:
            warn(f"s3://{path} is not a readable part of lake table {table!r} "
                 f"({str(err).splitlines()[0]}): skipped")
            continue
        parts.append(part)
    return pa.concat_tables(parts, promote_options="default") if parts else None
