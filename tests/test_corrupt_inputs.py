"""Corrupted inputs, each tried through the real code path: the pipeline's validate stage on a
prepared dataset directory, or `batchscale validate --table KIND FILE`. Each is refused with a
message naming the table (or file), the expectation and the offending values; a clean dataset
passes. (The suites' logic itself is tested on in-memory tables in tests/test_checks.py.)"""

from __future__ import annotations

import json
import math
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import clean_tables as checks_tables
from batchscale.checks import suites, validate_table
from batchscale.checks.stage import validate_dataset
from batchscale.config import DataPrepConfig, ExperimentConfig
from batchscale.data.prep import MANIFEST_FILE, prepare, sha256_file
from batchscale.data.user_parquet import load_user_parquet
from batchscale.errors import BadInput, ValidationFailed
from batchscale.schemas import TrialStatus, make_table, schema_for
from batchscale.storage import write_table_atomic
from helpers import run_cli

CONFIG_JSON = ExperimentConfig().to_json()
TRAIN_SHARD = "train-00000.parquet"
ENV = {"run_id": "r1", "config_hash": "c0ffee", "experiment": "corrupt", "workload": "digits-mlp",
       "git_commit": "deadbeef", "batchscale_version": "0.1.0", "torch_version": "2.14.1",
       "python_version": "3.11", "device_name": "cpu", "threads": 2, "world_size": 1}


@pytest.fixture
def data_dir(tmp_path) -> Path:
    out = tmp_path / "data"
    prepare(DataPrepConfig(), out)
    return out


def replace_shard(data_dir: Path, table: pa.Table, *, keep_manifest_checksum: bool = False):
    """Rewrite the train shard; unless told otherwise the manifest is updated to the new bytes,
    so that only the corruption under test can fail."""
    write_table_atomic(data_dir / TRAIN_SHARD, table)
    if keep_manifest_checksum:
        return
    rows = pq.read_table(data_dir / MANIFEST_FILE).to_pylist()
    for row in rows:
        if row["shard"] == TRAIN_SHARD:
            row["sha256"] = sha256_file(data_dir / TRAIN_SHARD)
    write_table_atomic(data_dir / MANIFEST_FILE, make_table("manifest", rows))


def run_stage(data_dir: Path, tmp_path: Path) -> Path:
    json_path = tmp_path / "validation.json"
    validate_dataset(CONFIG_JSON, str(data_dir), str(json_path), str(tmp_path / "v.html"))
    return json_path


def refused_by_stage(data_dir: Path, tmp_path: Path, capsys, *needles: str) -> str:
    with pytest.raises(ValidationFailed) as err:
        run_stage(data_dir, tmp_path)
    message = str(err.value)
    for needle in needles:
        assert needle in message, message
    assert "validate train-00000.parquet: FAILED" in capsys.readouterr().out
    results = json.loads((tmp_path / "validation.json").read_text())
    assert any(not r["success"] for r in results)
    return message


def train_table(data_dir: Path) -> pa.Table:
    return pq.read_table(data_dir / TRAIN_SHARD)


# ------------------------------------------------------------------------------ dataset
def test_clean_dataset_passes(data_dir, tmp_path, capsys):
    results = json.loads(run_stage(data_dir, tmp_path).read_text())
    assert [r["table"] for r in results] == ["manifest", "val-00000.parquet", TRAIN_SHARD]
    assert all(r["success"] for r in results)
    assert "validate train-00000.parquet: passed" in capsys.readouterr().out


