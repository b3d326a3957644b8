"""The what-if planner's communication: the data-parallel cells of a run (step time,
the compute in it, the exposed rest), the trials' all-reduce probes, and the `CommModel` fitted
to them or stated by the user (docs/architecture.md, "What-if planner").

The communication measured here is what a data-parallel step costs beyond its compute: the
exposed all-reduce (the part not hidden behind backward) plus, where the workers shared one
machine's cores, whatever their contention adds. On such a host the compute in a step is
k × one process's step at the whole batch, k fitted to the cells (N processes of one thread can
split a batch better or worse than one process's threads do); the plan itself gives every
worker its own device.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from batchscale.errors import BadInput
from batchscale.fits import numeric_column, trained_trials
from batchscale.planner.model import (
    ASSUMED,
    EFFECTIVE,
    MEASURED,
    SET_TO_ZERO,
    CommModel,
    CommSource,
    fit_comm_model,
)

if TYPE_CHECKING:
    from batchscale.planner.inputs import PlanInputs

SHARED_FACTOR_RANGE = (0.25, 2.0)
"""A fitted shared-host compute factor outside this range is noise, not a property of the host:
N processes on the cores one had neither beat it by 4× nor lose half their speed."""


def parallel_compute_s(inputs: PlanInputs, batch: float, workers: int) -> float:
    """The compute in a data-parallel step at global `batch`: one device's step at the
    per-worker batch, or, where the workers shared one machine's cores, k × one process's step
    at the whole batch (`shared_compute_factor`: the N processes together have what one had)."""
    if inputs.shared_host and workers > 1:
        return inputs.shared_compute_factor * inputs.compute_s(batch)
    return inputs.compute_s(batch / workers)


def data_parallel_cells(runs: pd.DataFrame) -> pd.DataFrame:
    """Per (global batch, workers > 1): median seconds per step over the trials, how many, and
    the worst share of time their threads waited for a CPU."""
    frame = pd.DataFrame({
        "batch_size": numeric_column(runs, "batch_size"),
        "workers": numeric_column(runs, "workers"),
        "t": numeric_column(runs, "train_time_s") / numeric_column(runs, "steps_run"),
        "trial_id": runs["trial_id"].to_numpy(),
        "wait": numeric_column(runs, "cpu_wait_share"),
    })
    frame = frame[(frame["workers"] > 1) & np.isfinite(frame["t"]) & (frame["t"] > 0)]
    cells = frame[frame["trial_id"].isin(trained_trials(runs)["trial_id"])].drop_duplicates(
        "trial_id").groupby(["batch_size", "workers"]).agg(
        step_time_s=("t", "median"), trials=("t", "size"), cpu_wait=("wait", "max"))
    return cells.reset_index()


def with_cells(inputs: PlanInputs, cells: pd.DataFrame) -> PlanInputs:
    """`inputs` with these data-parallel cells: on a shared host the compute factor fitted to
    them (so leaving a cell out refits it too), then each cell's compute and exposed rest."""
    if inputs.shared_host:
        factor, note = shared_compute_factor(inputs, cells)
        inputs = dataclasses.replace(inputs, shared_compute_factor=factor,
                                     shared_compute_note=note)
    cells = cells[["batch_size", "workers", "step_time_s", "trials", "cpu_wait"]].copy()
    cells["compute_s"] = [parallel_compute_s(inputs, b, n) for b, n in
                          zip(cells["batch_size"], cells["workers"], strict=True)]
    cells["comm_s"] = cells["step_time_s"] - cells["compute_s"]
    return dataclasses.replace(inputs, data_parallel=cells)


def shared_compute_factor(inputs: PlanInputs, cells: pd.DataFrame) -> tuple[float, str]:
    """(k, how): step = c_N + k × one process's step at the whole batch, least squares over the
    cells with one intercept per worker count. Needs a worker count with two cells of different
    compute; else (or outside SHARED_FACTOR_RANGE) k = 1, and the note says why."""
    if cells.empty:
        return 1.0, ""
    whole = np.array([inputs.compute_s(b) for b in cells["batch_size"]])
    counts = sorted(set(cells["workers"]))
    design = np.column_stack([whole, *[(cells["workers"] == n).to_numpy(float) for n in counts]])
    if len(cells) <= len(counts) or np.linalg.matrix_rank(design) < design.shape[1]:
        return 1.0, ("one cell per worker count: their compute is taken as one process's at the "
                     "whole batch (k = 1, assumed)")
    factor = float(np.linalg.lstsq(design, cells["step_time_s"].to_numpy(float), rcond=None)[0][0])
    low, high = SHARED_FACTOR_RANGE
    if not low <= factor <= high:
        return 1.0, (f"the cells' compute factor fitted to {factor:.2g}, outside {low:g}–{high:g}:"
                     " noise, so k = 1 (assumed)")
    return factor, (f"their compute is {factor:.2g} × one process's at the whole batch (fitted "
                    f"to {len(cells)} cells)")


