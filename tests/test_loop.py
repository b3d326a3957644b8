"""A user's own training loop (batchscale.TrainingLoop): batchscale calls `train(trial)` once
per trial, under real torchrun process groups, records what it reports, stops it at the
targets, and the analysis fits and recommends from it. The loops are in loop_workloads.py; the
own-loop example (examples/own_loop) runs end to end from a copy, as a user would."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from batchscale.contract_check import check_workload
from batchscale.convergence.loop_trial import BatchSampler, LoopTrial
from batchscale.errors import BadInput
from batchscale.workloads import get_workload
from helpers import run_cli, store_env

TESTS_DIR = Path(__file__).parent
EXAMPLE_DIR = TESTS_DIR.parent / "examples" / "own_loop"


def converge(tmp_path: Path, workload: str, *flags: str, cwd: Path = TESTS_DIR):
    out = tmp_path / "out"
    result = run_cli(["converge", "--workload", workload, "--out", str(out), *flags], cwd=cwd)
    runs = (pq.read_table(out / "runs.parquet").to_pandas()
            if (out / "runs.parquet").exists() else None)
    return result, runs


def _timed_trial(clock: list[float], monkeypatch) -> tuple[LoopTrial, list[dict]]:
    """A one-worker LoopTrial on a clock the test moves (no training, no torchrun)."""
    monkeypatch.setattr("batchscale.convergence.loop_trial.time.perf_counter", lambda: clock[0])
    settings = SimpleNamespace(max_steps=100, eval_every_steps=5, warmup_steps=0,
                               lr_decay="none", decay_steps=None, min_lr_ratio=0.0)
    trial = SimpleNamespace(trial_id="t", batch_size=8, lr=0.1, lr_rule="sqrt", seed=0)
    reports: list[dict] = []
    context = LoopTrial(SimpleNamespace(training=settings), trial,
                        SimpleNamespace(world_size=1, rank=0, device="cpu"), [], 10,
                        lambda row: reports.append(row))
    return context, reports


def test_training_time_starts_at_the_first_batch_not_at_the_set_up(monkeypatch):
    clock = [100.0]
    trial, reports = _timed_trial(clock, monkeypatch)
    sampler = trial.batch_sampler(64)
    clock[0] = 102.5  # the loop's set-up: its data, its model, an import
    trial.report(0, {"val_accuracy": 0.1})  # an evaluation before training: no time yet
    batches = iter(sampler)
    next(batches)  # the first batch starts the clock
    clock[0] = 103.0
    with trial.evaluating():
        clock[0] = 103.25  # evaluation is not training time either
    next(batches)
    trial.report(5, {"val_accuracy": 0.5})
    assert [r["train_time_s"] for r in reports] == [0.0, 0.5]  # 102.5-103.0, eval left out


def test_a_loop_without_the_sampler_is_timed_from_train_or_from_start_training(monkeypatch):
    clock = [0.0]
    trial, reports = _timed_trial(clock, monkeypatch)
    clock[0] = 1.5
    trial.report(5, {"val_accuracy": 0.5})  # no sampler, no start_training: since `train`
    trial.start_training()  # as a Trainer's on_train_begin calls it
    clock[0] = 2.0
    trial.start_training()  # later calls do nothing
    clock[0] = 2.25
    trial.report(10, {"val_accuracy": 0.6})
    assert [r["train_time_s"] for r in reports] == [1.5, 0.75]


def test_each_rank_reads_its_slice_of_the_same_global_batch():
    one = iter(BatchSampler(50, 8, seed=3, rank=0, world_size=1))
    two = [iter(BatchSampler(50, 8, seed=3, rank=r, world_size=2)) for r in range(2)]
    for _ in range(20):  # past two epochs
        assert next(one) == next(two[0]) + next(two[1])


def test_a_loop_is_resolved_and_owns_its_targets():
    workload = get_workload("loop_workloads:good_loop")
    assert workload.kind == "loop" and workload.has_own_data
    assert workload.metrics == ("val_accuracy",)
    with pytest.raises(BadInput, match="is a TrainingLoop: batchscale cannot build its model"):
        check_workload(workload)  # a sweep of it: nothing to time


@pytest.mark.parametrize(("name", "message"), [
    ("unknown_metric", "TrainingLoop.metrics names 'val_f1'; allowed: "),
    ("unreported_target", r"a target is on val_loss, which the workload does not report; its "
                          r"metrics \(TrainingLoop.metrics\): val_accuracy"),
])
def test_a_loop_that_cannot_work_is_refused_before_any_trial(name, message):
    with pytest.raises(BadInput, match=message):
        check_workload(get_workload(f"loop_workloads:{name}"), convergence=True)


def test_sweep_and_halving_of_a_loop_are_refused_with_exit_2(tmp_path):
    sweep = run_cli(["sweep", "--workload", "loop_workloads:good_loop", "--batch-sizes", "8",
                     "--out", str(tmp_path / "s.parquet")], cwd=TESTS_DIR)
    assert sweep.returncode == 2 and "`batchscale run`, `converge` and `analyze`" in sweep.stderr
    assert "Traceback" not in sweep.stderr
    config = tmp_path / "halving.yaml"
    config.write_text("workload: loop_workloads:good_loop\nconvergence:\n  lr_rules: [tuned]\n"
                      "  lr_candidates: [0.1, 0.3]\n  lr_halving_eta: 2\n")
    result, runs = converge(tmp_path, "loop_workloads:good_loop", "--config", str(config))
    assert result.returncode == 2 and "lr_halving_eta" in result.stderr and runs is None


def test_a_pipeline_with_a_batch_schedule_is_refused_for_a_loop_before_any_stage(tmp_path):
    for module in ("loop_workloads.py", "contract_workloads.py"):  # the first imports the second
        shutil.copy(TESTS_DIR / module, tmp_path)
    (tmp_path / "c.yaml").write_text("workload: loop_workloads:good_loop\n"
                                     "batch_schedule:\n  enabled: true\n")
    result = run_cli(["run", "--config", "c.yaml"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert ("batch_schedule: loop_workloads:good_loop is a TrainingLoop, whose model and "
            "optimizer batchscale never holds") in result.stderr
    assert "or set batch_schedule.enabled: false" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / ".batchscale").exists()


def test_misbehaving_loops_fail_their_trial_and_the_others_go_on(tmp_path):
    """At batch 16 each loop misbehaves in its own way; batches 8 and 32 reach the target."""
    expected = {
        "raises": ("failed", "raised RuntimeError: out of ideas at step 7 (at "),
        "silent": ("failed", "returned without calling trial.report()"),
        "nan": ("diverged", "reported non-finite val_accuracy at step "),
        "undeclared": ("failed", "metrics ['val_f1'] are not among the loop's declared"),
    }
    for how, (status, message) in expected.items():
        result, runs = converge(tmp_path / how, f"loop_workloads:{how}", "--batch-sizes",
                                "8", "16", "32", "--seeds", "0")
        assert result.returncode == 0, result.stderr
        assert message in result.stderr and "Traceback" not in result.stderr
        at_16 = runs["batch_size"].eq(16)
        assert runs.loc[at_16, "status"].eq(status).all(), (how, result.stderr)
        assert runs.loc[at_16, "stop_reason"].str.contains(message, regex=False).all(), how
        assert runs.loc[~at_16, "status"].eq("reached").all(), (how, result.stderr)
        assert runs.loc[~at_16, "stop_reason"].isna().all(), how
        if status == "failed":  # the command goes on, and names what failed at its end
            assert re.search(r"note: 2 of 6 trials failed \(status failed: .*\): b16-\S+: .*"
                             + re.escape(message), result.stderr), result.stderr


def test_a_loop_in_a_two_worker_group_measures_the_noise_scale(tmp_path):
    result, runs = converge(tmp_path, "loop_workloads:good_loop", "--workers", "2",
                            "--batch-sizes", "16", "64", "--seeds", "0", "--optimizer", "adamw")
    assert result.returncode == 0, result.stderr
    assert "note: --optimizer does not apply to a TrainingLoop: your loop builds its own " \
           "optimizer" in result.stderr
    assert runs["status"].eq("reached").all() and runs["world_size"].eq(2).all()
    assert runs["workers"].eq(2).all()
    # from DDP's own all-reduce, through the comm hook (a few noisy updates: any sign)
    assert runs["b_simple"].notna().all()
    curves = pq.read_table(tmp_path / "out" / "curves.parquet").to_pandas()
    assert (curves.groupby("trial_id")["train_time_s"].diff().dropna() > 0).all()
    # the report before the one that met the target is recorded, as for a Workload's trial
    for run in runs.itertuples():
        steps = curves.loc[curves["trial_id"] == run.trial_id, "step"].tolist()
        at = steps.index(run.steps_to_target)
        assert run.steps_before_target == (steps[at - 1] if at else 0)
    # the all-reduce probe a Workload's trial runs, at the size of the model `prepare` saw:
    # what the planner fits the link to, instead of assuming its latency
    from contract_workloads import mlp

    assert runs["gradient_bytes"].eq(4 * sum(p.numel() for p in mlp().parameters())).all()
    assert runs["allreduce_backend"].eq("gloo").all()
    assert (runs["allreduce_small_s"] > 0).all() and (runs["allreduce_gradient_s"] > 0).all()
    assert runs["allreduce_small_bytes"].eq(1024).all()


def test_a_loop_trial_records_how_long_its_threads_waited_for_a_cpu(tmp_path):
    """As a Workload's trial does: the analysis flags its times NOT TRUSTED above the limit."""
    from batchscale.conditions import run_queue_wait_s

    if run_queue_wait_s() is None:
        pytest.skip("this kernel does not report the run-queue wait (/proc/self/schedstat)")
    result, runs = converge(tmp_path, "loop_workloads:good_loop", "--batch-sizes", "16",
                            "--seeds", "0")
    assert result.returncode == 0, result.stderr
    share = runs["cpu_wait_share"]
    assert share.notna().all() and share.between(0, 1).all(), share
    assert runs["allreduce_small_s"].isna().all()  # one worker: no group to probe


