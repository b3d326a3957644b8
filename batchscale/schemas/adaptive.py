"""The table of the adaptive search: its decisions (the registry and `make_table` are in
`batchscale.schemas`)."""

from __future__ import annotations

import pyarrow as pa

DECISIONS = pa.schema(
    [
        # The adaptive search's decisions (batchscale/adaptive/driver.py): one row per decision, in
        # order. A row that ran a cell names it (batch_size, seed); the interval is the one
        # after that cell (null while the fit gives none), the spend is cumulative.
        pa.field("decision", pa.int64(), nullable=False),
        pa.field("action", pa.string(), nullable=False),  # probe, predict, place, refine, stop
        pa.field("batch_size", pa.int64()),
        pa.field("seed", pa.int64()),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("lr_rule", pa.string(), nullable=False),
        pa.field("target_metric", pa.string(), nullable=False),
        pa.field("target_value", pa.float64(), nullable=False),
        # B_crit predicted from the gradient noise scale, with the spread of B_simple near the
        # target; method: near target, extrapolated, or none.
        pa.field("predicted_b_crit", pa.float64()),
        pa.field("predicted_low", pa.float64()),
        pa.field("predicted_high", pa.float64()),
        pa.field("prediction_method", pa.string(), nullable=False),
        pa.field("b_crit", pa.float64()),
        pa.field("b_crit_low", pa.float64()),
        pa.field("b_crit_high", pa.float64()),
        pa.field("interval_ratio", pa.float64()),
        # B* = sqrt(B_crit·α/β) and its interval (B_crit's mapped), where the trials' own step
        # times give the line t = α + βB; the adaptive_objective b_star narrows it.
        pa.field("b_star", pa.float64()),
        pa.field("b_star_low", pa.float64()),
        pa.field("b_star_high", pa.float64()),
        # What the simulated results of this cell made the study expect the ratio to become.
        pa.field("expected_ratio", pa.float64()),
        pa.field("examples_spent", pa.int64(), nullable=False),
        pa.field("device_s_spent", pa.float64(), nullable=False),
        # Device-seconds held: each cell's launch wall time (start-up, data loading, evaluation
        # and training) × workers, cumulative; null in rows written before it was recorded.
        pa.field("device_s_held", pa.float64()),
        pa.field("workers", pa.int64(), nullable=False),
        # The grid the search chose its cells from (convergence.batch_sizes × its seeds), so
        # that its cost can be compared with that grid's wherever the table is read; null in
        # rows written before layout 6.
        pa.field("grid_batch_sizes", pa.list_(pa.int64())),
        pa.field("grid_seeds", pa.int64()),
    ]
)