def probe_points(runs: pd.DataFrame) -> pd.DataFrame:
    """(workers, bytes, seconds, cv) of every data-parallel trial's all-reduce probe: its small
    message and its gradient, once per trial (a trial has a runs row per target)."""
    trials = trained_trials(runs)
    workers = numeric_column(trials, "workers")
    small = numeric_column(trials, "allreduce_small_s")
    keep = (workers > 1) & np.isfinite(small) & np.isfinite(
        numeric_column(trials, "allreduce_gradient_s"))
    trials, workers = trials[keep], workers[keep]
    cv = numeric_column(trials, "allreduce_cv")
    small_rows = pd.DataFrame({"workers": workers, "bytes": numeric_column(
        trials, "allreduce_small_bytes"), "seconds": numeric_column(
        trials, "allreduce_small_s"), "cv": np.nan})
    gradient_rows = pd.DataFrame({"workers": workers, "bytes": numeric_column(
        trials, "gradient_bytes"), "seconds": numeric_column(
        trials, "allreduce_gradient_s"), "cv": cv})
    return pd.concat([small_rows, gradient_rows], ignore_index=True)


def comm_model(inputs: PlanInputs, link_gbps: float | None = None,
               latency_us: float | None = None) -> CommModel:
    """A stated link (every parameter assumed), else the fit to the data-parallel runs. With
    one worker count and one gradient size measured, latency and bandwidth cannot be told
    apart: latency is `latency_us` or 0 (assumed) and the fitted bandwidth carries the rest."""
    if link_gbps is not None:
        if latency_us is None:
            raise BadInput("--link-gbps needs --latency-us too (a link is its bandwidth and "
                           "its latency per hop)")
        return CommModel.from_link(link_gbps, latency_us)
    if not inputs.probe.empty:
        return probed_model(inputs, latency_us)
    cells = inputs.data_parallel
    if cells.empty:
        raise BadInput("the run has no data-parallel runs (workers > 1) to measure the "
                       "communication from: give --link-gbps and --latency-us, or set "
                       "convergence.scaling_workers")
    if (cells["comm_s"] <= 0).all():
        raise BadInput("the data-parallel runs were no slower per step than one worker at the "
                       "per-worker batch, so their communication cannot be measured: give "
                       "--link-gbps and --latency-us")
    separable = cells["workers"].nunique() >= 2
    latency_s = None if separable and latency_us is None else (latency_us or 0.0) * 1e-6
    model = cells_model(inputs, latency_s)
    # Without a probe of the link, the bandwidth is what the steps' exposed time implies: the
    # link less whatever training hid, plus whatever else the steps waited for.
    note = ("an effective bandwidth fitted to the data-parallel steps (no all-reduce probe), "
            "with nothing taken as hidden")
    if latency_s is not None and latency_us is None:
        note += ("; latency assumed 0: one worker count measured cannot separate latency from "
                 "bandwidth, so past it the all-reduce is taken as bandwidth-bound")
    if model.note:  # the fit's own (a negative latency set to 0)
        note += f"; {model.note}"
    return CommModel(model.bandwidth_Bps, model.latency_s, model.hidden_share,
                     CommSource(EFFECTIVE, model.source.latency, ASSUMED), note)


