"""Columns several tables share, in the same order everywhere."""

from __future__ import annotations

import pyarrow as pa

CRITICAL_BATCH_FIELDS = [
    # B_crit with its 90 % interval; NaN where the data support only a bound (b_crit_bound
    # "above"/"below" b_crit_bound_batch) or nothing (b_crit_reason says why).
        pa.field("b_crit", pa.float64()),
        pa.field("b_crit_low", pa.float64()),
        pa.field("b_crit_high", pa.float64()),
        pa.field("b_crit_bound", pa.string()),
        pa.field("b_crit_bound_batch", pa.float64()),
        pa.field("b_crit_reason", pa.string()),
]
