"""What-if planner, pure core: step time, steps, time to target and device-hours for
N workers × b per worker from one run's fits and an all-reduce model; the time/cost Pareto front
and a recommendation. No I/O: the CLI, lake, report and pipeline wire it in. A number is a claim:
steps, times and device-hours carry the band from the B_crit interval (`Band`), communication
parameters say whether they were measured, assumed, or set otherwise (`CommSource`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MEASURED, ASSUMED = "measured", "assumed"
# Neither measured nor assumed: a bandwidth fitted to the data-parallel steps' exposed time
# carries the link and whatever else those steps waited for (workers contending for one host's
# cores); a hidden share of 0 where the steps exposed more than the bare all-reduce is what is
# left when none can be shown hidden, not a measurement of it.
EFFECTIVE, SET_TO_ZERO = "effective", "set to 0"
# Why adding workers stops helping at a plan point (PlanRow.limit).
LIMIT_MEMORY, LIMIT_PAST_B_CRIT, LIMIT_COMMUNICATION = "memory", "past B_crit", "communication"
# Past this share of the step time in the all-reduce, a worker adds more waiting than computing.
COMM_LIMIT_SHARE = 0.5
FASTEST_WITHIN_BUDGET = "fastest_within_budget"
CHEAPEST_WITHIN_DEADLINE = "cheapest_within_deadline"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


BACKWARD_SHARE = 2 / 3
"""The backward pass's share of a training step (about twice the forward's FLOPs): the most an
all-reduce overlapped with it can hide, whatever share of it a noisy run's fit says was hidden."""

@dataclass(frozen=True)
class CommSource:
    """Where each communication parameter came from: MEASURED, ASSUMED, EFFECTIVE (bandwidth)
    or SET_TO_ZERO (hidden share)."""

    bandwidth: str
    latency: str
    hidden_share: str

    def unmeasured_names(self) -> str:
        """The parameters not measured, each with how it was set ("" when all were measured):
        "link bandwidth (effective), hidden share (set to 0)"."""
        sources = (self.bandwidth, self.latency, self.hidden_share)
        pairs = zip(("link bandwidth", "latency", "hidden share"), sources, strict=True)
        return ", ".join(f"{name} ({source})" for name, source in pairs if source != MEASURED)


def ring_regressors(workers: np.ndarray, gradient_bytes: np.ndarray) -> tuple[np.ndarray, ...]:
    """The two terms of a ring all-reduce: bytes each worker sends, 2(N−1)/N·G, and sequential
    hops, 2(N−1); both 0 at N = 1. One place, so the fit and the prediction agree."""
    workers = np.asarray(workers, dtype=float)
    return 2 * (workers - 1) / workers * np.asarray(gradient_bytes, dtype=float), 2 * (workers - 1)


@dataclass(frozen=True)
class CommModel:
    """Ring all-reduce: t_comm(N) = 2(N−1)/N·G/bandwidth_Bps + 2(N−1)·latency_s (0 at N = 1).
    `hidden_share` in [0, 1] is the share of t_comm overlapped with the backward pass; only
    (1 − hidden_share)·t_comm adds to the step time."""

    bandwidth_Bps: float
    latency_s: float
    hidden_share: float
    source: CommSource
    note: str = ""

    def __post_init__(self) -> None:
        _require(0 < self.bandwidth_Bps < math.inf, f"bandwidth_Bps {self.bandwidth_Bps} not > 0")
        _require(0 <= self.latency_s < math.inf, f"latency_s {self.latency_s} not >= 0")
        _require(0 <= self.hidden_share <= 1, f"hidden_share {self.hidden_share} not in [0, 1]")

    @classmethod
    def from_link(cls, gbps: float, latency_us: float, hidden_share: float = 0.0) -> CommModel:
        """A link the user states (a cluster not yet rented): `gbps` in gigabits (1e9 bit) per
        second, `latency_us` per hop. Every parameter is marked assumed."""
        source = CommSource(ASSUMED, ASSUMED, ASSUMED)
        return cls(gbps * 1e9 / 8, latency_us * 1e-6, hidden_share, source, "link as given")

    def comm_time_s(self, workers: int, gradient_bytes: float) -> float:
        """t_comm(N) of one all-reduce of `gradient_bytes` over `workers`."""
        bytes_term, hops = ring_regressors(np.asarray(workers), np.asarray(gradient_bytes))
        return float(bytes_term / self.bandwidth_Bps + hops * self.latency_s)


def _comm_points(measured: Iterable[tuple[float, float, float]]) -> np.ndarray:
    """(workers, gradient_bytes, comm_s) rows with N > 1 (N = 1 has no all-reduce to fit)."""
    points = np.asarray(list(measured), dtype=float).reshape(-1, 3)
    valid = np.isfinite(points).all() and (points >= [1, 1, 0]).all()
    _require(bool(valid), "measured points need workers >= 1, gradient_bytes >= 1, comm_s >= 0")
    points = points[points[:, 0] > 1]
    _require(len(points) > 0, "fitting the communication model needs a point with 2+ workers")
    return points


