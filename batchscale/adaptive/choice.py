"""The adaptive search's decisions, pure: predict B_crit from the gradient noise scale
measured in short probe trials, place the first batch sizes around the prediction, then add the
(batch size, seed) that most narrows the B_crit interval until it is narrow enough or the
budget is spent. No I/O and no training here: `driver.py` runs the trials these functions ask
for. docs/architecture.md, "Adaptive search", states the rules and why.

The interval the search narrows is the report's own (`critical.bootstrap_critical_batch`: seed
bootstrap united with Fieller's interval), so "stopped at ratio ≤ 2" means the report prints an
interval at most 2× wide. One difference: with one seed per batch size the report reads an
interval from the fit's residuals alone, while the search does not stop on one: it first asks for
a second seed, because seed scatter is what a search that stops early most needs to see.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from batchscale.analysis.critical import (
    BOOTSTRAP_CONFIDENCE,
    bootstrap_critical_batch,
    fit_critical_batch,
    steps_to_result,
)
from batchscale.analysis.critical_summary import edge_case_reason
from batchscale.analysis.interval import fit_lines
from batchscale.analysis.timetotarget import optimal_batch, optimal_batch_interval
from batchscale.convergence.probe import (
    MIN_NEAR_EVALUATIONS,
    near_target,
    noise_points,
)
from batchscale.errors import BadInput
from batchscale.fits import StepTimeFit, positive_pairs
from batchscale.metrics import metric as metric_named

PLACEMENT_FACTOR = 8.0
"""The first batch sizes span prediction/8 … prediction×8: wide enough that S(B) shows both its
1/B part (small batches) and its floor S_min (large ones), the two asymptotes the fit needs."""
FIRST_POINTS = 4
SIMULATED_DRAWS = 4
"""Draws of a candidate's unknown steps when scoring it: few, because the score only ranks
candidates, and each draw costs a bootstrap."""

STOP_NARROW, STOP_BUDGET, STOP_EXHAUSTED = "interval narrow enough at 90 %", "budget spent", \
    "nothing left to measure"
STOP_NO_GAIN = "no cell left is expected to narrow the interval"
STOP_DEVICE_BUDGET = "device-second budget spent"
STOP_B_STAR = "B* interval narrow enough (adaptive_objective b_star)"


@dataclass(frozen=True)
class NoisePrediction:
    """B_crit predicted from B_simple: its median near the target and the interquartile range
    of those evaluations, or an extrapolation when the probe stopped short of the target."""

    b_crit: float
    low: float
    high: float
    method: str
    """'near target' (median of the evaluations near it) or 'extrapolated' (log B_simple
    against progress, a straight line carried to the target) or 'none'."""
    evaluations: int
    reason: str = ""


NO_NOISE_SCALE = ("the probe recorded no gradient noise scale (a TrainingLoop on one process "
                  "records none: its B_simple needs two or more workers, `--workers 2`)")


def predict_b_crit(curves: pd.DataFrame, metric: str, target: float) -> NoisePrediction:
    """B_crit ≈ B_simple near the target (McCandlish et al. 2018, Fig. 4), from the probe
    trials' evaluations (curves rows with b_simple and the metric). Evaluations of several
    trials are pooled, each trial's progress measured from its own first evaluation with a
    noise scale (convergence/probe.py: the rule a probe trial stops on)."""
    try:
        metric_named(metric)
    except KeyError as err:  # the message names the allowed metrics
        raise BadInput(str(err).strip('"')) from None
    near, progress_all, gns_all = [], [], []
    for _, trial in curves.sort_values("step").groupby("trial_id", sort=True):
        progress, gns = noise_points(pd.to_numeric(trial[metric], errors="coerce"),
                                     pd.to_numeric(trial["b_simple"], errors="coerce"),
                                     target, metric)
        if not progress.size:
            continue
        near.append(near_target(progress, gns))
        progress_all.append(progress)
        gns_all.append(gns)
    near_values = np.concatenate(near) if near else np.array([])
    if near_values.size >= MIN_NEAR_EVALUATIONS:
        low, mid, high = np.percentile(near_values, [25, 50, 75])
        return NoisePrediction(float(mid), float(low), float(high), "near target",
                               int(near_values.size))
    if not pd.to_numeric(curves["b_simple"], errors="coerce").notna().any():
        return NoisePrediction(math.nan, math.nan, math.nan, "none", 0, NO_NOISE_SCALE)
    if not progress_all or np.concatenate(progress_all).size < MIN_NEAR_EVALUATIONS:
        return NoisePrediction(math.nan, math.nan, math.nan, "none", 0,
                               "the probe recorded fewer than "
                               f"{MIN_NEAR_EVALUATIONS} evaluations with a noise scale")
    return _extrapolate(np.concatenate(progress_all), np.concatenate(gns_all))


def _extrapolate(progress: np.ndarray, gns: np.ndarray) -> NoisePrediction:
    """log B_simple on progress, a least-squares line carried to progress 1; the spread is
    the line's residual scatter (±1 standard deviation, as the interquartile range is about)."""
    slope, intercept = np.polyfit(progress, np.log(gns), 1)
    residual = np.log(gns) - (intercept + slope * progress)
    spread = float(np.std(residual, ddof=2)) if progress.size > 2 else math.nan
    centre = math.exp(intercept + slope)
    reason = (f"the probe got {progress.max():.0%} of the way to the target: B_simple "
              "extrapolated along its trend")
    return NoisePrediction(centre, centre * math.exp(-spread), centre * math.exp(spread),
                           "extrapolated", int(progress.size), reason)


