"""One result row per expectation, the same shape whoever checked it (schema, GX, Python rule).

Rows are plain JSON-safe dicts: they go straight into the validation JSON artifact. A passing
row may carry a `warning`: something a reader must see although it does not fail the table
(e.g. a few sweep rows flagged unstable, below the share that fails it).
"""

from __future__ import annotations

import math
from typing import Any

MAX_SHOWN = 5
"""Offending values (and rows) shown per expectation."""

SOURCE_SCHEMA = "schema"
SOURCE_GX = "great_expectations"
SOURCE_PYTHON = "python"


def result(
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
        "warning": None,
    }
    base.update(details)
    return plain(base)


def plain(value: Any) -> Any:
    """Make a value JSON-safe: numpy scalars to Python, NaN/inf to strings."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