def test_truncated_parquet_file(data_dir, tmp_path):
    shard = data_dir / TRAIN_SHARD
    shard.write_bytes(shard.read_bytes()[:-100])
    result = run_cli(["validate", "--table", "dataset", str(shard)], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert f"{shard} is not a valid Parquet file" in result.stderr
    with pytest.raises(BadInput, match=f"{shard} is not a valid Parquet file"):
        run_stage(data_dir, tmp_path)


def test_renamed_column(data_dir, tmp_path):
    shard = tmp_path / "renamed.parquet"
    pq.write_table(train_table(data_dir).rename_columns(["pixels", "label"]), shard)
    result = run_cli(["validate", "--table", "dataset", str(shard)], cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "dataset table failed validation" in result.stderr
    assert "expect_column_to_exist(features)" in result.stderr
    assert "pixels" in result.stderr  # the column found instead


def test_nans_in_features(data_dir, tmp_path, capsys):
    table = train_table(data_dir)
    features = np.stack(table.column("features").to_numpy(zero_copy_only=False))
    features[[3, 7], 5] = np.nan
    replace_shard(data_dir, table.set_column(0, "features", [list(features)]))
    refused_by_stage(data_dir, tmp_path, capsys, "dataset table failed validation",
                     "expect_column_values_to_be_between(features_nonfinite_count)",
                     "2 of 1438 unexpected")


def test_labels_out_of_range(data_dir, tmp_path, capsys):
    table = train_table(data_dir)
    labels = table.column("label").to_numpy().copy()
    labels[[0, 9]] = [10, 12]  # a 10-class dataset
    replace_shard(data_dir, table.set_column(1, "label", pa.array(labels)))
    message = refused_by_stage(data_dir, tmp_path, capsys, "dataset table failed validation",
                               "expect_column_values_to_be_between(label)")
    assert "10" in message and "12" in message


def with_twin(table: pa.Table, column: str) -> pa.Table:
    """`table` with a second column of the same name (Parquet files can hold that)."""
    return pa.Table.from_arrays([*table.columns, table.column(column)],
                                names=[*table.column_names, column])


def test_duplicated_column_in_a_shard(data_dir, tmp_path, capsys):
    replace_shard(data_dir, with_twin(train_table(data_dir), "label"))
    refused_by_stage(data_dir, tmp_path, capsys, f"[{TRAIN_SHARD}] dataset table failed",
                     "expect_column_names_to_be_unique(label)")


def test_duplicated_column_in_the_manifest(data_dir, tmp_path):
    manifest = pq.read_table(data_dir / MANIFEST_FILE)
    pq.write_table(with_twin(manifest, "num_classes"), data_dir / MANIFEST_FILE)
    with pytest.raises(ValidationFailed) as err:
        run_stage(data_dir, tmp_path)
    assert "[manifest] manifest table failed" in str(err.value)
    assert "expect_column_names_to_be_unique(num_classes)" in str(err.value)


def test_shard_checksum_does_not_match_manifest(data_dir, tmp_path, capsys):
    table = train_table(data_dir)
    replace_shard(data_dir, table.take(np.arange(len(table))[::-1]), keep_manifest_checksum=True)
    with pytest.raises(ValidationFailed) as err:
        run_stage(data_dir, tmp_path)
    message = str(err.value)
    assert "manifest table failed validation" in message
    assert "expect_shard_checksums_to_match_manifest(sha256)" in message
    assert f"{TRAIN_SHARD}: manifest " in message and sha256_file(data_dir / TRAIN_SHARD) in message


# -------------------------------------------------------------------------------- sweep
def sweep_row(batch: int, samples_per_s: float) -> dict:
    step_s = batch / samples_per_s if samples_per_s > 0 else 0.01
    return {"input_mode": "synthetic", "batch_size": batch, "status": TrialStatus.OK,
            "precision": "fp32", "timed_steps": 20, "step_time_median_s": step_s,
            "step_time_p10_s": step_s * 0.9, "step_time_p90_s": step_s * 1.1, "step_time_cv": 0.05,
            "samples_per_s": samples_per_s, "peak_memory_bytes": 1000 * batch,
            "train_flops_per_sample": 1e6, "achieved_flops_per_s": 1e9,
            "peak_flops_per_s": 1e10, "mfu": 0.1}


def test_sweep_with_negative_throughput(tmp_path):
    clean = make_table("sweep", [sweep_row(4, 400.0), sweep_row(16, 1200.0)], ENV)
    assert validate_table("sweep", clean).success  # the same rows, uncorrupted, pass
    path = tmp_path / "sweep.parquet"
    write_table_atomic(path, make_table("sweep", [sweep_row(4, 400.0), sweep_row(16, -5.0)],
                                        ENV))
    result = run_cli(["validate", "--table", "sweep", str(path)], cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "sweep table failed validation" in result.stderr
    assert "expect_column_values_to_be_between(samples_per_s)" in result.stderr
    assert "-5.0" in result.stderr


# ------------------------------------------------------- numeric extremes, every table
# Clean tables and the pipeline's context come from tests/test_checks.py. Each extreme below is
# injected into numeric columns of a clean table; validation must fail naming every column it
# should refuse. What is not refused is stated here, one reason each:
# a noise ratio; a diverging loss grows without end (and a loss target or a trial's last value
# of a loss or perplexity has no natural ceiling); a measured slope of noisy steps
UNBOUNDED_ABOVE = {"b_simple", "train_loss", "measured_slope", "train_batch_loss", "val_loss",
                   "val_perplexity", "target_value", "final_metric_value"}
# a noisy estimate of tr(Sigma)/|G|^2 can come out negative; slopes d log S / d log B are <= 0
# change: a drop is negative; slope: B_crit may shrink along a study's axis
SIGNED = {"b_simple", "measured_slope", "fit_slope", "change", "slope", "slope_low",
          "slope_high"}
NAN_MEANS_NOT_MEASURED = {
    "dataset": set(), "manifest": set(),
    "sweep": {"step_time_cv", "step_time_cv_outside_gc"},
    "curves": {"b_simple"},
    "runs": {"b_simple"},
    "analysis": {"steps_to_target", "examples_to_target", "step_time_s", "time_to_target_s",
                 "samples_per_s", "s_min", "e_min", "s_min_se", "e_min_se", "b_crit",
                 "b_crit_low", "b_crit_high", "b_simple", "b_crit_bound_batch", "fit_slope",
                 "measured_slope", "sweep_step_time_s", "steps_low", "steps_high",
                 "time_to_target_s_low", "time_to_target_s_high", "b_simple_low",
                 "b_simple_high"},
    "regressions": {"samples_per_s", "history_median", "history_mad", "allowed_drop", "change"},
    "plan": set(),
    "decisions": set(),
    "study": {"b_crit", "b_crit_bound_batch", "b_crit_high", "b_crit_low", "b_simple", "b_star",
              "b_star_high", "b_star_low", "b_star_cap", "e_min", "s_min", "s_min_se",
              "e_min_se",
              "answer_time_to_target_s", "answer_time_to_target_s_low",
              "answer_time_to_target_s_high"},
    "study_axes": {"range_factor", "range_factor_high", "range_factor_low", "slope",
                   "slope_high", "slope_low"},
    "critical_over_training": {"b_crit", "b_crit_low", "b_crit_high", "b_crit_bound_batch",
                               "s_min", "e_min", "b_simple"},
    "schedule_check": {"steps_to_target", "examples_to_target", "train_time_s_to_target",
                       "predicted_steps", "predicted_steps_low", "predicted_steps_high",
                       "predicted_examples", "predicted_examples_low",
                       "predicted_examples_high", "reference_steps"},
}
ROWS_TO_CORRUPT = {"curves": [0, 1, 2, 4, 5, 7]}  # not a trial's last row (diverged may be NaN)
EXTREMES = ("inf", "-inf", "nan", "huge", "negative")


def numeric_columns(kind: str) -> list[str]:
    return [f.name for f in schema_for(kind)
            if pa.types.is_integer(f.type) or pa.types.is_floating(f.type)]


def must_refuse(kind: str, column: str, extreme: str) -> bool:
    if extreme == "nan":
        return column not in NAN_MEANS_NOT_MEASURED[kind]
    if extreme == "huge":
        return column not in UNBOUNDED_ABOVE
    if extreme == "negative":
        return column not in SIGNED
    return True


def extreme_value(extreme: str, is_int: bool, draw=None):
    """The value of an extreme; with a hypothesis `draw`, a random one of that class."""
    fixed = {"inf": math.inf, "-inf": -math.inf, "nan": math.nan,
             "huge": 2**62 if is_int else 1e300, "negative": -1 if is_int else -1e-6}
    if draw is None or extreme in ("inf", "-inf", "nan"):
        return fixed[extreme]
    if extreme == "huge":
        return draw(st.integers(2**62, 2**64 - 1) if is_int else st.floats(1e19, 1.7e308))
    return draw(st.integers(-(2**63), -1) if is_int
                else st.floats(-1.7e308, -1e-9, allow_infinity=False))


def corrupted(kind: str, row: int, values: dict) -> pa.Table:
    """The clean table with `values` (column -> value) put into `row`, each column typed as
    pyarrow infers it (so a float in an integer column makes it a float column)."""
    tbl = checks_tables.table(kind)
    for column, value in values.items():
        cells = tbl.column(column).to_pylist()
        cells[row] = value
        big = isinstance(value, int) and value >= 2**63
        tbl = tbl.set_column(tbl.schema.get_field_index(column), column,
                             pa.array(cells, pa.uint64() if big else None))
    return tbl


def fits_column_type(kind: str, column: str, value) -> bool:
    """Whether `value` keeps the column's Arrow type (else only the schema check can see it)."""
    column_type = schema_for(kind).field(column).type
    if pa.types.is_floating(column_type):
        return True
    half = 2 ** (column_type.bit_width - 1)
    return isinstance(value, int) and -half <= value < half


def assert_refused_naming(kind: str, row: int, injected: dict[str, tuple[str, object]]) -> None:
    """Validate with the values that keep their column's type, then with those that do not
    (a mistyped column stops validation at the schema); every refusable column is named."""
    groups = ({c: ev for c, ev in injected.items() if fits_column_type(kind, c, ev[1])},
              {c: ev for c, ev in injected.items() if not fits_column_type(kind, c, ev[1])})
    for group in groups:
        if not group:
            continue
        tbl = corrupted(kind, row, {c: value for c, (_, value) in group.items()})
        report = validate_table(kind, tbl, context=checks_tables.context(kind))
        named = {r["column"] for r in report.failures() if isinstance(r["column"], str)}
        # A corrupted step can make this row its trial's last, where a non-finite metric is
        # allowed (a diverged trial's last evaluation): then only the step must be named.
        reordered = kind == "curves" and "step" in group
        for column, (extreme, value) in group.items():
            if reordered and extreme in ("nan", "inf", "-inf") and column != "step":
                continue
            if must_refuse(kind, column, extreme):
                assert {column, f"{column}_finite_or_last"} & named, (
                    f"{kind}.{column} = {value!r} (row {row}) was not refused:\n"
                    + report.failure_message())


@pytest.mark.parametrize("extreme", EXTREMES)
@pytest.mark.parametrize("kind", list(checks_tables.ROWS))
def test_each_extreme_in_every_numeric_column_is_refused(kind, extreme):
    injected = {c: (extreme, extreme_value(extreme, c not in float_columns(kind)))
                for c in numeric_columns(kind)}
    assert_refused_naming(kind, ROWS_TO_CORRUPT.get(kind, [0])[0], injected)


@pytest.mark.parametrize("kind", list(checks_tables.ROWS))
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking: ~0.4 s a try
@given(data=st.data())
def test_random_extremes_in_random_columns_are_refused(kind, data):
    columns = data.draw(st.lists(st.sampled_from(numeric_columns(kind)), min_size=1,
                                 unique=True), label="columns")
    rows = ROWS_TO_CORRUPT.get(kind, range(len(checks_tables.ROWS[kind]())))
    row = data.draw(st.sampled_from(list(rows)), label="row")
    injected = {}
    for column in columns:
        extreme = data.draw(st.sampled_from(EXTREMES), label=column)
        injected[column] = (extreme,
                            extreme_value(extreme, column not in float_columns(kind), data.draw))
    assert_refused_naming(kind, row, injected)


def float_columns(kind: str) -> set[str]:
    return {f.name for f in schema_for(kind) if pa.types.is_floating(f.type)}


def test_documented_nan_columns_are_the_suites():
    """The NaN exemptions above are the ones the suites declare (meta.nan_allowed)."""
    for kind, columns in NAN_MEANS_NOT_MEASURED.items():
        assert set(suites.load_suite(kind)["meta"]["nan_allowed"]) == columns, kind


# ------------------------------------------------------------------- user Parquet labels
def user_parquet(tmp_path: Path, labels: pa.Array, rows: int | None = None) -> Path:
    rows = len(labels) if rows is None else rows
    path = tmp_path / "mine.parquet"
    pq.write_table(pa.table({"features": [[0.5, 1.0]] * rows, "label": labels}), path)
    return path


def refused_user_labels(tmp_path: Path, labels: pa.Array, *needles: str) -> str:
    """Refused through data prep with the file and column named, nothing written."""
    path = user_parquet(tmp_path, labels)
    out = tmp_path / "out"
    with pytest.raises(BadInput) as err:
        prepare(DataPrepConfig(name="parquet", source_uri=str(path)), out)
    message = str(err.value)
    for needle in (str(path), "label column 'label'", *needles):
        assert needle in message, message
    assert not out.exists()
    return message


def test_huge_user_label_is_refused_before_any_allocation(tmp_path):
    path = user_parquet(tmp_path, pa.array([0, 1, 2**40, 1]))
    tracemalloc.start()
    try:
        with pytest.raises(BadInput, match="labels of 100000 or more .* \\[1099511627776\\] at "
                                           "rows \\[2\\]"):
            load_user_parquet(str(path), "features", "label", None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50 * 2**20, f"{peak / 2**20:.0f} MiB traced"


@pytest.mark.parametrize(("labels", "needle"), [
    (pa.array([0, 1, 2**64 - 1, 1], pa.uint64()), "[18446744073709551615] at rows [2]"),
    (pa.array([0, -(2**62), 1, 1]), "negative labels [-4611686018427387904] at rows [1]"),
    (pa.array([0, 1, 99_999, 1]), "goes up to 99999, so 100000 classes for only 4 rows"),
    (pa.array([0.0, 1.0, 1.0, 0.0]), "has type double"),
    (pa.array([0.0, float("nan"), 1.0, 0.0]), "no floats, no NaN"),
    (pa.array(["0", "1", "1", "0"]), "has type string"),
])
def test_user_labels_outside_the_classes_are_refused(tmp_path, labels, needle):
    refused_user_labels(tmp_path, labels, needle)


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(bad=st.one_of(st.integers(100_000, 2**64 - 1), st.integers(-(2**63), -1)),
       row=st.integers(0, 3))
def test_any_label_out_of_range_is_refused_naming_it(tmp_path, bad, row):
    values = [0, 1, 1, 0]
    values[row] = bad
    labels = pa.array(values, pa.uint64() if bad >= 2**63 else pa.int64())
    path = user_parquet(tmp_path, labels)
    with pytest.raises(BadInput) as err:
        load_user_parquet(str(path), "features", "label", None)
    assert f"[{bad}] at rows [{row}]" in str(err.value) and str(path) in str(err.value)


def test_user_labels_within_bounds_still_load(tmp_path):
    raw = load_user_parquet(str(user_parquet(tmp_path, pa.array([0, 3, 1, 2], pa.uint8()))),
                            "features", "label", None)
    assert raw.num_classes == 4 and raw.labels.dtype == np.int64