def powers_of_two_between(smallest: int, largest: int) -> list[int]:
    """The powers of two in [smallest, largest] (the batch sizes a search may place)."""
    if smallest < 1 or largest < smallest:
        return []
    low = math.ceil(math.log2(smallest))
    return [2**k for k in range(low, int(math.log2(largest)) + 1)]


def place_batch_sizes(predicted: float, allowed: Sequence[int],
                      points: int = FIRST_POINTS) -> list[int]:
    """`points` batch sizes log-spaced over predicted/8 … predicted×8, each the nearest allowed
    one; where the allowed range cuts that span, the span slides inside it, so the points stay
    as spread as the range allows."""
    allowed = sorted(set(allowed))
    if not allowed or not math.isfinite(predicted) or predicted <= 0:
        return allowed[:points]
    log_allowed = np.log(allowed)
    half_width = math.log(PLACEMENT_FACTOR)
    centre = min(max(math.log(predicted), log_allowed[0] + half_width),
                 log_allowed[-1] - half_width)
    wanted = np.linspace(centre - half_width, centre + half_width, points)
    chosen = {allowed[int(np.argmin(np.abs(log_allowed - w)))] for w in wanted}
    return sorted(chosen)


@dataclass(frozen=True)
class Cell:
    """One (batch size, seed) of trials to run: every LR rule of the config at that point."""

    batch_size: int
    seed: int


@dataclass(frozen=True)
class IntervalState:
    """B_crit of the search rule's trials so far, its interval, and the fit's bound if any."""

    b_crit: float
    low: float
    high: float
    bound: str
    reason: str
    s_min: float = math.nan

    @property
    def ratio(self) -> float:
        """high/low of the interval; inf without one."""
        if self.low > 0 and math.isfinite(self.high) and math.isfinite(self.low):
            return self.high / self.low
        return math.inf


