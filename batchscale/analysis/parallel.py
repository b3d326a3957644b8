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
    """The last B_simple of each trial: the runs table's, or, in a runs table without the
    column (a table from elsewhere), the curve's last finite value.

    The training code estimates B_simple = tr Σ / |G|² (McCandlish et al. 2018, App. A) as a
    ratio of moving averages; it grows during training, so the final value is the one to
    compare with B_crit at the target. A trial whose runs row has none (a column all trials
    carry) ended with a failed estimate (|G|² ≤ 0: `NoiseScale.b_simple`) and is left out: its
    curve's last finite value is an earlier estimate from as |G|² fell towards 0, too large to
    mean anything, and `batchscale analyze` without the curves could not repeat it. A trial that
    repeats another's batch size, learning rate, seed and worker count (the rules' shared
    reference batch) counts once. Columns: trial_id, batch_size, b_simple.
    """
    recorded = "b_simple" in runs.columns  # by the table's columns, not by its values
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
    if recorded:  # the runs record it: they alone say it, failed estimates included
        logged = logged.iloc[0:0]
    last = logged.groupby("trial_id").last().reset_index()[["trial_id", "batch_size", "b_simple"]]
    merged = pd.concat([final[np.isfinite(final["b_simple"])], last], ignore_index=True)
    merged = merged.drop_duplicates("trial_id", keep="first")
    # The LR rules agree at the reference batch, so their trials there train the same model on
    # the same data: one measurement, under two trial ids, counted once.
    setting = runs.drop_duplicates("trial_id").set_index("trial_id")[["lr", "seed", "workers"]]
    keys = setting.reindex(merged["trial_id"].to_numpy()).set_axis(merged.index)
    known = keys.notna().all(axis=1)
    twice = known & pd.concat([merged[["batch_size"]], keys], axis=1).duplicated()
    return merged[~twice].reset_index(drop=True)


NO_B_SIMPLE = ("no B_simple recorded with the runs (a table from elsewhere seldom has one; "
               "batchscale's trials measure it from two gradients of different batch sizes at a "
               "step, which a TrainingLoop on one worker lacks: run it on two workers; "
               "convergence.gns_every_steps: null turns the measurement off)")


def noise_scale(runs: pd.DataFrame,
                curves: pd.DataFrame) -> tuple[pd.DataFrame, NoiseScaleSummary]:
    """The final B_simple per batch size (its median over the batch's trials, their lowest and
    highest, and how many: columns median, low, high, trials, indexed by batch_size), and over
    all trials its median with the interquartile range. A final estimate ≤ 0 is left out and
    counted: B_simple = tr Σ / |G|² cannot be negative, but its unbiased estimate of |G|² can
    when the noise swamps the gradient, and such a value says only that the estimate failed
    there. A trial that diverged is left out too: its last gradients are those of a model
    blowing up, not of the training the noise scale predicts."""
    runs = ensure_columns(runs, schemas.RUNS)
    diverged = matches(runs, "status", RunStatus.DIVERGED)
    curves = ensure_columns(curves, schemas.CURVES)
    gone = curves["trial_id"].isin(set(runs.loc[diverged, "trial_id"]))
    final = final_b_simple(runs[~diverged], curves[~gone])
    usable = final[final["b_simple"] > 0]
    dropped = int(len(final) - len(usable))
    by_batch = usable.groupby("batch_size")["b_simple"].agg(
        median="median", low="min", high="max", trials="size")
    if final.empty and diverged.all() and len(runs):
        return by_batch, NoiseScaleSummary(
            math.nan, 0, f"every trial diverged ({len(runs)}): a diverging run's gradients say "
                         "nothing of the noise scale of the training that reaches the target")
    if final.empty:
        return by_batch, NoiseScaleSummary(math.nan, 0, NO_B_SIMPLE)
    if usable.empty:
        return by_batch, NoiseScaleSummary(
            math.nan, 0, f"every trial's final estimate ({dropped}) was ≤ 0: the gradient "
                         "noise swamped |G|², so no B_simple can be read", dropped=dropped)
    low, high = np.percentile(usable["b_simple"], [25, 75])
    return by_batch, NoiseScaleSummary(float(usable["b_simple"].median()), int(len(usable)), "",
                                       float(low), float(high), dropped,
                                       _unrecorded(runs[~diverged], final))


