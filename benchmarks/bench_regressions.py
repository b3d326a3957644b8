"""Does the regression check catch real steps without crying wolf? Synthetic cell
histories replayed through the change-point test (batchscale/lake/changepoints.py) exactly as
publish judges them run by run, with `publish.history_runs` = HISTORY_RUNS.

Run-to-run noise comes from measured figures, said in the output (`noise_source`):
- real sweeps, measured here: REAL_SWEEPS production-default sweeps in a row (the rows of
  bench_sweep's repeatability part: digits-mlp and resnet18 at 32 px, each on torch's default
  threads and on one thread (`sweep.threads`), alternating). Each
  cell's vouched-for rows give its relative residuals (x / median − 1), resampled with
  replacement. The sweeps also give how often the next sweep fell inside a row's rerun
  interval (the interval's coverage, on the same rows), and how often a sweep fell inside the
  prediction interval of the sweeps before it (stats.history_coverage: the interval a cell's
  history in the lake could give);
- the local lake's real sweep rows, when it holds cells measured well in at least
  MIN_LAKE_RUNS comparable runs (same speed fingerprint, no unstable rows, no disturbed run):
  each such cell's relative residuals (x / median − 1) are resampled with replacement;
- always, normal noise at the run-to-run CVs README.md states for 5 production-default sweeps
  in a row on our 2-core machine (`bench_sweep`): resnet18 B=64 0.047, B=16 0.076; digits-mlp
  0.186 to 0.257 (sub-millisecond steps), and 0.02 for a quiet GPU-sized step for reference.

Resampling runs independently drops the drift between neighbouring runs (a slow afternoon
makes several runs slow together), which makes false alarms look rarer than they are; the
scheduled-run scenario test (tests/test_regression_scenario.py) covers that case with real runs.

Figures, each with its exact binomial (Clopper-Pearson) 95 % interval:
- detection within two runs of an injected 15 % and 30 % step (confirmed at the first or second
  run after it; goals ≥ 80 % and ≥ 95 %), STEP_TRIALS histories of PRE_STEP_RUNS runs each;
- false alarms per 100 cell-runs on step-free histories (goal ≤ 1): "confirmed" is the alarm,
  "suspected" is reported too; FREE_HISTORIES histories of FREE_RUNS runs, every run judged
  once it has MIN_HISTORY_RUNS before it;
- the earlier single-run rule on the same histories (a run more than
  max(3 · 1.4826 · MAD, 10 % of the median) below the median regressed), for comparison.
The histories are deterministic (fixed seed); the real sweeps are measured anew on each run,
on torch's default threads and on one: the whole benchmark took 6 min 34 s on 2 CPU cores,
most of it those sweeps.

Run: `make bench BENCH=bench_regressions` (or `python -m benchmarks.run bench_regressions`).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from batchscale.lake.changepoints import (
    CONFIRMED,
    MIN_HISTORY_RUNS,
    SUSPECTED,
    baseline_before,
    detect,
    replay,
)
from benchmarks import scaled
from benchmarks.stats import (
    Figure,
    Goal,
    clopper_pearson,
    history_coverage,
    next_run_coverage,
    share_figure,
    verdict,
)

HISTORY_RUNS = 10
"""publish.history_runs' default."""
PRE_STEP_RUNS = 10
STEP_TRIALS = scaled(2000, 200)
FREE_HISTORIES = scaled(300, 30)
FREE_RUNS = 40
STEPS = {0.15: Goal(0.80), 0.30: Goal(0.95)}
FALSE_ALARM_GOAL = Goal(1.0, at_least=False)
"""Per 100 cell-runs."""
LEVEL = 0.95
README_CVS = {"quiet GPU step (reference)": 0.02, "resnet18 B=64": 0.047,
              "resnet18 B=16": 0.076, "digits-mlp best": 0.186, "digits-mlp worst": 0.257}
MIN_LAKE_RUNS = 5
REAL_SWEEPS = scaled(10, 3)
MIN_REAL_ROWS = 3
# A sweep's history interval is checked once this many earlier sweeps vouch for its batch.
MIN_HISTORY_SWEEPS = 3
"""A cell needs this many vouched-for rows among the real sweeps to give a history."""
SINGLE_RUN_RULE = {"noise_mads": 3.0, "min_drop_share": 0.10}
SEED = 18

Noise = Callable[[np.random.Generator, int], np.ndarray]
"""Draws n relative deviations (x / level − 1)."""


def normal_noise(cv: float) -> Noise:
    return lambda rng, n: cv * rng.standard_normal(n)


def resampled_noise(residuals: np.ndarray) -> Noise:
    return lambda rng, n: rng.choice(residuals, size=n, replace=True)


def single_run_alarms(series: np.ndarray, start: int) -> list[bool]:
    """The earlier single-run rule, for every run from `start` on."""
    return [baseline_before(series, i, HISTORY_RUNS, **SINGLE_RUN_RULE).below(series[i])
            for i in range(start, series.size)]