def edge_stop(cut: tuple[bool, bool], measured: Sequence[int], allowed: Sequence[int]) -> str:
    """Why the search stops at the edge of the allowed batch sizes: its interval is cut on a side
    where every allowed batch beyond has run (no cell can measure further); "" otherwise."""
    if cut[1] and max(measured) >= max(allowed):
        return (f"B_crit's interval runs up to the largest allowed batch ({max(allowed):,}), "
                "which has run: B_crit may lie beyond it, and no allowed batch size can bound "
                "it from above")
    if cut[0] and min(measured) <= min(allowed):
        return (f"B_crit's interval runs down to the smallest allowed batch "
                f"({min(allowed):,}), which has run: B_crit may lie below it, and no allowed "
                "batch size can bound it from below")
    return ""


def interval_state(runs: pd.DataFrame, rule: str, bootstrap_samples: int,
                   confidence: float = BOOTSTRAP_CONFIDENCE) -> IntervalState:
    """The search rule's B_crit and interval from its trials (rows of one target), read at
    `confidence` (the search narrows the 90 % one; it reports the one read where a stopped
    search's interval holds the truth 90 % of the time: critical.ADAPTIVE_READ_LEVEL)."""
    rule_runs = runs[runs["lr_rule"] == rule]
    table = steps_to_result(rule_runs, by=(), reduce="median")
    fit = fit_critical_batch(table["batch_size"], table["steps_to_target"])
    low, high = bootstrap_critical_batch(runs, rule, bootstrap_samples, confidence=confidence,
                                         seeds_needed=True)
    # the analysis's words where too few batch sizes reached the target: which ones some
    # trials reached, and how the others stopped short
    reason = (edge_case_reason(rule_runs, table) or fit.reason) if math.isnan(fit.b_crit) \
        else fit.reason
    return IntervalState(fit.b_crit, low, high, fit.bound, reason, fit.s_min)


def prune_step(state: IntervalState, batch_size: int, factor: float | None,
               max_steps: int) -> int | None:
    """The step from which a trial at `batch_size` still short of the target is hopelessly
    behind: `factor` × the steps the fit allows there at the interval's far end,
    S_min·(1 + B_crit_high/B) (more steps at every batch than the centre's). None without a
    factor, an interval or a fit, or when the bound is past the trial's own step budget."""
    if factor is None or not (math.isfinite(state.s_min) and state.s_min > 0
                              and math.isfinite(state.high) and state.high > 0):
        return None
    bound = math.ceil(factor * state.s_min * (1 + state.high / batch_size))
    return bound if bound < max_steps else None


@dataclass(frozen=True)
class Optimum:
    """B* = sqrt(B_crit·α/β), the batch fastest to the target, with its interval: B_crit's
    interval and the step-time line's uncertainty about α/β, combined."""

    b_star: float
    low: float
    high: float

    @property
    def ratio(self) -> float:
        if self.low > 0 and math.isfinite(self.high) and math.isfinite(self.low):
            return self.high / self.low
        return math.inf


def optimum(state: IntervalState, step_fit: StepTimeFit) -> Optimum:
    """B* and its interval from the B_crit state and one device's step-time line
    (timetotarget.optimal_batch_interval: B_crit's interval and the line's uncertainty about
    α/β, combined); NaN where either is missing (B_crit not a number, α or β not positive)."""
    b_star = optimal_batch(step_fit.alpha_s, step_fit.beta_s, state.b_crit)
    return Optimum(b_star, *optimal_batch_interval(step_fit, state.b_crit, state.low,
                                                   state.high))


def candidate_cells(done: Sequence[Cell], allowed: Sequence[int],
                    seeds: Sequence[int]) -> list[Cell]:
    """Cells not yet run: a new batch size (with the first seed), or another seed at a batch
    size already run (the next unused seed, in the config's order)."""
    ran = set(done)
    batches = {c.batch_size for c in done}
    new_batches = [Cell(b, seeds[0]) for b in allowed if b not in batches]
    more_seeds = []
    for b in sorted(batches):
        unused = [s for s in seeds if Cell(b, s) not in ran]
        if unused:
            more_seeds.append(Cell(b, unused[0]))
    return new_batches + more_seeds


