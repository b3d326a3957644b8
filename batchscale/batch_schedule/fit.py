"""From the branches to an answer: B_crit(t) per checkpoint (the S(B) fit and interval of
`analysis.critical`), how well the gradient noise scale tracks it, the step warm-up of the
batch it suggests with its predicted saving, and the check's paired comparison."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
import pandas as pd

from batchscale.analysis.critical import (
    BOOTSTRAP_CONFIDENCE,
    bootstrap_critical_batch,
    fit_critical_batch,
)
from batchscale.batch_schedule.measure import Stage
from batchscale.schemas import RunStatus
from batchscale.tdist import t_quantile

LEVEL = BOOTSTRAP_CONFIDENCE
"""Every interval here is at B_crit's level (90 %)."""
RANK_BOOTSTRAP_SAMPLES = 2000
MIN_RANK_POINTS = 3
RANK_INTERVAL_POINTS = 6
MAX_PERMUTATION_POINTS = 8
"""An exact permutation test enumerates n! orders: up to 8 checkpoints (40,320)."""


@dataclass(frozen=True)
class CheckpointFit:
    """B_crit at one checkpoint of the reference run, from its branches."""

    checkpoint_step: int
    examples: int
    val_loss: float
    milestone_loss: float
    b_crit: float
    b_crit_low: float
    b_crit_high: float
    bound: str
    """"above"/"below" `bound_batch` where the branches support only a bound; "" otherwise."""
    bound_batch: float
    reason: str
    s_min: float
    e_min: float
    b_simple: float
    """The gradient noise scale of the reference run at the checkpoint (its EMA)."""
    batches_reached: int

    def as_row(self) -> dict:
        return asdict(self)


def fit_checkpoint(step: int, rows: list[dict], curve_row: dict, rule: str, samples: int,
                   range_factor: float) -> CheckpointFit:
    """The S(B) fit of one checkpoint's branches (one run per batch: Fieller's interval)."""
    batch = np.array([r["batch_size"] for r in rows], dtype=float)
    steps = np.array([r["steps_to_milestone"] if r["reached"] else math.nan for r in rows],
                     dtype=float)
    fit = fit_critical_batch(batch, steps, range_factor=range_factor)
    runs = pd.DataFrame({"lr_rule": rule, "batch_size": batch.astype(int),
                         "lr": [r["lr"] for r in rows], "seed": 0, "steps_to_target": steps,
                         "status": [RunStatus.REACHED if r["reached"] else RunStatus.NOT_REACHED
                                    for r in rows]})
    low, high = bootstrap_critical_batch(runs, rule, samples, range_factor=range_factor)
    b_simple = curve_row.get("b_simple")
    return CheckpointFit(
        checkpoint_step=step, examples=int(curve_row["examples"]),
        val_loss=float(curve_row["val_loss"]), milestone_loss=float(rows[0]["milestone_loss"]),
        b_crit=fit.b_crit, b_crit_low=low, b_crit_high=high, bound=fit.bound,
        bound_batch=fit.bound_batch, reason=fit.reason, s_min=fit.s_min, e_min=fit.e_min,
        b_simple=math.nan if b_simple is None else float(b_simple),
        batches_reached=int(np.isfinite(steps).sum()))


# ------------------------------------------------------------------ does B_simple track it?


