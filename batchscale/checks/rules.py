"""The checks great-expectations cannot express, run in Python and reported as result rows.

A suite names the rules it wants in `meta.python_checks` (with their options). Every rule takes
(table, dataframe, parameter values, context, **options) and returns a list of result rows; a
rule whose cross-table input is not in the context returns no rows.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from batchscale.checks.results import MAX_SHOWN, SOURCE_PYTHON, plain, result
from batchscale.errors import BadInput
from batchscale.metrics import METRICS, target_label
from batchscale.schemas import Quality, RunStatus, TrialStatus

# ---------------------------------------------------------------- finite numbers


def finite_values(
    table: pa.Table, row_keys: list[str], nan_allowed: dict[str, str],
    checked_elsewhere: dict[str, str],
) -> list[dict]:
    """One result per floating-point column: every value present is finite.

    Run on the Arrow table because pandas (and so great-expectations) reads NaN as null and
    skips it. A column of `nan_allowed` may hold NaN where the suite says what NaN means (not
    measured, not fitted), never +-inf; `checked_elsewhere` names columns with their own rule.
    """
    results = []
    for f in table.schema:
        if not pa.types.is_floating(f.type) or f.name in checked_elsewhere:
            continue
        column = table.column(f.name)
        bad = pc.is_inf(column) if f.name in nan_allowed else pc.invert(pc.is_finite(column))
        rows = np.flatnonzero(pc.fill_null(bad, False).to_numpy(zero_copy_only=False))
        description = (f"no +-inf (NaN means {nan_allowed[f.name]})" if f.name in nan_allowed
                       else "no NaN or +-inf where a value is present")
        results.append(result(
            "expect_column_values_to_be_finite", f.name, rows.size == 0, SOURCE_PYTHON,
            description=description,
            element_count=len(column) - column.null_count, unexpected_count=int(rows.size),
            unexpected_values=[column[int(i)].as_py() for i in rows[:MAX_SHOWN]],
            unexpected_rows=[_row_of(table, int(i), row_keys) for i in rows[:MAX_SHOWN]],
        ))
    return results


def _row_of(table: pa.Table, i: int, row_keys: list[str]) -> dict:
    """A row identified by its key columns and position, as the GX adapter reports rows."""
    return {"row": i, **{k: table.column(k)[i].as_py() for k in row_keys}}


# ---------------------------------------------------------------- class balance


def class_balance(
    table: pa.Table, df: pd.DataFrame, parameters: dict, context: dict,
    *, min_share_of_uniform: float,
) -> list[dict]:
    """Extreme imbalance: the rarest class has fewer rows than a share of the uniform count
    (not for dense targets, whose label only summarises the row)."""
    if context.get("dense_targets"):
        return []
    num_classes = parameters["num_classes"]
    labels = df["label"].dropna().astype("int64")
    counts = labels[(labels >= 0) & (labels < num_classes)].value_counts()
    counts = {c: int(counts.get(c, 0)) for c in range(num_classes)}
    return [_balance_result("label", counts, min_share_of_uniform)]


def histogram_class_balance(
    table: pa.Table, df: pd.DataFrame, parameters: dict, context: dict,
    *, min_share_of_uniform: float,
) -> list[dict]:
    """Class balance of each split, from the shards' class histograms summed per split (not
    for dense targets, whose label only summarises the row)."""
    if context.get("dense_targets"):
        return []
    totals: dict[str, np.ndarray] = {}
    for split, hist in zip(table.column("split").to_pylist(),
                           table.column("class_histogram").to_pylist(), strict=True):
        total = totals.setdefault(split, np.zeros(len(hist or []), np.int64))
        if hist and len(hist) == len(total):  # other lengths are reported by the GX suite
            total += hist
    return [
        _balance_result(f"class_histogram[split={split}]",
                        {c: int(n) for c, n in enumerate(hist)}, min_share_of_uniform)
        for split, hist in sorted(totals.items(), key=lambda item: str(item[0]))
    ]


def _balance_result(column: str, counts: dict[int, int], min_share: float) -> dict:
    """Flag classes under `min_share` of the uniform count.

    Below one row of floor (e.g. a small last shard) a missing class is chance, not imbalance,
    so such tables pass; the manifest's per-split check still covers the whole split.
    """
    total = sum(counts.values())
    floor = min_share * total / max(len(counts), 1)
    rare = sorted((n, c) for c, n in counts.items() if n < floor) if floor >= 1 else []
    return result(
        "expect_smallest_class_to_be_at_least_share_of_uniform", column, not rare,
        SOURCE_PYTHON,
        description=f"every class has at least {min_share:g} of the uniform share of rows",
        kwargs={"min_share_of_uniform": min_share, "min_rows": round(floor, 3)},
        element_count=total,
        unexpected_count=len(rare),
        unexpected_values=[f"class {c}: {n} rows" for n, c in rare[:MAX_SHOWN]],
        observed_value={"smallest_class_rows": min(counts.values(), default=0),
                        "uniform_rows": round(total / max(len(counts), 1), 3)},
    )


# ---------------------------------------------------------------- shard files


def shard_checksums(
    table: pa.Table, df: pd.DataFrame, parameters: dict, context: dict,
) -> list[dict]:
    """Every shard's sha256 as written matches the manifest, and no file is unlisted."""
    if "shard_checksums" not in context:
        return []
    actual = context["shard_checksums"]
    listed = dict(zip(table.column("shard").to_pylist(), table.column("sha256").to_pylist(),
                      strict=True))
    bad = [
        f"{shard}: manifest {listed.get(shard, 'not listed')}, file {actual.get(shard, 'missing')}"
        for shard in sorted(set(listed) | set(actual))
        if listed.get(shard) != actual.get(shard)
    ]
    return [result(
        "expect_shard_checksums_to_match_manifest", "sha256", not bad, SOURCE_PYTHON,
        description="the sha256 of each shard file equals the manifest's",
        element_count=len(listed), unexpected_count=len(bad), unexpected_values=bad[:MAX_SHOWN],
    )]


