"""The report's "Adaptive search" section, from the `decisions` table (batchscale/adaptive/ writes
it; this module only reads it, so the analysis stays below the search): what the noise scale
predicted, where the first batch sizes went, how the B_crit interval narrowed cell by cell, and
what the search spent against what a grid of the same batch sizes and seeds would have spent.

The grid's cost is an estimate (its trials were not run): per batch size, the examples to the
target by the search's final fit, S(B)·B, times the seeds; it says so wherever it is shown."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from batchscale.adaptive.futility import STOP_FUTILE
from batchscale.analysis.critical import (
    ADAPTIVE_READ_LEVEL,
    DEFAULT_RANGE_FACTOR,
    cut_sides,
    fit_critical_batch,
    interval_note,
    steps_to_result,
)
from batchscale.analysis.figures import Plot, make_plot, new_axes
from batchscale.analysis.interval import LineFits, fit_lines
from batchscale.analysis.targets import row_targets, same_target
from batchscale.fits import ensure_columns, positive_pairs
from batchscale.schemas import RUNS
from batchscale.tdist import t_quantile

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CELL_ACTIONS = ("probe", "place", "refine")
STOPPED_READING = ("a search that stops once its interval is narrow selects lucky draws: on "
                   "simulated searches (bench_adaptive_calibration, 7 settings of 200) its "
                   "interval read at 90 % held the true B_crit 79–88.5 % of the time, read at "
                   "98 % 95–98.5 %")
ADAPTIVE_HEADINGS = ("#", "action", "cell", "why", "B_crit after [90 % interval]", "examples spent")


@dataclass(frozen=True)
class AdaptiveSection:
    """What the report shows of an adaptive search."""

    sentences: tuple[str, ...]
    rows: tuple[dict, ...]
    """One per decision: action, cell, reason, interval after, examples spent."""
    plot: Plot


def _number(value: object) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return math.nan
    return number


GRID_LEVEL = 0.9
"""Level of the interval on a grid's estimated cost."""


@dataclass(frozen=True)
class GridEstimate:
    """A grid's cost by the search's final fit, with its GRID_LEVEL interval: the fit's own
    uncertainty (S_min and E_min; for device time also the step-time line's α and β) carried by
    the delta method with Student's t over the fit's degrees of freedom. It is the interval of
    the cost the fit expects; a grid's own trials would scatter about that. NaN where there is
    no estimate, or no interval (`low` NaN: the fit does not bound the cost away from zero)."""

    value: float
    low: float = math.nan
    high: float = math.nan


NO_ESTIMATE = GridEstimate(math.nan)


def grid_examples_estimate(decisions: pd.DataFrame, runs: pd.DataFrame | None,
                           batch_sizes: list[int], seeds: int) -> GridEstimate:
    """Examples a grid of `batch_sizes` × `seeds` would have spent, by the search's final fit
    S(B) = S_min + E_min/B from its own trials: seeds × Σ (S_min·B + E_min)."""
    lines = _final_lines(decisions, runs)
    if lines is None:
        return NO_ESTIMATE
    b = np.asarray(batch_sizes, dtype=float)
    gradient = seeds * np.array([b.sum(), b.size])  # d cost / d (S_min, E_min)
    return _linear_estimate(gradient @ _fit_parameters(lines), [(gradient, _fit_cov(lines))],
                            int(lines.dof))


