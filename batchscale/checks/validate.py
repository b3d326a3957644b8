"""Validate one table: its schema first (names and types, nothing converted between kinds), then
its great-expectations suite, the finite check of every float column, and the Python rules the
suite names; every outcome lands in one TableValidation."""

from __future__ import annotations

import pyarrow as pa

from batchscale import schemacheck, schemas
from batchscale.checks import gx, suites
from batchscale.checks.outcome import TableValidation, table_validation
from batchscale.checks.results import SOURCE_SCHEMA, result
from batchscale.checks.rules import PYTHON_CHECKS, finite_values
from batchscale.errors import BadInput


def validate_table(kind: str, table: pa.Table, *, context: dict | None = None) -> TableValidation:
    """Check `table` against the `kind` suite; a malformed table yields a failed report."""
    suite = suites.load_suite(kind)
    meta = suite["meta"]
    context = suites.checked_context(kind, suite, context or {})
    table, schema_failures = _conform(kind, table)
    if schema_failures:
        return table_validation(kind, schema_failures, {})
    df = suites.validation_frame(table, meta["derived_columns"])
    parameters = suites.resolve_parameters(meta["parameters"], context, df)
    values = {name: p["value"] for name, p in parameters.items()}
    results = gx.run_suite(kind, df, values, meta["row_keys"])
    results += finite_values(table, meta["row_keys"], meta["nan_allowed"],
                             meta["finite_checked_elsewhere"])
    for name, options in meta["python_checks"].items():
        check = PYTHON_CHECKS[name]
        results += check(table, df, values, context, **options)
    return table_validation(kind, results, parameters)


def _conform(kind: str, table: pa.Table) -> tuple[pa.Table, list[dict]]:
    """The table cast to its schema, or failed results for duplicated, missing and mistyped
    columns. Nulls in required columns pass here so the suite's not-null expectations name
    them."""
    extra = [n for n in table.column_names if n not in schemas.schema_for(kind).names]
    # A misspelled or foreign column is refused, not dropped without a word.
    refused = [result(
        "expect_table_columns_to_match_set", None, False, SOURCE_SCHEMA,
        description=f"every column is one of the {kind} schema's",
        observed_value={"columns_not_in_schema": extra},
        error=f"columns {extra} are not in the {kind} schema (a misspelling, or a column of "
              "another table); `batchscale validate --help` lists the tables")] if extra else []
    try:
        return schemacheck.check_schema(kind, table, allow_nulls=True), refused
    except BadInput as err:
        return table, _explain_schema_error(kind, table, str(err)) + refused


def _duplicated_result(name: str, count: int) -> dict:
    return result(
        "expect_column_names_to_be_unique", name, False, SOURCE_SCHEMA,
        description="each column name appears once (a duplicated column is ambiguous)",
        observed_value={"times": count},
    )


def _explain_schema_error(kind: str, table: pa.Table, message: str) -> list[dict]:
    """Name each duplicated, missing or mistyped column, so the message says which one and what
    was found."""
    schema = schemas.schema_for(kind)
    extra = [n for n in table.column_names if n not in schema.names]
    results = [_duplicated_result(n, count)
               for n, count in schemacheck.duplicated_columns(table).items()]
    results += [
        result(
            "expect_column_to_exist", name, False, SOURCE_SCHEMA,
            description=f"{name} is a column of the {kind} schema",
            observed_value={"columns_not_in_schema": extra},
        )
        for name in schema.names
        if name not in table.column_names
    ]
    for name, why in schemacheck.column_problems(kind, table).items():
        results.append(
            result(
                "expect_column_type_to_be", name, False, SOURCE_SCHEMA,
                description=f"{name} has type {schema.field(name).type}",
                unexpected_values=[str(table.schema.field(name).type)],
                error=f"{name} {why}",
            )
        )
    if not results:
        results.append(result("expect_table_to_match_schema", None, False, SOURCE_SCHEMA,
                              description=message))
    return results
