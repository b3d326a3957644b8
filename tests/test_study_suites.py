"""The study suites (batchscale/expectations/study.json, study_axes.json) accept the tables a
study's compare stage writes, NaN where it means "only a bound" or "not fitted", and refuse
each broken table with a message naming the expectation and the column."""

from __future__ import annotations

import json
import math

import pytest

from batchscale.checks import gx, validate_table
from batchscale.schemas import ENV_FIELDS, make_table

STUDY_ID = "study-1"
ENV = {"run_id": STUDY_ID, "config_hash": "c0ffee", "experiment": "study-test",
       "workload": "digits-mlp", "git_commit": "deadbeef", "batchscale_version": "0.1.0",
       "torch_version": "2.14.1", "python_version": "3.11.9", "device_name": "cpu",
       "threads": 2, "world_size": 1, "cuda_version": None, "gpu_driver": None, "image": None,
       "schema_version": 4, "study_id": STUDY_ID, "variant": None}
assert set(ENV) == {f.name for f in ENV_FIELDS}
NAN = math.nan


@pytest.fixture(scope="module", autouse=True)
def gx_context():
    """Create the process's GX context once, up front (it is reused by every validation)."""
    return gx.gx_context()


def study_row(fraction: float, **changes) -> dict:
    """A variant with B_crit ≈ 80·fraction, its interval, B* from a step-time line."""
    variant = f"dataset_fraction={fraction}"
    b_crit = 80.0 * fraction
    row = {"variant": variant, "variant_run_id": f"{STUDY_ID}-{variant}",
           "axis_values": json.dumps({"dataset_fraction": fraction}),
           "target_metric": "val_accuracy", "target_value": 0.9, "lr_rule": "sqrt",
           "b_crit": b_crit, "b_crit_low": 0.7 * b_crit, "b_crit_high": 1.4 * b_crit,
           "s_min": 40.0, "e_min": 40.0 * b_crit, "b_simple": 11.5, "saturation_batch": 256,
           "b_star": math.sqrt(b_crit * 50), "b_star_low": math.sqrt(0.7 * b_crit * 50),
           "b_star_high": math.sqrt(1.4 * b_crit * 50), "parameters": 17_930}
    return {**row, **changes}


def study_rows() -> list[dict]:
    """Three fitted variants and one whose data support only a lower bound on B_crit (NaN
    figures, no B*, no noise-scale estimate)."""
    bound = study_row(1.0, b_crit=NAN, b_crit_low=NAN, b_crit_high=NAN, b_crit_bound="above",
                      b_crit_bound_batch=256.0, b_crit_reason="still improving at 256",
                      s_min=NAN, e_min=NAN, b_simple=NAN, b_star=NAN, b_star_low=NAN,
                      b_star_high=NAN, saturation_batch=None)
    return [study_row(0.25), study_row(0.5), study_row(0.75), bound]


def axes_row(axis: str, **changes) -> dict:
    row = {"axis": axis, "x_name": axis, "x_scale": "log", "target_metric": "val_accuracy",
           "target_value": 0.9, "lr_rule": "sqrt", "variants_fitted": 3, "slope": 1.0,
           "slope_low": 0.6, "slope_high": 1.4, "range_factor": 3.0,
           "range_factor_low": 1.9, "range_factor_high": 4.7, "verdict": "grows"}
    return {**row, **changes}


def axes_rows() -> list[dict]:
    """A fitted axis, a flat one, and a categorical one (NaN: not fitted, and why)."""
    unfitted = {c: NAN for c in ("slope", "slope_low", "slope_high", "range_factor",
                                 "range_factor_low", "range_factor_high")}
    return [
        axes_row("dataset_fraction"),
        axes_row("weight_decay", x_scale="linear", slope=0.1, slope_low=-0.2, slope_high=0.4,
                 range_factor=1.1, range_factor_low=0.8, range_factor_high=1.5,
                 verdict="no detectable change"),
        axes_row("model", x_name="model", x_scale="categorical", variants_fitted=4,
                 verdict="not fitted: its values are not numbers (compare the variants' rows)",
                 **unfitted),
    ]


def study_table(rows: list[dict] | None = None):
    return make_table("study", study_rows() if rows is None else rows, ENV)


