"""Reading the results lake back with pyarrow.dataset (Hive partitions `date=` / `run_id=`).

Only complete runs count: publish writes a run's manifest (`_runs/run_id=<id>/manifest.json`)
after all its tables, so a run without one (still publishing, or interrupted) is left out of
history and regression baselines instead of showing up with half its tables. Runs are ordered
by when their manifest was written (create-only, so that time never changes), then by run id:
run ids need not sort by time (on a cluster they are KFP's run UUIDs).
"""

from __future__ import annotations

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyarrow import fs as pafs

from batchscale.storage import ObjectStore

RUNS_FOLDER = "_runs"
MANIFEST_NAME = "manifest.json"
RUN_PARTITION = "run_id="
PUBLISHED_AT = "published_at"
PARTITIONING = ds.partitioning(
    pa.schema([("date", pa.string()), ("run_id", pa.string())]), flavor="hive"
)
"""Explicit string types: inferred ones would turn a run id like `20261129` into an integer
and clash with the `run_id` column every result file also carries."""


def lake_path(store: ObjectStore, table: str) -> str:
    """The pyarrow filesystem path of one lake table ("<bucket>/<prefix>/<table>")."""
    return f"{store.settings.bucket}/{store.key(table)}"


def complete_runs(store: ObjectStore) -> pd.DataFrame:
    """Runs whose manifest is in the lake: columns run_id, published_at (UTC), in order."""
    selector = pafs.FileSelector(lake_path(store, RUNS_FOLDER), recursive=True,
                                 allow_not_found=True)
    rows = []
    for info in store.pyarrow_filesystem().get_file_info(selector):
        folder, name = info.path.split("/")[-2:]
        if name == MANIFEST_NAME and folder.startswith(RUN_PARTITION):
            rows.append({"run_id": folder[len(RUN_PARTITION):], PUBLISHED_AT: info.mtime})
    runs = pd.DataFrame(rows, columns=["run_id", PUBLISHED_AT])
    return runs.sort_values([PUBLISHED_AT, "run_id"], ignore_index=True)


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
    try:
        dataset = ds.dataset(lake_path(store, table), filesystem=store.pyarrow_filesystem(),
                             format="parquet", partitioning=PARTITIONING)
    except FileNotFoundError:
        return None
    complete = ds.field("run_id").isin(runs["run_id"].tolist())
    rows = dataset.to_table(columns=columns,
                            filter=complete if filter is None else complete & filter)
    if not rows.num_rows:
        return None
    frame = rows.to_pandas().merge(runs, on="run_id", how="left")
    return frame.sort_values([PUBLISHED_AT, "run_id"], kind="stable", ignore_index=True)
