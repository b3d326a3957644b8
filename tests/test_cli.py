"""The command line: bad input stops before any work with exit 2 and writes nothing."""

import math
import os
import socket
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchscale import cli
from batchscale.cli import build_parser
from batchscale.cliflags import FlagText, config_from_args, flag_for
from batchscale.config import (
    ExperimentConfig,
    SweepConfig,
    load_config,
    parse_config,
    section_models,
)
from batchscale.errors import BadInput
from helpers import run_cli, store_env


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("yaml_text", "needle"),
    [
        ("bogus_key: 1\n", "bogus_key: unknown key"),
        ("sweep:\n  batch_sizes: [4, x]\n", "sweep.batch_sizes.1"),
        ("sweep:\n  batch_sizes: [0]\n", "sweep.batch_sizes.0"),
        ("convergence:\n  batch_sizes: [3.5]\n", "convergence.batch_sizes.0"),
        ("dataset:\n  name: imagenet\n", "dataset.name: unknown dataset 'imagenet'"),
        ("workload: resnet9000\n", "workload: unknown workload 'resnet9000'"),
    ],
)
def test_run_refuses_bad_config_before_any_work(tmp_path, yaml_text, needle):
    (tmp_path / "bad.yaml").write_text(yaml_text)
    result = run_cli(["run", "--config", "bad.yaml"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]  # nothing written


def test_run_refuses_unimportable_user_model(tmp_path):
    (tmp_path / "c.yaml").write_text("workload: no_such_pkg.models:build\n")
    result = run_cli(["run", "--config", "c.yaml"], cwd=tmp_path)
    assert result.returncode == 2
    assert "cannot import module 'no_such_pkg.models'" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]


def test_run_refuses_unreachable_endpoint(tmp_path):
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    env = {"BATCHSCALE_S3_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": "s"}
    result = run_cli(["run"], cwd=tmp_path, env=env, timeout_s=120)
    assert result.returncode == 2
    assert endpoint in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_sweep_refuses_bad_batch_list(tmp_path):
    for text in ("", "1,two", "0,4", "-2"):
        result = run_cli(["sweep", "--batch-sizes", text, "--out", "s.parquet"], cwd=tmp_path)
        assert result.returncode == 2, (text, result.stderr)
        assert "--batch-sizes" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_help_lists_every_command(tmp_path):
    result = run_cli(["--help"], cwd=tmp_path)
    assert result.returncode == 0
    for command in ("run", "compile", "store", "sweep", "converge", "validate", "analyze",
                    "workloads"):
        assert command in result.stdout


# ------------------------------------------------------------ flags named after config fields
SWEEP_FIELDS = ("batch_sizes", "device", "precision", "channels_last", "torch_compile",
                "memory_limit_bytes", "image_size_px", "max_batch_size", "time_budget_s", "threads")


def parse(argv: list[str]) -> ExperimentConfig:
    return config_from_args(build_parser().parse_args(argv))


def test_config_flags_are_named_after_their_fields():
    text = build_parser().parse_args(["sweep", "--out", "x"])
    assert {name for section, name in text.config_fields if section == "sweep"} == set(
        SWEEP_FIELDS)
    help_text = run_cli(["sweep", "--help"], cwd=Path.cwd()).stdout
    for name in SWEEP_FIELDS:
        assert flag_for(name) in help_text
        assert " ".join(SweepConfig.model_fields[name].description.split()[:3]) in " ".join(
            help_text.split())
    assert flag_for("time_budget_s") == "--time-budget-s"