def _unrecorded(runs: pd.DataFrame, final: pd.DataFrame) -> int:
    """Trials whose runs row holds no finite B_simple and that got none from elsewhere."""
    estimates = numeric_column(runs, "b_simple")
    trials = runs.loc[~np.isfinite(estimates), "trial_id"]
    return int(len(set(trials) - set(final["trial_id"])))


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


MAX_PHYSICAL_EFFICIENCY = 1.2
"""Data-parallel efficiency (speed-up ÷ workers) above this is not physical: the ideal is 1,
and the margin covers timing noise and the cache gain of a smaller per-worker batch."""


def worker_choice(
    runs: pd.DataFrame, cell: tuple[str, int] | None = None
) -> tuple[int | None, str]:
    """Workers = 1 unless trials with more workers reached the target faster, with both times.

    Times are per (LR rule, batch, workers) cell (`_median_times`). They are compared like for
    like at one cell run with one worker and more: `cell` (the recommended rule and batch) if
    it was, else the fastest such cell; without one, each worker count's fastest cell is named
    beside its time.
    """
    runs = ensure_columns(runs, schemas.RUNS)
    counts = worker_counts(runs)
    if len(counts) <= 1:
        only = counts[0] if counts else 1
        return only, f"only {_workers(only)} measured"
    medians = _median_times(runs)
    if medians.empty:
        return 1, "no trial reached the target"
    fastest, place, where, cells = _compared(medians, cell)
    best = int(fastest.idxmin())
    spreads = _seed_ranges(runs)
    # measured times, not the batch line's steps × step time: the two can differ in the last
    # digit for the same cell, and the words say which this is
    listing = place + "; ".join(
        f"{_workers(int(n))}: {_time_text(fastest[n], spreads.get(cells[n]))} to target"
        f"{where.get(n, '')}"
        for n in fastest.index
    ) + " (medians of the trials' measured times, with their range over seeds)"
    if 1 not in fastest.index:
        return best, f"{listing} — {_workers(best)} fastest; 1 worker did not reach the target"
    if best == 1:
        return 1, f"{listing} — more workers did not reach the target sooner than 1"
    speedup = fastest[1] / fastest[best]
    if where:  # each count's own fastest cell: a speed-up, but of different cells
        return best, (f"{listing} — {_workers(best)} reached the target {speedup:.3g}× sooner "
                      "than 1, in another cell (no cell ran with both, so no data-parallel "
                      "efficiency is given)")
    if speedup / best > MAX_PHYSICAL_EFFICIENCY:
        return None, (
            f"{listing} — {_workers(best)} reached the target {speedup:.3g}× sooner than 1, a"
            f" data-parallel efficiency of {speedup / best:.0%}: not physical (above"
            f" {MAX_PHYSICAL_EFFICIENCY:.0%}; most likely the 1-worker trials were slowed, e.g."
            " by a busy machine), so no worker count is recommended from it"
        )
    return best, (
        f"{listing} — {_workers(best)} reached the target {speedup:.3g}× sooner than 1, for"
        f" {best}× the workers ({_efficiency_text(speedup / best)})"
    )


def _efficiency_text(efficiency: float) -> str:
    """"78% data-parallel efficiency"; above the ideal 100 %, flagged: the figure is no
    efficiency a group can have, only that the workers were faster (timing noise, or the cache
    gain of a smaller per-worker batch, makes up the rest)."""
    if efficiency <= 1:
        return f"{efficiency:.0%} data-parallel efficiency"
    return (f"{efficiency:.0%} data-parallel efficiency — NOT TRUSTED as an efficiency: above "
            "the ideal 100%, so timing noise or the cache gain of a smaller per-worker batch "
            "is in it; the workers were faster, not that much faster")