def grid_device_s_estimate(decisions: pd.DataFrame, runs: pd.DataFrame | None,
                           batch_sizes: list[int], seeds: int) -> GridEstimate:
    """Device-seconds of training the grid would have spent: seeds × S(B) × t(B) summed over
    `batch_sizes`, S from the final fit and t = α + βB from the search's own one-worker trials
    (training time per step, as `device_s_spent` counts it). The interval carries both fits'
    uncertainty (independent data: their variances add), at the fewer degrees of freedom."""
    from batchscale.analysis.timetotarget import convergence_step_times
    from batchscale.fits import fit_step_time

    lines = _final_lines(decisions, runs)
    if lines is None or "train_time_s" not in runs.columns:
        return NO_ESTIMATE
    times = convergence_step_times(runs[runs["workers"] == 1])
    line = fit_step_time(list(times), list(times.values()))
    b = np.asarray(batch_sizes, dtype=float)
    step_s = line.alpha_s + line.beta_s * b
    steps = lines.s_min + lines.e_min / b
    if not (np.all(np.isfinite(step_s) & (step_s > 0)) and np.all(np.isfinite(steps))):
        return NO_ESTIMATE
    var_alpha, var_beta, cov = line.covariance
    line_cov = np.array([[var_alpha, cov], [cov, var_beta]])
    by_fit = seeds * np.array([step_s.sum(), (step_s / b).sum()])  # d / d (S_min, E_min)
    by_line = seeds * np.array([steps.sum(), (steps * b).sum()])  # d / d (α, β)
    return _linear_estimate(seeds * float((steps * step_s).sum()),
                            [(by_fit, _fit_cov(lines)), (by_line, line_cov)],
                            min(int(lines.dof), line.dof))


def _linear_estimate(value: float, parts: list[tuple[np.ndarray, np.ndarray]],
                     dof: int) -> GridEstimate:
    """`value` ± t·sqrt(Σ gᵀCg) over the (gradient, covariance) parts; no interval without
    degrees of freedom, a finite variance, or a low end above zero."""
    variance = sum(float(g @ c @ g) for g, c in parts)
    if dof < 1 or not math.isfinite(variance):
        return GridEstimate(value)
    half = t_quantile(0.5 + GRID_LEVEL / 2, dof) * math.sqrt(max(variance, 0.0))
    if value - half <= 0:
        return GridEstimate(value, math.nan, value + half)
    return GridEstimate(value, value - half, value + half)


def _fit_parameters(lines: LineFits) -> np.ndarray:
    return np.array([float(lines.s_min), float(lines.e_min)])


def _fit_cov(lines: LineFits) -> np.ndarray:
    var_s, var_e, cov = float(lines.var_s), float(lines.var_e), float(lines.cov_se)
    return np.array([[var_s, cov], [cov, var_e]])


def _final_lines(decisions: pd.DataFrame, runs: pd.DataFrame | None) -> LineFits | None:
    """The line S(B) = S_min + E_min/B fitted to the search rule's trials of its target, as
    `fit_critical_batch` fits it; None when that gives no B_crit number."""
    rows = _target_runs(decisions, runs)
    if rows is None:
        return None
    table = steps_to_result(rows, by=(), reduce="median")
    fit = fit_critical_batch(table["batch_size"], table["steps_to_target"])
    if not math.isfinite(fit.b_crit):
        return None
    return fit_lines(*positive_pairs(table["batch_size"], table["steps_to_target"]))


def search_grid(decisions: pd.DataFrame, runs: pd.DataFrame | None) -> tuple[list[int], int]:
    """(batch sizes, seeds per batch size) of the grid the search chose its cells from, as its
    decisions record it; for a table written before they did, the batch sizes and the number
    of seeds its trials ran (a grid no larger than the real one, so the search's share of it
    reads high rather than low)."""
    recorded = decisions.get("grid_batch_sizes", pd.Series(dtype=object)).dropna()
    seeds = pd.to_numeric(decisions.get("grid_seeds", pd.Series(dtype=float)),
                          errors="coerce").dropna()
    if len(recorded) and len(seeds):
        return sorted(int(b) for b in recorded.iloc[-1]), int(seeds.iloc[-1])
    if runs is None or runs.empty:
        return [], 1
    return sorted(int(b) for b in set(runs["batch_size"])), max(1, int(runs["seed"].nunique()))