def tracking(fits: list[CheckpointFit], seed: int = 0) -> dict:
    """B_simple / B_crit per checkpoint with an interval (B_crit's interval mapped), their
    geometric mean with a Student-t interval on the log ratios, and Spearman's rank correlation
    over checkpoints with its exact one-sided permutation p-value (how often a random order of
    the checkpoints correlates as well), and a bootstrap interval over checkpoints from
    RANK_INTERVAL_POINTS on (with fewer, resamples tie so often that the interval would only
    repeat the estimate). None where too few checkpoints have both figures."""
    both = [f for f in fits if math.isfinite(f.b_crit) and math.isfinite(f.b_simple)
            and f.b_simple > 0]
    ratios = [{"checkpoint_step": f.checkpoint_step, "ratio": f.b_simple / f.b_crit,
               "low": f.b_simple / f.b_crit_high if f.b_crit_high > 0 else math.nan,
               "high": f.b_simple / f.b_crit_low if f.b_crit_low > 0 else math.inf}
              for f in both]
    result = {"ratios": ratios, "points": len(both), "ratio_mean": None, "rank": None}
    if len(both) >= 2:
        logs = np.log([r["ratio"] for r in ratios])
        half = t_quantile(0.5 + LEVEL / 2, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(
            len(logs))
        result["ratio_mean"] = tuple(float(math.exp(v)) for v in
                                     (logs.mean(), logs.mean() - half, logs.mean() + half))
    if len(both) >= MIN_RANK_POINTS:
        x = np.array([f.b_simple for f in both])
        y = np.array([f.b_crit for f in both])
        rho = _spearman(x, y)
        low = high = math.nan
        if len(both) >= RANK_INTERVAL_POINTS:
            rng = np.random.default_rng(seed)
            draws = np.array([_spearman(x[i], y[i]) for i in
                              rng.integers(0, len(x), (RANK_BOOTSTRAP_SAMPLES, len(x)))])
            draws = draws[np.isfinite(draws)]
            tail = (1 - LEVEL) / 2
            low, high = (float(q) for q in np.quantile(draws, [tail, 1 - tail]))
        result["rank"] = (rho, low, high, _permutation_p(x, y, rho))
    return result


def _permutation_p(x: np.ndarray, y: np.ndarray, rho: float, seed: int = 0) -> float:
    """Share of orders of y whose rank correlation with x is at least `rho`: all orders up to
    MAX_PERMUTATION_POINTS checkpoints, else RANK_BOOTSTRAP_SAMPLES random ones."""
    import itertools

    if len(y) <= MAX_PERMUTATION_POINTS:
        orders = itertools.permutations(range(len(y)))
    else:
        rng = np.random.default_rng(seed)
        orders = (rng.permutation(len(y)) for _ in range(RANK_BOOTSTRAP_SAMPLES))
    values = [_spearman(x, y[list(order)]) for order in orders]
    return float(np.mean([v >= rho - 1e-12 for v in values if math.isfinite(v)]))


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


# ----------------------------------------------------------------------------- the schedule


def plan_schedule(fits: list[CheckpointFit], base_batch: int,
                  batch_sizes: list[int]) -> list[Stage]:
    """A step warm-up of the batch: from each checkpoint on, the largest measured batch not
    above that checkpoint's B_crit (so the batch doubles once B_crit passes twice the batch;
    where B_crit is only bounded above the largest batch, that bound), never smaller than
    before; a checkpoint with B_crit below its batches or without a fit changes nothing. A
    stage starts where the validation loss reaches the reference's loss at that checkpoint.
    At B = B_crit a run takes twice the fewest steps and twice the fewest examples (McCandlish
    et al.'s balance point); past it, examples buy few steps."""
    stages, current = [], base_batch
    for fit in sorted(fits, key=lambda f: f.checkpoint_step):
        usable = fit.b_crit if math.isfinite(fit.b_crit) else (
            fit.bound_batch if fit.bound == "above" else math.nan)
        if not math.isfinite(usable):
            continue
        choice = max((b for b in batch_sizes if b <= usable), default=base_batch)
        if choice > current:
            stages.append(Stage(from_loss=fit.val_loss, batch_size=choice))
            current = choice
    return stages


def step_ratio(b_crit: float, batch: int, base_batch: int) -> float:
    """S(batch) / S(base_batch) under S = S_min (1 + B_crit/B)."""
    if math.isinf(b_crit):
        return base_batch / batch
    return (1 + b_crit / batch) / (1 + b_crit / base_batch)


def predicted(fits: list[CheckpointFit], stages: list[Stage], base_batch: int,
              reference_steps: float) -> dict:
    """The schedule's steps and examples to the target predicted from the fits: the reference's
    steps in each stage's stretch (from its checkpoint to the next stage's, the last to the
    reference's steps to target) times S(b)/S(B0) at the B_crit that chose the stage, with the
    range from that B_crit's interval (a bound: up to 1/B scaling)."""
    by_loss = {f.val_loss: f for f in fits}
    starts = [by_loss[s.from_loss].checkpoint_step for s in stages] + [reference_steps]
    steps = [starts[0] if stages else reference_steps] * 3
    examples = [steps[0] * base_batch] * 3
    for stage, begin, end in zip(stages, starts, starts[1:], strict=False):
        fit = by_loss[stage.from_loss]
        span = max(0.0, end - begin)
        ends = ((fit.b_crit, fit.b_crit_low, fit.b_crit_high) if math.isfinite(fit.b_crit)
                else (fit.bound_batch, fit.bound_batch, math.inf))
        for i, b_crit in enumerate(ends):
            b_crit = ends[0] if math.isnan(b_crit) else b_crit  # no interval: the estimate
            value = span * step_ratio(b_crit, stage.batch_size, base_batch)
            steps[i] += value
            examples[i] += value * stage.batch_size
    # index 0: the estimate; a larger B_crit (index 2) saves more steps.
    return {"steps": steps[0], "steps_low": steps[2], "steps_high": steps[1],
            "examples": examples[0], "examples_low": examples[2],
            "examples_high": examples[1], "reference_steps": reference_steps,
            "reference_examples": reference_steps * base_batch}


# ------------------------------------------------------------------------------ the check


def paired_ratio(scheduled: list[float], constant: list[float]) -> tuple[float, float, float]:
    """Geometric mean of scheduled/constant over paired seeds with a Student-t interval on the
    log ratios (NaN, NaN interval from one pair)."""
    logs = np.log(np.asarray(scheduled, dtype=float) / np.asarray(constant, dtype=float))
    mean = float(logs.mean())
    if logs.size < 2:
        return math.exp(mean), math.nan, math.nan
    half = t_quantile(0.5 + LEVEL / 2, logs.size - 1) * logs.std(ddof=1) / math.sqrt(logs.size)
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    v = np.asarray(values, dtype=float)
    if v.size < 2:
        return float(v.mean()), math.nan, math.nan
    half = t_quantile(0.5 + LEVEL / 2, v.size - 1) * v.std(ddof=1) / math.sqrt(v.size)
    return float(v.mean()), float(v.mean() - half), float(v.mean() + half)


def check_summary(rows: list[dict]) -> dict:
    """The check over seeds where both runs reached the target: paired ratios of steps,
    examples and training time (scheduled / constant), and each schedule's final loss."""
    by = {(r["schedule"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows})
    pairs = [(by[("scheduled", s)], by[("constant", s)]) for s in seeds
             if ("scheduled", s) in by and ("constant", s) in by
             and by[("scheduled", s)]["reached"] and by[("constant", s)]["reached"]]
    summary = {"seeds": len(seeds), "paired": len(pairs)}
    if not pairs:
        return summary
    for key in ("steps_to_target", "examples_to_target", "train_time_s_to_target"):
        summary[key] = paired_ratio([a[key] for a, _ in pairs], [b[key] for _, b in pairs])
    for name, index in (("scheduled", 0), ("constant", 1)):
        summary[f"{name}_final_val_loss"] = mean_interval([p[index]["final_val_loss"]
                                                           for p in pairs])
        summary[f"{name}_steps"] = mean_interval([p[index]["steps_to_target"] for p in pairs])
    return summary
