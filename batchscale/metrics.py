"""The metrics a convergence trial can be trained to, and which way is better for each.

A target is a metric and a value: `val_accuracy >= 0.95`, `val_loss <= 0.3`. Each metric knows
its direction, so "reached" means the same thing everywhere (the trainer, the analysis, the
checks). Validation metrics are computed on the whole validation split; `train_loss` on a fixed
training subset (`convergence.train_eval_rows`, the first rows of the training split), never on
the running average of the batches seen, which lags the model and mixes learning rates
(docs/architecture.md, "Targets").

Each task evaluates some of them (`TASK_METRICS`); a target the workload cannot evaluate is
refused when the config is read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Metric:
    """One metric: its column name in `curves`, its direction and what it measures."""

    name: str
    higher_is_better: bool
    meaning: str

    def reached(self, value: float | None, target: float) -> bool:
        """Whether `value` meets `target` (a missing or non-finite value never does)."""
        if value is None or not math.isfinite(value):
            return False
        return value >= target if self.higher_is_better else value <= target

    def improved(self, value: float | None, best: float | None) -> bool:
        """Whether `value` is better than `best` (None: nothing yet)."""
        if value is None or not math.isfinite(value):
            return False
        if best is None:
            return True
        return value > best if self.higher_is_better else value < best

    def harder(self, a: float, b: float) -> bool:
        """Whether target value `a` is harder to reach than `b`."""
        return a > b if self.higher_is_better else a < b

    @property
    def comparison(self) -> str:
        return ">=" if self.higher_is_better else "<="


METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("val_accuracy", True, "share of validation examples classified right"),
    Metric("val_loss", False, "mean validation loss (nats per example, token or pixel)"),
    Metric("val_perplexity", False, "exp(val_loss) of a language model, per token"),
    Metric("val_miou", True, "mean intersection-over-union of the validation masks' classes"),
    Metric("val_pixel_accuracy", True, "share of validation pixels classified right"),
    Metric("val_map50", True, "detection: mean average precision at IoU 0.5 over the classes "
                              "(all-point interpolation)"),
    Metric("train_loss", False, "mean loss on a fixed training subset (train_eval_rows)"),
)}
METRIC_NAMES = tuple(METRICS)

# Which metrics each kind of task evaluates (the validation ones come from its `evaluate`, the
# trainer adds train_loss from the same function on the training subset).
TASK_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("val_accuracy", "val_loss", "train_loss"),
    "language_model": ("val_loss", "val_perplexity", "train_loss"),
    "segmentation": ("val_miou", "val_pixel_accuracy", "val_loss", "train_loss"),
    "detection": ("val_loss", "val_map50", "train_loss"),
}


# Each kind of built-in workload owns its default target (a workload's, not the config's): used
# when a config names none. Values from the example configs of batchscale/configs.
TASK_DEFAULT_TARGETS: dict[str, tuple[str, float]] = {
    "classification": ("val_accuracy", 0.95),
    "language_model": ("val_loss", 2.6),
    "segmentation": ("val_miou", 0.5),
    "detection": ("val_loss", 1.5),
}


def metric(name: str) -> Metric:
    """The metric called `name`; KeyError names the allowed ones."""
    try:
        return METRICS[name]
    except KeyError:
        raise KeyError(f"unknown metric {name!r}; allowed: {', '.join(METRIC_NAMES)}") from None


def target_label(name: str, value: float) -> str:
    """A target as people write it: 'val_accuracy >= 0.95'."""
    return f"{name} {metric(name).comparison} {value:g}"