# ---------------------------------------------------------------- runs against their curves


def steps_to_target_matches_curves(
    table: pa.Table, df: pd.DataFrame, parameters: dict, context: dict,
) -> list[dict]:
    """A reached row's steps_to_target is the first curve step whose value of the row's target
    metric reaches the target (higher or lower, as the metric says)."""
    if "curves" not in context:
        return []
    reached = [r for r in _run_rows(table) if r["status"] == RunStatus.REACHED]
    bad = []
    for run in reached:
        metric, value = _row_target(run)
        found = _first_crossing(context["curves"], run["trial_id"], metric, value)
        if found is None or found != run["steps_to_target"]:
            seen = "never reach the target" if found is None else f"cross at step {found}"
            bad.append(f"{run['trial_id']} ({target_label(metric, value)}): steps_to_target "
                       f"{run['steps_to_target']}, curves {seen}")
    return [result(
        "expect_steps_to_target_to_match_curves", "steps_to_target", not bad, SOURCE_PYTHON,
        description="steps_to_target is the first curve step at which the row's target metric "
        "reaches target_value (val_accuracy >= target_val_accuracy in version 1 rows)",
        element_count=len(reached), unexpected_count=len(bad), unexpected_values=bad[:MAX_SHOWN],
    )]


def reached_trials_have_finite_losses(
    table: pa.Table, df: pd.DataFrame, parameters: dict, context: dict,
) -> list[dict]:
    """A trial whose curve holds a NaN/inf loss diverged; it cannot be marked reached."""
    if "curves" not in context:
        return []
    points = _curve_points(context["curves"], ["trial_id", "step", "train_loss"])
    finite = pc.fill_null(pc.is_finite(context["curves"].column("train_loss")), True)
    reached = {r["trial_id"] for r in _run_rows(table) if r["status"] == RunStatus.REACHED}
    nonfinite = ~finite.to_numpy(zero_copy_only=False)
    bad_points = points[nonfinite & points["trial_id"].isin(reached)].drop_duplicates("trial_id")
    bad = [f"{r.trial_id}: train_loss {plain(r.train_loss)} at step {r.step}"
           for r in bad_points.itertuples()]
    return [result(
        "expect_reached_trials_to_have_finite_losses", "status", not bad, SOURCE_PYTHON,
        description="trials marked reached have no NaN/inf train_loss in their curves",
        element_count=len(reached), unexpected_count=len(bad), unexpected_values=bad[:MAX_SHOWN],
    )]


def _run_rows(table: pa.Table) -> list[dict]:
    """Runs rows as Python values (pandas would turn nullable integers into floats)."""
    columns = ["trial_id", "status", "steps_to_target", "target_val_accuracy"]
    columns += [c for c in ("target_metric", "target_value") if c in table.column_names]
    return table.select(columns).to_pylist()


def _row_target(run: dict) -> tuple[str, float]:
    """(metric, value) of a runs row; a version 1 row's target is val_accuracy."""
    if run.get("target_metric"):
        return run["target_metric"], run["target_value"]
    return "val_accuracy", run["target_val_accuracy"]


def _first_crossing(curves: pa.Table, trial_id: str, metric: str, value: float) -> int | None:
    """The first step after training started (> 0) of `trial_id`'s curve at which `metric`
    reaches `value`."""
    if metric not in METRICS:
        return None
    if metric not in curves.column_names:
        raise BadInput(f"validate runs: context curves lacks column {metric!r}")
    points = _curve_points(curves, ["trial_id", "step", metric]).dropna()
    points = points[points["trial_id"] == trial_id]
    hits = [int(step) for step, v in zip(points["step"], points[metric], strict=True)
            if step > 0 and METRICS[metric].reached(float(v), value)]  # step 0: untrained
    return min(hits) if hits else None


