"""Parallelism beyond the batch: the gradient noise scale B_simple (a cheap predictor of
B_crit), data-parallel efficiency over worker counts, and how many workers to use."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from batchscale import schemas
from batchscale.analysis.summary import NoiseScaleSummary
from batchscale.fits import ensure_columns, matches, numeric_column
from batchscale.schemas import RunStatus


def final_b_simple(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """The last B_simple of each trial (runs table first, else the curve's last finite value).

    The training code estimates B_simple = tr Σ / |G|² (McCandlish et al. 2018, App. A) as a
    ratio of moving averages; it grows during training, so the final value is the one to
    compare with B_crit at the target. Columns: trial_id, batch_size, b_simple.
    """
    runs = ensure_columns(runs, schemas.RUNS)
    curves = ensure_columns(curves, schemas.CURVES)
    final = pd.DataFrame(
        {
            "trial_id": runs["trial_id"].to_numpy(),
            "batch_size": numeric_column(runs, "batch_size"),
            "b_simple": numeric_column(runs, "b_simple"),
        }
    )
    logged = pd.DataFrame(
        {
            "trial_id": curves["trial_id"].to_numpy(),
            "batch_size": numeric_column(curves, "batch_size"),
            "step": numeric_column(curves, "step"),
            "b_simple": numeric_column(curves, "b_simple"),
        }
    )
    logged = logged[np.isfinite(logged["b_simple"])].sort_values("step")
    last = logged.groupby("trial_id").last().reset_index()[["trial_id", "batch_size", "b_simple"]]
    merged = pd.concat([final[np.isfinite(final["b_simple"])], last], ignore_index=True)
    return merged.drop_duplicates("trial_id", keep="first").reset_index(drop=True)


def noise_scale(runs: pd.DataFrame, curves: pd.DataFrame) -> tuple[pd.Series, NoiseScaleSummary]:
    """The median final B_simple per batch size, and over all trials."""
    final = final_b_simple(runs, curves)
    by_batch = final.groupby("batch_size")["b_simple"].median()
    if final.empty:
        return by_batch, NoiseScaleSummary(math.nan, 0, "no B_simple recorded")
    return by_batch, NoiseScaleSummary(float(final["b_simple"].median()), int(len(final)), "")


def data_parallel_efficiency(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (batch, workers): training samples/s and efficiency thr(N) / (N·thr(1)).

    Throughput is steps_run·B / train_time_s of each trial (evaluation excluded), median over
    trials. Efficiency is NaN where one worker was not run at that batch.
    """
    runs = ensure_columns(runs, schemas.RUNS)
    batch = numeric_column(runs, "batch_size")
    frame = pd.DataFrame(
        {
            "batch_size": batch,
            "workers": numeric_column(runs, "workers"),
            "samples_per_s": (
                numeric_column(runs, "steps_run") * batch / numeric_column(runs, "train_time_s")
            ),
        }
    )
    frame = frame[np.isfinite(frame["samples_per_s"]) & (frame["samples_per_s"] > 0)]
    table = frame.groupby(["batch_size", "workers"], sort=True)["samples_per_s"].median()
    table = table.reset_index()
    single = table[table["workers"] == 1].set_index("batch_size")["samples_per_s"]
    baseline = table["batch_size"].map(single)
    table["efficiency"] = table["samples_per_s"] / (table["workers"] * baseline)
    return table


def worker_counts(runs: pd.DataFrame) -> list[int]:
    """The distinct worker counts the convergence trials ran with, ascending."""
    workers = numeric_column(ensure_columns(runs, schemas.RUNS), "workers")
    return sorted({int(w) for w in workers[np.isfinite(workers)]})


def worker_choice(runs: pd.DataFrame) -> tuple[int | None, str]:
    """Workers = 1 unless trials with more workers reached the target faster (median time)."""
    runs = ensure_columns(runs, schemas.RUNS)
    counts = worker_counts(runs)
    if len(counts) <= 1:
        only = counts[0] if counts else 1
        return only, f"only {only} worker{'s' if only != 1 else ''} measured"
    time = numeric_column(runs, "time_to_target_s")
    reached = matches(runs, "status", RunStatus.REACHED) & np.isfinite(time)
    frame = pd.DataFrame(
        {
            "lr_rule": runs["lr_rule"].to_numpy(),
            "batch_size": numeric_column(runs, "batch_size"),
            "workers": numeric_column(runs, "workers"),
            "time": time,
        }
    )[reached]
    medians = frame.groupby(["lr_rule", "batch_size", "workers"])["time"].median()
    fastest = medians.groupby(level="workers").min()
    if fastest.empty:
        return 1, "no trial reached the target"
    if 1 not in fastest.index:
        best = int(fastest.idxmin())
        return best, f"{best} workers fastest to target ({fastest[best]:.3g} s); 1 worker not run"
    best = int(fastest.idxmin())
    if best == 1 or fastest[best] >= fastest[1]:
        return 1, f"more workers did not reach the target faster than 1 ({fastest[1]:.3g} s)"
    return best, f"{best} workers reached the target in {fastest[best]:.3g} s vs {fastest[1]:.3g} s"