def test_flags_replace_the_config_values_and_no_flag_keeps_the_config():
    assert parse(["sweep", "--out", "x"]) == load_config()
    assert parse(["run"]) == load_config()
    cfg = parse(["sweep", "--out", "x", "--workload", "digits-cnn", "--batch-sizes", "8,2", "4",
                 "--torch-compile", "--no-channels-last", "--memory-limit-bytes", "2GiB",
                 "--time-budget-s", "0.5", "--image-size-px", "64", "--device", "cpu"])
    assert cfg.workload == "digits-cnn"
    assert cfg.sweep.batch_sizes == [2, 4, 8]  # validated by the model: sorted
    assert (cfg.sweep.torch_compile, cfg.sweep.channels_last) == (True, False)
    assert cfg.sweep.memory_limit_bytes == 2 * 2**30
    assert (cfg.sweep.time_budget_s, cfg.sweep.image_size_px, cfg.sweep.device) == (0.5, 64, "cpu")
    assert parse(["sweep", "--out", "x", "--threads", "1"]).sweep.threads == 1
    assert parse(["sweep", "--out", "x", "--batch-sizes", "auto"]).sweep.batch_sizes == "auto"
    assert parse(["run", "--fail-on-regression"]).publish.fail_on_regression is True
    converge = parse(["converge", "--out", "x", "--lr-rules", "sqrt,tuned", "--lr-candidates",
                      "0.1", "0.2", "--workers", "2", "--batch-sizes", "64", "256"]).convergence
    assert (converge.lr_rules, converge.lr_candidates, converge.workers) == (["sqrt", "tuned"],
                                                                       [0.1, 0.2], 2)


def test_another_workload_on_the_embedded_config_is_its_own_experiment(tmp_path):
    """Rows of a user's model run on the embedded config were recorded as experiment
    'digits-default'; they take a name from the workload instead (a config file's name stays)."""
    assert parse(["converge", "--out", "x"]).name == "digits-default"
    assert parse(["converge", "--out", "x", "--workload", "digits-cnn"]).name == "digits-cnn"
    assert parse(["converge", "--out", "x", "--workload", "mytraining:workload"]).name == \
        "mytraining-workload"
    config = tmp_path / "mine.yaml"
    config.write_text("name: my-study\n")
    assert parse(["converge", "--out", "x", "--config", str(config), "--workload",
                  "digits-cnn"]).name == "my-study"


def test_old_flag_spellings_still_work_with_a_note(capsys):
    cfg = parse(["sweep", "--out", "x", "--compile", "--time-budget", "0.5", "--image-size",
                 "64", "--memory-limit", "512MB"])
    assert cfg.sweep.torch_compile is True and cfg.sweep.time_budget_s == 0.5
    assert cfg.sweep.image_size_px == 64 and cfg.sweep.memory_limit_bytes == 512_000_000
    assert parse(["converge", "--out", "x", "--lr-rule", "sqrt"]).convergence.lr_rules == ["sqrt"]
    notes = capsys.readouterr().err
    for old, new in [("--compile", "--torch-compile"), ("--time-budget", "--time-budget-s"),
                     ("--image-size", "--image-size-px"),
                     ("--memory-limit", "--memory-limit-bytes"), ("--lr-rule", "--lr-rules")]:
        assert f"{old} is deprecated and goes in the next release; use {new}" in notes
    assert "--time-budget " not in run_cli(["sweep", "--help"], cwd=Path.cwd()).stdout