def probed_model(inputs: PlanInputs, latency_us: float | None = None) -> CommModel:
    """The link the trials' all-reduce probes measured (a small message and the gradient: both
    ring terms, latency per hop and bandwidth), and the share of it training hid: a
    data-parallel cell's exposed time is its step beyond one device's compute, and the hidden
    share is 1 − exposed / bare all-reduce (median over the cells). Where the cells exposed more
    than the bare all-reduce (workers sharing one machine's cores contend with each other),
    nothing is hidden and the excess is carried by an effective bandwidth fitted to the cells
    with the probe's latency; the note says by how much."""
    probe = inputs.probe
    given_latency_s = None if latency_us is None else latency_us * 1e-6
    try:
        link = fit_comm_model(probe[["workers", "bytes", "seconds"]].to_numpy(),
                              latency_s=given_latency_s)
    except ValueError as err:
        return _unresolved_link(inputs, given_latency_s, str(err))
    measured = (f"link from {len(probe) // 2} all-reduce probe(s), {_link_words(link)}"
                f"{_each_probe_range(probe)}{_probe_cv(probe)}")
    cells = inputs.data_parallel
    if cells.empty:
        return CommModel(link.bandwidth_Bps, link.latency_s, 0.0, CommSource(
            MEASURED, link.source.latency, ASSUMED), f"{measured}; hidden share assumed 0: no "
            "data-parallel step time to measure it from")
    bare = np.array([link.comm_time_s(int(n), inputs.gradient_bytes) for n in cells["workers"]])
    exposed = cells["comm_s"].to_numpy(dtype=float) / bare
    ratio = float(np.median(exposed))
    spread = (f"{ratio:.2g}× the bare all-reduce (cells {exposed.min():.2g}–{exposed.max():.2g}×)"
              if len(exposed) > 1 else f"{ratio:.2g}× the bare all-reduce (one cell)")
    if ratio <= 1:
        # A step no slower than its compute (ratio <= 0: the reference's own noise) hid it all.
        return CommModel(link.bandwidth_Bps, link.latency_s, min(1.0, 1 - ratio),
                         CommSource(MEASURED, link.source.latency, MEASURED),
                         f"{measured}; training exposed {spread}")
    effective = cells_model(inputs, link.latency_s)
    return CommModel(effective.bandwidth_Bps, link.latency_s, 0.0,
                     CommSource(EFFECTIVE, link.source.latency, SET_TO_ZERO),
                     f"{measured}; the data-parallel steps exposed {spread}: more than the "
                     "all-reduce itself (workers sharing one machine's cores contend), so an "
                     "effective bandwidth carries the excess and nothing is taken as hidden")


def _link_words(link: CommModel) -> str:
    """'latency 41 µs per hop, 2.3 Gbit/s' (gigabits: 1e9 bit)."""
    return (f"latency {link.latency_s * 1e6:.3g} µs per hop, "
            f"{8 * link.bandwidth_Bps / 1e9:.3g} Gbit/s")


def _each_probe_range(probe: pd.DataFrame) -> str:
    """The spread behind the one fitted link: the latency and bandwidth each probe gives alone
    (its small message and its gradient: rows i and i + half of `probe_points`)."""
    half = len(probe) // 2
    points = probe[["workers", "bytes", "seconds"]].to_numpy()
    links = []
    for i in range(half):
        try:
            links.append(fit_comm_model(points[[i, i + half]]))
        except ValueError:  # this probe's gradient no slower than its small message: noise
            continue
    if len(links) < 2:
        return ""
    latency_us = [link.latency_s * 1e6 for link in links]
    gbps = [8 * link.bandwidth_Bps / 1e9 for link in links]
    return (f" (each probe alone, {len(links)} of {half}: latency {min(latency_us):.3g}–"
            f"{max(latency_us):.3g} µs, {min(gbps):.3g}–{max(gbps):.3g} Gbit/s)")


def _probe_cv(probe: pd.DataFrame) -> str:
    cv = numeric_column(probe, "cv")
    return f", probe CV {np.nanmedian(cv):.0%}" if np.isfinite(cv).any() else ""


def _unresolved_link(inputs: PlanInputs, latency_s: float | None, why: str) -> CommModel:
    """The probes' two sizes did not separate the ring's terms (noise: the gradient's
    all-reduce no slower than the small message's). The small message still measures the
    latency (its bytes take nothing); the bandwidth is then the effective one of the cells, and
    nothing is taken as hidden (assumed)."""
    probe, cells = inputs.probe, inputs.data_parallel
    small = probe[probe["bytes"] == probe["bytes"].min()]
    if latency_s is None:
        latency_s = float(np.median(small["seconds"] / (2 * (small["workers"] - 1))))
    if cells.empty or (cells["comm_s"] <= 0).all():
        raise BadInput(f"the all-reduce probes did not resolve the link ({why}) and no "
                       "data-parallel step was slower than its compute: give --link-gbps and "
                       "--latency-us")
    effective = cells_model(inputs, latency_s)
    return CommModel(effective.bandwidth_Bps, latency_s, 0.0,
                     CommSource(EFFECTIVE, MEASURED, ASSUMED),
                     f"the all-reduce probes did not resolve the link's bandwidth ({why}"
                     f"{_probe_cv(probe)}): latency {latency_s * 1e6:.3g} µs per hop from "
                     "their small message, an effective bandwidth fitted to the data-parallel "
                     "steps, hidden share assumed 0")


def cells_model(inputs: PlanInputs, latency_s: float | None) -> CommModel:
    """The ring model fitted to the data-parallel cells' exposed times (an effective bandwidth;
    latency fitted too where `latency_s` is None); BadInput where they cannot be fitted."""
    cells = inputs.data_parallel
    points = [(n, inputs.gradient_bytes, max(c, 0.0))
              for n, c in zip(cells["workers"], cells["comm_s"], strict=True)]
    try:
        return fit_comm_model(points, latency_s=latency_s)
    except ValueError as err:
        raise BadInput(f"cannot fit the communication model: {err}") from None
