"""The check's statistics, from the `schedule_check` table: the scheduled run against the
constant run at B0 (where it starts: the steps it must save) and against a constant run at its
own last batch (`FINAL_CONSTANT`: the examples it must save), paired by seed, as geometric
means of the per-seed ratios with Student-t intervals on their logs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from batchscale.analysis.critical import BOOTSTRAP_CONFIDENCE
from batchscale.tdist import t_quantile

LEVEL = BOOTSTRAP_CONFIDENCE
"""Every interval here is at B_crit's level (90 %)."""
FINAL_CONSTANT = "constant_final"
"""The `schedule` of a check run at the schedule's last batch from its first step."""
RATIO_KEYS = ("steps_to_target", "examples_to_target", "train_time_s_to_target")


def t_interval(values: np.ndarray) -> tuple[float, float, float]:
    mean = float(values.mean())
    if values.size < 2:
        return mean, math.nan, math.nan
    half = (t_quantile(0.5 + LEVEL / 2, values.size - 1) * values.std(ddof=1)
            / math.sqrt(values.size))
    return mean, mean - half, mean + half


def paired_ratio(scheduled, constant) -> tuple[float, float, float]:
    """Geometric mean of scheduled/constant over paired seeds with a Student-t interval on the
    log ratios (NaN interval from one pair)."""
    return geometric_interval(np.asarray(scheduled, dtype=float)
                              / np.asarray(constant, dtype=float))


def geometric_interval(values) -> tuple[float, float, float]:
    """Geometric mean of positive figures (steps, a loss) with a Student-t interval on their
    logs: the ends stay positive, as the figures are."""
    return tuple(math.exp(v) if math.isfinite(v) else math.nan
                 for v in t_interval(np.log(np.asarray(values, dtype=float))))


def check_summary(check: pd.DataFrame) -> dict:
    """The check over seeds where both runs reached the target: paired ratios (scheduled /
    constant) of steps, examples and training time, each schedule's steps and loss at the stop;
    and, where the table has them, the same against the constant runs at the last batch
    (`final`: None where none ran)."""
    rows = check.to_dict("records")
    by = {(r["schedule"], r["seed"]): r for r in rows}
    seeds = sorted({r["seed"] for r in rows if r["schedule"] == "scheduled"})
    pairs = _pairs(by, seeds, "constant")
    summary = {"seeds": len(seeds), "paired": len(pairs),
               "diverged": sum(bool(r["diverged"]) for r in rows
                               if r["schedule"] != FINAL_CONSTANT),
               "final": final_summary(by, seeds)}
    if not pairs:
        return summary
    summary.update(_ratios(pairs))
    for name, index in (("scheduled", 0), ("constant", 1)):
        summary[f"{name}_final_val_loss"] = geometric_interval([p[index]["final_val_loss"]
                                                                for p in pairs])
        summary[f"{name}_steps"] = geometric_interval([p[index]["steps_to_target"]
                                                       for p in pairs])
    return summary


def final_summary(by: dict, seeds: list) -> dict | None:
    """The scheduled runs against the constant runs at their last batch: the batch, the runs
    there, how many reached the target (and diverged), and the paired ratios over the seeds
    where both reached."""
    finals = [by[(FINAL_CONSTANT, s)] for s in seeds if (FINAL_CONSTANT, s) in by]
    if not finals:
        return None
    batch = int(str(finals[0]["batch_sizes"]).split(">")[0])
    pairs = _pairs(by, seeds, FINAL_CONSTANT)
    return {"batch_size": batch, "runs": len(finals),
            "reached": sum(bool(r["reached"]) for r in finals),
            "diverged": sum(bool(r["diverged"]) for r in finals),
            "paired": len(pairs), **(_ratios(pairs) if pairs else {})}


def _pairs(by: dict, seeds: list, other: str) -> list[tuple[dict, dict]]:
    return [(by[("scheduled", s)], by[(other, s)]) for s in seeds
            if (other, s) in by and by[("scheduled", s)]["reached"] and by[(other, s)]["reached"]]


def _ratios(pairs: list[tuple[dict, dict]]) -> dict:
    return {key: paired_ratio([a[key] for a, _ in pairs], [b[key] for _, b in pairs])
            for key in RATIO_KEYS}


def ranged(values, digits: str = ".3g", said: bool = False) -> str:
    """"1.2 [1.0, 1.4]"; without an interval, the value and why (or the value alone where the
    sentence has `said` why once)."""
    value, low, high = values
    if not math.isfinite(low):
        return f"{value:{digits}}" if said else f"{value:{digits}} (one seed: no interval)"
    return f"{value:{digits}} [{low:{digits}}, {high:{digits}}]"


def ends(ratio: tuple) -> tuple[float, float]:
    """A ratio's (low, high) ends: its interval, or the ratio itself from one seed."""
    value, low, high = ratio
    return (low, high) if math.isfinite(low) else (value, value)


def shown_better_than_final(final: dict | None) -> bool:
    """Whether the schedule is shown (whole interval below 1) to need fewer steps or fewer
    examples than the constant run at its last batch; True where no such runs were paired."""
    if not final or not final["paired"]:
        return True
    return (ends(final["steps_to_target"])[1] < 1
            or ends(final["examples_to_target"])[1] < 1)


def final_dominates(final: dict | None) -> bool:
    """Whether the constant run at the schedule's last batch is shown to need fewer steps while
    the schedule is not shown to need fewer examples (by the ratios' intervals; the ratios
    alone from one seed): the schedule is then no answer to take."""
    if not final or not final["paired"]:
        return False
    steps, examples = ends(final["steps_to_target"]), ends(final["examples_to_target"])
    return steps[0] > 1 and examples[1] >= 1