def adaptive_section(decisions: pd.DataFrame | None, runs: pd.DataFrame | None,
                     batch_sizes: list[int] | None = None, seeds: int | None = None,
                     range_factor: float = DEFAULT_RANGE_FACTOR,
                     read_level: float = ADAPTIVE_READ_LEVEL) -> AdaptiveSection | None:
    """The section, or None when the run was not an adaptive search. Its cost is compared with
    a grid of `batch_sizes` × `seeds` (None: the grid the decisions record, `search_grid`);
    `range_factor` is analysis.b_crit_range_factor, where an interval is cut to a bound;
    `read_level`: the level the search's final interval was read at (critical.read_level)."""
    if decisions is None or decisions.empty:
        return None
    decisions = decisions.sort_values("decision")
    if batch_sizes is None or seeds is None:
        batch_sizes, seeds = search_grid(decisions, runs)
    last = decisions.iloc[-1]
    sentences = [_prediction_sentence(decisions), _placement_sentence(decisions),
                 _final_sentence(last, _target_runs(decisions, runs), range_factor, read_level),
                 _cost_sentence(decisions, runs, batch_sizes, seeds)]
    rows = tuple(_row(r, read_level) for r in decisions.to_dict("records"))
    plot = make_plot(lambda: draw_search(decisions),
                     "B_crit after each cell the search ran (bars: its 90 % interval), against "
                     "the examples spent so far; the band: B_crit predicted from the gradient "
                     "noise scale",
                     "no cell gave a B_crit interval")
    return AdaptiveSection(tuple(s for s in sentences if s), rows, plot)


def _prediction_sentence(decisions: pd.DataFrame) -> str:
    predicted = decisions[decisions["action"] == "predict"]
    if predicted.empty:
        return ""
    p = predicted.iloc[0]
    centre, low, high = (_number(p[k]) for k in ("predicted_b_crit", "predicted_low",
                                                  "predicted_high"))
    if not math.isfinite(centre):
        return f"The gradient noise scale gave no prediction: {p['reason']}."
    return (f"The probes' gradient noise scale ({p['prediction_method']}) predicted B_crit ≈ "
            f"{centre:.3g} (interquartile range {low:.3g}–{high:.3g}).")


def _placement_sentence(decisions: pd.DataFrame) -> str:
    placed = decisions[decisions["action"].isin(("probe", "place"))]["batch_size"].dropna()
    if placed.empty:
        return ""
    sizes = ", ".join(f"{int(b):,}" for b in sorted(set(placed)))
    return f"Probed and placed batch sizes: {sizes}."


def _target_runs(decisions: pd.DataFrame, runs: pd.DataFrame | None) -> pd.DataFrame | None:
    """The trials of the search's rule and target (a trial has a row per target); None when
    the runs have none (a runs table that is not this search's)."""
    if runs is None or runs.empty:
        return None
    last = decisions.iloc[-1]
    searched = (str(last["target_metric"]), float(last["target_value"]))
    targets = row_targets(ensure_columns(runs, RUNS))  # a layout 1 row: its target_val_accuracy
    of_target = np.array([same_target(t, searched) for t in targets], dtype=bool)
    rows = runs[of_target & (runs["lr_rule"] == last["lr_rule"]).to_numpy()]
    return rows if len(rows) else None


def _final_sentence(last: pd.Series, runs: pd.DataFrame | None, range_factor: float,
                    read_level: float) -> str:
    b_crit, low, high = (_number(last[k]) for k in ("b_crit", "b_crit_low", "b_crit_high"))
    cells = int(last["decision"])
    if math.isfinite(low) and math.isfinite(high):
        note = "" if runs is None else interval_note(runs, last["lr_rule"], (low, high),
                                                     range_factor=range_factor)
        return (f"The search stopped ({last['reason']}) with B_crit {b_crit:.3g}, 90 % interval "
                f"{low:.3g}–{high:.3g} (high/low {high / low:.2f}), after {cells} decisions"
                + (f"; {note}" if note else "") + f". That interval is read at the "
                f"{read_level:.0%} level: {_reading(read_level)}."
                + _b_star_sentence(last, cut=runs is not None and any(
                    cut_sides(runs, last["lr_rule"], (low, high), range_factor=range_factor)))
                + _futile_sentence(last))
    return f"The search stopped ({last['reason']}) without a B_crit interval."


