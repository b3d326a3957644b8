"""One pyarrow schema per table, kept by capability in this package's modules (`measurement`,
`adaptive`, `study`, `batch_schedule`) and registered here. Every result row also carries the run's
environment columns.

Units are in the column names. `make_table` is the only way tables are built, so a missing or
mistyped column fails where it is produced, not three stages later.
"""

from __future__ import annotations

from enum import StrEnum

import pyarrow as pa

from batchscale.errors import BadInput
from batchscale.schemas.adaptive import DECISIONS
from batchscale.schemas.batch_schedule import CRITICAL_OVER_TRAINING, SCHEDULE_CHECK
from batchscale.schemas.measurement import (
    ANALYSIS,
    CURVES,
    DATASET,
    MANIFEST,
    PLAN,
    REGRESSIONS,
    RUNS,
    SWEEP,
)
from batchscale.schemas.study import STUDY, STUDY_AXES


class TrialStatus(StrEnum):
    """`status` of a sweep row: did the batch fit and run?"""

    OK = "ok"
    OOM = "oom"
    ERROR = "error"


TIMED_BEFORE = "earlier trials had timed it"
"""In a sweep row's error where the batch failed only after earlier rounds had timed it: the
batch can run, so the convergence stage does not refuse it."""


class Quality(StrEnum):
    """`quality` of a timed sweep row: can its figures be trusted?"""

    OK = "ok"
    UNSTABLE = "unstable"


class RunStatus(StrEnum):
    """`status` of a convergence trial (runs table)."""

    REACHED = "reached"
    NOT_REACHED = "not_reached"
    DIVERGED = "diverged"
    PRUNED = "pruned"
    """Stopped by the adaptive search: hopelessly behind what its fit implies (excluded from
    the fit; convergence.adaptive_prune_factor)."""
    PROBED = "probed"
    """A probe trial the adaptive search stopped at its probe budget or once B_simple was
    stable near the target (convergence.adaptive_probe_budget_examples): it measured the noise
    scale, not the steps to the target. Excluded from the fit."""
    FAILED = "failed"
    """A user's training loop raised, never reported, or reported what is not a metric
    (batchscale/loop.py); its message is in the converge log. Excluded from the fit."""


class StopKind(StrEnum):
    """How a not_reached trial's `stop_reason` (runs table) begins, by what ended it; readers
    count the trials that stopped short by these (`stop_kind`)."""

    STALLED = "stalled"
    """No metric of an unreached target improved for convergence.patience_evals evaluations."""
    OUT_OF_STEPS = "ran convergence.max_steps"
    """The trial spent convergence.max_steps."""


def stop_kind(reason: object) -> StopKind | None:
    """The StopKind a `stop_reason` begins with; None for others (a divergence, a loop's own
    failure) and for no reason (reached, or a row from before it was recorded)."""
    text = reason if isinstance(reason, str) else ""
    return next((kind for kind in StopKind if text.startswith(kind.value)), None)


TUNED_RULE = "tuned"
"""`lr_rule` of trials that try every learning rate of `lr_candidates` at each batch size."""
OLD_LR_RULES = {"grid": TUNED_RULE}
"""Old names of LR rules: rows written before keep them and are read under the new name
(`current_lr_rules`); configs that use them are read with a note (config/loading.py)."""


def current_lr_rules(table):
    """`table` (a pandas frame or a pyarrow table) with old LR rule names in `lr_rule` replaced
    by their current ones; unchanged when it has no such column."""
    if isinstance(table, pa.Table):
        if "lr_rule" not in table.column_names:
            return table
        import pyarrow.compute as pc

        column = table.column("lr_rule")
        for old, new in OLD_LR_RULES.items():
            column = pc.if_else(pc.equal(column, old), new, column)
        return table.set_column(table.schema.get_field_index("lr_rule"), "lr_rule", column)
    if table is None or "lr_rule" not in table.columns:
        return table
    return table.assign(lr_rule=table["lr_rule"].replace(OLD_LR_RULES))


