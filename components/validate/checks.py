"""Validate a table against its great-expectations suite, plus the checks GX cannot express.

The suites live as versioned JSON in `batchscale/expectations/<kind>.json`. Besides the GX
expectations, each suite's `meta` declares what this module adds around them:

- `parameters`: values substituted into `$PARAMETER` placeholders, taken from `context` or,
  when absent, derived from the table (recorded in the report so a trivial pass is visible);
- `context`: other accepted context keys (cross-table inputs such as the curves table);
- `derived_columns`: scalar columns computed from list columns (GX handles lists poorly);
- `python_checks`: checks run in Python, reported in the same results list as GX's.

great_expectations is imported lazily (≈2–7 s, ≈250 MB): only code that validates pays for it,
and one ephemeral context per process is reused.
"""

from __future__ import annotations

import functools
import html
import json
import math
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from batchscale import schemas
from batchscale.errors import BadInput, ValidationFailed

SUITES_DIR = Path(schemas.__file__).parent / "expectations"
MAX_SHOWN = 5
"""Offending values (and rows) shown per expectation."""

SOURCE_SCHEMA = "schema"
SOURCE_GX = "great_expectations"
SOURCE_PYTHON = "python"


@dataclass
class ValidationReport:
    """The outcome of validating one table: every expectation's result, pass or fail."""

    kind: str
    success: bool
    results: list[dict]
    statistics: dict
    parameters: dict = field(default_factory=dict)
    """Parameter values used, with where each came from (context or the table itself)."""

    def failures(self) -> list[dict]:
        return [r for r in self.results if not r["success"]]

    def failure_message(self) -> str:
        """One line per failed expectation, naming the column(s) and up to 5 offending values."""
        failed = self.failures()
        if not failed:
            return f"{self.kind} table passed all {len(self.results)} expectations"
        lines = [
            f"{self.kind} table failed validation: {len(failed)} of {len(self.results)} "
            "expectations failed"
        ]
        lines += [f"  - {_describe_failure(r)}" for r in failed]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, allow_nan=False)

    def to_html(self) -> str:
        """A self-contained page (inline CSS, no external resources) for the run's artifacts."""
        return _render_html(self)


def validate_table(kind: str, table: pa.Table, *, context: dict | None = None) -> ValidationReport:
    """Check `table` against the `kind` suite; a malformed table yields a failed report."""
    suite = load_suite(kind)
    context = _checked_context(kind, suite, context or {})
    table, schema_failures = _conform(kind, table)
    if schema_failures:
        return _report(kind, schema_failures, {})
    df = _frame(table, suite["meta"]["derived_columns"])
    parameters = _parameters(suite["meta"]["parameters"], context, df)
    values = {name: p["value"] for name, p in parameters.items()}
    row_keys = suite["meta"]["row_keys"]
    results = _run_gx(kind, df, values, row_keys)
    for name, options in suite["meta"]["python_checks"].items():
        check = PYTHON_CHECKS[name]
        results += check(table, df, values, context, **options)
    return _report(kind, results, parameters)


def require_valid(
    kind: str,
    table: pa.Table,
    *,
    context: dict | None = None,
    json_path: str | None = None,
    html_path: str | None = None,
) -> ValidationReport:
    """Validate, write the JSON/HTML reports (pass or fail), raise ValidationFailed on failure."""
    report = validate_table(kind, table, context=context)
    for path, text in ((json_path, report.to_json), (html_path, report.to_html)):
        if path is not None:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(text(), encoding="utf-8")
    if not report.success:
        raise ValidationFailed(report.failure_message())
    return report


@functools.cache
def load_suite(kind: str) -> dict:
    """The suite JSON of `kind` (BadInput for an unknown kind)."""
    schemas.schema_for(kind)
    return json.loads((SUITES_DIR / f"{kind}.json").read_text(encoding="utf-8"))


# ---------------------------------------------------------------- context and parameters


def _checked_context(kind: str, suite: dict, context: dict) -> dict:
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