def _futile_sentence(last: pd.Series) -> str:
    """What to do when the search stopped because no grid is expected to pin B_crit."""
    if not str(last["reason"]).startswith(STOP_FUTILE):
        return ""
    return (" Running the grid would not be expected to narrow it: the steps to target scatter "
            "too much between seeds and about the fit. More seeds per batch size "
            "(`convergence.seeds`; the stop reason says how many the forecast needs) average "
            "that scatter down; or accept this interval (`convergence.target_interval_ratio`).")


def _b_star_sentence(last: pd.Series, cut: bool) -> str:
    """B* = sqrt(B_crit·α/β) with its interval (B_crit's and the step-time line's), where the
    decisions have it; `cut`: B_crit's interval is a bound on one side, and so is B*'s."""
    b_star, low, high = (_number(last.get(k)) for k in ("b_star", "b_star_low", "b_star_high"))
    if not (math.isfinite(b_star) and math.isfinite(low) and math.isfinite(high) and low > 0):
        return ""
    return (f" B*, the batch fastest to the target (sqrt(B_crit·α/β) with the trials' own "
            f"step-time line), is {b_star:.3g}, interval {low:.3g}–{high:.3g} (high/low "
            f"{high / low:.2f})" + (", a bound on the same side as B_crit's" if cut else "")
            + ".")


def _cost_sentence(decisions: pd.DataFrame, runs: pd.DataFrame | None, batch_sizes: list[int],
                   seeds: int) -> str:
    spent = int(decisions["examples_spent"].max())
    spent_s, held_s = (_number(decisions[column].max()) if column in decisions else math.nan
                       for column in ("device_s_spent", "device_s_held"))
    device = (f", {spent_s:,.1f} device-seconds of training (training time × workers)"
              if math.isfinite(spent_s) else "")
    if math.isfinite(held_s) and held_s > 0:
        device += (f" and held devices for {held_s:,.1f} device-seconds in all (each cell's "
                   "launch wall time × workers: start-up, data loading and evaluation included"
                   + _outside_training(spent_s, held_s) + ")")
    grid = grid_examples_estimate(decisions, runs, batch_sizes, seeds)
    if not math.isfinite(grid.value) or grid.value <= 0:
        return (f"It trained on {spent:,} examples{device}; a grid's cost cannot be estimated "
                "without a B_crit fit.")
    text = (f"It trained on {spent:,} examples{device}; a grid of {len(batch_sizes)} batch sizes "
            f"× {seeds} seeds would have needed about {_sig3(grid.value)} examples "
            f"({_estimate_interval(grid, _sig3)}) by the search's final fit (an estimate: the grid "
            f"was not run; the interval is the fit's, and a grid's own trials would scatter "
            f"about it), so the search spent {_share(spent, grid)} of its examples")
    grid_s = grid_device_s_estimate(decisions, runs, batch_sizes, seeds)
    if math.isfinite(spent_s) and math.isfinite(grid_s.value) and grid_s.value > 0:
        text += (f" and {_share(spent_s, grid_s)} of its training device time (about "
                 f"{grid_s.value:,.1f} device-seconds, "
                 f"{_estimate_interval(grid_s, lambda v: f'{v:,.1f}')}, with the search's "
                 "own step-time line)")
    if math.isfinite(held_s) and held_s > 0:
        text += ("; the time held has no grid estimate: start-up is paid once per launch, "
                 "and a grid launches once per worker count locally and once per batch size on "
                 "a cluster, the search once for all its one-worker cells locally and once per "
                 "cell otherwise")
    return text + "."


