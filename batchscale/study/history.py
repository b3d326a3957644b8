"""`batchscale history --studies`: the published studies over time, each axis's answer per
study, so a changed answer (a new model, more data, a code change) shows side by side."""

from __future__ import annotations

import math

import pandas as pd

from batchscale.lake.lake import read_lake_table
from batchscale.storage import ObjectStore


def _interval(row) -> str:
    if not math.isfinite(row["slope"]):
        return row["verdict"]
    power = "exponent" if row["x_scale"] == "log" else "ln B_crit per unit"
    return (f"{row['verdict']}: ×{row['range_factor']:.3g} [{row['range_factor_low']:.3g}, "
            f"{row['range_factor_high']:.3g}] over the range, {power} {row['slope']:.2f} "
            f"[{row['slope_low']:.2f}, {row['slope_high']:.2f}]")


def study_history(store: ObjectStore, experiment: str | None = None,
                  last: int | None = None) -> pd.DataFrame:
    """The study_axes rows of every published study (of `experiment`), oldest first; `last`:
    only the most recent N studies."""
    axes = read_lake_table(store, "study_axes")
    if axes is None:
        return pd.DataFrame()
    if experiment is not None:
        axes = axes[axes["experiment"] == experiment]
    studies = list(dict.fromkeys(axes["run_id"]))
    keep = set(studies[-last:] if last else studies)
    return axes[axes["run_id"].isin(keep)].reset_index(drop=True)


def study_history_lines(axes: pd.DataFrame) -> list[str]:
    """A block per study: its date, experiment and commit, then a line per (axis, target)."""
    if axes.empty:
        return ["no published study in the lake (run one with `batchscale study --config "
                "batchscale/configs/study-digits.yaml`)"]
    lines = []
    for study_id, rows in axes.groupby("run_id", sort=False):
        first = rows.iloc[0]
        lines.append(f"study {study_id} ({first['date']}, {first['experiment']}, commit "
                     f"{str(first['git_commit'])[:10]}, {int(rows['variants_fitted'].max())} "
                     "variants fitted)")
        for _, row in rows.iterrows():
            target = f"{row['target_metric']} {row['target_value']:g}, {row['lr_rule']}"
            lines.append(f"  {row['axis']:<24} {target:<28} {_interval(row)}")
    return lines