def _median_times(runs: pd.DataFrame) -> pd.Series:
    """Time to target per (lr_rule, batch_size, workers), like S(B): per learning rate the
    median over seeds with a trial that did not reach the target counted as never (+inf, so a
    learning rate that fails on half the seeds does not count), then the best learning rate.
    Cells no learning rate reached are left out."""
    frame = _time_frame(runs)
    per_lr = frame.groupby([*TIME_KEYS, "lr"], dropna=False)["time"].median()
    best = per_lr.groupby(level=TIME_KEYS).min()
    return best[np.isfinite(best)]


TIME_KEYS = ["lr_rule", "batch_size", "workers"]


def _time_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Each trial's cell, learning rate and time to target (+inf where it did not reach)."""
    time = numeric_column(runs, "time_to_target_s")
    reached = matches(runs, "status", RunStatus.REACHED) & np.isfinite(time)
    return pd.DataFrame({"lr_rule": runs["lr_rule"].to_numpy(),
                         "batch_size": numeric_column(runs, "batch_size"),
                         "workers": numeric_column(runs, "workers"),
                         "lr": numeric_column(runs, "lr"),
                         "time": np.where(reached, time, np.inf)})


def _seed_ranges(runs: pd.DataFrame) -> dict[tuple, tuple[float, float, int]]:
    """Per (lr_rule, batch_size, workers): the lowest and highest time to target over the
    seeds that reached it at the learning rate `_median_times` chose there (the lowest
    median), and how many they were."""
    chosen: dict[tuple, tuple[float, pd.Series]] = {}
    for (*cell, _lr), times in _time_frame(runs).groupby([*TIME_KEYS, "lr"],
                                                        dropna=False)["time"]:
        median = times.median()
        if tuple(cell) not in chosen or median < chosen[tuple(cell)][0]:
            chosen[tuple(cell)] = (median, times)
    ranges = {}
    for cell, (_, times) in chosen.items():
        finite = times[np.isfinite(times)]
        if len(finite):
            ranges[cell] = (float(finite.min()), float(finite.max()), int(len(finite)))
    return ranges


def _time_text(value: float, spread: tuple[float, float, int] | None) -> str:
    """"0.0821 s [0.078, 0.0862] over 2 seeds" where two or more seeds reached, else the
    median alone with "(one seed)"."""
    if spread is None or spread[2] < 2:
        return f"{value:.3g} s (one seed)"
    return f"{value:.3g} s [{spread[0]:.3g}, {spread[1]:.3g}] over {spread[2]} seeds"


def _paired_cell(medians: pd.Series, cell: tuple[str, int] | None) -> tuple[str, float] | None:
    """Where to compare worker counts like for like: the recommended cell if it ran with one
    worker and more, else the fastest cell that did; None when no cell did."""
    counts = medians.groupby(level=["lr_rule", "batch_size"]).apply(
        lambda times: set(times.index.get_level_values("workers"))
    )
    paired = [key for key, workers in counts.items() if 1 in workers and len(workers) > 1]
    if cell is not None and (cell[0], float(cell[1])) in paired:
        return cell[0], float(cell[1])
    if not paired:
        return None
    return min(paired, key=lambda key: medians.loc[key].min())


def _compared(
    medians: pd.Series, cell: tuple[str, int] | None
) -> tuple[pd.Series, str, dict, dict]:
    """Per worker count the time compared; where all were measured ("at batch 64 (linear): ")
    or, when no cell ran with one worker and more, where each was (" (linear, batch 64)");
    and per worker count its (lr_rule, batch_size, workers) cell."""
    paired = _paired_cell(medians, cell)
    if paired is not None:
        rule, batch = paired
        times = medians.loc[(rule, batch)]
        cells = {n: (rule, batch, n) for n in times.index}
        elsewhere = (f", the cell run with one worker and more (the recommended batch "
                     f"{int(cell[1])} ({cell[0]}) ran with one only)"
                     if cell is not None and tuple(cell) != (rule, batch) else "")
        return times, f"at batch {int(batch)} ({rule}){elsewhere}: ", {}, cells
    best = medians.groupby(level="workers").idxmin()
    times = medians.groupby(level="workers").min()
    where = {n: f" ({key[0]}, batch {int(key[1])})" for n, key in best.items()}
    return times, "", where, dict(best.items())


def _workers(n: int) -> str:
    return f"{n} worker{'s' if n != 1 else ''}"
