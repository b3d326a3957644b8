"""The validate stage refuses bad tables with a message naming table, expectation and values."""

from __future__ import annotations

import html
import json
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from batchscale import schemacheck
from batchscale.checks import gx, suites, validate_table
from batchscale.checks.outcome import validation_page
from batchscale.config import SweepConfig
from batchscale.errors import BadInput
from batchscale.schemas import TABLES, schema_for
from clean_tables import (
    BATCH_SIZES,
    ENV,
    ROWS,
    SHA,
    context,
    curve_rows,
    dataset_rows,
    manifest_rows,
    refused,
    run_rows,
    sweep_row,
    sweep_rows,
    table,
)


@pytest.fixture(scope="module", autouse=True)
def gx_context():
    """Create the process's GX context once, up front (it is reused by every validation)."""
    return gx.gx_context()


# ---------------------------------------------------------------- clean tables


# ---------------------------------------------------------------- clean tables pass


@pytest.mark.parametrize("kind", list(TABLES))
def test_clean_table_passes(kind):
    report = validate_table(kind, table(kind), context=context(kind))
    assert report.success, report.failure_message()
    assert report.statistics["unsuccessful_expectations"] == 0
    assert report.statistics["evaluated_expectations"] == len(report.results) > 3


def test_parameters_default_from_data_and_say_so():
    report = validate_table("sweep", table("sweep"))
    assert report.success, report.failure_message()
    assert report.parameters["batch_sizes"] == {"value": [4, 16, 64], "source": "table"}


# ---------------------------------------------------------------- schema


def test_renamed_column_is_refused():
    tbl = table("dataset").rename_columns(["features", "labels"])
    refused("dataset", tbl, "expect_column_to_exist", "(label)", "labels")


def test_wrong_type_is_refused():
    tbl = table("dataset").set_column(1, "label", pa.array(["cat"] * 40))
    refused("dataset", tbl, "expect_column_type_to_be", "(label)", "string")


def test_nulls_in_required_columns_are_refused():
    """A table read with a looser schema may hold nulls where the schema forbids them."""
    loose = pa.schema([f.with_nullable(True) for f in schema_for("curves")])
    rows = [{**ENV, **row} for row in curve_rows()]
    rows[2]["lr"] = None
    refused("curves", pa.Table.from_pylist(rows, schema=loose),
            "expect_column_values_to_not_be_null(lr)", '"trial_id": "t4", "step": 20')


@pytest.mark.parametrize(("column", "values", "found"), [
    ("batch_size", ["4", "4", "16", "16", "64"], "string"),  # not parsed
    ("batch_size", [4.0, 4.0, 16.0, 16.0, 64.0], "double"),  # not truncated
    ("samples_per_s", ["100"] * 4 + [None], "string"),
    ("threads", [True] * 5, "bool"),
])
def test_values_of_another_kind_are_refused_not_converted(column, values, found):
    tbl = table("sweep")
    tbl = tbl.set_column(tbl.schema.get_field_index(column), column, pa.array(values))
    refused("sweep", tbl, f"expect_column_type_to_be({column})", found, "not converted")


def test_values_beyond_the_column_type_are_refused():
    tbl = table("sweep")
    big = pa.array([2**63] * len(tbl), pa.uint64())
    refused("sweep", tbl.set_column(tbl.schema.get_field_index("batch_size"), "batch_size", big),
            "expect_column_type_to_be(batch_size)", "do not fit int64")


def test_widening_within_a_kind_is_accepted():
    """int32 batch sizes, float32 or integer timings and large strings are the same values."""
    tbl = table("sweep")
    for column, kind in (("batch_size", pa.int32()), ("samples_per_s", pa.float32()),
                         ("step_time_cv", pa.float32()), ("input_mode", pa.large_string())):
        tbl = tbl.set_column(tbl.schema.get_field_index(column), column,
                             tbl.column(column).cast(kind))
    rows = tbl.column("peak_flops_per_s").to_pylist()
    tbl = tbl.set_column(tbl.schema.get_field_index("peak_flops_per_s"), "peak_flops_per_s",
                         pa.array([int(v) for v in rows], pa.int64()))
    report = validate_table("sweep", tbl, context=context("sweep"))
    assert report.success, report.failure_message()