def _str_dict(kind: str, key: str, value: Any) -> None:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise BadInput(f"validate {kind}: context {key} must be a dict of str to str")


CONTEXT_TYPES: dict[str, Callable[[str, str, Any], None]] = {
    "num_classes": _positive_int,
    "feature_length": _positive_int,
    "batch_sizes": _positive_int_list,
    "curves": _arrow_table,
    "shard_checksums": _str_dict,
}


def _parameters(declared: dict, context: dict, df: pd.DataFrame) -> dict:
    """Each suite parameter's value, from context or else derived from the data."""
    out = {}
    for name in declared:
        if name in context:
            value = context[name]
            out[name] = {"value": list(value) if isinstance(value, tuple) else value,
                         "source": "context"}
        else:
            out[name] = {"value": PARAMETER_DEFAULTS[name](df), "source": "table"}
    return out


def _default_num_classes(df: pd.DataFrame) -> int:
    labels = df["label"].dropna()
    return int(labels.max()) + 1 if len(labels) else 1


def _default_feature_length(df: pd.DataFrame) -> int:
    lengths = df["features_len"].dropna()
    return int(lengths.mode().iloc[0]) if len(lengths) else 0


def _default_batch_sizes(df: pd.DataFrame) -> list[int]:
    return sorted(int(b) for b in df["batch_size"].dropna().unique())


PARAMETER_DEFAULTS: dict[str, Callable[[pd.DataFrame], Any]] = {
    "num_classes": _default_num_classes,
    "feature_length": _default_feature_length,
    "batch_sizes": _default_batch_sizes,
}


# ---------------------------------------------------------------- schema


def _conform(kind: str, table: pa.Table) -> tuple[pa.Table, list[dict]]:
    """The table cast to its schema, or failed results for missing columns and uncastable types.
    Nulls in required columns pass here so the suite's not-null expectations name them."""
    try:
        return schemas.check_schema(kind, table, allow_nulls=True), []
    except BadInput as err:
        return table, _explain_schema_error(kind, table, str(err))


def _explain_schema_error(kind: str, table: pa.Table, message: str) -> list[dict]:
    """Name each missing or mistyped column, so the message says which one and what was found."""
    schema = schemas.schema_for(kind)
    extra = [n for n in table.column_names if n not in schema.names]
    results = [
        _result(
            "expect_column_to_exist", name, False, SOURCE_SCHEMA,
            description=f"{name} is a column of the {kind} schema",
            observed_value={"columns_not_in_schema": extra},
        )
        for name in schema.names
        if name not in table.column_names
    ]
    for f in schema:
        if f.name in table.column_names and not _castable(table.column(f.name), f.type):
            results.append(
                _result(
                    "expect_column_type_to_be", f.name, False, SOURCE_SCHEMA,
                    description=f"{f.name} has type {f.type}",
                    unexpected_values=[str(table.schema.field(f.name).type)],
                )
            )
    if not results:
        results.append(_result("expect_table_to_match_schema", None, False, SOURCE_SCHEMA,
                               description=message))
    return results


def _castable(column: pa.ChunkedArray, target: pa.DataType) -> bool:
    try:
        column.cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return False
    return True


# ---------------------------------------------------------------- derived columns


def _frame(table: pa.Table, derived: dict) -> pd.DataFrame:
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


def _finite_or_last(t: pa.Table) -> pa.Array:
    """True where train_loss is finite or the row is its trial's last step, null where null.

    A diverged trial records the non-finite loss that stopped it as its last curve row; anywhere
    else a NaN/inf loss is a bug. Computed here because pandas reads NaN as null.
    """
    curves = t.select(["trial_id", "step", "train_loss"]).to_pandas()
    last = curves["step"] == curves.groupby("trial_id")["step"].transform("max")
    finite = np.isfinite(curves["train_loss"].to_numpy(dtype=float))
    ok = (finite | last.to_numpy()).tolist()
    return pa.array(ok, pa.bool_(), mask=t.column("train_loss").is_null().to_numpy(
        zero_copy_only=False))