def test_a_loop_that_wraps_ddp_itself_has_its_noise_scale_measured_on_it(tmp_path):
    """trial.measure_noise on the loop's own DDP (as a Trainer makes one) records B_simple as
    trial.prepare's does, and the model's gradient size (what the planner's all-reduce
    carries); on a plain model, or on one `prepare` already measures, in a two-worker group the
    trial fails saying why."""
    from contract_workloads import mlp

    result, runs = converge(tmp_path / "ddp", "loop_workloads:framework_ddp", "--workers", "2",
                            "--batch-sizes", "16", "--seeds", "0")
    assert result.returncode == 0, result.stderr
    assert runs["status"].eq("reached").all() and runs["b_simple"].notna().all()
    assert runs["gradient_bytes"].eq(4 * sum(p.numel() for p in mlp().parameters())).all()
    for how, message in (("plain", "trial.measure_noise: got a Sequential, not the "
                                    "DistributedDataParallel"),
                         ("prepared", "trial.measure_noise: the noise scale is already measured")):
        result, runs = converge(tmp_path / how, f"loop_workloads:framework_{how}", "--workers",
                                "2", "--batch-sizes", "16", "--seeds", "0")
        assert message in result.stderr and "Traceback" not in result.stderr, how
        assert runs["status"].eq("failed").all(), how


