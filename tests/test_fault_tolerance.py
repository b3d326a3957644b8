"""Fault tolerance with real processes: real `torchrun` groups (gloo on CPU) whose worker is
SIGKILLed mid-run by the training script's fault drill (BATCHSCALE_FAULT_KILL_AT_STEP, first
attempt only); torchrun restarts the group, the trial resumes from its checkpoint (a local
directory or the real SeaweedFS of the `object_store` fixture) and reaches the target at exactly
the step of an uninterrupted run. A changed world size or config fails fast instead."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from batchscale.config import parse_config
from batchscale.convergence import faults, runner
from batchscale.convergence.spec import ConvergenceSpec
from batchscale.data.prep import prepare
from batchscale.errors import BadInput, BatchscaleError
from helpers import run_cli

KILL_AT_STEP = 33  # after the checkpoint at step 30, before the target (~step 60 at batch 64)
SETTINGS = {"batch_sizes": [64], "lr_rules": ["sqrt"], "seeds": [0], "max_steps": 300,
            "target_val_accuracy": 0.9, "eval_every_steps": 5, "checkpoint_every_steps": 10}
RUN_TIMEOUT_S = 300


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits")
    prepare(parse_config({}).dataset, out)
    return out


def make_spec(out: Path, digits_dir: Path, workers: int, checkpoint_dir: str | None = None):
    cfg = parse_config({"convergence": SETTINGS})
    return runner.build_spec(cfg, [64], data_dir=str(digits_dir), out_dir=str(out),
                             run_id="ft", workers=workers, checkpoint_dir=checkpoint_dir)


def with_workers(spec: ConvergenceSpec, workers: int) -> ConvergenceSpec:
    """The same spec for another worker count (trial ids unchanged, as after a resize)."""
    return spec.model_copy(update={
        "training": spec.training.model_copy(update={"workers": workers})})


def run_group(spec: ConvergenceSpec, max_restarts: int, monkeypatch, kill_rank: int | None = None):
    """The launcher's own torchrun call; with `kill_rank`, that rank dies at KILL_AT_STEP."""
    if kill_rank is not None:
        monkeypatch.setenv(faults.FAULT_KILL_AT_STEP_ENV, str(KILL_AT_STEP))
        monkeypatch.setenv(faults.FAULT_KILL_RANK_ENV, str(kill_rank))
    runner.launch_local(spec, RUN_TIMEOUT_S, max_restarts)
    curves, runs = runner.collect(spec)
    return curves.to_pylist(), runs.to_pylist()[0]


def trajectory(curves: list[dict]) -> list[tuple]:
    """What must not depend on an interruption: steps, losses, accuracies, noise scale."""
    return [(c["step"], c["train_loss"], c["val_accuracy"], c["b_simple"]) for c in curves]


def test_killed_worker_resumes_from_local_checkpoint_at_the_same_step(
        tmp_path, digits_dir, monkeypatch, capfd):
    base_curves, base = run_group(make_spec(tmp_path / "base", digits_dir, 2), 0, monkeypatch)
    assert base["status"] == "reached" and base["steps_to_target"] > KILL_AT_STEP
    capfd.readouterr()
    curves, run = run_group(make_spec(tmp_path / "killed", digits_dir, 2), 2, monkeypatch,
                            kill_rank=1)
    log = capfd.readouterr().err
    assert f"fault drill: rank 1 kills itself after step {KILL_AT_STEP}" in log
    assert "resumed from b64-sqrt-s0-w2/step-00000030.pt (step 30)" in log
    assert run["steps_to_target"] == base["steps_to_target"]
    assert trajectory(curves) == trajectory(base_curves)
    assert run["world_size"] == 2


