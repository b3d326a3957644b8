"""The command line: bad input stops before any work with exit 2 and writes nothing."""

import socket

import pytest

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