ENV_FIELDS = [
    pa.field("run_id", pa.string(), nullable=False),
    pa.field("config_hash", pa.string(), nullable=False),
    pa.field("experiment", pa.string(), nullable=False),
    pa.field("workload", pa.string(), nullable=False),
    pa.field("git_commit", pa.string(), nullable=False),
    pa.field("batchscale_version", pa.string(), nullable=False),
    pa.field("torch_version", pa.string(), nullable=False),
    pa.field("python_version", pa.string(), nullable=False),
    pa.field("device_name", pa.string(), nullable=False),
    pa.field("threads", pa.int32(), nullable=False),
    pa.field("world_size", pa.int32(), nullable=False),
    # Software under torch (null on a CPU, and in rows written before version 4): the CUDA
    # runtime torch was built with, the NVIDIA driver, and the image reference the pipeline task
    # ran (images.IMAGE_REF_ENV; null outside a pipeline).
    pa.field("cuda_version", pa.string()),
    pa.field("gpu_driver", pa.string()),
    pa.field("image", pa.string()),
    # The table layout the row was written with (SCHEMA_VERSION); null in rows written before
    # the column existed (version 1). Readers take older partitions under today's schema, the
    # columns added since reading as null (docs/architecture.md, "Schema versions").
    pa.field("schema_version", pa.int32()),
    # A study's variant (config `variant`) and the study (its run id less the variant's name);
    # null for a single run, and in rows written before version 3.
    pa.field("study_id", pa.string()),
    pa.field("variant", pa.string()),
]
SCHEMA_VERSION = 11
"""2: several targets per trial (runs: a row per trial and target, target_metric and
target_value), every evaluated metric in curves, curves' train_loss on a fixed training subset
(the running batch mean moved to train_batch_loss). 3: `study_id` and `variant` in every result
row. 4: `cuda_version`, `gpu_driver` and `image` (the regression check's software fields).
5: the answer card as a row of the analysis table (`answer`, `answer_*`). 6: the grid an
adaptive search chose from, on each of its decisions (`grid_batch_sizes`, `grid_seeds`).
7: the evaluation before the one that met a target (`runs.steps_before_target`), and where
the analysis's sweep step time came from (`analysis.sweep_step_time_source`). 8: S_min's and
E_min's standard errors (`analysis.s_min_se`, `analysis.e_min_se`), and the trial a runs row's
results come from where it was not trained itself (`runs.trained_as`). 9: the analysis
rows' spread over seeds (`trials_at_lr`, `reached_at_lr`, `steps_low`/`_high`,
`time_to_target_s_low`/`_high`) and over a batch's B_simple estimates (`b_simple_low`/`_high`,
`b_simple_trials`). 10: the learning rate of each stage of a batch-size schedule
(`critical_over_training.base_batch_lr`, `scheduled_lr`); why an analysis row has no B_crit
(`analysis.b_crit_reason`); the study's S_min and E_min standard errors and each variant's
answer (`study.s_min_se`, `e_min_se`, `answer_*`). 11: how many seeds a variant's answer
is over and why its time cannot be trusted (`study.answer_seeds`, `answer_timing_flag`)."""

__all__ = ["ANALYSIS", "CRITICAL_OVER_TRAINING", "CURVES", "DATASET", "DECISIONS",
           "TIMED_BEFORE", "ENV_FIELDS", "MANIFEST", "PLAN", "REGRESSIONS",
           "RESULT_TABLES", "RUNS", "SCHEDULE_CHECK",
           "SCHEMA_VERSION", "STUDY", "STUDY_AXES", "SWEEP", "TABLES", "Quality", "RunStatus",
           "StopKind", "stop_kind",
           "OLD_LR_RULES", "TUNED_RULE", "TrialStatus", "current_lr_rules", "make_table",
           "schema_for"]


RESULT_TABLES = {
    "sweep": SWEEP,
    "curves": CURVES,
    "runs": RUNS,
    "analysis": ANALYSIS,
    "plan": PLAN,
    "decisions": DECISIONS,
    "study": STUDY,
    "study_axes": STUDY_AXES,
    "critical_over_training": CRITICAL_OVER_TRAINING,
    "schedule_check": SCHEDULE_CHECK,
}
TABLES = {"dataset": DATASET, "manifest": MANIFEST, **RESULT_TABLES, "regressions": REGRESSIONS}


def schema_for(kind: str) -> pa.Schema:
    """The full schema of a table kind (result tables include the environment columns)."""
    if kind not in TABLES:
        raise BadInput(f"unknown table kind {kind!r}; allowed: {', '.join(TABLES)}")
    base = TABLES[kind]
    if kind in RESULT_TABLES:
        return pa.schema(ENV_FIELDS + list(base))
    return base


def make_table(kind: str, rows: list[dict], env: dict | None = None) -> pa.Table:
    """Build a table of `kind` from row dicts, adding `env` to every row of result tables."""
    schema = schema_for(kind)
    if kind in RESULT_TABLES:
        if env is None:
            raise ValueError(f"{kind} rows need the environment columns")
        rows = [{**env, "schema_version": SCHEMA_VERSION, **row} for row in rows]
    names = set(schema.names)
    for row in rows:
        extra = set(row) - names
        if extra:
            raise ValueError(f"{kind} row has columns outside the schema: {sorted(extra)}")
    return pa.Table.from_pylist(rows, schema=schema)


NOT_MEASURED_KEY = b"batchscale.not_measured"
"""Schema metadata of a table its stage left empty on purpose: why nothing was measured."""


def not_measured_table(kind: str, env: dict | None, reason: str) -> pa.Table:
    """An empty table of `kind` that says why it is empty (a TrainingLoop has no sweep), so
    the checks after it can tell it from a stage that produced nothing."""
    table = make_table(kind, [], env)
    return table.replace_schema_metadata({**(table.schema.metadata or {}),
                                          NOT_MEASURED_KEY: reason.encode()})


def not_measured_reason(table: pa.Table) -> str | None:
    """Why an empty table was left empty, or None for any other table."""
    reason = (table.schema.metadata or {}).get(NOT_MEASURED_KEY)
    return reason.decode() if reason is not None and table.num_rows == 0 else None