def _bandwidth_only(points: np.ndarray, latency_s: float) -> float:
    """1/bandwidth by least squares through the origin, the latency's share taken out first."""
    bytes_term, hops = ring_regressors(points[:, 0], points[:, 1])
    return float(bytes_term @ (points[:, 2] - hops * latency_s) / (bytes_term @ bytes_term))


def _fit_both(points: np.ndarray) -> tuple[float, float]:
    """(1/bandwidth, latency) by least squares, refused when the regressors are dependent. The
    columns are scaled first: bytes are ~1e9 and hops ~10, and the rank test must not care."""
    bytes_term, hops = ring_regressors(points[:, 0], points[:, 1])
    scale = np.array([np.linalg.norm(bytes_term), np.linalg.norm(hops)])
    design = np.column_stack([bytes_term, hops]) / scale
    got = [sorted(set(points[:, column].astype(int).tolist())) for column in (0, 1)]
    _require(np.linalg.matrix_rank(design) == 2, "fitting bandwidth and latency needs points at "
             f"2+ worker counts (N > 1) or 2+ gradient sizes, got workers {got[0]} and gradient "
             f"bytes {got[1]}; give latency_s to fit the bandwidth alone")
    inverse_bandwidth, latency_s = np.linalg.lstsq(design, points[:, 2], rcond=None)[0] / scale
    return float(inverse_bandwidth), float(latency_s)


def fit_comm_model(
    measured: Iterable[tuple[float, float, float]], *, latency_s: float | None = None,
    hidden_share: float = 0.0, hidden_share_source: str = ASSUMED,
) -> CommModel:
    """Bandwidth and latency from measured (workers, gradient_bytes, comm_s) points, least
    squares on the two ring regressors. Both are fitted only when the points determine them (2+
    worker counts, or 2+ gradient sizes); else a given `latency_s` (marked assumed) lets the
    bandwidth be fitted alone, and without it the fit is refused. A negative fitted latency
    (noise on a fast link) is set to 0 and the bandwidth refitted, with a note."""
    points, latency_source, note = _comm_points(measured), ASSUMED, ""
    if latency_s is None:
        (inverse_bandwidth, latency_s), latency_source = _fit_both(points), MEASURED
        if latency_s < 0:
            latency_s, note = 0.0, "fitted latency was negative; set to 0"
            inverse_bandwidth = _bandwidth_only(points, 0.0)
    else:
        inverse_bandwidth = _bandwidth_only(points, latency_s)
    _require(inverse_bandwidth > 0, "measured communication time does not grow with the bytes")
    source = CommSource(MEASURED, latency_source, hidden_share_source)
    return CommModel(1 / inverse_bandwidth, latency_s, hidden_share, source, note)


@dataclass(frozen=True)
class Band:
    """A figure and its band from the B_crit interval (high may be inf: a bound)."""

    value: float
    low: float
    high: float

    def scaled(self, factor: float) -> Band:
        return Band(self.value * factor, self.low * factor, self.high * factor)


@dataclass(frozen=True)
class StepsFit:
    """S(B) = S_min + E_min/B and the B_crit interval [b_crit_low, b_crit_high]."""

    s_min: float
    e_min: float
    b_crit_low: float
    b_crit_high: float

    def __post_init__(self) -> None:
        _require(self.s_min > 0 and 0 < self.e_min < math.inf, "steps fit needs S_min, E_min > 0")
        _require(0 <= self.b_crit_low <= self.b_crit_high, "steps fit needs B_crit low <= high")

    def steps(self, batch: float) -> Band:
        """S(batch) and its band. The band keeps S_min fixed and takes E_min = S_min·B_crit at
        the interval's ends: the interval on B_crit is what the analysis reports, and S_min (the
        large-batch steps) is the better-determined parameter."""
        value = self.s_min + self.e_min / batch
        low, high = (self.s_min * (1 + edge / batch)
                     for edge in (self.b_crit_low, self.b_crit_high))
        # The fit's own B_crit need not lie inside the reported interval (it is cut at the
        # measured range and unites two intervals): the band always contains the figure.
        return Band(value, min(low, value), max(high, value))


