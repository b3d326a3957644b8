"""The findings of a batch-schedule measurement, read from its two tables
(`critical_over_training`, `schedule_check`): B_simple against B_crit over the checkpoints (a
rank correlation with its interval and a permutation test), the schedule's stages, the
prediction, the check's summary and the cost. `section.py` says them in words.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from batchscale.batch_schedule.check import (
    LEVEL,
    check_summary,
    shown_better_than_final,
    t_interval,
)
from batchscale.conditions import shares_apart
from batchscale.config import AnalysisConfig

STEP_GOAL = 0.25
"""The schedule is worth taking when it needs at least this share fewer optimizer steps."""
MIN_RANK_POINTS = 3
RANK_INTERVAL_POINTS = 6
"""A bootstrap interval of the rank correlation from this many checkpoints on: resamples of
fewer tie so often that the interval would only repeat the estimate."""
RANK_SAMPLES = 2000
MAX_PERMUTATION_POINTS = 8
"""An exact permutation test enumerates n! orders: up to 8 checkpoints (40,320)."""
DEFAULT_MAX_CPU_WAIT_SHARE = AnalysisConfig.model_fields["max_cpu_wait_share"].default


# ------------------------------------------------------------------------------ statistics


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    rx, ry = pd.Series(x).rank().to_numpy(), pd.Series(y).rank().to_numpy()
    if rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def _permutation_p(x: np.ndarray, y: np.ndarray, rho: float, seed: int = 0) -> float:
    """Share of orders of y whose rank correlation with x is at least `rho`: all orders up to
    MAX_PERMUTATION_POINTS checkpoints, else RANK_SAMPLES random ones."""
    if len(y) <= MAX_PERMUTATION_POINTS:
        orders = itertools.permutations(range(len(y)))
    else:
        rng = np.random.default_rng(seed)
        orders = (rng.permutation(len(y)) for _ in range(RANK_SAMPLES))
    values = [_spearman(x, y[list(order)]) for order in orders]
    return float(np.mean([v >= rho - 1e-12 for v in values if math.isfinite(v)]))


def tracking(crit: pd.DataFrame, seed: int = 0) -> dict:
    """B_simple / B_crit per checkpoint (B_crit's interval mapped), their geometric mean with a
    Student-t interval on the log ratios, and Spearman's rank correlation over checkpoints with
    its permutation p-value (how often a random order of the checkpoints correlates as well)
    and, from RANK_INTERVAL_POINTS checkpoints on, a bootstrap interval."""
    both = crit[np.isfinite(crit["b_crit"]) & np.isfinite(crit["b_simple"])
                & (crit["b_simple"] > 0)]
    result = {"points": len(both), "ratio_mean": None, "rank": None}
    if len(both) >= 2:
        logs = np.log(both["b_simple"].to_numpy() / both["b_crit"].to_numpy())
        result["ratio_mean"] = tuple(math.exp(v) for v in t_interval(logs))
    if len(both) >= MIN_RANK_POINTS:
        x, y = both["b_simple"].to_numpy(), both["b_crit"].to_numpy()
        rho, low, high = _spearman(x, y), math.nan, math.nan
        if len(both) >= RANK_INTERVAL_POINTS:
            rng = np.random.default_rng(seed)
            draws = np.array([_spearman(x[i], y[i]) for i in
                              rng.integers(0, len(x), (RANK_SAMPLES, len(x)))])
            tail = (1 - LEVEL) / 2
            low, high = (float(q) for q in np.quantile(draws[np.isfinite(draws)],
                                                       [tail, 1 - tail]))
        result["rank"] = (rho, low, high, _permutation_p(x, y, rho))
    return result


# ------------------------------------------------------------------------------- findings


@dataclass
class Findings:
    """Everything the texts say, from the two tables."""

    crit: pd.DataFrame
    check: pd.DataFrame
    base_batch: int
    rule: str
    target: str
    tracking: dict = field(default_factory=dict)
    summary: dict = field(default_factory=dict)
    max_cpu_wait_share: float | None = DEFAULT_MAX_CPU_WAIT_SHARE
    """Above this CPU wait share (analysis.max_cpu_wait_share) the seconds are not trusted."""

    @classmethod
    def from_tables(cls, crit: pd.DataFrame, check: pd.DataFrame,
                    max_cpu_wait_share: float | None = DEFAULT_MAX_CPU_WAIT_SHARE) -> Findings:
        crit = crit.sort_values("checkpoint_step").reset_index(drop=True)
        first = check.iloc[0]
        return cls(crit=crit, check=check, base_batch=int(first["base_batch_size"]),
                   rule=str(first["lr_rule"]),
                   target=f"{first['target_metric']} {first['target_value']:g}",
                   tracking=tracking(crit), summary=check_summary(check),
                   max_cpu_wait_share=max_cpu_wait_share)

    def timing_flag(self) -> str:
        """" (seconds NOT TRUSTED: ...)" when a run waited for a CPU beyond the limit, else
        "": the device-second figures are then the machine's load, not the device's."""
        shares = pd.concat([self.crit.get("cpu_wait_share", pd.Series(dtype=float)),
                            self.check.get("cpu_wait_share", pd.Series(dtype=float))])
        worst = pd.to_numeric(shares, errors="coerce").max()
        limit = self.max_cpu_wait_share
        if limit is None or not math.isfinite(worst) or worst <= limit:
            return ""
        worst_text, limit_text = shares_apart(worst, limit)
        return (f" (seconds NOT TRUSTED: a run waited for a CPU {worst_text} of its runnable "
                f"time, above analysis.max_cpu_wait_share {limit_text})")

    @property
    def stages(self) -> list[tuple[float, int]]:
        """(from val_loss, batch) where the scheduled batch grows."""
        stages, batch = [], self.base_batch
        for row in self.crit.itertuples():
            if row.scheduled_batch_size > batch:
                batch = int(row.scheduled_batch_size)
                stages.append((float(row.val_loss), batch))
        return stages

    @property
    def prediction(self) -> dict | None:
        rows = self.check[(self.check["schedule"] == "scheduled")
                          & np.isfinite(self.check["predicted_steps"].astype(float))]
        return None if rows.empty else rows.iloc[0].to_dict()

    @property
    def reference(self) -> dict:
        return self.check[self.check["reference"]].iloc[0].to_dict()

    @property
    def wins(self) -> bool:
        """The check shows the schedule needs fewer steps than the constant B0 (the interval's
        top below 1) and, where the constant last batch ran beside it, fewer steps or fewer
        examples than that simpler answer too."""
        steps = self.summary.get("steps_to_target")
        return (bool(steps) and math.isfinite(steps[2]) and steps[2] < 1
                and shown_better_than_final(self.summary.get("final")))

    def peak_lrs(self) -> dict[int, float]:
        """The learning rate each batch of the schedule trains at (the LR rule's peak), where
        the table records it (not in rows written before layout 10)."""
        lrs = {}
        for column, batches in (("base_batch_lr", self.crit["base_batch_size"]),
                                ("scheduled_lr", self.crit["scheduled_batch_size"])):
            if column not in self.crit:
                continue
            values = pd.to_numeric(self.crit[column], errors="coerce")
            lrs.update({int(b): float(v) for b, v in zip(batches, values, strict=True)
                        if math.isfinite(v)})
        return lrs

    def schedule_text(self) -> str:
        lrs = self.peak_lrs()

        def at(batch: int) -> str:
            return f" at LR {lrs[batch]:.3g}" if batch in lrs else ""

        if not self.stages:
            return f"constant {self.base_batch}{at(self.base_batch)}"
        return f"{self.base_batch}{at(self.base_batch)}" + "".join(
            f", {b} from val_loss {loss:.3f}{at(b)}" for loss, b in self.stages)

    def cost_s(self) -> dict:
        others = self.check[~self.check["reference"]]
        return {"reference": float(self.reference["device_s"]),
                "branches": float(self.crit["branch_device_s"].sum()),
                "check": float(others["device_s"].sum())}
