"""The what-if planner: workers × per-worker batch from one run's measurements (docs/planner.md).

- `model`: the pure core (ring all-reduce, time to target and device-hours, accumulation,
  Pareto front, recommendation)
- `comm`: the all-reduce model fitted to the run's data-parallel cells and probes
- `inputs`: the planner's inputs read from a run's tables (BadInput naming what is missing)
- `table`: the `plan` table's rows, the printed plan, the check against the run's own cells
- `section`: the report's "What if: more workers" section
- `stage`: the plan table of a pipeline run
"""
