"""The `study:` section: one experiment fanned out over variants (docs/architecture.md,
"Studies"). This module holds the section's model and the axis names; expanding a config into
its variants' configs is `variants.py` (it needs the whole experiment model)."""

from __future__ import annotations

import difflib
from typing import Annotated

from pydantic import Field, field_validator, model_validator

from batchscale.config.fields import _Strict

AxisValue = bool | int | float | Annotated[str, Field(max_length=200)]
"""One value of an axis: what the config key it sets accepts."""

AXIS_ALIASES = {
    "dataset_fraction": "dataset.train_fraction",
    "label_noise": "dataset.train_label_noise",
    "model": "workload",
}
"""Short axis names and the config key each sets; any other axis is a config key itself."""

AXIS_TAGS = {"dataset_fraction": "fraction", "label_noise": "noise", "model": "",
             "workload": ""}
"""How an axis shows in a variant's name ("fraction0.25"); a config key shows as its last part
("base_lr0.1"); a model by its name alone."""

NOT_AN_AXIS = ("name", "study", "variant", "kubernetes", "publish")
"""Config keys a study may not vary: its identity, and where and how it runs and publishes."""

MAX_VARIANTS = 64
"""Variants a study may have: each is a whole pipeline run."""


class StudyConfig(_Strict):
    """Variants of the experiment, compared in one report (`batchscale study`)."""

    axes: Annotated[dict[str, list[AxisValue]], Field(max_length=8)] = {}
    """Named axes, each a list of values; the study runs every combination (the Cartesian
    product) unless `variants` lists them. An axis is a config key ("dataset.synthetic_noise",
    "workload", "convergence.base_lr") or a short name: dataset_fraction
    (dataset.train_fraction), label_noise (dataset.train_label_noise), model (workload). Empty:
    a single run, not a study."""
    variants: Annotated[list[dict[str, AxisValue]], Field(max_length=MAX_VARIANTS)] | None = None
    """An explicit list of variants instead of the product: each maps axes to one of their
    values; an axis it leaves out keeps the base config's value. null: the product."""

    @field_validator("axes")
    @classmethod
    def _axes_have_values(cls, axes: dict[str, list]) -> dict[str, list]:
        for axis, values in axes.items():
            if not values:
                raise ValueError(f"axis {axis!r} has no values")
            if len({repr(v) for v in values}) != len(values):
                raise ValueError(f"axis {axis!r} repeats a value: {values}")
            if len(values) > MAX_VARIANTS:
                raise ValueError(f"axis {axis!r} has {len(values)} values; at most "
                                 f"{MAX_VARIANTS}")
        return axes

    @model_validator(mode="after")
    def _variants_use_the_axes(self) -> StudyConfig:
        if self.variants is None:
            return self
        if not self.axes:
            raise ValueError("variants: name the axes they set under `axes`")
        for index, variant in enumerate(self.variants):
            for axis, value in variant.items():
                if axis not in self.axes:
                    close = difflib.get_close_matches(axis, list(self.axes), n=1)
                    hint = f" (did you mean {close[0]!r}?)" if close else ""
                    raise ValueError(f"variants.{index}: {axis!r} is not an axis{hint}; axes: "
                                     f"{', '.join(self.axes)}")
                if value not in self.axes[axis]:
                    raise ValueError(f"variants.{index}: {axis} {value!r} is not one of the "
                                     f"axis's values {self.axes[axis]}")
        return self

    @property
    def is_study(self) -> bool:
        return bool(self.axes)


def axis_key(axis: str) -> str:
    """The config key an axis sets (its alias resolved)."""
    return AXIS_ALIASES.get(axis, axis)


def axis_tag(axis: str) -> str:
    return AXIS_TAGS.get(axis, axis_key(axis).rsplit(".", 1)[-1])
