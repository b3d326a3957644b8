"""Table checks: each table kind's great-expectations suite plus the rules GX cannot express.

- validate.py: `validate_table`, the sequence (schema, GX suite, Python rules) for one table;
- suites.py: the suite files and what their `meta` declares (parameters, context, derived
  columns); gx.py: the great-expectations adapter; rules.py: the Python rules;
- results.py: the result row every check returns; report.py: TableValidation, the failure
  message and the HTML pages;
- stage.py: the validate stage's entry points (one JSON artifact and one page per table group).

Importing this package does not import great_expectations: only running a suite does.
"""

from batchscale.checks.outcome import TableValidation
from batchscale.checks.validate import validate_table

__all__ = ["TableValidation", "validate_table"]
