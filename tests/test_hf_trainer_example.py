"""examples/hf_trainer: an existing Hugging Face `Trainer` script run as a TrainingLoop, from a
copy of its folder (a user's own directory), with the real transformers and accelerate: the
script still trains on its own; batchscale runs its Trainer once per trial under torchrun,
stops it at the target through a TrainerCallback, and analyzes the trials without a sweep."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from helpers import run_cli

pytest.importorskip("accelerate", reason="the Trainer needs accelerate (the dev extra has it)")

EXAMPLE_DIR = Path(__file__).parent.parent / "examples" / "hf_trainer"


def test_a_hugging_face_trainer_runs_as_a_users_loop(tmp_path):
    work = tmp_path / "hf_trainer"
    shutil.copytree(EXAMPLE_DIR, work)
    script = subprocess.run([sys.executable, "train_sentiment.py", "--steps", "10",
                             "--eval-every", "5"], cwd=work, capture_output=True, text=True,
                            timeout=300)
    assert script.returncode == 0 and "'eval_accuracy'" in script.stdout, script.stderr
    # The docstring's command at a CI-sized grid (the docs quote the full config's figures).
    out = tmp_path / "conv"
    result = run_cli(["converge", "--workload", "train_sentiment:loop", "--config",
                      "config.yaml", "--batch-sizes", "16", "128", "--seeds", "0",
                      "--out", str(out)], cwd=work)
    assert result.returncode == 0, result.stderr
    runs = pq.read_table(out / "runs.parquet").to_pandas()
    assert runs["status"].eq("reached").all() and len(runs) == 2
    steps = runs.set_index("batch_size")["steps_to_target"]
    assert steps[16] > steps[128]
    curves = pq.read_table(out / "curves.parquet").to_pandas()
    assert (curves["val_accuracy"].groupby(curves["trial_id"]).max() >= 0.85).all()
    # the lr column is the Trainer's own linear decay (report(lr=...)), not the config's
    # schedule: falling at every evaluation, below the trial's peak
    for trial_id, curve in curves.sort_values("step").groupby("trial_id"):
        peak = runs.set_index("trial_id").loc[trial_id, "lr"]
        assert (curve["lr"].diff().dropna() < 0).all() and (curve["lr"] < peak).all(), curve
    analysis = run_cli(["analyze", str(out / "runs.parquet"), "--out", str(tmp_path / "an")],
                       cwd=work)
    assert analysis.returncode == 0, analysis.stderr
    assert "no throughput sweep was given" in analysis.stdout
    assert "Batch size:" in analysis.stdout


def test_the_trainers_ddp_gives_the_gradient_noise_scale_on_two_workers(tmp_path):
    """With two workers the Trainer wraps the model in its own DDP; the script hands it to
    `trial.measure_noise` in its first training step, so B_simple is recorded as for a loop
    that calls `trial.prepare` (what the adaptive search predicts B_crit from)."""
    work = tmp_path / "hf_trainer"
    shutil.copytree(EXAMPLE_DIR, work)
    out = tmp_path / "conv"
    result = run_cli(["converge", "--workload", "train_sentiment:loop", "--config",
                      "config.yaml", "--batch-sizes", "16", "--seeds", "0", "--workers", "2",
                      "--out", str(out)], cwd=work)
    assert result.returncode == 0, result.stderr
    runs = pq.read_table(out / "runs.parquet").to_pandas()
    assert runs["status"].eq("reached").all() and runs["workers"].eq(2).all()
    curves = pq.read_table(out / "curves.parquet").to_pandas()
    assert curves["b_simple"].notna().any()  # a few noisy updates: any sign
