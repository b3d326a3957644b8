"""The GX adapter's two passes (a cheap one over the whole suite, then the offending rows'
positions only where values offend) give exactly what one full SUMMARY pass gives: clean tables
of every kind, a table breaking a few expectations (run again one by one) and one breaking many
(the whole suite again)."""

from __future__ import annotations

import pytest

from batchscale.checks import gx, suites
from batchscale.schemas import TABLES
from clean_tables import ROWS, context, table


def frame_and_parameters(kind: str, rows: list[dict]):
    """What validate_table hands the adapter for these rows."""
    suite = suites.load_suite(kind)
    meta = suite["meta"]
    df = suites.validation_frame(table(kind, rows), meta["derived_columns"])
    checked = suites.checked_context(kind, suite, context(kind))
    parameters = suites.resolve_parameters(meta["parameters"], checked, df)
    return df, {name: p["value"] for name, p in parameters.items()}, meta["row_keys"]


def one_full_pass(kind: str, df, parameters: dict, row_keys: list[str]) -> list[dict]:
    definition = gx._validation_definition(kind)
    raw = gx.suite_results(definition, df, parameters, gx.OFFENDERS)
    return [gx._from_gx(r, df, row_keys) for r in raw]


def assert_same_as_one_full_pass(kind: str, rows: list[dict]) -> list[dict]:
    df, parameters, row_keys = frame_and_parameters(kind, rows)
    found = gx.run_suite(kind, df, parameters, row_keys)
    assert found == one_full_pass(kind, df, parameters, row_keys)
    return found


@pytest.mark.parametrize("kind", list(TABLES))
def test_a_clean_table_gets_what_one_full_pass_gives(kind):
    found = assert_same_as_one_full_pass(kind, ROWS[kind]())
    assert all(r["success"] for r in found)


def test_a_few_broken_expectations_name_their_rows_as_one_full_pass_does():
    rows = ROWS["sweep"]()
    rows[1]["samples_per_s"] = -5.0
    rows[2]["timed_steps"] = 0
    rows[3]["batch_size"] = 8  # not among the configured batch sizes (a $parameter)
    found = assert_same_as_one_full_pass("sweep", rows)
    failed = [r for r in found if not r["success"]]
    assert 1 <= len(failed) <= len(found) // gx.ONE_BY_ONE_SHARE  # run again one by one
    assert {row["row"] for r in failed for row in r["unexpected_rows"]} == {1, 2, 3}


def test_many_broken_expectations_name_their_rows_as_one_full_pass_does():
    rows = ROWS["sweep"]()
    for row in rows:
        for column, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                row[column] = -value - 1
            elif isinstance(value, str):
                row[column] = ""
    found = assert_same_as_one_full_pass("sweep", rows)
    failed = [r for r in found if not r["success"]]
    assert len(failed) > len(found) // gx.ONE_BY_ONE_SHARE  # the whole suite again
    assert {row["row"] for r in failed for row in r["unexpected_rows"]} == set(range(len(rows)))


def test_an_expectation_that_raises_is_reported_as_one_full_pass_reports_it():
    """A column GX cannot find (validate_table's schema check stops such a table first)."""
    df, parameters, row_keys = frame_and_parameters("sweep", ROWS["sweep"]())
    df = df.drop(columns=["samples_per_s"])
    found = gx.run_suite("sweep", df, parameters, row_keys)
    assert found == one_full_pass("sweep", df, parameters, row_keys)
    failed = [r for r in found if not r["success"]]
    assert len(failed) <= len(found) // gx.ONE_BY_ONE_SHARE  # run again one by one
    assert any('"samples_per_s"' in (r["error"] or "") for r in failed)