def figure(k: int, n: int, goal: Goal | None, per: float = 1.0, what: str = "") -> Figure:
    low, high = clopper_pearson(k, n, LEVEL)
    value, low, high = per * k / n, per * low, per * high
    return Figure(value, low, high, n, f"{k} of {n}{what}, exact {LEVEL:.0%}", goal,
                  verdict(low, high, goal))


@dataclass
class Tally:
    confirmed: int = 0
    suspected: int = 0
    single_run: int = 0
    cases: int = 0


def detection(noise: Noise, step: float, rng: np.random.Generator) -> Tally:
    """Histories with a step of `step` after PRE_STEP_RUNS runs: caught at the first or second
    run after it?"""
    tally = Tally()
    for _ in range(STEP_TRIALS):
        series = 1.0 + noise(rng, PRE_STEP_RUNS + 2)
        series[PRE_STEP_RUNS:] *= 1.0 - step
        judged = [detect(series[:end], HISTORY_RUNS) for end in (PRE_STEP_RUNS + 1,
                                                                  PRE_STEP_RUNS + 2)]
        tally.cases += 1
        tally.confirmed += any(d.verdict == CONFIRMED for d in judged)
        tally.suspected += any(d.verdict in (SUSPECTED, CONFIRMED) for d in judged)
        tally.single_run += any(single_run_alarms(series, PRE_STEP_RUNS))
    return tally


def false_alarms(noise: Noise, rng: np.random.Generator) -> Tally:
    """Step-free histories: every judged run (MIN_HISTORY_RUNS before it) is a cell-run."""
    tally = Tally()
    for _ in range(FREE_HISTORIES):
        series = 1.0 + noise(rng, FREE_RUNS)
        judged = replay(series, HISTORY_RUNS)[MIN_HISTORY_RUNS:]
        tally.cases += len(judged)
        tally.confirmed += sum(d.verdict == CONFIRMED for d in judged)
        tally.suspected += sum(d.verdict == SUSPECTED for d in judged)
        tally.single_run += sum(single_run_alarms(series, MIN_HISTORY_RUNS))
    return tally


def figures_for(noise: Noise) -> dict[str, Figure]:
    rng = np.random.default_rng(SEED)
    out = {}
    for step, goal in STEPS.items():
        tally = detection(noise, step, rng)
        name = f"{step:.0%} step"
        out[f"{name}: confirmed within 2 runs"] = figure(tally.confirmed, tally.cases, goal)
        out[f"{name}: suspected or confirmed within 2 runs"] = figure(tally.suspected,
                                                                      tally.cases, None)
        out[f"{name}: single-run rule within 2 runs"] = figure(tally.single_run, tally.cases,
                                                               None)
    tally = false_alarms(noise, rng)
    per = " cell-runs, per 100"
    out["false alarms per 100 cell-runs: confirmed"] = figure(
        tally.confirmed, tally.cases, FALSE_ALARM_GOAL, 100.0, per)
    out["suspected per 100 cell-runs (reported, never fails)"] = figure(
        tally.suspected, tally.cases, None, 100.0, per)
    out["single-run rule alarms per 100 cell-runs"] = figure(
        tally.single_run, tally.cases, None, 100.0, per)
    return out


def lake_residuals() -> tuple[dict[str, np.ndarray], str]:
    """Relative residuals of the local lake's well-measured cells with enough comparable runs,
    or none with why."""
    try:
        from batchscale.cli import connect_store
        from batchscale.lake.comparable import CELL_KEYS, FINGERPRINT_FIELDS, baseline_cells
        from batchscale.lake.lake import read_lake_table
        from batchscale.lake.regression import HISTORY_COLUMNS

        sweep = read_lake_table(connect_store(), "sweep", columns=HISTORY_COLUMNS)
    except Exception as err:  # no store here: the README figures still run
        return {}, f"local lake not readable ({type(err).__name__}: {err})"
    cells = baseline_cells(sweep, None, None) if sweep is not None else None
    if cells is None or cells.empty:
        return {}, "local lake holds no well-measured sweep rows"
    keys = list(dict.fromkeys((*CELL_KEYS, *FINGERPRINT_FIELDS)))
    found = {}
    for cell, rows in cells.fillna({k: "" for k in keys}).groupby(keys, sort=True):
        rates = rows["samples_per_s"].to_numpy(dtype=float)
        if rates.size >= MIN_LAKE_RUNS:
            name = f"{cell[0]} {cell[3]} B={cell[4]}"
            found[name] = rates / np.median(rates) - 1.0
    runs = sweep["run_id"].nunique()
    if not found:
        return {}, (f"local lake: {runs} runs, no cell with {MIN_LAKE_RUNS} comparable "
                    "well-measured runs")
    return found, f"local lake: {len(found)} cells with ≥ {MIN_LAKE_RUNS} comparable runs"