DERIVED_COLUMNS: dict[str, Callable[[pa.Table], pa.Array]] = {
    "features_len": _list_len("features"),
    "features_nonfinite_count": _nonfinite_count,
    "feature_shape_len": _list_len("feature_shape"),
    "feature_shape_min": _list_reduce("feature_shape", min),
    "feature_shape_text": _list_reduce("feature_shape", lambda v: "x".join(map(str, v))),
    "class_histogram_len": _list_len("class_histogram"),
    "class_histogram_sum": _list_reduce("class_histogram", sum),
    "class_histogram_min": _list_reduce("class_histogram", min),
    "train_loss_finite_or_last": _finite_or_last,
}


# ---------------------------------------------------------------- great expectations


@functools.cache
def _gx_context() -> Any:
    """One ephemeral GX context per process: creating it (and importing GX) takes seconds."""
    os.environ["GX_ANALYTICS_ENABLED"] = "false"
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    ctx.data_sources.add_pandas("batchscale")
    return ctx


@functools.cache
def _validation_definition(kind: str) -> Any:
    """The suite of `kind` bound to a whole-dataframe batch, registered once per process."""
    import great_expectations as gx

    ctx = _gx_context()
    data = load_suite(kind)
    suite = gx.ExpectationSuite(
        name=data["name"], expectations=data["expectations"], meta=data["meta"],
        notes=data.get("notes"),
    )
    if len(suite.expectations) != len(data["expectations"]):
        # GX logs and drops invalid expectations instead of raising: refuse a broken suite.
        raise RuntimeError(f"suite {kind}.json has invalid expectations (see the log above)")
    suite = ctx.suites.add(suite)
    asset = ctx.data_sources.get("batchscale").add_dataframe_asset(kind)
    batch = asset.add_batch_definition_whole_dataframe(kind)
    return ctx.validation_definitions.add(gx.ValidationDefinition(name=kind, data=batch,
                                                                  suite=suite))


def _run_gx(kind: str, df: pd.DataFrame, parameters: dict, row_keys: list[str]) -> list[dict]:
    """Run the suite; results in suite order, each with up to MAX_SHOWN offending values/rows."""
    definition = _validation_definition(kind)
    order = {e.id: i for i, e in enumerate(definition.suite.expectations)}
    outcome = definition.run(
        batch_parameters={"dataframe": df},
        expectation_parameters=parameters,
        result_format={"result_format": "SUMMARY", "partial_unexpected_count": MAX_SHOWN},
    ).to_json_dict()
    raw = sorted(outcome["results"], key=lambda r: order.get(r["expectation_config"]["id"], 0))
    return [_from_gx(r, df, row_keys) for r in raw]


def _from_gx(raw: dict, df: pd.DataFrame, row_keys: list[str]) -> dict:
    config = raw["expectation_config"]
    kwargs = {k: v for k, v in config["kwargs"].items() if k != "batch_id"}
    column = kwargs.pop("column", None) or kwargs.pop("column_list", None)
    if column is None and "column_A" in kwargs:
        column = [kwargs.pop("column_A"), kwargs.pop("column_B")]
    found = raw.get("result") or {}
    return _result(
        config["type"], column, bool(raw["success"]), SOURCE_GX,
        description=config.get("description") or "",
        kwargs=kwargs,
        element_count=found.get("element_count"),
        unexpected_count=found.get("unexpected_count"),
        unexpected_values=found.get("partial_unexpected_list", [])[:MAX_SHOWN],
        unexpected_rows=_rows(df, found.get("partial_unexpected_index_list", []), row_keys),
        observed_value=found.get("observed_value"),
        error=_exception_message(raw.get("exception_info") or {}),
    )


def _rows(df: pd.DataFrame, index: list, row_keys: list[str]) -> list[dict]:
    """Identify offending rows by their key columns (and position), not only by position."""
    rows = []
    for i in index[:MAX_SHOWN]:
        row = {"row": int(i)}
        row.update({k: df.at[i, k] for k in row_keys})
        rows.append(row)
    return rows