def test_the_own_loop_example_runs_through_the_whole_pipeline(tmp_path, object_store):
    """examples/own_loop on a copy (a user's own directory): the script runs on its own, and
    `batchscale run` takes its loop through every stage (kfp.local, the real store): the
    data-prep and sweep stages say there is nothing to prepare or time, B_crit is fitted and
    published, and `history` shows it over runs."""
    work = tmp_path / "own_loop"
    shutil.copytree(EXAMPLE_DIR, work)
    script = subprocess.run([sys.executable, "train_digits.py", "--steps", "20",
                             "--eval-every", "10"], cwd=work, capture_output=True, text=True,
                            timeout=120)
    assert script.returncode == 0 and "step 20:" in script.stdout, script.stderr
    # The example's config at a CI-sized grid (the docs quote the full config's figures).
    config = (work / "config.yaml").read_text().replace("[8, 16, 32, 64, 128]", "[8, 32, 128]")
    (work / "config.yaml").write_text(config)
    result = run_cli(["run", "--config", "config.yaml"], cwd=work, env=store_env(object_store),
                     timeout_s=600)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "Traceback" not in out
    log = next((work / ".batchscale" / "runs").glob("*/pipeline.log")).read_text()
    assert "no throughput sweep: train_digits:loop is a TrainingLoop" in log
    assert "validate sweep: no rows to check" in log
    assert "data_prep: nothing prepared: train_digits:loop reads its own data" in log
    assert "validate manifest: no rows to check" in log
    # each trial's line says what a Workload's trial says: targets reached, training time
    reached = re.findall(r"\[b\d+-sqrt-s\d-w1\] reached at step \d+ \(1 of 1 targets, "
                         r"\d+\.\d\d s\)", log)
    assert len(reached) == 6, log
    assert re.search(r"B_crit \(sqrt\): [\d.]+ \[[\d.]+, [\d.]+\]", result.stdout), result.stdout
    assert "throughput: none: no throughput sweep" in result.stdout
    # the loop's LR schedule is its own: the card names no warm-up it cannot see
    lr_line = next(line for line in result.stdout.splitlines() if "Learning rate:" in line)
    assert "warm-up" not in lr_line, lr_line
    assert "regressions: not judged: the run has no throughput rows" in result.stdout
    history = run_cli(["history", "--workload", "train_digits:loop"], cwd=work,
                      env=store_env(object_store))
    assert history.returncode == 0, history.stderr
    assert "samples/s: no timed sweep row published for train_digits:loop" in history.stdout
    assert "B_crit (90 % interval)" in history.stdout and "sqrt" in history.stdout