def test_resume_from_s3_checkpoints_in_seaweedfs(tmp_path, digits_dir, monkeypatch, capfd,
                                                 object_store):
    s = object_store.settings
    for name, value in {"BATCHSCALE_S3_ENDPOINT": s.endpoint_url, "AWS_ACCESS_KEY_ID":
                        s.access_key, "AWS_SECRET_ACCESS_KEY": s.secret_key}.items():
        monkeypatch.setenv(name, value)
    _, base = run_group(make_spec(tmp_path / "base", digits_dir, 1), 0, monkeypatch)
    capfd.readouterr()
    uri = f"s3://{s.bucket}/{s.prefix}/ckpt"
    _, run = run_group(make_spec(tmp_path / "killed", digits_dir, 1, uri), 1, monkeypatch,
                       kill_rank=0)
    assert "resumed from b64-sqrt-s0-w1/step-00000030.pt" in capfd.readouterr().err
    assert run["steps_to_target"] == base["steps_to_target"]
    keys = object_store.list("ckpt/b64-sqrt-s0-w1")
    assert object_store.key("ckpt/b64-sqrt-s0-w1/step-00000030.pt") in keys
    assert object_store.key("ckpt/b64-sqrt-s0-w1/final.pt") in keys


def test_a_group_of_another_size_fails_fast(tmp_path, digits_dir):
    spec = make_spec(tmp_path, digits_dir, 2)
    spec_path = tmp_path / "spec.json"
    spec_path.write_bytes(spec.to_json())
    cmd = runner.torchrun_command(str(spec_path), workers=1, max_restarts=0)
    result = subprocess.run(cmd, env=runner.torchrun_env(1), capture_output=True, text=True,
                            timeout=RUN_TIMEOUT_S)
    assert result.returncode != 0
    assert "world size is 1 but the spec asks for 2 workers" in result.stderr
    assert not (tmp_path / "trials").exists()


def test_checkpoint_of_another_worker_count_is_refused(tmp_path, digits_dir, monkeypatch):
    spec = make_spec(tmp_path, digits_dir, 2)
    with pytest.raises(BatchscaleError, match="torchrun exited with status 1"):
        run_group(spec, 0, monkeypatch, kill_rank=0)  # no restarts: the checkpoint stays
    ckpt = tmp_path / "checkpoints" / "b64-sqrt-s0-w2" / "step-00000030.pt"
    assert ckpt.is_file()
    one_worker = with_workers(spec, 1)
    with pytest.raises(BadInput, match=r"workers: checkpoint has 2, this run has 1\); a change "
                                       "of worker count would change the global batch"):
        runner.check_checkpoints(one_worker)
    # The training script refuses it too (for launchers that skip the check, e.g. a TrainJob).
    spec_path = tmp_path / "one.json"
    spec_path.write_bytes(one_worker.to_json())
    result = subprocess.run(runner.torchrun_command(str(spec_path), 1, 0),
                            env=runner.torchrun_env(1), capture_output=True, text=True,
                            timeout=RUN_TIMEOUT_S)
    assert result.returncode != 0
    assert "workers: checkpoint has 2, this run has 1" in result.stderr
    assert ckpt.is_file()  # the earlier state is kept


def test_cli_refuses_to_resume_a_changed_config(tmp_path, digits_dir):
    config = tmp_path / "c.yaml"
    lines = ["convergence:", "  max_restarts: 0"] + [
        f"  {k}: {v}" for k, v in SETTINGS.items() if k != "batch_sizes"]
    config.write_text("\n".join(lines) + "\n")
    args = ["converge", "--config", str(config), "--batch-sizes", "64", "--dataset-dir",
            str(digits_dir), "--out", str(tmp_path / "out"), "--run-id", "r1"]
    first = run_cli(args, cwd=tmp_path, env={faults.FAULT_KILL_AT_STEP_ENV: str(KILL_AT_STEP)})
    assert first.returncode == 1 and "no trial of this launch had finished" in first.stderr
    config.write_text(config.read_text().replace("seeds: [0]", "seeds: [0]\n  momentum: 0.8"))
    second = run_cli(args, cwd=tmp_path)
    assert second.returncode == 2
    assert "momentum: checkpoint has 0.9, this run has 0.8" in second.stderr
    assert (tmp_path / "out/work/r1/checkpoints/b64-sqrt-s0-w1/step-00000030.pt").is_file()