def _exception_message(info: dict) -> str | None:
    """GX nests exceptions per metric when a metric fails (e.g. a column it cannot find)."""
    if info.get("raised_exception"):
        return info.get("exception_message")
    for value in info.values():
        if isinstance(value, dict) and value.get("exception_message"):
            return value["exception_message"]
    return None


# ---------------------------------------------------------------- Python-side checks


def _class_balance(
    table: pa.Table, df: pd.DataFrame, parameters: dict, context: dict,
    *, min_share_of_uniform: float,
) -> list[dict]:
    """Extreme imbalance: the rarest class has fewer rows than a share of the uniform count."""
    num_classes = parameters["num_classes"]
    labels = df["label"].dropna().astype("int64")
    counts = labels[(labels >= 0) & (labels < num_classes)].value_counts()
    counts = {c: int(counts.get(c, 0)) for c in range(num_classes)}
    return [_balance_result("label", counts, min_share_of_uniform)]


def _histogram_class_balance(
    table: pa.Table, df: pd.DataFrame, parameters: dict, context: dict,
    *, min_share_of_uniform: float,
) -> list[dict]:
    """Class balance of each split, from the shards' class histograms summed per split."""
    totals: dict[str, np.ndarray] = {}
    for split, hist in zip(table.column("split").to_pylist(),
                           table.column("class_histogram").to_pylist(), strict=True):
        total = totals.setdefault(split, np.zeros(len(hist or []), np.int64))
        if hist and len(hist) == len(total):  # other lengths are reported by the GX suite
            total += hist
    return [
        _balance_result(f"class_histogram[split={split}]",
                        {c: int(n) for c, n in enumerate(hist)}, min_share_of_uniform)
        for split, hist in sorted(totals.items(), key=lambda item: str(item[0]))
    ]


def _balance_result(column: str, counts: dict[int, int], min_share: float) -> dict:
    """Flag classes under `min_share` of the uniform count.

    Below one row of floor (e.g. a small last shard) a missing class is chance, not imbalance,
    so such tables pass; the manifest's per-split check still covers the whole split.
    """
    total = sum(counts.values())
    floor = min_share * total / max(len(counts), 1)
    rare = sorted((n, c) for c, n in counts.items() if n < floor) if floor >= 1 else []
    return _result(
        "expect_smallest_class_to_be_at_least_share_of_uniform", column, not rare,
        SOURCE_PYTHON,
        description=f"every class has at least {min_share:g} of the uniform share of rows",
        kwargs={"min_share_of_uniform": min_share, "min_rows": round(floor, 3)},
        element_count=total,
        unexpected_count=len(rare),
        unexpected_values=[f"class {c}: {n} rows" for n, c in rare[:MAX_SHOWN]],
        observed_value={"smallest_class_rows": min(counts.values(), default=0),
                        "uniform_rows": round(total / max(len(counts), 1), 3)},
    )


def _shard_checksums(
    table: pa.Table, df: pd.DataFrame, parameters: dict, context: dict,
) -> list[dict]:
    """Every shard's sha256 as written matches the manifest, and no file is unlisted."""
    if "shard_checksums" not in context:
        return []
    actual = context["shard_checksums"]
    listed = dict(zip(table.column("shard").to_pylist(), table.column("sha256").to_pylist(),
                      strict=True))
    bad = [
        f"{shard}: manifest {listed.get(shard, 'not listed')}, file {actual.get(shard, 'missing')}"
        for shard in sorted(set(listed) | set(actual))
        if listed.get(shard) != actual.get(shard)
    ]
    return [_result(
        "expect_shard_checksums_to_match_manifest", "sha256", not bad, SOURCE_PYTHON,
        description="the sha256 of each shard file equals the manifest's",
        element_count=len(listed), unexpected_count=len(bad), unexpected_values=bad[:MAX_SHOWN],
    )]