@dataclass(frozen=True)
class PlanRow:
    """One (workers, per-worker batch) point; `unmeasured` names the communication parameters
    not measured, with how each was set; `limit` says why adding workers stops helping here
    ("" when it still helps)."""

    workers: int
    per_worker_batch: int
    global_batch: int
    step_time_s: float
    comm_s: float
    comm_share: float
    steps: Band
    time_to_target_s: Band
    device_hours: Band
    b_crit: Band
    feasible: bool
    limit: str
    unmeasured: str
    compute_source: str = "line"  # "measured": one device's measured step at the micro-batch
    accumulation_steps: int = 1  # micro-batches per optimizer step (1: b fits as one batch)

    @property
    def micro_batch(self) -> int:
        """The batch one forward/backward pass holds: b, or ceil(b/k) when accumulated."""
        return math.ceil(self.per_worker_batch / self.accumulation_steps)


def accumulation(b: int, max_b: int | None) -> tuple[int, int]:
    """(k, micro): a per-worker batch b above the largest that fits (`max_b`) is run as k =
    ceil(b/max_b) micro-batches of micro = ceil(b/k) <= max_b per optimizer step. Where k does
    not divide b, k·micro exceeds b by at most k − 1 examples: the compute charged for them is
    an upper bound. (1, b) when b fits, without a measured limit, or when nothing fits
    (max_b < 1: no micro-batch helps, the row is infeasible)."""
    if max_b is None or b <= max_b or max_b < 1:
        return 1, b
    k = math.ceil(b / max_b)
    return k, math.ceil(b / k)


def _limit(global_batch: int, comm_share: float, fit: StepsFit, max_b: int | None) -> str:
    """The first reason that applies: memory (infeasible beats slow: not even a micro-batch of
    one fits), then steps that no longer fall (B above B_crit's high end), then a step time
    grown by communication. An accumulated row is not limited by memory: it is feasible, and
    slower per example, which the Pareto front weighs."""
    if max_b is not None and max_b < 1:
        return LIMIT_MEMORY
    if global_batch > fit.b_crit_high:
        return LIMIT_PAST_B_CRIT
    return LIMIT_COMMUNICATION if comm_share > COMM_LIMIT_SHARE else ""


def plan_rows(
    step_time: tuple[float, float], steps_fit: StepsFit | tuple[float, float, float, float],
    comm: CommModel, gradient_bytes: float, workers: Sequence[int],
    per_worker_batches: Sequence[int], max_per_worker_batch: int | None = None,
    measured_step_s: Mapping[int, float] | None = None,
) -> list[PlanRow]:
    """One row per (N, b), N-major. `step_time` = (alpha_s, beta_s) of one device's line
    t = α + β·b at its own batch b; `steps_fit` = (S_min, E_min, B_crit low, B_crit high).
    B = N·b; t = α + β·b + t_comm(N) − hidden, where the hidden part is hidden_share·t_comm(N)
    but at most the backward pass it overlaps (BACKWARD_SHARE of one micro-batch's step); S(B)
    with its band
    (`StepsFit.steps`); time to target S·t; device-hours N·time/3600. A row with
    b > `max_per_worker_batch` accumulates (`accumulation`): its compute is k × one device's
    step at the micro-batch (k forward/backward passes), its all-reduce is paid once per
    optimizer step; only with `max_per_worker_batch` < 1 is it infeasible (limit "memory").
    `measured_step_s` (per-worker batch -> one device's measured seconds per step) replaces the
    line where given: the line is for batches not measured, as in the analysis's T(B)."""
    alpha_s, beta_s = step_time
    _require(min(step_time) >= 0 and sum(step_time) > 0, "step time needs α, β >= 0, not both 0")
    _require(gradient_bytes > 0, "gradient_bytes must be positive")
    sizes = min(workers, default=0), min(per_worker_batches, default=0)
    _require(min(sizes) >= 1, "worker counts and per-worker batches must be given, each >= 1")
    fit = steps_fit if isinstance(steps_fit, StepsFit) else StepsFit(*steps_fit)
    b_crit = Band(fit.e_min / fit.s_min, fit.b_crit_low, fit.b_crit_high)
    measured = {int(b): float(t) for b, t in (measured_step_s or {}).items()
                if math.isfinite(t) and t > 0}
    rows, unmeasured = [], comm.source.unmeasured_names()
    for n in workers:
        all_reduce_s = comm.comm_time_s(n, gradient_bytes)
        for b in per_worker_batches:
            k, micro = accumulation(b, max_per_worker_batch)
            micro_s = measured.get(micro, alpha_s + beta_s * micro)
            # Only the part not hidden behind backward adds to the step; once per optimizer
            # step, accumulated or not (the micro-batches before the last skip the all-reduce,
            # as DDP's no_sync does), so it can hide behind the last micro-batch's backward
            # only, and never for longer than that backward takes.
            hidden_s = min(comm.hidden_share * all_reduce_s, BACKWARD_SHARE * micro_s)
            comm_s = all_reduce_s - hidden_s
            step_s = k * micro_s + comm_s
            steps = fit.steps(n * b)
            time_s = steps.scaled(step_s)
            limit = _limit(n * b, comm_s / step_s, fit, max_per_worker_batch)
            hours = time_s.scaled(n / 3600)
            rows.append(PlanRow(n, b, n * b, step_s, comm_s, comm_s / step_s, steps, time_s, hours,
                                b_crit, limit != LIMIT_MEMORY, limit, unmeasured,
                                "measured" if micro in measured else "line", k))
    return rows


