"""The adaptive search, run: probe → predict → place → refine, each cell of trials
launched the way every convergence cell is (`convergence.runner.run_convergence`: torchrun
locally, a TrainJob with `launcher: kubeflow`), each decision a row of the `decisions` table.

Resuming: a cell whose trials all finished is read back instead of launched, and every decision
is a function of the finished trials alone (seeded bootstrap), so running a search again with
the same run id replays its decisions over the finished cells and carries on where it stopped.
docs/architecture.md, "Adaptive search".
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from batchscale.adaptive.choice import (
    STOP_B_STAR,
    STOP_BUDGET,
    STOP_DEVICE_BUDGET,
    STOP_NARROW,
    Cell,
    CellCost,
    IntervalState,
    NoisePrediction,
    candidate_cells,
    choose_next,
    edge_stop,
    interval_state,
    optimum,
    place_batch_sizes,
    predict_b_crit,
    prune_step,
)
from batchscale.adaptive.futility import grid_pin_chance
from batchscale.analysis.critical import BOOTSTRAP_CONFIDENCE, cut_sides, read_level
from batchscale.analysis.timetotarget import closed_interval
from batchscale.config import ExperimentConfig
from batchscale.convergence.cell_server import CellServer
from batchscale.convergence.probe import b_simple_stable
from batchscale.convergence.runner import (
    run_convergence,
    torchrun_env,
    trainings_per_seed,
    work_dir,
)
from batchscale.convergence.spec import ProbeSpec
from batchscale.fits import StepTimeFit, fit_step_time, trained_trials
from batchscale.schemas import RunStatus, make_table
from batchscale.storage import write_bytes_atomic

NO_LINE = StepTimeFit(math.nan, math.nan, math.nan, "no trial has run yet")
SEARCH_BOOTSTRAP_SAMPLES = 200


def held_record(seed: int) -> str:
    """Beside a cell's trials: the wall seconds of the launch that finished it, kept so a
    resumed search counts the device time the cell held as it was, not the moment it takes to
    read it back. One per seed: the cells of one batch size share a directory (their trial ids
    tell them apart), and each seed is its own launch."""
    return f"held-s{seed}.json"


@dataclass
class Search:
    """What the search has run so far: trial tables per cell, decisions, and its cost."""

    cfg: ExperimentConfig
    run_id: str
    data_dir: str
    workers: int
    echo: Callable[[str], None]
    work_root: Path | None = None
    cells: dict[Cell, tuple[pa.Table, pa.Table]] = field(default_factory=dict)
    decisions: list[dict] = field(default_factory=list)
    held_s: dict[tuple[str, Cell], float] = field(default_factory=dict)
    """Device-seconds each cell (or probe) held: its launch's wall time × workers."""
    trained_s: dict[tuple[str, Cell], float] = field(default_factory=dict)
    """Device-seconds each launch trained (train time × workers over its trials): held minus
    this is what a launch costs besides its steps."""
    probes: dict[Cell, tuple[pa.Table, pa.Table]] = field(default_factory=dict)
    """Probes on `adaptive_probe_budget_examples`: their own trials (trial ids ending in
    runner.PROBE_SUFFIX), in the tables and the cost, never in the fit."""
    server: CellServer | None = None
    """Where the cells train, one after another in one process group (None: a TrainJob
    each)."""

    @property
    def rule(self) -> str:
        return self.cfg.convergence.lr_rules[0]

    @property
    def target(self):
        targets = self.cfg.convergence.resolved_targets()
        return next((t for t in targets if t.primary), targets[0])

    def _launch(self, cell: Cell, out_dir: Path, prune_at_step: int | None,
                probe: ProbeSpec | None = None) -> tuple[pa.Table, pa.Table]:
        """Every LR rule of the config at one (batch size, seed), trained under `out_dir`."""
        c = self.cfg.convergence
        one_seed = c.model_copy(update={"seeds": [cell.seed], "strategy": "grid"})
        cfg = self.cfg.model_copy(update={"convergence": one_seed})
        started = time.monotonic()
        tables = run_convergence(cfg, [cell.batch_size], data_dir=self.data_dir,
                                 out_dir=str(out_dir), run_id=self.run_id,
                                 workers=self.workers, prune_at_step=prune_at_step,
                                 server=self.server, probe=probe)
        self.held_s[(out_dir.name, cell)] = held_wall_s(
            out_dir, cell.seed, time.monotonic() - started) * self.workers
        trials = trained_trials(tables[1].to_pandas())
        self.trained_s[(out_dir.name, cell)] = float(
            (trials["train_time_s"] * trials["workers"]).sum())
        return tables

    def run_probe(self, cell: Cell) -> str:
        """A probe: with `adaptive_probe_budget_examples`, trials of their own (TrialSpec.probe)
        that stop at the budget or once B_simple is stable near the target, kept out of the
        fit; else a cell like any other. How it ended, in words."""
        budget = self.cfg.convergence.adaptive_probe_budget_examples
        if budget is None:
            self.run_cell(cell)
            return ""
        out_dir = probe_dir(self.run_id, cell.batch_size, self.workers, self.work_root)
        probe = ProbeSpec(budget_examples=budget, metric=self.target.metric,
                          value=self.target.value)
        self.probes[cell] = self._launch(cell, out_dir, None, probe)
        curves, runs = (table.to_pandas() for table in self.probes[cell])
        return f"; {probe_outcome(curves, runs, probe)}, kept out of the fit"

    def run_cell(self, cell: Cell, prune_at_step: int | None = None) -> str:
        """Train every LR rule of the config at one (batch size, seed) to the targets, stopping
        trials still short of them at `prune_at_step` as pruned; what pruning did, in words."""
        if cell in self.cells:
            return ""
        c = self.cfg.convergence
        out_dir = work_dir(self.run_id, [cell.batch_size], self.workers, self.work_root)
        self.cells[cell] = self._launch(cell, out_dir, prune_at_step)
        if prune_at_step is None:
            return ""
        trials = trained_trials(self.cells[cell][1].to_pandas())
        pruned = int((trials["status"] == RunStatus.PRUNED).sum())
        return (f"; {pruned} of {len(trials)} trial(s) pruned (bound: step {prune_at_step}, "
                f"{c.adaptive_prune_factor:g}× the fit's steps at the interval's far end)")

    def prune_bound(self, cell: Cell, state: IntervalState) -> int | None:
        c = self.cfg.convergence
        return prune_step(state, cell.batch_size, c.adaptive_prune_factor, c.max_steps)

    def trained(self) -> list[tuple[pa.Table, pa.Table]]:
        """(curves, runs) of every launch so far: budgeted probes, then cells."""
        return [*self.probes.values(), *self.cells.values()]

    def tables(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        trained = self.trained()
        curves = pa.concat_tables([c for c, _ in trained]).to_pandas()
        runs = pa.concat_tables([r for _, r in trained]).to_pandas()
        return curves, runs

    def target_runs(self) -> pd.DataFrame:
        """The cells' rows for the search's target (a trial has a row per target); budgeted
        probes never count."""
        if self.cells:
            runs = pa.concat_tables([r for _, r in self.cells.values()]).to_pandas()
        else:  # only probes so far: their columns, none of their rows
            runs = self.tables()[1].iloc[0:0]
        t = self.target
        left_out = (RunStatus.PRUNED, RunStatus.PROBED)  # stopped short: not steps to target
        keep = ((runs["target_metric"] == t.metric) & (runs["target_value"] == t.value)
                & ~runs["status"].isin(left_out))
        return runs[keep]

    def step_line(self) -> StepTimeFit:
        """The step-time line (α, β, with how well its points pin α/β) at the search's worker
        count, from its own trials (train time per step, the analysis's first source): B* is
        the batch that reaches the target soonest on those workers. NaN before two batch sizes
        ran."""
        from batchscale.analysis.timetotarget import convergence_step_times

        _, runs = self.tables()
        times = convergence_step_times(runs)
        return fit_step_time(list(times), list(times.values()))

    def cell_cost(self) -> CellCost:
        """How the next cell is priced: the step-time line of the trials so far, and the
        median device-seconds a launch held besides training, over the launches after the
        first (which also paid the start-up; NaN before a second launch)."""
        launches = list(self.held_s)[1:]
        overhead = [self.held_s[k] - self.trained_s[k] for k in launches if k in self.trained_s]
        line = self.step_line() if self.trained() else NO_LINE
        return CellCost(line, float(np.median(overhead)) if overhead else math.nan,
                        rules=len(self.cfg.convergence.lr_rules), workers=self.workers,
                        trainings={b: trainings_per_seed(self.cfg, b)
                                   for b in self.cfg.convergence.batch_sizes})

    def objective_ratio(self, state: IntervalState) -> float:
        """high/low of what the search narrows: B_crit's interval, or B*'s."""
        if self.cfg.convergence.adaptive_objective == "b_star":
            return optimum(state, self.step_line()).ratio
        return state.ratio

    def spent(self) -> tuple[int, float, float]:
        """(examples, device-seconds of training, device-seconds held) so far: steps × batch
        size and training seconds × workers over every trial (probes and stopped trials
        included), and every cell's launch wall time × workers (start-up included)."""
        _, runs = self.tables()
        trials = trained_trials(runs)
        examples = int((trials["steps_run"] * trials["batch_size"]).sum())
        return (examples, float((trials["train_time_s"] * trials["workers"]).sum()),
                float(sum(self.held_s.values())))

    def record(self, action: str, cell: Cell | None, reason: str, state: IntervalState,
               prediction: NoisePrediction, expected_ratio: float = math.nan,
               read_at: float = BOOTSTRAP_CONFIDENCE, narrowed: float = math.nan) -> None:
        """One decision row, and its progress line; `read_at`: the level the row's interval
        was read at, said in the line when it is not the 90 % the search narrows, with
        `narrowed`, the high/low of the 90 % interval it narrowed, beside it."""
        examples, device_s, held_s = self.spent() if self.trained() else (0, 0.0, 0.0)
        best = optimum(state, self.step_line() if self.cells else NO_LINE)
        star_low, star_high = closed_interval((best.low, best.high))
        row = {"decision": len(self.decisions), "action": action,
               "batch_size": cell.batch_size if cell else None,
               "seed": cell.seed if cell else None, "reason": reason,
               "lr_rule": self.rule, "target_metric": self.target.metric,
               "target_value": self.target.value,
               "predicted_b_crit": _finite(prediction.b_crit),
               "predicted_low": _finite(prediction.low),
               "predicted_high": _finite(prediction.high),
               "prediction_method": prediction.method,
               "b_crit": _finite(state.b_crit), "b_crit_low": _finite(state.low),
               "b_crit_high": _finite(state.high), "interval_ratio": _finite(state.ratio),
               "expected_ratio": _finite(expected_ratio), "examples_spent": examples,
               "b_star": _finite(best.b_star), "b_star_low": _finite(star_low),
               "b_star_high": _finite(star_high),
               "device_s_spent": device_s, "device_s_held": held_s, "workers": self.workers,
               "grid_batch_sizes": list(self.cfg.convergence.batch_sizes),
               "grid_seeds": len(self.cfg.convergence.seeds)}
        self.decisions.append(row)
        self.echo(f"adaptive {row['decision']:>2} {action:<7} "
                  f"{'' if cell is None else f'b={cell.batch_size} seed={cell.seed} '}"
                  f"{reason}; B_crit {_interval_words(state, read_at, narrowed)}"
                  f"{_b_star_words(best)}; "
                  f"{examples:,} examples, {held_s:,.1f} device-seconds held")


def _b_star_words(best) -> str:
    if not math.isfinite(best.ratio):
        return ""
    return f"; B* {best.b_star:.3g} [{best.low:.3g}, {best.high:.3g}] (×{_ratio(best.ratio)})"


def _ratio(value: float) -> str:
    """An interval's high/low: two decimals where they mean something, 3 digits past ×100."""
    return f"{value:.2f}" if value < 100 else f"{value:.3g}"


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _interval_words(state: IntervalState, read_at: float = BOOTSTRAP_CONFIDENCE,
                    narrowed: float = math.nan) -> str:
    """"29.2 [21.2, 40.7] (×1.92)"; read at another level than the 90 % the search narrows,
    it says so, and the 90 % interval's own high/low (`narrowed`) where given, so that a
    wide stopped interval does not read as a contradiction of "narrow enough at 90 %"."""
    if math.isfinite(state.ratio):
        level = "" if read_at == BOOTSTRAP_CONFIDENCE else f", read at {read_at:.0%}"
        if level and math.isfinite(narrowed):
            level += (f", the level a stopped search's 90% claim needs; ×{_ratio(narrowed)} "
                      f"at {BOOTSTRAP_CONFIDENCE:.0%}")
        return (f"{state.b_crit:.3g} [{state.low:.3g}, {state.high:.3g}] "
                f"(×{_ratio(state.ratio)}{level})")
    if state.reason:
        return f"not estimated: {state.reason}"
    return (f"{state.b_crit:.3g}, no interval yet" if math.isfinite(state.b_crit)
            else "not estimated yet")


def _prediction_words(p: NoisePrediction) -> str:
    if not math.isfinite(p.b_crit):
        return p.reason
    words = (f"B_simple {p.method} predicts B_crit ≈ {p.b_crit:.3g} (interquartile range "
             f"{p.low:.3g}–{p.high:.3g}) from {p.evaluations} evaluations")
    return words + (f" ({p.reason})" if p.reason else "")


def probe_dir(run_id: str, batch_size: int, workers: int, work_root: Path | None) -> Path:
    """Where a budgeted probe trains: beside the cells' directories, under its own name, so a
    cell placed at the same batch size and seed starts from scratch and a resumed search reads
    the probe back."""
    cell_dir = work_dir(run_id, [batch_size], workers, work_root)
    return cell_dir.with_name(f"probe-b{batch_size}-w{workers}")


def probe_outcome(curves: pd.DataFrame, runs: pd.DataFrame, probe: ProbeSpec) -> str:
    """How a budgeted probe's trials ended, in words: each trial's row for the primary
    target, a probed one told apart by its curve (B_simple stable near the target, else the
    budget), counted per way of ending."""
    rows = runs[(runs["target_metric"] == probe.metric) & (runs["target_value"] == probe.value)]
    endings: dict[str, int] = {}
    for row in trained_trials(rows).itertuples():
        curve = curves[curves["trial_id"] == row.trial_id].sort_values("step")
        why = _probe_ending(row.status, curve.to_dict("records"), probe)
        endings[why] = endings.get(why, 0) + 1
    total = sum(endings.values())
    return "; ".join(f"{why} in {n} of {total} trial(s)" for why, n in endings.items())


def _probe_ending(status: str, curve: list[dict], probe: ProbeSpec) -> str:
    if status == RunStatus.REACHED:
        return "reached the target"
    if status != RunStatus.PROBED:
        return f"ended {status}"
    if b_simple_stable(curve, probe.metric, probe.value):
        return "stopped once B_simple was stable near the target"
    return f"stopped at its probe budget of {probe.budget_examples:,} examples"


def held_wall_s(out_dir: Path, seed: int, measured_s: float) -> float:
    """The wall seconds the launch of a cell (its batch size's `out_dir`, its `seed`) held its
    devices: the record kept beside its trials when there is one (the cell finished in an
    earlier launch), else `measured_s`, kept there (when the directory exists: the launch wrote
    its trials there)."""
    record = out_dir / held_record(seed)
    try:
        kept = float(json.loads(record.read_text())["wall_s"])
        if math.isfinite(kept) and kept >= 0:
            return kept
    except (OSError, ValueError, KeyError, TypeError):
        pass
    if out_dir.is_dir():
        write_bytes_atomic(record, json.dumps({"wall_s": measured_s}).encode())
    return measured_s


def allowed_batch_sizes(cfg: ExperimentConfig, largest_batch: int | None) -> list[int]:
    """The search chooses among the config's batch sizes, up to the largest that fits in memory
    (from the sweep, where known)."""
    sizes = list(cfg.convergence.batch_sizes)
    return [b for b in sizes if largest_batch is None or b <= largest_batch] or sizes[:1]


def run_adaptive(cfg: ExperimentConfig, *, data_dir: str, run_id: str,
                 workers: int | None = None, largest_batch: int | None = None,
                 work_root: Path | None = None,
                 echo: Callable[[str], None] = print) -> tuple[pa.Table, pa.Table, pa.Table]:
    """(curves, runs, decisions) of an adaptive search (`convergence.strategy: adaptive`);
    cells train under `work_root` (runner.work_dir)."""
    c = cfg.convergence
    search = Search(cfg, run_id, str(data_dir), workers or c.workers, echo, work_root)
    if c.launcher != "kubeflow":
        search.server = CellServer(torchrun_env(search.workers), search.workers)
    try:
        return _search(search, largest_batch)
    finally:
        if search.server is not None:
            search.server.close()


def _search(search: Search, largest_batch: int | None) -> tuple[pa.Table, pa.Table, pa.Table]:
    cfg, c = search.cfg, search.cfg.convergence
    allowed = allowed_batch_sizes(cfg, largest_batch)
    none = IntervalState(math.nan, math.nan, math.nan, "", "")
    for b in c.adaptive_probe_batch_sizes or allowed[:2]:
        stopped = search.run_probe(Cell(b, c.seeds[0]))
        search.record("probe", Cell(b, c.seeds[0]), "measures the gradient noise scale" + stopped,
                      none, NoisePrediction(math.nan, math.nan, math.nan, "none", 0))
    curves, _ = search.tables()
    prediction = predict_b_crit(curves, search.target.metric, search.target.value)
    placed = place_batch_sizes(prediction.b_crit, allowed, c.adaptive_first_points)
    search.record("predict", None, _prediction_words(prediction) +
                 f"; placing {', '.join(map(str, placed))}", none, prediction)
    for b in placed:
        cell = Cell(b, c.seeds[0])
        if cell not in search.cells:
            before = interval_state(search.target_runs(), search.rule, SEARCH_BOOTSTRAP_SAMPLES)
            pruning = search.run_cell(cell, search.prune_bound(cell, before))
            state = interval_state(search.target_runs(), search.rule, SEARCH_BOOTSTRAP_SAMPLES)
            search.record("place", cell, "around the prediction" + pruning, state, prediction)
    _refine(search, allowed, prediction)
    curves_t, runs_t = (pa.concat_tables([t[i] for t in search.trained()]) for i in (0, 1))
    return curves_t, runs_t, make_table("decisions", search.decisions, _environment(search, runs_t))


def _environment(search: Search, runs: pa.Table) -> dict:
    """The decisions' environment columns: the driver's, with the device and world size the
    trials ran on (what the decisions are about)."""
    from batchscale.envinfo import environment

    cfg = search.cfg
    env = environment(run_id=search.run_id, config_hash=cfg.config_hash, experiment=cfg.name,
                      workload=cfg.workload, world_size=search.workers, variant=cfg.variant)
    return {**env, "device_name": runs.column("device_name")[0].as_py()}


BUDGET_CHECKED = (" (a budget is checked before each refining cell: the probes and the placed "
                  "cells run first, and a cell once started trains to its end)")


def _stop_reason(search: Search, state: IntervalState, runs: pd.DataFrame,
                 allowed: list[int]) -> str:
    """Why the search stops before choosing another cell; "" to go on. An interval cut at the
    fit's range limit is never narrow enough: on that side it is a bound."""
    c = search.cfg.convergence
    cut = cut_sides(runs, search.rule, (state.low, state.high),
                    range_factor=search.cfg.analysis.b_crit_range_factor)
    if search.objective_ratio(state) <= c.target_interval_ratio and not any(cut):
        return STOP_NARROW if c.adaptive_objective == "b_crit" else STOP_B_STAR
    at_edge = edge_stop(cut, [cell.batch_size for cell in search.cells], allowed)
    if at_edge:
        return at_edge
    if c.adaptive_objective == "b_crit" and c.adaptive_futile_chance and not any(cut):
        forecast = grid_pin_chance(runs, search.rule, allowed, len(c.seeds),
                                   (state.low, state.high), c.target_interval_ratio,
                                   np.random.default_rng(len(search.cells)))
        if forecast.futile(c.adaptive_futile_chance):
            return forecast.words(c.target_interval_ratio)
    examples, _, held_s = search.spent()
    if c.adaptive_budget_examples and examples >= c.adaptive_budget_examples:
        return (f"{STOP_BUDGET}: {examples:,} examples against adaptive_budget_examples "
                f"{c.adaptive_budget_examples:,}{BUDGET_CHECKED}")
    if c.adaptive_budget_device_s and held_s >= c.adaptive_budget_device_s:
        return (f"{STOP_DEVICE_BUDGET}: {held_s:,.1f} device-seconds held against "
                f"adaptive_budget_device_s {c.adaptive_budget_device_s:g}{BUDGET_CHECKED}")
    cells = len(search.cells) + len(search.probes)
    return "cell limit reached" if cells >= c.adaptive_max_cells else ""


def _refine(search: Search, allowed: list[int], prediction: NoisePrediction) -> None:
    """Add the cell that most narrows the interval until it is narrow enough, it is cut at an
    end no allowed batch can pass, the budget is spent, the cell limit is reached or nothing is
    left to run."""
    c = search.cfg.convergence
    while True:
        runs = search.target_runs()
        state = interval_state(runs, search.rule, SEARCH_BOOTSTRAP_SAMPLES)
        stop = _stop_reason(search, state, runs, allowed)
        if not stop:
            candidates = candidate_cells(list(search.cells), allowed, list(c.seeds))
            cell, why, expected = choose_next(runs, search.rule, list(search.cells), candidates,
                                              prediction.b_crit, SEARCH_BOOTSTRAP_SAMPLES,
                                              cost=search.cell_cost())
            if cell is None:
                stop = why
        if stop:
            level = read_level(search.cfg.analysis, adaptive=True)
            search.record("stop", None, stop, interval_state(runs, search.rule,
                                                             SEARCH_BOOTSTRAP_SAMPLES, level),
                          prediction, read_at=level, narrowed=state.ratio)
            return
        pruning = search.run_cell(cell, search.prune_bound(cell, state))
        after = interval_state(search.target_runs(), search.rule, SEARCH_BOOTSTRAP_SAMPLES)
        search.record("refine", cell, why + pruning, after, prediction, expected)
