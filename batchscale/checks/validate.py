"""Validate one table: its schema first, then its great-expectations suite, then the Python rules
the suite names; every outcome lands in one ValidationReport."""

from __future__ import annotations

import pyarrow as pa

from batchscale import schemas
from batchscale.checks import gx, suites
from batchscale.checks.report import ValidationReport, make_report
from batchscale.checks.results import SOURCE_SCHEMA, result
from batchscale.checks.rules import PYTHON_CHECKS
from batchscale.errors import BadInput


def validate_table(kind: str, table: pa.Table, *, context: dict | None = None) -> ValidationReport:
    """Check `table` against the `kind` suite; a malformed table yields a failed report."""
    suite = suites.load_suite(kind)
    context = suites.checked_context(kind, suite, context or {})
    table, schema_failures = _conform(kind, table)
    if schema_failures:
        return make_report(kind, schema_failures, {})
    df = suites.validation_frame(table, suite["meta"]["derived_columns"])
    parameters = suites.resolve_parameters(suite["meta"]["parameters"], context, df)
    values = {name: p["value"] for name, p in parameters.items()}
    results = gx.run_suite(kind, df, values, suite["meta"]["row_keys"])
    for name, options in suite["meta"]["python_checks"].items():
        check = PYTHON_CHECKS[name]
        results += check(table, df, values, context, **options)
    return make_report(kind, results, parameters)


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
        result(
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
                result(
                    "expect_column_type_to_be", f.name, False, SOURCE_SCHEMA,
                    description=f"{f.name} has type {f.type}",
                    unexpected_values=[str(table.schema.field(f.name).type)],
                )
            )
    if not results:
        results.append(result("expect_table_to_match_schema", None, False, SOURCE_SCHEMA,
                              description=message))
    return results


def _castable(column: pa.ChunkedArray, target: pa.DataType) -> bool:
    try:
        column.cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return False
    return True