def test_duplicated_column_is_refused_by_name():
    tbl = table("dataset")
    twice = pa.Table.from_arrays([*tbl.columns, tbl.column("label")],
                                 names=["features", "label", "label"])
    message = refused("dataset", twice, "expect_column_names_to_be_unique(label)", '"times": 2')
    with pytest.raises(BadInput, match="duplicated columns 'label' \\(2 times\\)"):
        schemacheck.check_schema("dataset", twice)
    assert "features" not in message.split("\n", 1)[1]  # only the duplicated one is blamed


# ---------------------------------------------------------------- finite values and bounds


@pytest.mark.parametrize(("kind", "row", "column", "value", "expectation"), [
    ("sweep", 0, "samples_per_s", float("inf"), "expect_column_values_to_be_finite"),
    ("sweep", 0, "batch_size", 2**62, "expect_column_values_to_be_between"),
    ("curves", 1, "val_accuracy", float("nan"), "expect_column_values_to_be_finite"),
    ("runs", 0, "final_val_accuracy", float("-inf"), "expect_column_values_to_be_finite"),
    ("analysis", 0, "b_crit", float("inf"), "expect_column_values_to_be_finite"),
    ("sweep", 4, "step_time_median_s", -0.5, "expect_column_values_to_be_between"),  # oom row
    ("sweep", 0, "peak_memory_bytes", 2**55, "expect_column_values_to_be_between"),
])
def test_non_finite_and_out_of_bounds_values_are_refused(kind, row, column, value, expectation):
    rows = ROWS[kind]()
    rows[row][column] = value
    refused(kind, table(kind, rows), f"{expectation}({column})", f'"row": {row}', ctx={})


@pytest.mark.parametrize(("kind", "row", "column"), [
    ("sweep", 0, "step_time_cv"),  # fewer than two timed steps
    ("analysis", 0, "b_crit"),  # not fitted
    ("runs", 2, "b_simple"),  # the diverged trial's noise estimate overflowed
])
def test_nan_passes_where_the_suite_says_what_it_means(kind, row, column):
    rows = ROWS[kind]()
    rows[row][column] = float("nan")
    report = validate_table(kind, table(kind, rows), context=context(kind))
    assert report.success, report.failure_message()
    assert column in suites.load_suite(kind)["meta"]["nan_allowed"]


# ---------------------------------------------------------------- dataset


def test_nan_features_are_refused():
    rows = dataset_rows()
    rows[3]["features"] = [float("nan"), 1.0, float("inf"), 0.0]
    refused("dataset", table("dataset", rows), "expect_column_values_to_be_between",
            "(features_nonfinite_count)", "values [2]", '"row": 3')


def test_labels_out_of_range_are_refused():
    rows = dataset_rows()
    rows[5]["label"], rows[6]["label"] = 4, -1
    refused("dataset", table("dataset", rows), "expect_column_values_to_be_between", "(label)",
            "4", "-1", '"row": 5')


def test_feature_length_disagreeing_with_manifest_is_refused():
    refused("dataset", table("dataset"), "(features_len)", "values [4", "min_value=5",
            ctx={"num_classes": 4, "feature_length": 5})


def test_extreme_imbalance_is_refused():
    rows = [{"features": [0.0] * 4, "label": 0 if i else 1} for i in range(40)] + [
        {"features": [0.0] * 4, "label": 2 + i % 2} for i in range(40)
    ]
    refused("dataset", table("dataset", rows),
            "expect_smallest_class_to_be_at_least_share_of_uniform", "class 1: 1 rows")


def test_a_table_too_small_to_judge_balance_passes():
    rows = [{"features": [0.0] * 4, "label": i % 2} for i in range(6)]  # classes 2, 3 absent
    report = validate_table("dataset", table("dataset", rows), context={"num_classes": 4})
    assert report.success, report.failure_message()


# ---------------------------------------------------------------- manifest


def test_shard_checksum_mismatch_is_refused():
    sums = {**SHA, "train-1": "0" * 64}
    refused("manifest", table("manifest"), "expect_shard_checksums_to_match_manifest",
            f"train-1: manifest {SHA['train-1']}, file {'0' * 64}",
            ctx={"shard_checksums": sums})


