"""The suites themselves (batchscale/expectations/<kind>.json): every required column has its
not-null check, every numeric column its bounds, and the meta names only implemented helpers."""

from __future__ import annotations

import pyarrow as pa
import pytest

from batchscale.checks import rules, suites
from batchscale.schemas import TABLES, schema_for


@pytest.mark.parametrize("kind", list(TABLES))
def test_suite_requires_every_non_nullable_column(kind):
    """A column the schema marks required has a not-null expectation (lists via <col>_len)."""
    suite = suites.load_suite(kind)
    checked = {
        e["kwargs"]["column"]
        for e in suite["expectations"]
        if e["type"] == "expect_column_values_to_not_be_null" and "row_condition" not in e["kwargs"]
    }
    for f in schema_for(kind):
        if not f.nullable:
            name = f"{f.name}_len" if pa.types.is_list(f.type) else f.name
            assert name in checked, f"{kind}: {f.name} lacks a not-null expectation"


@pytest.mark.parametrize("kind", list(TABLES))
def test_suite_meta_names_only_implemented_helpers(kind):
    meta = suites.load_suite(kind)["meta"]
    assert set(meta["derived_columns"]) <= set(suites.DERIVED_COLUMNS)
    assert set(meta["python_checks"]) <= set(rules.PYTHON_CHECKS)
    assert set(meta["parameters"]) <= set(suites.PARAMETER_DEFAULTS)
    assert set(meta["parameters"]) | set(meta["context"]) <= set(suites.CONTEXT_TYPES)


OPEN_COLUMNS = {"b_simple": (None, None), "train_loss": (0, None), "measured_slope": (None, None),
                "train_batch_loss": (0, None), "val_loss": (0, None), "val_perplexity": (1, None),
                "target_value": (0, None), "final_metric_value": (0, None)}
"""Columns without an upper bound: the noise estimate (any sign; NaN/inf are still checked),
the loss (a diverging loss grows without end)."""
BOUNDED_IN = {("analysis", "b_simple")}
"""Open columns a table bounds all the same: the analysis table's B_simple is a median of the
estimates that did not fail, so positive."""


@pytest.mark.parametrize("kind", list(TABLES))
def test_suite_bounds_every_numeric_column(kind):
    """Every scalar numeric column has an unconditional between-check with both ends (or the
    open ends stated above); NaN/inf exemptions name float columns (validate checks the rest)."""
    suite = suites.load_suite(kind)
    bounds = {
        e["kwargs"]["column"]: (e["kwargs"].get("min_value"), e["kwargs"].get("max_value"))
        for e in suite["expectations"]
        if e["type"] == "expect_column_values_to_be_between" and "row_condition" not in e["kwargs"]
    }
    for f in schema_for(kind):
        numeric = pa.types.is_integer(f.type) or pa.types.is_floating(f.type)
        if not numeric:
            continue
        low, high = bounds.get(f.name, (None, None))
        open_ends = OPEN_COLUMNS.get(f.name) if (kind, f.name) not in BOUNDED_IN else None
        want_low, want_high = open_ends or (0, 1)
        assert (low is None) == (want_low is None), f"{kind}.{f.name}: lower bound {low}"
        assert (high is None) == (want_high is None), f"{kind}.{f.name}: upper bound {high}"
    meta = suite["meta"]
    floats = {f.name for f in schema_for(kind) if pa.types.is_floating(f.type)}
    assert set(meta["nan_allowed"]) | set(meta["finite_checked_elsewhere"]) <= floats
