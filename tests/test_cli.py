"""The command line: bad input stops before any work with exit 2 and writes nothing."""

import socket
from pathlib import Path

import pytest

from batchscale.cli import build_parser
from batchscale.cliflags import FlagText, config_from_args, flag_for
from batchscale.config import ExperimentConfig, SweepConfig, load_config, section_models
from helpers import run_cli


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
    for command in ("run", "compile", "store", "sweep", "converge", "validate", "workloads"):
        assert command in result.stdout


# ------------------------------------------------------------ flags named after config fields
SWEEP_FIELDS = ("batch_sizes", "device", "precision", "channels_last", "torch_compile",
                "memory_limit_bytes", "image_size_px", "max_batch_size", "time_budget_s")


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
    assert parse(["sweep", "--out", "x", "--batch-sizes", "auto"]).sweep.batch_sizes == "auto"
    assert parse(["run", "--fail-on-regression"]).publish.fail_on_regression is True
    converge = parse(["converge", "--out", "x", "--lr-rules", "sqrt,grid", "--lr-grid", "0.1",
                      "0.2", "--workers", "2", "--batch-sizes", "64", "256"]).convergence
    assert (converge.lr_rules, converge.lr_grid, converge.workers) == (["sqrt", "grid"],
                                                                       [0.1, 0.2], 2)


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
    (("convergence", "lr_rules"), ["sqrt", "grid"], ["sqrt", "grid"]),
    (("convergence", "checkpoint_uri"), "s3://b/p", "s3://b/p"),
])
def test_flag_text_becomes_the_field_value(annotation_of, text, value):
    section, name = annotation_of
    annotation = section_models()[section].model_fields[name].annotation
    assert FlagText.of(annotation).value(text) == value