def test_unlisted_shard_file_is_refused():
    sums = {**SHA, "train-2": "1" * 64}
    refused("manifest", table("manifest"), "expect_shard_checksums_to_match_manifest",
            "train-2: manifest not listed", ctx={"shard_checksums": sums})


def test_imbalanced_split_histogram_is_refused():
    rows = manifest_rows()
    rows[2].update(rows=60, class_histogram=[20, 1, 20, 19])
    refused("manifest", table("manifest", rows),
            "expect_smallest_class_to_be_at_least_share_of_uniform(class_histogram[split=val])",
            "class 1: 1 rows", ctx={})


def test_duplicate_shard_is_refused():
    rows = manifest_rows()
    rows[1]["shard"] = "train-0"
    refused("manifest", table("manifest", rows), "expect_column_values_to_be_unique", "(shard)",
            "train-0", ctx={})


# ---------------------------------------------------------------- sweep


def test_negative_throughput_is_refused():
    rows = sweep_rows()
    rows[1] = sweep_row("synthetic", 16, samples_per_s=-5.0)
    refused("sweep", table("sweep", rows), "expect_column_values_to_be_between",
            "(samples_per_s)", "-5.0", '"input_mode": "synthetic", "batch_size": 16')


def test_missing_timing_on_ok_row_is_refused():
    rows = sweep_rows()
    rows[0] = sweep_row("synthetic", 4, step_time_median_s=None)
    refused("sweep", table("sweep", rows), "expect_column_values_to_not_be_null",
            "(step_time_median_s)", "status == 'ok'")


def unstable(rows: list[dict], *indices: int) -> list[dict]:
    for i in indices:
        rows[i].update(quality="unstable", quality_reason="rounds disagree by 34% (> 15%)")
    return rows


def test_more_unstable_rows_than_allowed_fail_the_sweep():
    """Two of the four timed rows unstable (50 %) with at most 25 % allowed, and
    `sweep.unstable_fails` on."""
    ctx = {**context("sweep"), "max_unstable_share": 0.25, "unstable_fails": True}
    message = refused("sweep", table("sweep", unstable(sweep_rows(), 0, 3)),
                      "expect_unstable_share_to_be_at_most(quality)", "2 of 4 unexpected",
                      "synthetic batch 4: rounds disagree by 34% (> 15%)",
                      '"unstable_share": 0.5', ctx=ctx)
    assert "rerun on a quiet node" in message


def test_unstable_rows_within_the_share_pass_with_a_warning():
    report = validate_table("sweep", table("sweep", unstable(sweep_rows(), 2)),
                            context={**context("sweep"), "max_unstable_share": 0.25})
    assert report.success, report.failure_message()
    [warning] = report.warnings()
    assert warning.startswith("expect_unstable_share_to_be_at_most(quality): 1 of 4 timed rows "
                              "unstable (25%, at most 25% allowed): the analysis leaves them out")
    assert "real batch 4: rounds disagree" in warning
    assert report.statistics["warnings"] == 1
    assert "pass, with a warning" in report.to_html()


def test_sweep_share_defaults_to_the_config_and_old_tables_are_named():
    """Without context (`batchscale validate` on a file) the config's default applies; timed
    rows without a quality (a table from before it was recorded) pass, named in a warning."""
    rows = sweep_rows()
    rows[1]["quality"] = None
    report = validate_table("sweep", table("sweep", rows))
    assert report.success, report.failure_message()
    assert report.parameters["max_unstable_share"] == {
        "value": SweepConfig().max_unstable_share, "source": "config default"}
    assert report.warnings() == ["expect_unstable_share_to_be_at_most(quality): 1 of 4 timed "
                                 "rows carry no quality (a table from before batchscale judged "
                                 "its measurements): counted as ok"]
    assert validate_table("sweep", table("sweep")).warnings() == []


def test_quality_outside_the_set_or_unstable_without_reason_is_refused():
    rows = sweep_rows()
    rows[0]["quality"] = "great"
    refused("sweep", table("sweep", rows), "expect_column_values_to_be_in_set(quality)", "great")
    rows = unstable(sweep_rows(), 0)
    rows[0]["quality_reason"] = None
    refused("sweep", table("sweep", rows), "expect_column_values_to_not_be_null(quality_reason)")


@pytest.mark.parametrize(("value", "allowed"), [(1.5, False), (-0.1, False), (True, False),
                                                (0, True), (1, True)])