def _sig3(value: float) -> str:
    """`value` to 3 significant digits, with thousands separators."""
    return f"{round(value, 2 - math.floor(math.log10(value))):,.0f}" if value >= 100 else \
        f"{value:.3g}"


def _estimate_interval(estimate: GridEstimate, show) -> str:
    """"90 % interval low–high", or why there is none (`show` formats a bound)."""
    level = f"{GRID_LEVEL:.0%}"
    if math.isfinite(estimate.low):
        return f"{level} interval {show(estimate.low)}–{show(estimate.high)}"
    if math.isfinite(estimate.high):
        return f"at most {show(estimate.high)} at {level}; the fit does not bound it from below"
    return "no interval: the fit has no degrees of freedom left"


def _share(spent: float, estimate: GridEstimate) -> str:
    """spent ÷ the estimate, with the interval the estimate's gives it."""
    share = f"{spent / estimate.value:.0%}"
    if math.isfinite(estimate.low):
        return f"{share} ({spent / estimate.high:.0%}–{spent / estimate.low:.0%})"
    if math.isfinite(estimate.high):
        return f"{share} (at least {spent / estimate.high:.0%})"
    return f"{share} (no interval)"


def _outside_training(spent_s: float, held_s: float) -> str:
    """The share of the held time outside training, where the two clocks allow one."""
    if not math.isfinite(spent_s):
        return ""
    if spent_s > held_s:
        return ("; less than the training time the trials report, so the two clocks disagree "
                "and no share outside training is given")
    return f", {1 - spent_s / held_s:.0%} of it outside training"


def _reading(read_level: float) -> str:
    """Why the final interval is read above 90 %, with what that gave on simulated searches."""
    if read_level != ADAPTIVE_READ_LEVEL:
        return "analysis.b_crit_read_level"
    return STOPPED_READING


def _row(r: dict, read_level: float) -> dict:
    low, high = _number(r.get("b_crit_low")), _number(r.get("b_crit_high"))
    b_crit = _number(r.get("b_crit"))
    interval = (f"{b_crit:.3g} [{low:.3g}, {high:.3g}]" if math.isfinite(low)
                else f"{b_crit:.3g} (no interval)" if math.isfinite(b_crit) else "—")
    if r["action"] == "stop" and math.isfinite(low):
        interval += f" (read at {read_level:.0%})"
    batch = _number(r.get("batch_size"))
    cell = f"b={int(batch)}, seed {int(_number(r.get('seed')))}" if math.isfinite(batch) else ""
    return {"decision": int(r["decision"]), "action": r["action"], "cell": cell,
            "reason": r["reason"], "b_crit": interval,
            "examples": f"{int(r['examples_spent']):,}"}


def draw_search(decisions: pd.DataFrame) -> Figure | None:
    cells = decisions[decisions["action"].isin(CELL_ACTIONS)]
    numbers = cells[pd.to_numeric(cells["b_crit_low"], errors="coerce").notna()]
    if numbers.empty:
        return None
    fig, ax = new_axes("examples spent", "B_crit (batch size)", x_base=10, log_y=True)
    x = numbers["examples_spent"].to_numpy(float)
    y, low, high = (pd.to_numeric(numbers[k]).to_numpy(float)
                    for k in ("b_crit", "b_crit_low", "b_crit_high"))
    ax.errorbar(x, y, yerr=np.vstack([y - low, high - y]).clip(0), fmt="o-", capsize=3,
                label="B_crit after the cell (90 % interval)")
    predicted = decisions[decisions["action"] == "predict"]
    if not predicted.empty and math.isfinite(_number(predicted.iloc[0]["predicted_b_crit"])):
        p = predicted.iloc[0]
        ax.axhspan(_number(p["predicted_low"]), _number(p["predicted_high"]), alpha=0.2,
                   color="C1", label="predicted from B_simple")
    ax.legend(fontsize="small")
    return fig
