"""Command-line conventions: no abbreviated flags, an unknown flag or command answered with the
nearest one and the usage of the command it was given to, a closed stdout ending quietly, and an
unimportable workload module named with where it was looked for."""

from __future__ import annotations

import subprocess

import pytest

from batchscale.cli import build_parser, main
from helpers import BATCHSCALE, cli_env


def parse_error(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        build_parser().parse_args(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_an_abbreviated_flag_is_refused_with_the_full_one_suggested(capsys):
    err = parse_error(["converge", "--batch-size", "4", "--out", "x"], capsys)
    assert "batchscale converge: error: unrecognized arguments: --batch-size 4; did you mean " \
           "--batch-sizes?" in err
    assert err.startswith("usage: batchscale converge")


def test_a_misspelt_flag_is_named_before_a_missing_required_one(capsys):
    """`--out` is required too: the misspelling is what the user needs to hear first."""
    err = parse_error(["sweep", "--batch-szes", "4"], capsys)
    assert "unrecognized arguments: --batch-szes; did you mean --batch-sizes?" in err
    assert "required" not in err and err.startswith("usage: batchscale sweep")


def test_a_flag_with_no_near_neighbour_points_at_the_commands_help(capsys):
    err = parse_error(["sweep", "--out", "x", "--zzz"], capsys)
    assert "unrecognized arguments: --zzz; `batchscale sweep --help` lists its flags" in err
    err = parse_error(["--verbose"], capsys)
    assert "unrecognized arguments: --verbose; `batchscale --help` lists its flags" in err


def test_a_flag_of_a_like_named_command_points_at_that_command(capsys):
    """`schedule` (a recurring KFP run) is one slip from `batch-schedule`, which takes --out."""
    err = parse_error(["schedule", "--out", "x"], capsys)
    assert "unrecognized arguments: --out; --out is a flag of `batchscale batch-schedule`, " \
           "not of `batchscale schedule`: did you mean `batchscale batch-schedule`?" in err
    err = parse_error(["store", "--config", "x"], capsys)
    assert "`batchscale store --help` lists its flags" in err


def test_a_misspelt_command_gets_the_nearest_one(capsys):
    assert "did you mean sweep?" in parse_error(["swep"], capsys)


def test_values_that_look_like_numbers_are_not_taken_for_flags(capsys):
    err = parse_error(["sweep", "--batch-sizes", "-3", "--out", "x", "--zzz"], capsys)
    assert "unrecognized arguments: --zzz" in err and "-3" not in err.split("arguments:")[1]


def test_a_list_whose_first_value_is_negative_reaches_the_config_check(tmp_path, capsys):
    """argparse reads "-8,16" as an option ("expected at least one argument"); given to the
    flag, the config check names the field and what it allows, as for "16,-8"."""
    for value in ("-8,16", "16,-8"):
        code = main(["converge", "--batch-sizes", value, "--out", str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert code == 2 and "expected at least one argument" not in err
        assert "convergence.batch_sizes" in err and "greater than 0 (got -8)" in err, err


def test_a_closed_stdout_ends_quietly_with_exit_0():
    """`batchscale config reference | head -1`: the reader goes away after one line."""
    proc = subprocess.Popen(BATCHSCALE + ["config", "reference"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=cli_env(None))
    proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 0, stderr
    assert stderr == ""


def test_an_unimportable_workload_names_where_it_was_looked_for(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/nowhere")
    code = main(["sweep", "--workload", "mypkg.models:build", "--out", str(tmp_path / "s")])
    err = capsys.readouterr().err
    assert code == 2
    assert "cannot import module 'mypkg.models': No module named 'mypkg'" in err
    assert f"current directory ({tmp_path})" in err and "PYTHONPATH (/nowhere)" in err
    assert "Traceback" not in err


def test_a_list_flag_states_how_many_values_it_takes(capsys):
    """The help says what the config refuses: `branch_factors` takes 2 to 8 values."""
    with pytest.raises(SystemExit):
        main(["batch-schedule", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "ascending); with B0 they are the batch sizes of that checkpoint's S(B) fit. 2 to 8 " \
           "values, separated by spaces or commas." in help_text