def axes_table(rows: list[dict] | None = None):
    return make_table("study_axes", axes_rows() if rows is None else rows, ENV)


def refused(kind: str, table, expectation: str, *fragments: str) -> None:
    report = validate_table(kind, table)
    message = report.failure_message()
    assert not report.success, message
    assert message.startswith(f"{kind} table failed validation"), message
    for fragment in (expectation, *fragments):
        assert fragment in message, message


def changed(rows: list[dict], index: int, **changes) -> list[dict]:
    rows[index].update(changes)
    return rows


# ---------------------------------------------------------------- clean tables


@pytest.mark.parametrize("kind", ["study", "study_axes"])
def test_clean_study_tables_pass(kind):
    table = study_table() if kind == "study" else axes_table()
    report = validate_table(kind, table)
    assert report.success, report.failure_message()
    assert report.statistics["unsuccessful_expectations"] == 0
    assert report.statistics["evaluated_expectations"] == len(report.results) > 40


def test_nan_columns_of_the_clean_tables_are_the_ones_the_suites_explain():
    """The clean tables above do hold NaN (so the pass above covers the exemptions)."""
    bound = study_table().slice(3, 1).to_pylist()[0]
    assert math.isnan(bound["b_crit"]) and math.isnan(bound["b_star_high"])
    assert math.isnan(axes_table().slice(2, 1).to_pylist()[0]["slope"])


def test_a_b_star_without_a_closed_interval_passes():
    """B* from a step-time line through two batch sizes: a point, its interval null."""
    rows = changed(study_rows(), 1, b_star_low=NAN, b_star_high=NAN)
    report = validate_table("study", make_table("study", rows, ENV))
    assert report.success, report.failure_message()


# ---------------------------------------------------------------- study: broken tables


@pytest.mark.parametrize(("rows", "expectation", "fragment"), [
    (changed(study_rows(), 1, b_crit_low=50.0, b_crit_high=30.0),
     "expect_column_pair_values_a_to_be_greater_than_b(b_crit_high, b_crit_low)", "1 of"),
    (changed(study_rows(), 1, b_star_low=50.0, b_star_high=30.0),
     "expect_column_pair_values_a_to_be_greater_than_b(b_star_high, b_star_low)", "1 of"),
    (changed(study_rows(), 1, variant="dataset_fraction=0.25"),
     "expect_compound_columns_to_be_unique(variant, target_metric, target_value, lr_rule)",
     "2 of"),
    (changed(study_rows(), 2, variant=None), "expect_column_values_to_not_be_null(variant)",
     "1 of"),
    (changed(study_rows(), 0, variant_run_id=None),
     "expect_column_values_to_not_be_null(variant_run_id)", "1 of"),
    (changed(study_rows(), 0, target_value=None),
     "expect_column_values_to_not_be_null(target_value)", "1 of"),
    (changed(study_rows(), 0, b_crit=-3.0), "expect_column_values_to_be_between(b_crit)",
     "values [-3.0]"),
    (changed(study_rows(), 0, s_min=0.0), "expect_column_values_to_be_between(s_min)",
     "values [0.0]"),
    (changed(study_rows(), 0, b_star=2.0**60), "expect_column_values_to_be_between(b_star)",
     "1 of"),
    (changed(study_rows(), 3, b_crit_bound="between"),
     "expect_column_values_to_be_in_set(b_crit_bound)", 'values ["between"]'),
    (changed(study_rows(), 0, saturation_batch=0),
     "expect_column_values_to_be_between(saturation_batch)", "1 of"),
    (changed(study_rows(), 0, parameters=-1), "expect_column_values_to_be_between(parameters)",
     "values [-1]"),
    (changed(study_rows(), 0, lr_rule="cubic"), "expect_column_values_to_be_in_set(lr_rule)",
     'values ["cubic"]'),
    (changed(study_rows(), 0, b_crit=math.inf), "expect_column_values_to_be_finite(b_crit)",
     '"row": 0'),
    (changed(study_rows(), 0, b_simple=-math.inf), "expect_column_values_to_be_finite(b_simple)",
     '"row": 0'),
    (changed(study_rows(), 0, target_value=NAN),
     "expect_column_values_to_be_finite(target_value)", '"row": 0'),
], ids=["b_crit interval reversed", "b_star interval reversed", "duplicated variant",
        "missing variant", "missing variant run", "missing target", "negative b_crit",
        "zero s_min", "huge b_star", "unknown bound", "zero saturation batch",
        "negative parameters", "unknown lr rule", "infinite b_crit", "infinite b_simple",
        "nan target"])