def test_the_adaptive_search_runs_a_users_own_loop_and_analyze_reports_it(tmp_path):
    """examples/own_loop under `--strategy adaptive` (docs/your-model.md): the search runs the
    user's loop cell by cell, says why the noise scale predicts nothing on one process, stops
    with an interval, and `analyze` of its output carries the "Adaptive search" section."""
    from batchscale.checks import validate_table
    from batchscale.storage import read_table_file

    work = tmp_path / "own_loop"
    shutil.copytree(EXAMPLE_DIR, work)
    result, runs = converge(tmp_path, "train_digits:loop", "--config", "config.yaml",
                            "--strategy", "adaptive", "--batch-sizes", "8", "16", "32", "64",
                            "128", "256", "--seeds", "0", "1", "2", cwd=work)
    assert result.returncode == 0, result.stderr[-3000:]
    decisions = read_table_file(tmp_path / "out" / "decisions.parquet")
    assert validate_table("decisions", decisions).success
    rows = decisions.to_pylist()
    predicted = next(r for r in rows if r["action"] == "predict")
    assert predicted["prediction_method"] == "none"
    assert "no gradient noise scale" in predicted["reason"]
    assert rows[-1]["action"] == "stop" and rows[-1]["b_crit_low"] is not None
    assert set(runs["status"]) <= {"reached", "not_reached", "pruned"}
    analysis = run_cli(["analyze", str(tmp_path / "out" / "runs.parquet"), "--out",
                        str(tmp_path / "analysis")], cwd=work)
    assert analysis.returncode == 0, analysis.stderr
    assert "Adaptive search\n---" in analysis.stdout
    assert "a grid of 6 batch sizes × 3 seeds" in analysis.stdout


def test_a_loop_with_its_own_schedule_reports_its_learning_rate(monkeypatch):
    """`report(lr=...)` is what the curves table records; without it, `lr_at`'s schedule."""
    from batchscale.convergence.loop_trial import LoopStop

    trial, reports = _timed_trial([0.0], monkeypatch)
    trial.report(5, {"val_accuracy": 0.5}, lr=0.0375)
    assert reports[-1]["lr"] == 0.0375
    for bad in (-0.1, float("nan"), "0.1"):
        with pytest.raises(LoopStop, match="argument 'lr' is|must be a finite learning rate"):
            trial.report(10, {"val_accuracy": 0.6}, lr=bad)
    trial.report(10, {"val_accuracy": 0.6})
    assert reports[-1]["lr"] is None  # the runner records lr_at(step - 1) for it


def test_a_reported_metric_is_a_number_or_a_one_element_tensor_never_text():
    """float() reads "0.92" and a one-element tensor alike; only the second is a number a loop
    should report."""
    import numpy as np
    import pytest
    import torch

    from batchscale.convergence.loop_trial import LoopStop, _number

    assert _number("val_accuracy", torch.tensor(0.5)) == 0.5
    assert _number("val_accuracy", np.float32(0.25)) == 0.25
    assert _number("val_loss", 3) == 3.0
    for bad in ("0.92", b"0.9", torch.tensor([0.5, 0.6]), None, [0.5]):
        with pytest.raises(LoopStop, match="not a number"):
            _number("val_accuracy", bad)
