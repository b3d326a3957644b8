"""The suites, `batchscale/expectations/<kind>.json`, and what their `meta` declares around the
great-expectations expectations:

- `parameters`: values substituted into `$PARAMETER` placeholders, taken from the caller's
  context or, when absent, derived from the table (recorded in the report so that a trivial pass
  is visible);
- `context`: other accepted context keys (cross-table inputs such as the curves table);
- `derived_columns`: scalar columns computed from list columns (GX handles lists poorly);
- `nan_allowed`: float columns where NaN has a meaning (column -> what it means, e.g. not
  measured); every other float column must be finite where present (rules.finite_values);
- `finite_checked_elsewhere`: float columns whose NaN/inf rule is another check (column -> which);
- `python_checks`: rules run in Python (see rules.py), reported beside GX's results.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from batchscale import schemas
from batchscale.config import SweepConfig
from batchscale.errors import BadInput

SUITES_DIR = Path(__file__).parents[1] / "expectations"  # batchscale/expectations


@functools.cache
def load_suite(kind: str) -> dict:
    """The suite JSON of `kind` (BadInput for an unknown kind)."""
    schemas.schema_for(kind)
    return json.loads((SUITES_DIR / f"{kind}.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------- context


def checked_context(kind: str, suite: dict, context: dict) -> dict:
    """Refuse context keys the suite does not use, so a wiring mistake is not silently ignored."""
    allowed = {**suite["meta"]["parameters"], **suite["meta"]["context"]}
    unknown = sorted(set(context) - set(allowed))
    if unknown:
        raise BadInput(
            f"validate {kind}: unknown context keys {unknown}; allowed: {sorted(allowed) or 'none'}"
        )
    for key, value in context.items():
        CONTEXT_TYPES[key](kind, key, value)
    return context


def _positive_int(kind: str, key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BadInput(f"validate {kind}: context {key} must be a positive integer, got {value!r}")


def _positive_int_list(kind: str, key: str, value: Any) -> None:
    if not isinstance(value, list | tuple) or not value:
        raise BadInput(f"validate {kind}: context {key} must be a non-empty list, got {value!r}")
    for item in value:
        _positive_int(kind, key, item)


def _arrow_table(kind: str, key: str, value: Any) -> None:
    if not isinstance(value, pa.Table):
        raise BadInput(f"validate {kind}: context {key} must be a pyarrow Table")


def _share(kind: str, key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise BadInput(f"validate {kind}: context {key} must be a number from 0 to 1, "
                       f"got {value!r}")


def _str_dict(kind: str, key: str, value: Any) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadInput(f"validate {kind}: context {key} must be a dict of str to str")


def _bool(kind: str, key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise BadInput(f"validate {kind}: context {key} must be true or false, got {value!r}")


CONTEXT_TYPES: dict[str, Callable[[str, str, Any], None]] = {
    "num_classes": _positive_int,
    "feature_length": _positive_int,
    "batch_sizes": _positive_int_list,
    "curves": _arrow_table,
    "shard_checksums": _str_dict,
    "max_unstable_share": _share,
    "unstable_fails": _bool,
    "dense_targets": _bool,
}


# ---------------------------------------------------------------- parameters


def resolve_parameters(declared: dict, context: dict, df: pd.DataFrame) -> dict:
    """Each suite parameter's value, from context or else its default: derived from the data,
    or the config's default for a setting (CONFIG_DEFAULT_PARAMETERS)."""
    out = {}
    for name in declared:
        if name in context:
            value = context[name]
            out[name] = {"value": list(value) if isinstance(value, tuple) else value,
                         "source": "context"}
        else:
            source = "config default" if name in CONFIG_DEFAULT_PARAMETERS else "table"
            out[name] = {"value": PARAMETER_DEFAULTS[name](df), "source": source}
    return out


def _default_num_classes(df: pd.DataFrame) -> int:
    labels = df["label"].dropna()
    return int(labels.max()) + 1 if len(labels) else 1


def _default_feature_length(df: pd.DataFrame) -> int:
    lengths = df["features_len"].dropna()
    return int(lengths.mode().iloc[0]) if len(lengths) else 0


def _default_batch_sizes(df: pd.DataFrame) -> list[int]:
    return sorted(int(b) for b in df["batch_size"].dropna().unique())