def test_unstable_share_context_must_be_a_share(value, allowed):
    ctx = {**context("sweep"), "max_unstable_share": value}
    if allowed:
        assert validate_table("sweep", table("sweep"), context=ctx).success
    else:
        with pytest.raises(BadInput, match="max_unstable_share must be a number from 0 to 1"):
            validate_table("sweep", table("sweep"), context=ctx)


@pytest.mark.parametrize(
    ("kind", "row", "status"), [("sweep", 0, "crashed"), ("runs", 1, "done")]
)
def test_status_outside_the_set_is_refused(kind, row, status):
    rows = ROWS[kind]()
    rows[row]["status"] = status
    refused(kind, table(kind, rows), "expect_column_values_to_be_in_set", "(status)",
            f'values ["{status}"]')


def test_batch_size_not_configured_is_refused():
    rows = sweep_rows()
    rows.append(sweep_row("real", 32))
    refused("sweep", table("sweep", rows), "expect_column_values_to_be_in_set", "(batch_size)",
            "values [32]")


@pytest.mark.parametrize(
    ("kind", "row", "changes", "expectation"),
    [
        ("sweep", 1, {"batch_size": 4}, "expect_compound_columns_to_be_unique(input_mode, "
                                        "batch_size)"),
        ("curves", 1, {"step": 0}, "expect_compound_columns_to_be_unique(trial_id, step)"),
        ("runs", 1, {"trial_id": "t4"}, "expect_compound_columns_to_be_unique(trial_id, "
                                         "target_metric, target_value)"),
        ("analysis", 1, {"batch_size": 4}, "expect_compound_columns_to_be_unique(lr_rule, "
                                           "batch_size)"),
    ],
)
def test_duplicate_rows_are_refused(kind, row, changes, expectation):
    rows = ROWS[kind]()
    rows[row].update(changes)
    ctx = {"batch_sizes": BATCH_SIZES}
    refused(kind, table(kind, rows), expectation, "2 of", ctx=ctx)


# ---------------------------------------------------------------- curves and runs


def test_nan_loss_before_a_trials_last_row_is_refused():
    rows = curve_rows()
    rows[1]["train_loss"] = float("nan")
    refused("curves", table("curves", rows), "(train_loss_finite_or_last)",
            '"trial_id": "t4", "step": 10')


def test_reached_run_disagreeing_with_curves_is_refused():
    rows = run_rows()
    rows[1]["steps_to_target"] = 30
    refused("runs", table("runs", rows), "expect_steps_to_target_to_match_curves",
            "t16 (val_accuracy >= 0.9): steps_to_target 30, curves cross at step 20")


def test_reached_run_with_nan_loss_is_refused():
    curves = curve_rows()
    curves[6]["train_loss"] = float("nan")  # t16's last row
    ctx = {"batch_sizes": BATCH_SIZES, "curves": table("curves", curves)}
    refused("runs", table("runs"), "expect_reached_trials_to_have_finite_losses",
            "t16: train_loss nan at step 20", ctx=ctx)


def test_reached_run_without_steps_to_target_is_refused():
    rows = run_rows()
    rows[1]["time_to_target_s"] = float("nan")
    refused("runs", table("runs", rows), "expect_column_values_to_not_be_null",
            "(time_to_target_s)", '"trial_id": "t16"')


# ---------------------------------------------------------------- caller mistakes


def test_unknown_context_key_is_a_bad_input():
    with pytest.raises(BadInput, match="unknown context keys \\['batch_size'\\]"):
        validate_table("sweep", table("sweep"), context={"batch_size": [4]})


def test_unknown_kind_is_a_bad_input():
    with pytest.raises(BadInput, match="unknown table kind"):
        validate_table("nope", table("sweep"))


# ---------------------------------------------------------------- reports


def test_failed_report_as_json_and_html():
    rows = sweep_rows()
    rows[0]["status"] = "crashed"
    report = validate_table("sweep", table("sweep", rows))
    assert "sweep table failed validation" in report.failure_message()
    assert "crashed" in report.failure_message()
    saved = json.loads(report.to_json())
    assert saved["kind"] == "sweep" and saved["success"] is False
    page = report.to_html()
    assert "crashed" in page and "FAIL" in page
    assert "http://" not in page and "https://" not in page