def test_broken_study_table_is_refused(rows, expectation, fragment):
    refused("study", study_table(rows), expectation, fragment)


def test_empty_study_table_is_refused():
    refused("study", study_table([]), "expect_table_row_count_to_be_between")


def test_study_rows_of_two_studies_are_refused():
    rows = changed(study_rows(), 0, run_id="study-2", study_id="study-2")
    refused("study", study_table(rows), "expect_column_unique_value_count_to_be_between(run_id)")


def test_study_id_other_than_the_run_id_is_refused():
    rows = [{**row, "study_id": "another-study"} for row in study_rows()]
    refused("study", study_table(rows),
            "expect_column_pair_values_to_be_equal(run_id, study_id)", "4 of")


def test_study_row_with_an_older_schema_version_is_refused():
    rows = changed(study_rows(), 0, schema_version=2)
    refused("study", study_table(rows), "expect_column_values_to_be_between(schema_version)",
            "values [2]")


# ---------------------------------------------------------------- study_axes: broken tables


@pytest.mark.parametrize(("rows", "expectation", "fragment"), [
    (changed(axes_rows(), 0, verdict="grows a lot"),
     "expect_column_values_to_match_regex(verdict)", 'values ["grows a lot"]'),
    (changed(axes_rows(), 2, verdict="not fitted: "),
     "expect_column_values_to_match_regex(verdict)", 'values ["not fitted: "]'),
    (changed(axes_rows(), 0, verdict=None), "expect_column_values_to_not_be_null(verdict)",
     "1 of"),
    (changed(axes_rows(), 0, slope_low=1.4, slope_high=0.6),
     "expect_column_pair_values_a_to_be_greater_than_b(slope_high, slope_low)", "1 of"),
    (changed(axes_rows(), 1, slope_low=-0.2, slope_high=-0.4),
     "expect_column_pair_values_a_to_be_greater_than_b(slope_high, slope_low)", "1 of"),
    (changed(axes_rows(), 0, range_factor_low=4.7, range_factor_high=1.9),
     "expect_column_pair_values_a_to_be_greater_than_b(range_factor_high, range_factor_low)",
     "1 of"),
    (changed(axes_rows(), 1, axis="dataset_fraction"),
     "expect_compound_columns_to_be_unique(axis, target_metric, target_value, lr_rule)",
     "2 of"),
    (changed(axes_rows(), 0, x_scale="quadratic"), "expect_column_values_to_be_in_set(x_scale)",
     'values ["quadratic"]'),
    (changed(axes_rows(), 0, variants_fitted=-1),
     "expect_column_values_to_be_between(variants_fitted)", "values [-1]"),
    (changed(axes_rows(), 0, range_factor=0.0),
     "expect_column_values_to_be_between(range_factor)", "values [0.0]"),
    (changed(axes_rows(), 0, slope=1e16), "expect_column_values_to_be_between(slope)", "1 of"),
    (changed(axes_rows(), 0, slope_high=math.inf),
     "expect_column_values_to_be_finite(slope_high)", '"row": 0'),
    (changed(axes_rows(), 0, x_name=None), "expect_column_values_to_not_be_null(x_name)",
     "1 of"),
    (changed(axes_rows(), 0, study_id=None), "expect_column_values_to_not_be_null(study_id)",
     "1 of"),
], ids=["unknown verdict", "not fitted without why", "missing verdict", "slope interval reversed",
        "negative slope interval reversed", "range factor interval reversed", "duplicated axis",
        "unknown x scale", "negative variants fitted", "zero range factor", "huge slope",
        "infinite slope", "missing x name", "missing study id"])
def test_broken_axes_table_is_refused(rows, expectation, fragment):
    refused("study_axes", axes_table(rows), expectation, fragment)


def test_empty_axes_table_is_refused():
    refused("study_axes", axes_table([]), "expect_table_row_count_to_be_between")
