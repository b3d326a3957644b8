"""Input that used to be accepted without a word: each is now refused naming what is wrong, or,
where accepting is right, accepted with one line saying so."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from batchscale.checks import validate_table
from batchscale.config import load_config, parse_config
from batchscale.errors import BadInput
from batchscale.schemas import make_table
from clean_tables import ENV, run_rows
from helpers import run_cli


@pytest.mark.parametrize("text", ["", "# only a comment\n", "{}\n"])
def test_an_empty_config_runs_the_defaults_and_says_so(tmp_path, capsys, text):
    path = tmp_path / "empty.yaml"
    path.write_text(text)
    assert load_config(path) == parse_config({})
    assert "sets nothing (empty, or only comments): every setting is its default" in \
        capsys.readouterr().err


def test_a_standard_library_workload_is_refused_by_every_command_config_included():
    """`compile` imports nothing of the workload; the config itself refuses `os:system`."""
    with pytest.raises(BadInput, match="'os' is part of Python's standard library"):
        parse_config({"workload": "os:system"})


def test_an_empty_list_item_on_the_command_line_is_refused(tmp_path: Path):
    result = run_cli(["sweep", "--workload", "digits-mlp", "--batch-sizes", "1", "", "2",
                      "--out", str(tmp_path / "s.parquet")], cwd=tmp_path)
    assert result.returncode == 2 and "has an empty value" in result.stderr
    assert not (tmp_path / "s.parquet").exists()


def test_a_table_with_a_column_outside_its_schema_fails_validation():
    table = make_table("runs", run_rows(), ENV)
    assert validate_table("runs", table).success
    extra = table.append_column("steps_to_targte", pa.array([1] * table.num_rows))
    report = validate_table("runs", extra)
    assert not report.success
    assert "columns ['steps_to_targte'] are not in the runs schema" in report.failure_message()