@pytest.mark.parametrize(("args", "needles"), [
    (["--memory-limit-bytes", "2XB"], ["sweep.memory_limit_bytes", "2GiB", "--memory-limit-bytes"]),
    (["--memory-limit-bytes", "0"], ["sweep.memory_limit_bytes", "512MB"]),
    (["--time-budget-s", "0"], ["sweep.time_budget_s: Input should be greater than 0"]),
    (["--image-size-px", "1.5"], ["--image-size-px", "'1.5' is not an integer"]),
    (["--device", "tpu"], ["--device", "invalid choice: 'tpu'"]),
    (["--batch-sizes", "auto,4"], ["--batch-sizes", "'auto' is not an integer"]),
])
def test_bad_flag_values_are_refused_naming_the_field(tmp_path, args, needles):
    result = run_cli(["sweep", *args, "--out", "s.parquet"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    for needle in needles:
        assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("annotation_of", "text", "value"), [
    (("sweep", "batch_sizes"), ["1,2", "4"], [1, 2, 4]),
    (("sweep", "batch_sizes"), ["auto"], "auto"),
    (("sweep", "memory_limit_bytes"), "2GiB", "2GiB"),  # ByteSize reads it
    (("sweep", "time_budget_s"), "0.5", 0.5),
    (("convergence", "lr_rules"), ["sqrt", "tuned"], ["sqrt", "tuned"]),
    (("convergence", "checkpoint_uri"), "s3://b/p", "s3://b/p"),
])
def test_flag_text_becomes_the_field_value(annotation_of, text, value):
    section, name = annotation_of
    annotation = section_models()[section].model_fields[name].annotation
    assert FlagText.of(annotation).value(text) == value


# ------------------------------------------------------------ numbers on the command line
@pytest.mark.parametrize(("command", "args", "needle"), [
    ("sweep", ["--batch-sizes", "1,,2"], "empty item"),
    ("sweep", ["--batch-sizes", "1,"], "empty item"),
    ("sweep", ["--batch-sizes", ",4"], "empty item"),
    ("sweep", ["--batch-sizes", "\u0661\u0662"], "is not an integer"),  # Arabic-Indic 12
    ("sweep", ["--batch-sizes", "\uff11"], "is not an integer"),  # fullwidth 1
    ("sweep", ["--batch-sizes", "1_000"], "is not an integer"),
    ("sweep", ["--batch-sizes", "99999999999999999999"], "at most 2**63-1"),
    ("sweep", ["--batch-sizes", "9" * 5000], "at most 2**63-1"),
    ("sweep", ["--batch-sizes", "4294967296"], "sweep.batch_sizes"),  # int64, but no batch
    ("sweep", ["--max-batch-size", "9223372036854775808"], "at most 2**63-1"),
    ("sweep", ["--image-size-px", "\uff16\uff14"], "is not an integer"),
    ("sweep", ["--time-budget-s", "inf"], "not a finite number"),
    ("sweep", ["--time-budget-s", "1e400"], "beyond the numbers allowed (finite"),
    ("sweep", ["--time-budget-s", "1E100"], "at most 2**63-1 in size"),
    ("sweep", ["--memory-limit-bytes", "1e400"], "sweep.memory_limit_bytes"),
    ("sweep", ["--memory-limit-bytes", "0.5"], "sweep.memory_limit_bytes"),
    ("converge", ["--lr-candidates", "inf"], "not a finite number"),
    ("converge", ["--lr-candidates", "nan"], "not a finite number"),
    ("converge", ["--lr-candidates", "0.1,-inf"], "not a finite number"),
    ("converge", ["--lr-candidates", "\u0661.\u0665"], "is not a number"),
    ("converge", ["--workers", "\u0662"], "is not an integer"),
    ("history", ["--workload", "digits-mlp", "--last", "\uff15"], "is not an integer"),
])
def test_numbers_are_ascii_finite_and_bounded_naming_the_flag(tmp_path, command, args, needle):
    out = ["--out", "o"] if command in ("sweep", "converge") else []
    result = run_cli([command, *args, *out], cwd=tmp_path, timeout_s=120)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr
    flag = args[-2]
    assert flag in result.stderr or flag.lstrip("-").replace("-", "_") in result.stderr
    assert "Traceback" not in result.stderr
    assert len(result.stderr) < 4000  # a 5000-digit number is not echoed whole
    assert list(tmp_path.iterdir()) == []


def test_memory_sizes_that_are_not_whole_bytes_say_what_is_allowed(tmp_path):
    for text in ("0.5", "1e400"):
        result = run_cli(["sweep", "--memory-limit-bytes", text, "--out", "o"], cwd=tmp_path)
        assert result.returncode == 2
        assert "got 0" not in result.stderr and repr(text) in result.stderr
        assert "512MB or 2GiB" in result.stderr


@given(st.lists(st.integers(0, 2**63 - 1), min_size=1, max_size=6),
       st.sampled_from([",", ", ", " , ", " "]))
@settings(max_examples=80, deadline=None)
def test_any_int64_list_reads_back_whatever_the_separator(values, separator):
    text = FlagText(int, is_list=True)
    assert text.value([separator.join(map(str, values))]) == values
    assert text.value([f"{v}," for v in values[:-1]] + [str(values[-1])]) == values  # "1, 2"


@given(st.text(max_size=30))
@settings(max_examples=100, deadline=None)
def test_any_flag_text_is_a_number_or_a_value_error(text):
    for flag in (FlagText(int, is_list=True), FlagText(float), FlagText(int)):
        try:
            value = flag.value([text] if flag.is_list else text)
        except ValueError as err:
            assert len(str(err)) < 300
            continue
        for number in value if isinstance(value, list) else [value]:
            assert math.isfinite(number) and abs(number) <= 2**63 - 1
            assert text.isascii()


# ------------------------------------------------------------------ output paths, up front
def _fifo(tmp_path: Path) -> Path:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    return fifo


@pytest.mark.parametrize(("command", "make_out", "needle"), [
    ("sweep", lambda d: d / "afile" / "s.parquet", "is a file"),
    ("sweep", lambda d: d / "adir", "is a directory"),
    ("sweep", _fifo, "not a regular file"),
    ("sweep", lambda d: Path("/proc/batchscale-no/s.parquet"), "cannot write in '/proc'"),
    ("sweep", lambda d: d / ("x" * 300), "too long"),
    ("converge", lambda d: d / "afile", "is a file, not a directory"),
    ("converge", lambda d: d / "afile" / "out", "is a file"),
    ("report", lambda d: d / "adir", "is a directory"),
    ("history", lambda d: d / "afile" / "h.png", "is a file"),
    ("validate", lambda d: d / "adir", "is a directory"),
    ("compile", lambda d: d / "afile" / "p.yaml", "is a file"),
    ("analyze", lambda d: d / "afile", "is a file, not a directory"),
])
def test_unwritable_output_paths_are_refused_before_any_work(tmp_path, command, make_out,
                                                             needle):
    (tmp_path / "afile").write_text("x")
    (tmp_path / "adir").mkdir()
    out = make_out(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    flag = {"report": "--out", "history": "--plot", "validate": "--html",
            "compile": "--output"}.get(command, "--out")
    args = {"report": ["--run-id", "r1"], "history": ["--workload", "digits-mlp"],
            "validate": ["--table", "sweep", "missing.parquet"],
            "analyze": ["missing.csv"]}.get(command, [])
    started = time.monotonic()
    result = run_cli([command, *args, flag, str(out)], cwd=tmp_path, timeout_s=120)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and flag in result.stderr
    assert "Traceback" not in result.stderr and "sweep digits-mlp on" not in result.stderr
    assert time.monotonic() - started < 60  # no trial, no store, no data prep
    assert sorted(p.name for p in tmp_path.iterdir()) == before


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_directory_is_refused_before_any_work(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        result = run_cli(["sweep", "--out", str(locked / "s.parquet")], cwd=tmp_path)
        assert result.returncode == 2 and "cannot write in" in result.stderr
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


# ------------------------------------------------------------------------------ redaction
SECRET = "Pw9zQ7xK"


@pytest.mark.parametrize("endpoint", [
    f"http://user:{SECRET}@127.0.0.1:1", f"http://admin:p@{SECRET}@127.0.0.1:1",
    f"http://admin:p/{SECRET}@127.0.0.1:1", f"admin:{SECRET}@localhost:8333",
    f"://admin:{SECRET}@h:8333",
])
def test_credentials_in_the_endpoint_are_never_printed(tmp_path, endpoint):
    env = {"BATCHSCALE_S3_ENDPOINT": endpoint, "AWS_ACCESS_KEY_ID": "k",
           "AWS_SECRET_ACCESS_KEY": "s"}
    result = run_cli(["report", "--run-id", "r1", "--out", "r.html"], cwd=tmp_path, env=env,
                     timeout_s=120)
    assert result.returncode == 2, result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("args", [
    ["history", "--workload", "digits-mlp", "--precision", f"http://u:{SECRET}@h"],  # argparse
    ["sweep", "--device", f"http://u:{SECRET}@h", "--out", "o"],
    ["converge", "--lr-candidates", f"http://u:{SECRET}@h", "--out", "o"],
    ["report", "--run-id", f"http://u:{SECRET}@h"],
    ["sweep", "--workload", f"s3://k:{SECRET}@b/x:f", "--out", "o"],
])
def test_credentials_in_arguments_are_never_echoed(tmp_path, args):
    result = run_cli(args, cwd=tmp_path, timeout_s=120)
    assert result.returncode == 2, result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("error", "status", "shown"), [
    (BadInput(f"store at http://u:{SECRET}@h:1 refused"), 2,
     "batchscale: error: store at http://***@h:1 refused"),
    (RuntimeError(f"boom at http://u:{SECRET}@h:1"), 1, "RuntimeError: boom at http://***@h:1"),
])
def test_whatever_a_command_raises_is_printed_redacted(monkeypatch, capsys, error, status,
                                                       shown):
    def broken(_args):
        raise error

    monkeypatch.setattr(cli, "cmd_datasets", broken)
    assert cli.main(["datasets"]) == status
    err = capsys.readouterr().err
    assert shown in err and SECRET not in err
    assert ("Traceback" in err) == (status == 1)  # bad input never shows one; a bug does


def test_run_reports_a_task_that_refused_its_input_without_a_traceback(tmp_path, object_store):
    """A corrupt dataset file passes the config check (it is a path) and fails in the data-prep
    task: the task prints the refusal, and `run` names the task and exits as the task did (2),
    with no executor traceback anywhere in its output."""
    (tmp_path / "bad.parquet").write_text("not parquet at all")
    (tmp_path / "c.yaml").write_text(
        f"dataset:\n  name: parquet\n  source_uri: {tmp_path / 'bad.parquet'}\n"
        "convergence:\n  optimizer: adamw\n")
    result = run_cli(["run", "--config", "c.yaml"], cwd=tmp_path, env=store_env(object_store),
                     timeout_s=300)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "(digits-mlp on parquet)" in result.stderr
    assert "note: convergence.base_lr 0.05 with adamw" in result.stderr
    assert "task 'data-prep' refused to go on: " in result.stderr
    assert "bad.parquet is not a valid Parquet file" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert "batchscale-task-refusal" not in result.stdout + result.stderr  # in the log only


def test_a_tasks_refusal_is_read_back_with_its_exit_status(capsys):
    from batchscale.errors import BadInput, ValidationFailed, task_refusal, task_refusals

    for error in (BadInput("shard x: bad\nsecond line"), ValidationFailed("table y failed")):
        with pytest.raises(SystemExit) as stop, task_refusals():
            raise error
        assert stop.value.code == error.exit_code
        err = capsys.readouterr().err
        assert err.startswith(f"batchscale: error: {error}\n")
        refusal = task_refusal("INFO other lines\n    " + err.splitlines()[-1] + "\n")
        assert (str(refusal), refusal.exit_code) == (str(error), error.exit_code)
    assert task_refusal("a task that crashed with a bug prints no refusal") is None


@pytest.mark.parametrize("text", ["0\x85", "\u30001", "1\u00a0", "4,\x858"])
def test_a_number_padded_with_non_ascii_space_is_refused(text):
    """str.strip() drops U+0085, U+3000 and U+00A0; the flags accept ASCII only."""
    for flag in (FlagText(int, is_list=True), FlagText(float), FlagText(int)):
        with pytest.raises(ValueError):
            flag.value([text] if flag.is_list else text)


def test_the_run_header_says_when_a_workload_trains_on_its_own_data():
    """A workload with its own data does not train on the config's dataset (data-prep then
    prepares none), and the first line must not say it does."""
    from batchscale.cli.pipeline_cmds import run_header
    from batchscale.workloads import get_workload

    cfg = parse_config({"workload": "contract_workloads:good"})
    own = run_header(cfg, get_workload(cfg.workload), "r1")
    assert own == ("batchscale run r1: digits-default (contract_workloads:good on its own "
                   "data)")
    assert run_header(load_config(), get_workload("digits-mlp"), "r2").endswith(
        "(digits-mlp on digits)")


def test_compiling_a_users_own_workload_says_the_default_images_lack_it():
    from batchscale.cli.pipeline_cmds import own_code_note

    note = own_code_note("mypkg.train:workload", {})
    assert note.startswith("workload mypkg.train:workload is your own code, and the images "
                           "above are batchscale's, without it")
    assert own_code_note("mypkg.train:workload", {"BATCHSCALE_IMAGE": "me/mine:1"}) is None
    assert own_code_note("digits-mlp", {}) is None


def test_compiling_says_what_it_could_tell_of_a_training_loop():
    """The compile imports a user's module to tell a TrainingLoop, whose sweep step then asks
    for no GPU (tests/test_kubernetes.py checks the request), and says when it cannot."""
    from batchscale.cli.pipeline_cmds import loop_note

    assert loop_note("loop_workloads:good_loop") == (
        "loop_workloads:good_loop is a TrainingLoop: its throughput-sweep step measures "
        "nothing and requests no GPU")
    assert loop_note("not_importable_here:loop").startswith(
        "cannot import not_importable_here:loop here, so the compile cannot tell")
    assert loop_note("contract_workloads:good") is None
    assert loop_note("digits-mlp") is None