def test_passed_report_as_json_and_html():
    report = validate_table("curves", table("curves"))
    assert report.success
    assert json.loads(report.to_json())["statistics"]["unsuccessful_expectations"] == 0
    page = report.to_html()
    assert "<title>batchscale validation: curves</title>" in page
    assert "curves table" in page and "passed" in page


def test_page_shows_every_expectation_failures_first():
    rows = sweep_rows()
    rows[0]["status"] = "crashed"
    report = validate_table("sweep", table("sweep", rows))
    page = report.to_html()
    assert page.count("<tr class=") == len(report.results)
    assert page.index('<tr class="fail">') < page.index('<tr class="pass">')
    stats = report.statistics
    assert (f"{stats['unsuccessful_expectations']} of {stats['evaluated_expectations']} "
            "expectations failed") in page
    assert 'Parameters: <code>{"batch_sizes"' in html.unescape(page)


def test_page_escapes_values_from_the_table():
    hostile = "<script>alert(1)</script>"
    rows = sweep_rows()
    rows[0]["status"] = hostile
    page = validate_table("sweep", table("sweep", rows)).to_html()
    assert hostile not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_stage_page_has_one_section_per_table_and_escapes_labels():
    hostile = "<script>alert(1)</script>.parquet"
    reports = [("sweep", validate_table("sweep", table("sweep"))),
               (hostile, validate_table("curves", table("curves")))]
    page = validation_page(reports)
    assert page.count('<section class="validation">') == 2
    assert "sweep: sweep table" in page
    assert hostile not in page and "&lt;script&gt;alert(1)&lt;/script&gt;.parquet" in page
    assert "<script" not in page


def test_importing_checks_does_not_import_great_expectations():
    code = ("import sys, batchscale.checks, batchscale.checks.stage; "
            "assert 'great_expectations' not in sys.modules, 'great_expectations imported'")
    root = Path(__file__).resolve().parents[1]
    subprocess.run([sys.executable, "-c", code], cwd=root, check=True)


DEFERRED_CHECK = """
import math, sys
from batchscale.checks import gx, validate_table
from clean_tables import context, refused, sweep_row, table
assert not [m for m in gx.DEFERRED_MODULES if m in sys.modules], 'imported before GX'
report = validate_table('sweep', table('sweep'), context=context('sweep'))
assert report.success, report.failure_message()
refused('sweep', table('sweep', [sweep_row('real', 4, samples_per_s=-1.0)]),
        'expect_column_values_to_be_between(samples_per_s)')
bodies = ('scipy.stats._stats_py', 'altair.vegalite')
assert not [m for m in bodies if m in sys.modules], [m for m in bodies if m in sys.modules]
import altair, scipy.stats
assert math.isclose(scipy.stats.entropy([0.5, 0.5]), math.log(2)) and altair.Chart
assert all(m in sys.modules for m in bodies)
"""


@pytest.mark.slow
def test_great_expectations_import_defers_what_the_suites_do_not_use():
    """What gx.DEFERRED_MODULES saves in every validate task, through the task's own path (the
    first GX import inside validate_table): their code does not run while a suite passes a
    clean table and refuses a bad one, and they still work on first use. A fresh process: this
    one may have imported them already."""
    subprocess.run([sys.executable, "-c", DEFERRED_CHECK], cwd=Path(__file__).parent,
                   check=True, timeout=300)


def test_a_sweep_row_whose_samples_per_s_disagrees_with_its_step_time_is_refused():
    """A trial's planted row: samples_per_s and its interval ×10 at one batch, the step time
    left as it was. Each figure is in range alone; together they cannot both be true, and the
    analysis would have called that batch the best and the saturation batch."""
    from batchscale.schemas import make_table
    from clean_tables import sweep_rows

    rows = sweep_rows()
    assert validate_table("sweep", make_table("sweep", rows, ENV)).success
    rows[1] = {**rows[1], "samples_per_s": rows[1]["samples_per_s"] * 10}
    failed = validate_table("sweep", make_table("sweep", rows, ENV))
    assert not failed.success
    message = failed.failure_message()
    assert "samples_per_s is batch_size / step_time_median_s" in message
    assert "synthetic batch 16: samples_per_s 1000, batch / median step 100" in message