def _config_default(model: type, field: str) -> Callable[[pd.DataFrame], Any]:
    """A setting's default from the config model (defined once there), whatever the table."""
    return lambda df: model.model_fields[field].default


CONFIG_DEFAULT_PARAMETERS = {"max_unstable_share": (SweepConfig, "max_unstable_share"),
                             "unstable_fails": (SweepConfig, "unstable_fails")}
"""Parameters that are settings: without context (`batchscale validate` on a file), the
config's default applies."""
PARAMETER_DEFAULTS: dict[str, Callable[[pd.DataFrame], Any]] = {
    "num_classes": _default_num_classes,
    "feature_length": _default_feature_length,
    "batch_sizes": _default_batch_sizes,
    **{name: _config_default(*where) for name, where in CONFIG_DEFAULT_PARAMETERS.items()},
}


# ---------------------------------------------------------------- derived columns


def validation_frame(table: pa.Table, derived: dict) -> pd.DataFrame:
    """The dataframe GX validates: scalar columns as they are, list columns replaced by helpers."""
    scalar = [f.name for f in table.schema if not pa.types.is_list(f.type)]
    df = table.select(scalar).to_pandas()
    for name in derived:
        df[name] = DERIVED_COLUMNS[name](table).to_pandas()
    return df


def _list_len(column: str) -> Callable[[pa.Table], pa.Array]:
    return lambda t: pc.list_value_length(t.column(column).combine_chunks())


def _list_reduce(column: str, reduce: Callable) -> Callable[[pa.Table], pa.Array]:
    """Per-row reduction of a list column (null rows stay null, empty lists give null)."""

    def derive(t: pa.Table) -> pa.Array:
        values = t.column(column).to_pylist()
        return pa.array([None if v is None or not v else reduce(v) for v in values])

    return derive


def _nonfinite_count(t: pa.Table) -> pa.Array:
    """NaN, inf or missing values per row, vectorised: datasets hold millions of feature values."""
    lists = t.column("features").combine_chunks()
    bad = pc.invert(pc.fill_null(pc.is_finite(lists.values), False)).to_numpy(zero_copy_only=False)
    running = np.concatenate([[0], np.cumsum(bad, dtype=np.int64)])
    offsets = lists.offsets.to_numpy()
    counts = running[offsets[1:]] - running[offsets[:-1]]
    return pa.array(counts, pa.int64(), mask=lists.is_null().to_numpy(zero_copy_only=False))


def _finite_or_last(column: str) -> Callable[[pa.Table], pa.Array]:
    """True where `column` (a loss) is finite or the row is its trial's last step, null where
    null.

    A diverged trial records the non-finite loss that stopped it (and its evaluation of the
    broken model) as its last curve row; anywhere else a NaN/inf loss is a bug. Computed here
    because pandas reads NaN as null.
    """

    def derive(t: pa.Table) -> pa.Array:
        curves = t.select(["trial_id", "step", column]).to_pandas()
        last = curves["step"] == curves.groupby("trial_id")["step"].transform("max")
        finite = np.isfinite(curves[column].to_numpy(dtype=float))
        ok = (finite | last.to_numpy()).tolist()
        return pa.array(ok, pa.bool_(), mask=t.column(column).is_null().to_numpy(
            zero_copy_only=False))

    return derive


LOSS_COLUMNS = ("train_loss", "train_batch_loss", "val_loss", "val_perplexity")
"""Curve columns that may be non-finite on a diverged trial's last row."""


DERIVED_COLUMNS: dict[str, Callable[[pa.Table], pa.Array]] = {
    "features_len": _list_len("features"),
    "features_nonfinite_count": _nonfinite_count,
    "feature_shape_len": _list_len("feature_shape"),
    "feature_shape_min": _list_reduce("feature_shape", min),
    "feature_shape_text": _list_reduce("feature_shape", lambda v: "x".join(map(str, v))),
    "class_histogram_len": _list_len("class_histogram"),
    "class_histogram_sum": _list_reduce("class_histogram", sum),
    "class_histogram_min": _list_reduce("class_histogram", min),
    "grid_batch_sizes_len": _list_len("grid_batch_sizes"),
    "grid_batch_sizes_min": _list_reduce("grid_batch_sizes", min),
    **{f"{column}_finite_or_last": _finite_or_last(column) for column in LOSS_COLUMNS},
}