def real_sweeps() -> tuple[dict[str, np.ndarray], dict, str, dict]:
    """REAL_SWEEPS production-default sweeps measured now: each cell's relative residuals over
    its MIN_REAL_ROWS or more vouched-for rows; the rerun interval coverage of the next sweep
    (bench_sweep.coverage_figures) and the history's (history_figures); the source line; the
    sweeps' samples/s and rerun intervals as measured."""
    from benchmarks.bench_sweep import (
        REPEAT_THREADS,
        coverage_figures,
        repeat_sweeps,
        vouched_intervals,
        vouched_rates,
    )

    with tempfile.TemporaryDirectory() as tmp:
        sweeps = repeat_sweeps(Path(tmp), REAL_SWEEPS, REPEAT_THREADS)
    runs = {w: [vouched_rates(rows) for rows in s] for w, s in sweeps.items()}
    intervals = {w: [vouched_intervals(rows) for rows in s] for w, s in sweeps.items()}
    cells = {}
    for workload, per_sweep in runs.items():
        for batch in sorted({b for run in per_sweep for b in run}):
            rates = np.array([run[batch] for run in per_sweep if batch in run], dtype=float)
            if rates.size >= MIN_REAL_ROWS:
                cells[f"{workload} B={batch}"] = rates / np.median(rates) - 1.0
    source = (f"{REAL_SWEEPS} real sweeps per workload measured now: {len(cells)} cells with "
              f"≥ {MIN_REAL_ROWS} vouched-for rows")
    figures = {**coverage_figures(runs, intervals), **history_figures(runs, intervals)}
    raw = {"samples_per_s": runs, "rerun_intervals": intervals}  # figures can be recomputed
    return cells, figures, source, raw


def history_figures(runs: dict[str, list[dict[int, float]]],
                    intervals: dict[str, list[dict[int, tuple[float, float]]]]) -> dict:
    """How often a sweep fell inside the prediction interval of the sweeps before it
    (stats.history_coverage, keyed "history, <workload>"), and how often the next sweep fell
    inside the lake's next-run interval (stats.next_run_coverage: "next-run, ..." with the
    row's own interval, "steps alone, ..." without), per workload and pooled."""
    from benchmarks.bench_sweep import RERUN_COVERAGE_GOAL

    kinds = {"history": {w: history_coverage(r, MIN_HISTORY_SWEEPS) for w, r in runs.items()},
             "next-run": {w: next_run_coverage(r, intervals[w]) for w, r in runs.items()},
             "steps alone": {w: next_run_coverage(r) for w, r in runs.items()}}
    figures = {}
    for kind, checks in kinds.items():
        checks["pooled"] = (sum(c[0] for c in checks.values()),
                            sum(c[1] for c in checks.values()),
                            [w for c in checks.values() for w in c[2]])
        figures.update({f"{kind}, {name}": {
            "figure": share_figure(covered, checked, RERUN_COVERAGE_GOAL) if checked else None,
            "median_half_width": statistics.median(widths) if widths else None}
            for name, (covered, checked, widths) in checks.items()})
    return figures


def print_figures(title: str, figures: dict[str, Figure]) -> None:
    print(f"  {title}")
    for name, value in figures.items():
        print(f"    {name}: {value.text(digits=3)}")
    sys.stdout.flush()


def real_sweep_figures(results: dict) -> None:
    """The check on histories resampled from real sweeps, and the rows' rerun coverage."""
    cells, coverage, source, raw = real_sweeps()
    results["real_sweeps"] = source
    results["real_sweeps_raw"] = raw
    print(f"  {source}")
    for name, entry in coverage.items():
        if entry["figure"] is not None:
            what = _coverage_words(name)
            results[f"next sweep {what}"] = entry
            print(f"    next sweep {what}: {entry['figure'].text(digits=3)}; median "
                  f"half-width {entry['median_half_width']:.3f}")
    for name, residuals in cells.items():
        cv = float(np.std(residuals, ddof=1))
        label = f"real {name}: {residuals.size} sweeps, CV {cv:.3f}, resampled"
        figures = figures_for(resampled_noise(residuals))
        results[label] = figures
        print_figures(label, figures)


def _coverage_words(name: str) -> str:
    kind, _, workload = name.partition(", ")
    return {"history": f"inside the prediction interval of the sweeps before it, {workload}",
            "next-run": f"inside the lake's next-run interval, {workload}",
            "steps alone": f"inside the run-to-run step interval alone, {workload}",
            }.get(kind, f"inside the rerun interval, {name}")


def run() -> dict:
    results: dict = {"history_runs": HISTORY_RUNS, "interval": f"Clopper-Pearson {LEVEL:.0%}"}
    real_sweep_figures(results)
    residuals, source = lake_residuals()
    results["noise_source"] = source
    print(f"  noise: {source}; README CVs {README_CVS}")
    for name, cv in README_CVS.items():
        figures = figures_for(normal_noise(cv))
        results[f"README CV {cv:g} ({name})"] = figures
        print_figures(f"README CV {cv:g} ({name}), normal noise", figures)
    for name, values in residuals.items():
        cv = float(np.std(values, ddof=1))
        figures = figures_for(resampled_noise(values))
        results[f"lake {name} (CV {cv:.3f}, {values.size} runs)"] = figures
        print_figures(f"lake cell {name}: {values.size} runs, CV {cv:.3f}, resampled",
                      figures)
    return results


if __name__ == "__main__":
    run()