def pareto_front(rows: Iterable[PlanRow]) -> list[PlanRow]:
    """Feasible rows that no other feasible row beats on both time to target and device-hours
    (central values), fastest first."""
    points = [(r, (r.time_to_target_s.value, r.device_hours.value)) for r in rows if r.feasible]
    points = [(row, point) for row, point in points if np.isfinite(point).all()]

    def dominated(point: tuple[float, float]) -> bool:
        return any(o[0] <= point[0] and o[1] <= point[1] and o != point for _, o in points)

    front = [(point, row) for row, point in points if not dominated(point)]
    return [row for _, row in sorted(front, key=lambda pair: pair[0])]


@dataclass(frozen=True)
class Objective:
    """FASTEST_WITHIN_BUDGET (`limit` in device-hours) or CHEAPEST_WITHIN_DEADLINE (seconds)."""

    kind: str
    limit: float

    def __post_init__(self) -> None:
        kinds = (FASTEST_WITHIN_BUDGET, CHEAPEST_WITHIN_DEADLINE)
        _require(self.kind in kinds, f"objective {self.kind!r} is not one of {kinds}")
        _require(self.limit > 0, "the objective's budget or deadline must be positive")


def format_duration(seconds: float) -> str:
    """Seconds in the unit a reader plans in; "unbounded" for an open band's end."""
    for unit, size, below in (("s", 1, 120), ("min", 60, 7200), ("h", 3600, math.inf)):
        if seconds < below:
            return f"{seconds / size:.3g} {unit}"
    return "unbounded"


def describe(row: PlanRow) -> str:
    """The plan and its figures, each with its band, and its flags."""
    time, hours, b_crit = row.time_to_target_s, row.device_hours, row.b_crit
    text = (
        f"N = {row.workers}, b = {row.per_worker_batch} per worker{_accumulated(row)} (global "
        f"batch B = {row.global_batch}): {format_duration(time.value)} to target (band "
        f"{format_duration(time.low)}–{format_duration(time.high)} from the B_crit interval "
        f"{b_crit.low:.4g}–{b_crit.high:.4g}) for {hours.value:.3g} device-hours (band "
        f"{hours.low:.3g}–{hours.high:.3g})"
    )
    if row.limit == LIMIT_PAST_B_CRIT:  # said of this row's own batch, not of a later one
        text += (f"; adding workers stops helping here: past B_crit (the global batch "
                 f"{row.global_batch} is above B_crit's interval, {b_crit.low:.4g}–"
                 f"{b_crit.high:.4g}, so more workers would grow the batch, not cut the steps)")
    elif row.limit:
        text += f"; adding workers stops helping here: {row.limit}"
    return text + (f"; not measured: {row.unmeasured}" if row.unmeasured else "")


def _accumulated(row: PlanRow) -> str:
    k = row.accumulation_steps
    return f" as {k}×{row.micro_batch} accumulated" if k > 1 else ""


def recommend(rows: Iterable[PlanRow], objective: Objective) -> tuple[PlanRow | None, str]:
    """The chosen row and a sentence why, or None and a sentence why nothing fits. Chosen on
    central values from the Pareto front; the sentence says whether the band's high end still
    fits, since the B_crit interval can be wide."""
    front = pareto_front(rows)
    if not front:
        return None, "No feasible plan: every row exceeds the per-worker memory."
    if objective.kind == FASTEST_WITHIN_BUDGET:
        bounded, goal = "device_hours", "time_to_target_s"
        words = ("Fastest", f"the budget of {objective.limit:g} device-hours", "cheapest")
    else:
        bounded, goal = "time_to_target_s", "device_hours"
        words = ("Cheapest", f"the deadline of {format_duration(objective.limit)}", "fastest")
    fits = [r for r in front if getattr(r, bounded).value <= objective.limit]
    if not fits:
        nearest = min(front, key=lambda r: getattr(r, bounded).value)
        return None, f"No plan fits {words[1]}; the {words[2]} is {describe(nearest)}."
    best = min(fits, key=lambda r: (getattr(r, goal).value, getattr(r, bounded).value))
    at_high = "within" if getattr(best, bounded).high <= objective.limit else "outside"
    reason = f"{words[0]} within {words[1]}: {describe(best)}"
    return best, f"{reason}. At the band's high end it is {at_high} {words[1]}."