def _simulated(runs: pd.DataFrame, rule: str, cell: Cell, steps: float) -> pd.DataFrame:
    """`runs` plus one made-up trial of `rule` at `cell` that reached the target in `steps`."""
    template = runs[runs["lr_rule"] == rule].iloc[0].to_dict()
    row = {**template, "batch_size": cell.batch_size, "seed": cell.seed,
           "steps_to_target": steps, "status": "reached",
           "trial_id": f"simulated-b{cell.batch_size}-s{cell.seed}"}
    return pd.concat([runs, pd.DataFrame([row])], ignore_index=True)


def expected_ratio(runs: pd.DataFrame, rule: str, cell: Cell, bootstrap_samples: int,
                   rng: np.random.Generator) -> tuple[float, float]:
    """(median interval ratio after running `cell`, the steps it is predicted to take): its
    steps drawn from the current fit with the fit's own relative scatter (the cell's result is
    unknown until it runs)."""
    table = steps_to_result(runs[runs["lr_rule"] == rule], by=(), reduce="median")
    batch, steps = positive_pairs(table["batch_size"], table["steps_to_target"])
    fits = fit_lines(batch, steps)
    predicted = float(fits.s_min) + float(fits.e_min) / cell.batch_size
    if not (math.isfinite(predicted) and predicted > 0):
        return math.inf, math.inf
    scatter = max(float(fits.scatter), 0.01)
    ratios = []
    for noise in rng.normal(0.0, scatter, SIMULATED_DRAWS):
        trial = _simulated(runs, rule, cell, max(1.0, round(predicted * math.exp(noise))))
        ratios.append(interval_state(trial, rule, bootstrap_samples).ratio)
    return float(np.median(ratios)), predicted


@dataclass(frozen=True)
class CellCost:
    """What a cell is predicted to hold in device-seconds, the currency a user pays: a fixed
    share per launch (evaluation, the data, the hand-off to the process group), measured as
    held minus training time over the launches after the first (which also paid the start-up),
    plus its steps at the step-time line's t(B) = α + βB, for every trial the cell trains at
    that batch and every worker. `trainings` maps a batch size to the trials one seed trains
    there (every rule's learning rates, the rules' shared reference batch trained once); a
    batch it does not name trains `rules` trials. With successive halving the tuned rule's
    candidates are priced as full trials, though most stop at a rung: an upper bound there.

    Examples alone mislead here: a small batch costs few examples but as many fixed per-step
    costs as a large one, so on a device with a large α a search ranked by examples spends its
    time on small batches."""

    step_fit: StepTimeFit
    overhead_s: float
    rules: int = 1
    workers: int = 1
    trainings: Mapping[int, int] = field(default_factory=dict)

    def device_s(self, batch_size: int, steps: float) -> float:
        """Predicted held device-seconds of a cell at `batch_size` taking `steps`; NaN without a
        step-time line that is positive there."""
        step_s = self.step_fit.alpha_s + self.step_fit.beta_s * batch_size
        if not (math.isfinite(step_s) and step_s > 0 and math.isfinite(steps)):
            return math.nan
        overhead = self.overhead_s if math.isfinite(self.overhead_s) else 0.0
        trials = self.trainings.get(batch_size, self.rules)
        return max(overhead, 0.0) + trials * self.workers * steps * step_s