def _steps_to_target_matches_curves(
    table: pa.Table, df: pd.DataFrame, parameters: dict, context: dict,
) -> list[dict]:
    """A reached trial's steps_to_target is the first curve step at or above the target."""
    if "curves" not in context:
        return []
    reached = [r for r in _run_rows(table) if r["status"] == "reached"]
    crossing = _first_crossings(context["curves"], reached)
    bad = []
    for run in reached:
        found = crossing.get(run["trial_id"])
        if found is None or found != run["steps_to_target"]:
            seen = "never reach the target" if found is None else f"cross at step {found}"
            bad.append(f"{run['trial_id']}: steps_to_target {run['steps_to_target']}, "
                       f"curves {seen}")
    return [_result(
        "expect_steps_to_target_to_match_curves", "steps_to_target", not bad, SOURCE_PYTHON,
        description="steps_to_target is the first curve step whose val_accuracy >= "
        "target_val_accuracy",
        element_count=len(reached), unexpected_count=len(bad), unexpected_values=bad[:MAX_SHOWN],
    )]


def _run_rows(table: pa.Table) -> list[dict]:
    """Runs rows as Python values (pandas would turn nullable integers into floats)."""
    columns = ["trial_id", "status", "steps_to_target", "target_val_accuracy"]
    return table.select(columns).to_pylist()


def _first_crossings(curves: pa.Table, runs: list[dict]) -> dict[str, int]:
    """trial_id -> first step whose val_accuracy reaches that trial's target."""
    targets = {r["trial_id"]: r["target_val_accuracy"] for r in runs}
    points = _curve_points(curves, ["trial_id", "step", "val_accuracy"]).dropna()
    points = points[points["val_accuracy"] >= points["trial_id"].map(targets)]
    first = points.groupby("trial_id")["step"].min()
    return {trial: int(step) for trial, step in first.items()}


def _reached_trials_have_finite_losses(
    table: pa.Table, df: pd.DataFrame, parameters: dict, context: dict,
) -> list[dict]:
    """A trial whose curve holds a NaN/inf loss diverged; it cannot be marked reached."""
    if "curves" not in context:
        return []
    points = _curve_points(context["curves"], ["trial_id", "step", "train_loss"])
    finite = pc.fill_null(pc.is_finite(context["curves"].column("train_loss")), True)
    reached = {r["trial_id"] for r in _run_rows(table) if r["status"] == "reached"}
    nonfinite = ~finite.to_numpy(zero_copy_only=False)
    bad_points = points[nonfinite & points["trial_id"].isin(reached)].drop_duplicates("trial_id")
    bad = [f"{r.trial_id}: train_loss {_plain(r.train_loss)} at step {r.step}"
           for r in bad_points.itertuples()]
    return [_result(
        "expect_reached_trials_to_have_finite_losses", "status", not bad, SOURCE_PYTHON,
        description="trials marked reached have no NaN/inf train_loss in their curves",
        element_count=len(reached), unexpected_count=len(bad), unexpected_values=bad[:MAX_SHOWN],
    )]


def _curve_points(curves: pa.Table, columns: list[str]) -> pd.DataFrame:
    """Columns of the context curves table, refusing a table that lacks them (a wiring bug)."""
    missing = [c for c in columns if c not in curves.column_names]
    if missing:
        raise BadInput(f"validate runs: context curves lacks columns {missing}")
    return curves.select(columns).to_pandas()


PYTHON_CHECKS: dict[str, Callable[..., list[dict]]] = {
    "class_balance": _class_balance,
    "histogram_class_balance": _histogram_class_balance,
    "shard_checksums": _shard_checksums,
    "steps_to_target_matches_curves": _steps_to_target_matches_curves,
    "reached_trials_have_finite_losses": _reached_trials_have_finite_losses,
}


# ---------------------------------------------------------------- results and rendering


def _result(
    expectation: str, column: str | list | None, success: bool, source: str, **details: Any
) -> dict:
    """One result row, JSON-safe (NaN/inf and numpy scalars become plain values)."""
    base = {
        "expectation": expectation,
        "column": column,
        "success": success,
        "source": source,
        "description": "",
        "kwargs": {},
        "element_count": None,
        "unexpected_count": None,
        "unexpected_values": [],
        "unexpected_rows": [],
        "observed_value": None,
        "error": None,
    }
    base.update(details)
    return _plain(base)


