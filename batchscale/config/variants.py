"""A study's variants: each a whole experiment config, the base with some keys set (see
`study.py` for the section). Every variant runs through the same stages as a single run; the
`variant` key names it in every row it produces (docs/architecture.md, "Studies")."""

from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import dataclass

from pydantic import ValidationError

from batchscale import names
from batchscale.config.study import MAX_VARIANTS, NOT_AN_AXIS, axis_key, axis_tag
from batchscale.errors import BadInput

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
RUN_ID_SEPARATOR = "-"
"""Between the study id and the variant's name in the variant's run id."""


@dataclass(frozen=True)
class Variant:
    name: str
    """Safe as a path segment: it ends the variant's run id and is the rows' `variant`."""
    values: dict[str, object]
    """Axis → the value this variant takes (the base config's where the variant left it out)."""
    config: object
    """The variant's own ExperimentConfig (its `study` section empty, `variant` set)."""


def variant_run_id(study_id: str, variant: str) -> str:
    return names.check_run_id(f"{study_id}{RUN_ID_SEPARATOR}{variant}")


def study_id_of(run_id: str, variant: str | None) -> str | None:
    """The study a variant's run belongs to: its run id less the variant's name; None for a run
    that is no variant."""
    suffix = f"{RUN_ID_SEPARATOR}{variant}"
    if variant is None or not run_id.endswith(suffix):
        return None
    return run_id[: -len(suffix)]


def sorted_axes(cfg) -> dict[str, list]:
    """The study's axes by name: the config's JSON form (its hash, what a cluster's components
    and the comparison read) sorts keys, so every order the code relies on is this one."""
    return dict(sorted(cfg.study.axes.items()))


def _settings(cfg) -> list[dict[str, object]]:
    """Each variant's axis values, in the order they run: the product of the axes (by name),
    or the explicit list with the base config's values filled in."""
    axes = sorted_axes(cfg)
    if cfg.study.variants is None:
        return [dict(zip(axes, combo, strict=True)) for combo in itertools.product(*axes.values())]
    base = cfg.model_dump(mode="json")
    return [{axis: variant.get(axis, _get(base, axis_key(axis))) for axis in axes}
            for variant in cfg.study.variants]


def _get(data: dict, key: str) -> object:
    for part in key.split("."):
        data = data[part]
    return data


def _set(data: dict, key: str, value: object) -> None:
    *parents, last = key.split(".")
    for part in parents:
        data = data[part]
    data[last] = value


def _check_key(cfg, axis: str) -> None:
    key = axis_key(axis)
    data = cfg.model_dump(mode="json")
    try:
        found = _get(data, key)
    except (KeyError, TypeError):
        found = None
        known = False
    else:
        known = True
    if not known or key.split(".")[0] in NOT_AN_AXIS or isinstance(found, dict):
        raise BadInput(f"study.axes: {axis!r} is not a config key a study can vary"
                       f"{_nearest_key(data, key)}; use a key such as dataset.synthetic_noise, "
                       "workload or convergence.base_lr, or dataset_fraction, label_noise, model")


def _nearest_key(data: dict, key: str) -> str:
    """" (did you mean 'convergence.base_lr'?)" for a misspelled key of a config section."""
    section, _, rest = key.rpartition(".")
    try:
        names = list(_get(data, section)) if section else list(data)
    except (KeyError, TypeError):
        return ""
    close = difflib.get_close_matches(rest, [str(n) for n in names], n=1)
    return f" (did you mean {(section + '.' if section else '') + close[0]!r}?)" if close else ""


def _name(values: dict[str, object]) -> str:
    parts = [f"{axis_tag(axis)}{value:g}" if isinstance(value, float) and not isinstance(
        value, bool) else f"{axis_tag(axis)}{value}" for axis, value in values.items()]
    return _UNSAFE.sub("_", "_".join(parts)).strip("._-") or "variant"


def expand(cfg) -> list[Variant]:
    """The variants of a study config, each validated as a whole experiment; BadInput naming
    the variant and the problem when one is not valid. A config that is no study: []."""
    from batchscale.config.models import ExperimentConfig

    if not cfg.study.is_study:
        return []
    for axis in cfg.study.axes:
        _check_key(cfg, axis)
    keys = [axis_key(axis) for axis in cfg.study.axes]
    if len(set(keys)) < len(keys):
        raise BadInput(f"study.axes: two axes set the same config key ({', '.join(keys)}); a "
                       "short name and its key (dataset_fraction and dataset.train_fraction, "
                       "model and workload) are one axis")
    settings = _settings(cfg)
    repeated = [i for i, values in enumerate(settings) if values in settings[:i]]
    if repeated:
        raise BadInput(f"study.variants.{repeated[0]} repeats an earlier variant: "
                       f"{settings[repeated[0]]}")
    if len(settings) > MAX_VARIANTS:
        raise BadInput(f"study: {len(settings)} variants; at most {MAX_VARIANTS} (list fewer "
                       "under study.variants)")
    named = [_name(values) for values in settings]
    if len(set(named)) < len(named) or any(len(n) > 64 or ".." in n for n in named):
        named = [f"v{index:02d}" for index in range(len(settings))]
    variants = []
    for name, values in zip(named, settings, strict=True):
        data = cfg.model_dump(mode="json")
        for axis, value in values.items():
            _set(data, axis_key(axis), value)
        data["study"], data["variant"] = {}, name
        try:
            variant_cfg = ExperimentConfig.model_validate(data)
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}"
                                 for e in err.errors())
            raise BadInput(f"study variant {name} ({values}): {problems}") from None
        # The value as the config holds it ("1e-3" read as text becomes 0.001), so the slope
        # fit sees a number and two spellings of one value are one variant.
        dumped = variant_cfg.model_dump(mode="json")
        values = {axis: _get(dumped, axis_key(axis)) for axis in values}
        variants.append(Variant(name, values, variant_cfg))
    same = [v.name for i, v in enumerate(variants)
            if any(v.values == w.values for w in variants[:i])]
    if same:
        raise BadInput(f"study: variant {same[0]} repeats an earlier one once its values are "
                       "read as the config reads them; list each value once")
    return variants