def unsupported_next(state: IntervalState, done: Sequence[Cell], candidates: Sequence[Cell],
                     predicted: float) -> tuple[Cell | None, str]:
    """The next cell while the fit gives no interval to narrow: past the bound it found, or the
    batch size nearest the prediction that is not run yet, or a second seed where there is
    none (the interval needs two seeds somewhere)."""
    if not candidates:
        return None, STOP_EXHAUSTED
    measured = {d.batch_size for d in done}
    new = [c for c in candidates if c.batch_size not in measured]
    if state.bound == "above" and new:
        cell = max(new, key=lambda c: c.batch_size)
        return cell, "steps still fall like 1/B: " + _beyond(cell, measured, "larger")
    if state.bound == "below" and new:
        cell = min(new, key=lambda c: c.batch_size)
        return cell, "no batch saved steps: " + _beyond(cell, measured, "smaller")
    if math.isfinite(state.b_crit):
        centre = state.b_crit
        pool, why = [c for c in candidates if c not in new] or list(candidates), \
            "a second seed nearest B_crit: the interval needs seeds to resample"
    else:
        centre = predicted if math.isfinite(predicted) and predicted > 0 else 1.0
        pool, why = new or list(candidates), ("no B_crit yet: another batch size" if new
                                              else "no B_crit yet: another seed")
    cell = min(pool, key=lambda c: (abs(math.log(c.batch_size / centre)), c.seed))
    return cell, why


def _beyond(cell: Cell, measured: set[int], side: str) -> str:
    """Whether `cell` is past the batch sizes measured on `side`, or (none being allowed there)
    the other way, to see whether the bound holds."""
    past = cell.batch_size > max(measured) if side == "larger" else cell.batch_size < min(measured)
    if past:
        return f"a {side} batch"
    return (f"no {side} batch is allowed, so batch {cell.batch_size:,}, to see whether that "
            "holds over more batch sizes")


def _prices(forecasts: list[tuple[Cell, float, float]],
            cost: CellCost | None) -> list[float] | None:
    """Each forecast cell's predicted device-seconds, or None unless every cell the fit can
    forecast has one (ranking device-seconds against examples would mix units)."""
    if cost is None:
        return None
    prices = [cost.device_s(cell.batch_size, steps) for cell, _, steps in forecasts]
    forecast = [p for p, (_, _, steps) in zip(prices, forecasts, strict=True)
                if math.isfinite(steps)]
    if not forecast or not all(math.isfinite(p) and p > 0 for p in forecast):
        return None
    return prices


def choose_next(runs: pd.DataFrame, rule: str, done: Sequence[Cell], candidates: Sequence[Cell],
                predicted: float, bootstrap_samples: int, seed: int = 0,
                cost: CellCost | None = None) -> tuple[Cell | None, str, float]:
    """(cell, why, expected ratio after it): the candidate that narrows the interval most per
    device-second it is predicted to hold (`cost`), or per example where no step-time line
    prices every candidate (log of the ratio gained ÷ the cell's cost); the rule of
    `unsupported_next` while there is no interval yet. Per unit of cost, because a large batch
    often narrows most but costs most: the search's point is the answer at a fraction of the
    grid's cost."""
    state = interval_state(runs, rule, bootstrap_samples)
    if not math.isfinite(state.ratio):
        cell, why = unsupported_next(state, done, candidates, predicted)
        return cell, why, math.inf
    if not candidates:
        return None, STOP_EXHAUSTED, state.ratio
    rng = np.random.default_rng(seed)
    forecasts = [(cell, *expected_ratio(runs, rule, cell, bootstrap_samples, rng))
                 for cell in candidates]
    prices = _prices(forecasts, cost)
    unit = "example" if prices is None else "device-second"
    scored = []
    for i, (cell, ratio, steps) in enumerate(forecasts):
        price = steps * cell.batch_size if prices is None else prices[i]
        gain = math.log(state.ratio) - math.log(ratio) if math.isfinite(ratio) else -math.inf
        scored.append((gain / price if gain > 0 else -math.inf, gain, -i, ratio, price, cell))
    _, gain, _, ratio, price, cell = max(scored, key=lambda s: s[:3])
    if gain <= 0:  # the steps scatter too much for more cells to help: stop spending
        return None, STOP_NO_GAIN, state.ratio
    cost_words = "" if prices is None else f", forecast to hold {price:.3g} device-s"
    return cell, (f"narrows the interval most per {unit} (expected ratio {ratio:.2f}"
                  f"{cost_words})"), ratio