def _curve_points(curves: pa.Table, columns: list[str]) -> pd.DataFrame:
    """Columns of the context curves table, refusing a table that lacks them (a wiring bug)."""
    missing = [c for c in columns if c not in curves.column_names]
    if missing:
        raise BadInput(f"validate runs: context curves lacks columns {missing}")
    return curves.select(columns).to_pandas()


# ---------------------------------------------------------------- sweep measurement quality


def unstable_share(
    table: pa.Table, df: pd.DataFrame, parameters: dict, context: dict,
) -> list[dict]:
    """At most `max_unstable_share` of the timed (ok) sweep rows are flagged unstable; any
    unstable row below that share passes with a warning naming the rows and why."""
    limit = parameters["max_unstable_share"]
    rows = table.select(["input_mode", "batch_size", "status", "quality",
                         "quality_reason"]).to_pylist()
    timed = [r for r in rows if r["status"] == TrialStatus.OK]
    unstable = [r for r in timed if r["quality"] == Quality.UNSTABLE]
    unjudged = sum(r["quality"] is None for r in timed)
    share = len(unstable) / len(timed) if timed else 0.0
    named = [f"{r['input_mode']} batch {r['batch_size']}: {r['quality_reason']}"
             for r in unstable]
    within = share <= limit
    success = within or not parameters.get("unstable_fails", False)
    warnings = []
    if unstable and within:
        warnings.append(f"{len(unstable)} of {len(timed)} timed rows unstable ({share:.0%}, at "
                        f"most {limit:.0%} allowed): the analysis leaves them out; "
                        + "; ".join(named[:MAX_SHOWN]))
    elif unstable and success:
        warnings.append(f"MEASUREMENT DISTURBED: {len(unstable)} of {len(timed)} timed rows "
                        f"unstable ({share:.0%}, more than {limit:.0%}); passed because "
                        "sweep.unstable_fails is false: the analysis leaves them out and the "
                        "regression check does not judge this run; "
                        + "; ".join(named[:MAX_SHOWN]))
    if unjudged:
        warnings.append(f"{unjudged} of {len(timed)} timed rows carry no quality (a table from "
                        "before batchscale judged its measurements): counted as ok")
    return [result(
        "expect_unstable_share_to_be_at_most", "quality", success, SOURCE_PYTHON,
        description=f"at most {limit:.0%} of the timed rows flagged unstable "
        "(sweep.max_unstable_share): more means the machine was too busy to trust the sweep; "
        "rerun on a quiet node, pin CPUs or request Guaranteed QoS",
        kwargs={"max_unstable_share": limit},
        element_count=len(timed), unexpected_count=len(unstable),
        unexpected_values=named[:MAX_SHOWN],
        observed_value={"unstable_share": round(share, 4)},
        warning="; ".join(warnings) or None,
    )]


def samples_per_s_matches_step_time(
    table: pa.Table, df: pd.DataFrame, parameters: dict, context: dict,
    max_relative_error: float = 1e-3,
) -> list[dict]:
    """A timed row's samples/s is its batch over its median step time, as the sweep writes it:
    a row whose throughput disagrees with its own step time cannot be true, whichever figure
    is wrong, and would make a saturation batch and sentences the table contradicts."""
    rows = table.select(["input_mode", "batch_size", "status", "step_time_median_s",
                         "samples_per_s"]).to_pylist()
    bad = []
    for i, r in enumerate(rows):
        step, rate = r["step_time_median_s"], r["samples_per_s"]
        if r["status"] != TrialStatus.OK or not all(
                isinstance(v, float) and np.isfinite(v) and v > 0 for v in (step, rate)):
            continue
        if abs(rate * step / r["batch_size"] - 1.0) > max_relative_error:
            bad.append((i, r, r["batch_size"] / step))
    return [result(
        "expect_samples_per_s_to_match_step_time", "samples_per_s", not bad, SOURCE_PYTHON,
        description="a timed row's samples_per_s is batch_size / step_time_median_s (within "
        f"{max_relative_error:.1%}): a row whose throughput disagrees with its own step time "
        "cannot be true",
        kwargs={"max_relative_error": max_relative_error},
        element_count=len(rows), unexpected_count=len(bad),
        unexpected_values=[f"{r['input_mode']} batch {r['batch_size']}: samples_per_s "
                           f"{r['samples_per_s']:.6g}, batch / median step {expected:.6g}"
                           for _, r, expected in bad[:MAX_SHOWN]],
        unexpected_rows=[{"row": i, "input_mode": r["input_mode"],
                          "batch_size": r["batch_size"]} for i, r, _ in bad[:MAX_SHOWN]],
    )]


PYTHON_CHECKS: dict[str, Callable[..., list[dict]]] = {
    "class_balance": class_balance,
    "histogram_class_balance": histogram_class_balance,
    "shard_checksums": shard_checksums,
    "steps_to_target_matches_curves": steps_to_target_matches_curves,
    "reached_trials_have_finite_losses": reached_trials_have_finite_losses,
    "unstable_share": unstable_share,
    "samples_per_s_matches_step_time": samples_per_s_matches_step_time,
}
