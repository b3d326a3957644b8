"""The great-expectations adapter: run a suite on a dataframe, return plain result rows.

great_expectations is imported here only, inside the functions that run it (≈2–7 s, ≈250 MB):
importing batchscale.checks stays cheap, and one ephemeral context per process is reused. Its
import defers the modules it loads only for expectations our suites do not use
(DEFERRED_MODULES).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.util
import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any

import pandas as pd

from batchscale.checks.results import MAX_SHOWN, SOURCE_GX, result
from batchscale.checks.suites import load_suite

DEFERRED_MODULES = ("scipy.stats", "altair")
"""Imported by great_expectations at start-up only for the KL-divergence and KS-test
expectations and their charts, which no suite here uses: 1.7 s of its 4.9 s import (one
`python -X importtime`, 2 cores, load ≈1.5); a validate task's start-up × 0.78, 90 % interval
[0.68, 0.79] (benchmarks/bench_startup.py, 5 rounds, load 2.3-3.5). Each is loaded lazily: the
same module, its code run unchanged on first attribute access (importlib.util.LazyLoader)."""


class _LazyFinder(importlib.abc.MetaPathFinder):
    """Finds `names` through the other finders and defers running them to their first use
    (on Python < 3.12 not safe if two threads make that first use at once: none here does)."""

    def __init__(self, names: Iterable[str]):
        self.names = frozenset(names)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if hasattr(spec.loader, "exec_module"):
                    spec.loader = importlib.util.LazyLoader(spec.loader)
                return spec
        return None


@contextlib.contextmanager
def _deferred(names: Iterable[str]) -> Iterator[None]:
    """Inside the block, a first import of one of `names` makes a lazy module (it stays
    lazy, and stays in sys.modules, after the block); outside it, imports are as usual."""
    finder = _LazyFinder(n for n in names if n not in sys.modules)
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)


def _great_expectations() -> Any:
    """The great_expectations module; every import of it here goes through this function, so
    that whichever runs first defers DEFERRED_MODULES."""
    os.environ["GX_ANALYTICS_ENABLED"] = "false"
    with _deferred(DEFERRED_MODULES):
        import great_expectations
    return great_expectations


@functools.cache
def gx_context() -> Any:
    """One ephemeral GX context per process: creating it (and importing GX) takes seconds."""
    gx = _great_expectations()
    from great_expectations.data_context.types.base import ProgressBarsConfig

    ctx = gx.get_context(mode="ephemeral")
    ctx.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
    ctx.data_sources.add_pandas("batchscale")
    return ctx


@functools.cache
def _validation_definition(kind: str) -> Any:
    """The suite of `kind` bound to a whole-dataframe batch, registered once per process."""
    gx = _great_expectations()
    ctx = gx_context()
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


FIRST_PASS = {"result_format": "BASIC", "partial_unexpected_count": MAX_SHOWN}
"""Every expectation's verdict, counts and first offending values, without their row positions:
about 0.6 of SUMMARY's time on a sweep table (benchmarks/bench_validation.py), and a table
without offending values needs nothing more."""
OFFENDERS = {"result_format": "SUMMARY", "partial_unexpected_count": MAX_SHOWN}
"""For the expectations a table breaks: also the positions of the offending rows."""
ONE_BY_ONE_SHARE = 3
"""Up to one in this many expectations offending, those are run again one by one (45-90 ms each
on a sweep table, whose whole suite takes about 2 s); past that, the whole suite again costs
about as much or less."""


def run_suite(kind: str, df: pd.DataFrame, parameters: dict, row_keys: list[str]) -> list[dict]:
    """Run the suite; results in suite order, each with up to MAX_SHOWN offending values/rows.
    One pass over the whole suite, then, where values offend, another for their rows'
    positions."""
    definition = _validation_definition(kind)
    raw = suite_results(definition, df, parameters, FIRST_PASS)
    offending = [i for i, found in enumerate(raw) if _offends(found)]
    if len(offending) > len(raw) // ONE_BY_ONE_SHARE:
        return [_from_gx(r, df, row_keys)
                for r in suite_results(definition, df, parameters, OFFENDERS)]
    if offending:
        batch = definition.data.get_batch(batch_parameters={"dataframe": df})
        by_id = {e.id: e for e in definition.suite.expectations}
        for i in offending:
            expectation = by_id[raw[i]["expectation_config"]["id"]]
            raw[i] = batch.validate(expectation, result_format=OFFENDERS,
                                    expectation_parameters=parameters).to_json_dict()
    return [_from_gx(r, df, row_keys) for r in raw]


def suite_results(definition: Any, df: pd.DataFrame, parameters: dict,
                  result_format: dict) -> list[dict]:
    """GX's raw result of every expectation of `definition`'s suite, in suite order."""
    order = {e.id: i for i, e in enumerate(definition.suite.expectations)}
    outcome = definition.run(batch_parameters={"dataframe": df},
                             expectation_parameters=parameters,
                             result_format=result_format).to_json_dict()
    return sorted(outcome["results"], key=lambda r: order.get(r["expectation_config"]["id"], 0))


def _offends(raw: dict) -> bool:
    """Whether SUMMARY can add to this result: it adds only the offending rows' positions
    (GX computes them from the same condition that counted them)."""
    return not raw["success"] or bool((raw.get("result") or {}).get("unexpected_count"))


def _from_gx(raw: dict, df: pd.DataFrame, row_keys: list[str]) -> dict:
    config = raw["expectation_config"]
    kwargs = {k: v for k, v in config["kwargs"].items() if k != "batch_id"}
    column = kwargs.pop("column", None) or kwargs.pop("column_list", None)
    if column is None and "column_A" in kwargs:
        column = [kwargs.pop("column_A"), kwargs.pop("column_B")]
    found = raw.get("result") or {}
    return result(
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
