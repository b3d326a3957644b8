"""A table held against its schema (`batchscale/schemas`): duplicated, missing and mistyped columns,
named with why, before any check reads the values. Only widening within one kind of value
converts; everything else is refused rather than parsed or truncated."""

from __future__ import annotations

import pyarrow as pa

from batchscale.errors import BadInput
from batchscale.schemas import schema_for


def duplicated_columns(table: pa.Table) -> dict[str, int]:
    """Column names that appear more than once, with how often: such a column cannot be told
    apart from its twin, so no check can say which one it read."""
    counts: dict[str, int] = {}
    for name in table.column_names:
        counts[name] = counts.get(name, 0) + 1
    return {name: n for name, n in counts.items() if n > 1}


def column_problems(kind: str, table: pa.Table) -> dict[str, str]:
    """Columns of `table` (present, not duplicated) that do not hold the schema's type, with why.

    Only widening within one kind of value converts (int32 -> int64, float32 -> float64,
    large_string -> string, integers where floats are expected, a list of such values, an
    all-null column): strings where numbers are expected, or floats where integers are, are
    refused rather than parsed or truncated. Values that do not fit the type are refused too.
    """
    problems = {}
    duplicated = duplicated_columns(table)
    for f in schema_for(kind):
        if f.name not in table.column_names or f.name in duplicated:
            continue
        found = table.schema.field(f.name).type
        if not _same_kind(found, f.type):
            problems[f.name] = f"has type {found}; expected {f.type} (not converted)"
        elif found != f.type:
            error = _cast_error(table.column(f.name), f.type)
            if error:
                problems[f.name] = f"has values that do not fit {f.type}: {error}"
    return problems


def _same_kind(found: pa.DataType, expected: pa.DataType) -> bool:
    if found == expected or pa.types.is_null(found):
        return True
    if pa.types.is_dictionary(found):
        return _same_kind(found.value_type, expected)
    if _is_list(expected):
        return _is_list(found) and _same_kind(found.value_type, expected.value_type)
    if pa.types.is_integer(expected):
        return pa.types.is_integer(found)
    if pa.types.is_floating(expected):
        return pa.types.is_floating(found) or pa.types.is_integer(found)
    if pa.types.is_string(expected):
        return pa.types.is_string(found) or pa.types.is_large_string(found)
    return False


def _is_list(kind: pa.DataType) -> bool:
    return pa.types.is_list(kind) or pa.types.is_large_list(kind) or \
        pa.types.is_fixed_size_list(kind)


def _cast_error(column: pa.ChunkedArray, target: pa.DataType) -> str | None:
    try:
        column.cast(target)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as err:
        return str(err)
    return None


def with_added_columns(kind: str, table: pa.Table) -> pa.Table:
    """`table` with the nullable columns its schema gained since it was written, all null (a
    file from an older layout, as the lake reads its old partitions); a missing required
    column stays missing for `check_schema` to name."""
    for f in schema_for(kind):
        if f.nullable and f.name not in table.column_names:
            table = table.append_column(f, pa.nulls(table.num_rows, f.type))
    return table


def check_schema(kind: str, table: pa.Table, allow_nulls: bool = False) -> pa.Table:
    """Refuse a table whose columns or types differ from the schema of `kind` (see
    `column_problems` for what converts). With `allow_nulls`, nulls in required columns pass
    (the validation suite then names them)."""
    schema = schema_for(kind)
    duplicated = duplicated_columns(table)
    if duplicated:
        raise BadInput(f"{kind} table has duplicated columns "
                       f"{', '.join(f'{n!r} ({c} times)' for n, c in duplicated.items())}; "
                       "each column name must appear once")
    missing = [n for n in schema.names if n not in table.column_names]
    if missing:
        raise BadInput(f"{kind} table is missing columns {missing}; expected {schema.names}")
    problems = column_problems(kind, table)
    if problems:
        raise BadInput(f"{kind} table does not match its schema: "
                       + "; ".join(f"column {n!r} {why}" for n, why in problems.items()))
    if allow_nulls:
        schema = pa.schema([f.with_nullable(True) for f in schema])
    try:
        return table.select(schema.names).cast(schema)
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError) as err:
        # ValueError: pyarrow refuses nulls in a non-nullable field this way.
        raise BadInput(f"{kind} table does not match its schema: {err}") from None