def _plain(value: Any) -> Any:
    """Make a value JSON-safe: numpy scalars to Python, NaN/inf to strings."""
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


def _report(kind: str, results: list[dict], parameters: dict) -> ValidationReport:
    failed = sum(not r["success"] for r in results)
    statistics = {
        "evaluated_expectations": len(results),
        "successful_expectations": len(results) - failed,
        "unsuccessful_expectations": failed,
        "success_percent": round(100.0 * (len(results) - failed) / len(results), 2)
        if results else 100.0,
    }
    return ValidationReport(kind, failed == 0, results, statistics, _plain(parameters))


def _describe_failure(r: dict) -> str:
    """`expectation(column) [settings]: what was found — expected: why`."""
    text = f"{r['expectation']}({_column_text(r) or 'table'})"
    if r["kwargs"]:
        text += f" [{_settings(r)}]"
    found = _found(r)
    if found:
        text += ": " + found
    if r["description"]:
        text += f" — expected: {r['description']}"
    return text


def _column_text(r: dict) -> str:
    return ", ".join(r["column"]) if isinstance(r["column"], list) else (r["column"] or "")


def _settings(r: dict) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in r["kwargs"].items())


def _found(r: dict) -> str:
    """What a result saw: counts, up to MAX_SHOWN offending values and rows, errors."""
    details = []
    if r["unexpected_count"] is not None and r["element_count"] is not None:
        details.append(f"{r['unexpected_count']} of {r['element_count']} unexpected")
    if r["unexpected_values"]:
        details.append(f"values {_short(r['unexpected_values'][:MAX_SHOWN])}")
    if r["unexpected_rows"]:
        details.append(f"rows {_short(r['unexpected_rows'][:MAX_SHOWN])}")
    if r["observed_value"] is not None:
        details.append(f"observed {_short(r['observed_value'])}")
    if r["error"]:
        details.append(f"error: {r['error']}")
    return "; ".join(details)


def _short(value: Any) -> str:
    if isinstance(value, dict) and value.get("type") == "comparison":
        return f"{value['column']['name']} {value['operator']} {value['parameter']!r}"
    if isinstance(value, list | dict):
        return json.dumps(value, default=str)
    return str(value)


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem;color:#222}
h1{font-size:1.4rem}.ok{color:#17692e}.bad{color:#a11}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{border:1px solid #ccc;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f3f3}tr.fail{background:#fdecec}code{font-size:.85rem}
"""


def _render_html(report: ValidationReport) -> str:
    status = "passed" if report.success else "FAILED"
    stats = report.statistics
    rows = "\n".join(_html_row(r) for r in sorted(report.results, key=lambda r: r["success"]))
    params = html.escape(json.dumps(report.parameters, default=str))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>batchscale validation: {html.escape(report.kind)}</title>
<style>{_CSS}</style></head><body>
<h1>{html.escape(report.kind)} table <span class="{'ok' if report.success else 'bad'}">\
{status}</span></h1>
<p>{stats['unsuccessful_expectations']} of {stats['evaluated_expectations']} expectations failed
({stats['success_percent']}% passed).</p>
<p>Parameters: <code>{params}</code></p>
<table><thead><tr><th>result</th><th>expectation</th><th>column</th><th>expected</th>
<th>settings</th><th>found</th></tr></thead>
<tbody>
{rows}
</tbody></table></body></html>
"""


def _html_row(r: dict) -> str:
    cells = [
        "pass" if r["success"] else "FAIL", r["expectation"], _column_text(r), r["description"],
        _settings(r), "" if r["success"] else _found(r),
    ]
    body = "".join(f"<td>{html.escape(str(c))}</td>" for c in cells)
    return f'<tr class="{"pass" if r["success"] else "fail"}">{body}</tr>'
