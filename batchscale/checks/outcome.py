"""What validation hands back: the TableValidation of one table, the failure message that
ValidationFailed carries, and the HTML pages (templates/validation.html.j2)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from batchscale.checks.results import MAX_SHOWN, plain
from batchscale.html import render_page

TEMPLATE = "validation.html.j2"


@dataclass
class TableValidation:
    """The outcome of validating one table: every expectation's result, pass or fail."""

    kind: str
    success: bool
    results: list[dict]
    statistics: dict
    parameters: dict = field(default_factory=dict)
    """Parameter values used, with where each came from (context or the table itself)."""

    def failures(self) -> list[dict]:
        return [r for r in self.results if not r["success"]]

    def warnings(self) -> list[str]:
        """One line per passing check that carries a warning (shown, never failing)."""
        return [f"{r['expectation']}({_column_text(r) or 'table'}): {r['warning']}"
                for r in self.results if r["success"] and r.get("warning")]

    def failure_message(self) -> str:
        """One line per failed expectation, naming the column(s) and up to 5 offending values."""
        failed = self.failures()
        if not failed:
            return f"{self.kind} table passed all {len(self.results)} expectations"
        lines = [
            f"{self.kind} table failed validation: {len(failed)} of {len(self.results)} "
            "expectations failed"
        ]
        lines += [f"  - {describe_failure(r)}" for r in failed]
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, allow_nan=False)

    def to_html(self) -> str:
        """A self-contained page (inline CSS, no external resources) for the run's artifacts."""
        return render_page(TEMPLATE, title=f"batchscale validation: {self.kind}",
                           page_heading=None, sections=[_section(f"{self.kind} table", self)],
                           note="")


def table_validation(kind: str, results: list[dict], parameters: dict) -> TableValidation:
    """The report of `results`, with the pass/fail counts GX's own results carry."""
    failed = sum(not r["success"] for r in results)
    statistics = {
        "evaluated_expectations": len(results),
        "successful_expectations": len(results) - failed,
        "unsuccessful_expectations": failed,
        "warnings": sum(bool(r["success"] and r.get("warning")) for r in results),
        "success_percent": round(100.0 * (len(results) - failed) / len(results), 2)
        if results else 100.0,
    }
    return TableValidation(kind, failed == 0, results, statistics, plain(parameters))


def validation_page(reports: list[tuple[str, TableValidation]], note: str = "") -> str:
    """One page for several tables (label, report), as the validate stage writes it; `note`:
    a line above them (why a table had no rows to check)."""
    sections = [_section(f"{label}: {report.kind} table", report) for label, report in reports]
    return render_page(TEMPLATE, title="batchscale validation",
                       page_heading="batchscale validation", sections=sections, note=note)


# ---------------------------------------------------------------- describing results


def describe_failure(r: dict) -> str:
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


# ---------------------------------------------------------------- HTML


def _section(name: str, report: TableValidation) -> dict:
    """What the template shows of one table, as plain values (the template escapes them)."""
    return {
        "name": name,
        "success": report.success,
        "statistics": report.statistics,
        "parameters": json.dumps(report.parameters, default=str),
        "rows": [_row(r) for r in sorted(report.results, key=lambda r: r["success"])],
    }


def _row(r: dict) -> dict:
    """One table row: result, expectation, column, expected, settings, found (failures and
    warnings only)."""
    warning = r["success"] and r.get("warning")
    result_text = ("pass, with a warning" if warning else "pass") if r["success"] else "FAIL"
    found = f"warning: {r['warning']}" if warning else "" if r["success"] else _found(r)
    cells = [result_text, r["expectation"], _column_text(r), r["description"], _settings(r),
             found]
    return {"success": r["success"], "cells": cells}
