"""A published run's tables as the what-if planner's inputs (`batchscale plan`): the run read
back from the lake by its manifest, the gradient size its trials recorded (counted from its
workload for older runs), and the environment
columns its plan table carries (the run's own)."""

from __future__ import annotations

import pandas as pd

from batchscale.errors import BadInput
from batchscale.planner.inputs import (
    PlanInputs,
    gradient_bytes,
    read_plan_inputs,
    recorded_gradient_bytes,
)
from batchscale.schemas import ENV_FIELDS
from batchscale.storage import ObjectStore

NEEDED_TABLES = ("runs", "analysis")


def plan_inputs_of_run(store: ObjectStore, run_id: str, lr_rule: str | None = None
                       ) -> tuple[PlanInputs, dict[str, pd.DataFrame]]:
    """The planner's inputs from a published run, and its tables as pandas; BadInput for a run
    not in the lake, or one without the tables a plan needs."""
    from batchscale.lake.summary import load_run

    _, tables = load_run(store, run_id)  # BadInput naming a run not in the lake
    missing = [name for name in NEEDED_TABLES if name not in tables]
    if missing:
        raise BadInput(f"run {run_id} has no {' or '.join(missing)} table in the lake: a plan "
                       "needs the convergence runs and their analysis")
    frames = {name: table.to_pandas() for name, table in tables.items()}
    runs = frames["runs"]
    if runs.empty:
        raise BadInput(f"run {run_id} has an empty runs table: nothing to plan from")
    # Runs from before the trials recorded their gradient bytes: count them from the workload.
    grad = None if recorded_gradient_bytes(runs) else gradient_bytes(
        str(runs["workload"].iloc[0]), _num_classes(frames), _image_size(frames.get("sweep")))
    inputs = read_plan_inputs(frames.get("sweep"), runs, frames["analysis"], grad, lr_rule)
    return inputs, frames


def _num_classes(frames: dict[str, pd.DataFrame]) -> int | None:
    manifest = frames.get("dataset_manifest")
    if manifest is None or manifest.empty or "num_classes" not in manifest:
        return None
    return int(manifest["num_classes"].iloc[0])


def _image_size(sweep: pd.DataFrame | None) -> int | None:
    if sweep is None or "image_size_px" not in sweep or sweep["image_size_px"].isna().all():
        return None
    return int(sweep["image_size_px"].dropna().iloc[0])


def run_env(frames: dict[str, pd.DataFrame]) -> dict:
    """The run's environment columns (from its runs table) for the plan table's rows."""
    first = frames["runs"].iloc[0]
    return {f.name: _plain(first[f.name]) for f in ENV_FIELDS if f.name != "schema_version"}


def _plain(value):
    """A plain Python value; a missing one (NaN or None in pandas, e.g. a column written before
    it existed, as `variant` before schema 3) as None."""
    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return None
    return value.item() if hasattr(value, "item") else value
