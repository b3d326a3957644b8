"""The critical batch over training and the batch-size schedule (batchscale/batch_schedule/):
the fit recovers a known B_crit(t), the schedule follows it, the measurement is deterministic
and resumes after a kill, and the command writes a checked table and an honest summary."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from batchscale.batch_schedule import findings, fit, measure
from batchscale.batch_schedule import section as schedule_section
from batchscale.config import ExperimentConfig
from batchscale.errors import BadInput
from helpers import run_cli

CONFIG = {
    "name": "digits-bs",
    "convergence": {"lr_rules": ["linear"], "base_lr": 0.1,
                    "targets": [{"metric": "val_accuracy", "value": 0.85}]},
    "batch_schedule": {"base_batch_size": 4, "branch_factors": [2, 4, 8],
                       "checkpoint_steps": [20, 60], "milestone_steps": 20, "max_steps": 400,
                       "check_seeds": [0, 1], "val_rows": 128},
}


# ------------------------------------------------------------------------------ config


def test_config_refuses_what_a_schedule_cannot_use():
    from batchscale.batch_schedule.stage import check_config

    with pytest.raises(ValueError, match="ascending and above 1"):
        ExperimentConfig.model_validate({"batch_schedule": {"branch_factors": [4, 2]}})
    with pytest.raises(ValueError, match="past batch_schedule.max_steps"):
        ExperimentConfig.model_validate({"batch_schedule": {"checkpoint_steps": [100],
                                                            "milestone_steps": 50,
                                                            "max_steps": 120}})
    grid = ExperimentConfig.model_validate({"convergence": {"lr_rules": ["tuned"],
                                                            "lr_candidates": [0.1]}})
    with pytest.raises(BadInput, match="only tuned"):
        check_config(grid)
    decay = ExperimentConfig.model_validate({"convergence": {"lr_decay": "cosine"}})
    with pytest.raises(BadInput, match="lr_decay"):
        check_config(decay)
    with pytest.raises(ValueError, match="lr_decay 'cosine' decays"):  # the stage: at load
        ExperimentConfig.model_validate({"convergence": {"lr_decay": "cosine"},
                                         "batch_schedule": {"enabled": True}})


# --------------------------------------------------------- the measurement, for real


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    from batchscale.data.prep import prepare

    cfg = ExperimentConfig.model_validate(CONFIG)
    data = tmp_path_factory.mktemp("bs-data")
    prepare(cfg.dataset, data)
    return cfg, str(data)


def _measure(cfg, data, work):
    from batchscale.batch_schedule.stage import measure_schedule

    return measure_schedule(cfg, data, work, "bs-test", lambda line: None)


def _figures(outcome) -> list:
    """What must not change between two runs of the same measurement (not the timings)."""
    return ([(r["checkpoint_step"], r["batch_size"], r["steps_to_milestone"])
             for r in outcome.branches],
            [(f.b_crit, f.b_crit_low, f.b_crit_high, f.bound) for f in outcome.fits],
            [(r["schedule"], r["seed"], r["steps_to_target"], r["final_val_loss"])
             for r in outcome.check_rows])


def test_the_measurement_is_deterministic_and_resumes_after_a_kill(prepared, tmp_path):
    """Two measurements in fresh directories give the same branches, fits and check; one killed
    after the reference run's first checkpoint and after a branch resumes to the same answer."""
    cfg, data = prepared
    first = _measure(cfg, data, tmp_path / "a")
    assert first.stages, "the digits example is expected to schedule a larger batch"
    assert _figures(_measure(cfg, data, tmp_path / "b")) == _figures(first)
    killed = tmp_path / "killed"
    shutil.copytree(tmp_path / "a", killed)
    (killed / "reference" / "final.json").unlink()  # as if killed after checkpoint 20
    (killed / "reference" / "step-60.pt").unlink()
    for path in list((killed / "branches").glob("*.json"))[1:]:
        path.unlink()
    shutil.rmtree(killed / "check")
    assert _figures(_measure(cfg, data, killed)) == _figures(first)


def test_the_command_writes_a_checked_table_and_a_summary_that_agree(prepared, tmp_path,
                                                                     capsys):
    from batchscale.cli import main

    cfg, data = prepared
    config = tmp_path / "bs.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    out = tmp_path / "out"
    assert main(["batch-schedule", "--config", str(config), "--dataset-dir", data,
                 "--out", str(out)]) == 0
    table = pq.read_table(out / "critical_over_training.parquet").to_pylist()
    assert [r["checkpoint_step"] for r in table] == [20, 60]
    assert all(r["scheduled_batch_size"] >= 4 and r["git_commit"] for r in table)
    # each stage's learning rate, by the linear rule from base_lr 0.1 at reference batch 32
    assert all(r["scheduled_lr"] == pytest.approx(0.1 * r["scheduled_batch_size"] / 32)
               and r["base_batch_lr"] == pytest.approx(0.1 * 4 / 32) for r in table)
    text = (out / "batch_schedule.md").read_text()
    assert f"**Schedule**: 4 at LR {0.1 * 4 / 32:.3g}" in text
    for r in table:
        assert f"| {r['checkpoint_step']:,} |" in text
    assert "**Check** (2 of 2 seeds" in text and "× the constant run's steps" in text
    check = pq.read_table(out / "schedule_check.parquet").to_pandas()
    scheduled = check[check["schedule"] == "scheduled"]
    last = scheduled["stages"].iloc[0].split(":")[-1]  # "from_loss:batch,...": the last batch
    finals = check[check["schedule"] == "constant_final"]
    assert sorted(finals["seed"]) == [0, 1] and finals["batch_sizes"].eq(last).all()
    assert f"Against a constant {last} from the first step (the schedule's last batch" in text
    assert json.loads((out / "validation.json").read_text())[0]["success"]
    assert (out / "critical_over_training.png").stat().st_size > 1000
    assert "B_crit" in capsys.readouterr().out


def test_a_rank_correlation_of_few_checkpoints_gets_its_chance_not_a_false_interval():
    """Three checkpoints in the same order: rho 1, but a random order does that 1 time in 6;
    no bootstrap interval (its resamples would only repeat 1.0)."""
    crit = pd.DataFrame({"b_crit": [10.0, 20.0, 40.0], "b_simple": [10 / 3, 20 / 3, 40 / 3]})
    found = findings.tracking(crit)
    rho, low, high, p_value = found["rank"]
    assert rho == 1.0 and math.isnan(low) and math.isnan(high)
    assert p_value == pytest.approx(1 / 6)
    value, low, high = found["ratio_mean"]
    assert value == pytest.approx(1 / 3) and low <= value <= high


def _run_cli(tmp_path, data, **changes) -> tuple[int, str]:
    import subprocess
    import sys

    config = {**CONFIG, **changes}
    path = tmp_path / "bs.yaml"
    path.write_text(yaml.safe_dump(config))
    result = subprocess.run([sys.executable, "-m", "batchscale.cli", "batch-schedule",
                             "--config", str(path), "--dataset-dir", data,
                             "--out", str(tmp_path / "out")],
                            capture_output=True, text=True, timeout=300)
    return result.returncode, result.stderr


def test_a_diverging_reference_run_stops_with_a_message_and_no_traceback(prepared, tmp_path):
    _, data = prepared
    code, stderr = _run_cli(tmp_path, data, convergence={**CONFIG["convergence"],
                                                         "base_lr": 1e6})
    assert code == 1, stderr
    assert "the reference run diverged at step" in stderr and "convergence.base_lr" in stderr
    assert "Traceback" not in stderr


@pytest.mark.parametrize(("workload", "said"), [
    ("bad_index", "Workload.train_data (its dataset's __getitem__) failed on index "),
    ("per_example_loss", "Workload.loss returned Tensor of shape [4]"),
])
def test_the_workloads_own_code_failing_mid_run_is_bad_input_in_one_line(tmp_path, workload,
                                                                         said):
    """An item past the check's two examples that cannot be read, a loss that gives one value
    per example on a real batch: exit 2 with the member, the run (seed, step) and the user's
    line where the error was raised in their code, and no traceback."""
    path = tmp_path / "bs.yaml"
    path.write_text(yaml.safe_dump({**CONFIG, "workload": f"user_code_error_workloads:{workload}"}))
    result = run_cli(["batch-schedule", "--config", str(path), "--out", str(tmp_path / "out")],
                     cwd=Path(__file__).parent, timeout_s=300)
    assert result.returncode == 2, result.stderr[-3000:]
    assert said in result.stderr and "in the batch schedule's run from seed 0 at step" in \
        result.stderr, result.stderr[-3000:]
    assert "Traceback" not in result.stderr and result.stderr.count("error:") == 1


def test_a_dataset_smaller_than_the_largest_branch_batch_is_refused(prepared, tmp_path):
    _, data = prepared
    code, stderr = _run_cli(tmp_path, data, batch_schedule={**CONFIG["batch_schedule"],
                                                            "branch_factors": [2, 1024]})
    assert code == 2, stderr
    assert "fewer than the largest branch batch 4096" in stderr and "Traceback" not in stderr


def test_the_section_and_the_answer_card_come_from_the_tables_and_agree():
    """From the two tables alone: the table rows, the schedule, the check's ratio, and the
    answer card's line, which names the schedule only because the check shows fewer steps."""
    from clean_tables import critical_over_training_rows, schedule_check_rows

    crit, check = pd.DataFrame(critical_over_training_rows()), pd.DataFrame(schedule_check_rows())
    found = schedule_section.section(schedule_section.Findings.from_tables(crit, check))
    assert [row[0] for row in found.rows] == ["100", "300"]
    assert found.rows[0][4] == "13 [5.3, 25.5]" and found.rows[1][4] == "above 64"
    text = " ".join(found.paragraphs)
    assert "**Schedule**: 8 at LR 0.05, 64 from val_loss 2.400 at LR 0.141." in text
    assert "2 of 2 seeds" in text and ("meets the goal of 25% fewer steps that makes a schedule "
                                       "worth taking") in text
    assert found.answer.startswith(
        "**Batch-size schedule: 8 at LR 0.05, 64 from val_loss 2.400 at LR 0.141**")
    assert "the examples of a constant 8 (where it starts; no other fixed batch was run beside " \
           "it)" in found.answer
    assert "(#critical-over-training)" in found.answer
    worse = check.assign(steps_to_target=[900.0, 810.0, 901.0, 809.0])
    lost = schedule_section.section(schedule_section.Findings.from_tables(crit, worse))
    assert lost.answer is None and "does not establish" in " ".join(lost.paragraphs)


def test_a_users_workload_is_measured_through_the_public_contract(tmp_path):
    """A batchscale.Workload (its own Dataset, loss and metrics) branches like a built-in; a
    TrainingLoop, whose state batchscale never holds, is refused naming why."""
    config = {**CONFIG, "workload": "contract_workloads:good",
              "convergence": {"lr_rules": ["linear"], "base_lr": 0.1, "targets": [
                  {"metric": "val_accuracy", "value": 0.9}]}}
    cfg = ExperimentConfig.model_validate(config)
    outcome = _measure(cfg, str(tmp_path / "unused"), tmp_path / "work")
    assert [f.checkpoint_step for f in outcome.fits] == [20, 60]
    assert all(r["examples"] > 0 for r in outcome.branches)
    loop = ExperimentConfig.model_validate({**config, "workload": "loop_workloads:good_loop"})
    with pytest.raises(BadInput, match="is a TrainingLoop, whose model and optimizer"):
        _measure(loop, str(tmp_path / "unused"), tmp_path / "loop")


def test_the_terminal_summary_line_says_what_the_check_found():
    from clean_tables import critical_over_training_rows, schedule_check_rows

    crit, check = pd.DataFrame(critical_over_training_rows()), pd.DataFrame(schedule_check_rows())
    found = schedule_section.Findings.from_tables(crit, check)
    assert schedule_section.summary_line(found).startswith(
        "batch-size schedule: 8 at LR 0.05, 64 from val_loss 2.400 at LR 0.141 — 0.46 [")
    worse = schedule_section.Findings.from_tables(
        crit, check.assign(steps_to_target=[900.0, 810.0, 901.0, 809.0]))
    worse_line = schedule_section.summary_line(worse)
    assert "does not establish the goal of 25% fewer steps" in worse_line
    # 900 and 901 steps lie outside the prediction the branches made: said, not left to guess.
    assert "did not hold: the scheduled runs' steps (900, 901) all lie outside it" in worse_line
    assert "did not hold" not in schedule_section.summary_line(found)
    # Two runs far apart, both above the prediction [301, 399]: the interval of their mean
    # reaches into it, the runs do not; one run inside it and the prediction held.
    def scheduled_at(steps: list[float]) -> str:
        changed = check.copy()
        changed.loc[changed["schedule"] == "scheduled", "steps_to_target"] = steps
        return schedule_section.summary_line(schedule_section.Findings.from_tables(crit,
                                                                                   changed))

    assert "steps (420, 900) all lie outside it" in scheduled_at([420.0, 900.0])
    assert "did not hold" not in scheduled_at([380.0, 900.0])
    # One seed: no interval anywhere, said once rather than after every figure.
    one = schedule_section.Findings.from_tables(crit, check[check["seed"] == 0])
    text = schedule_section.markdown(one, "w")
    assert "(1 of 1 seeds with both runs at the target; one seed, so no intervals): the " \
           "schedule took 0.46× the constant run's steps (54% fewer; one seed cannot " \
           "establish the goal of 25% fewer steps" in text
    assert "one seed: no interval" not in text


def test_sigterm_stops_the_measurement_keeping_what_it_finished(prepared, tmp_path):
    """SIGTERM once a branch is written: exit 143, one line, no traceback; the rerun with the
    same --out keeps the finished units and completes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    _, data = prepared
    config = tmp_path / "bs.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    out = tmp_path / "out"
    command = [sys.executable, "-m", "batchscale.cli", "batch-schedule", "--config",
               str(config), "--dataset-dir", data, "--out", str(out)]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 120
    while not list((out / "work" / "branches").glob("*.json")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    stderr = proc.communicate(timeout=60)[1]
    assert proc.returncode == 143, stderr
    assert "Traceback" not in stderr
    kept = {p.name: p.read_bytes() for p in (out / "work" / "branches").glob("*.json")}
    assert kept
    rerun = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    for name, data_bytes in kept.items():
        assert (out / "work" / "branches" / name).read_bytes() == data_bytes


def test_seconds_measured_on_a_busy_machine_are_flagged_not_trusted():
    """A run that waited for a CPU beyond analysis.max_cpu_wait_share: the time ratio and the
    cost say NOT TRUSTED; the step figures, which a busy machine does not change, do not."""
    from clean_tables import critical_over_training_rows, schedule_check_rows

    crit, check = pd.DataFrame(critical_over_training_rows()), pd.DataFrame(schedule_check_rows())
    quiet = " ".join(schedule_section.sentences(schedule_section.Findings.from_tables(crit, check)))
    assert "NOT TRUSTED" not in quiet
    busy = schedule_section.Findings.from_tables(crit, check.assign(cpu_wait_share=0.35))
    text = " ".join(schedule_section.sentences(busy))
    assert text.count("seconds NOT TRUSTED: a run waited for a CPU 35%") == 2
    assert "NOT TRUSTED" not in schedule_section.summary_line(busy)


def test_a_reference_loss_that_does_not_fall_leaves_its_checkpoints_unbranched(prepared,
                                                                               tmp_path):
    """At a learning rate of 1e-9 the reference's loss stands still: no milestone lies below a
    checkpoint, so a branch would 'reach' it at step 0. No branch runs; each checkpoint says
    why and what to change, and the table still passes its suite."""
    from batchscale.batch_schedule.tables import tables
    from batchscale.checks import validate_table
    from batchscale.envinfo import environment

    cfg, data = prepared
    still = cfg.model_copy(update={"convergence": cfg.convergence.model_copy(
        update={"base_lr": 1e-9})})
    outcome = _measure(still, data, tmp_path / "work")
    assert outcome.branches == [] and outcome.stages == []
    for f in outcome.fits:
        assert f.batches_reached == 0 and math.isnan(f.b_crit)
        assert f.reason.startswith(f"the reference run's val_loss did not fall from step "
                                   f"{f.checkpoint_step} (")
        assert "choose batch_schedule.checkpoint_steps where the loss still falls" in f.reason
    env = environment(run_id="r", config_hash=still.config_hash, experiment=still.name,
                      workload=still.workload, device="cpu", variant=None)
    crit, _ = tables(outcome, env)
    report = validate_table("critical_over_training", crit)
    assert report.success, report.failure_message()

    # A loss that rose over the milestone's steps: unbranched, it passes; a row claiming its
    # branches reached a milestone above the checkpoint's loss does not.
    rose = fit.unbranched(20, {"val_loss": 0.5, "examples": 80}, 0.6, 20)
    outcome.fits = [rose]
    assert validate_table("critical_over_training", tables(outcome, env)[0]).success
    outcome.fits = [dataclasses.replace(rose, batches_reached=3)]
    failed = validate_table("critical_over_training", tables(outcome, env)[0])
    assert "a milestone that branches reached lies below" in failed.failure_message()


def test_the_command_trains_a_users_workload_to_its_own_target(tmp_path, capsys):
    """A Workload that names its target (val_loss <= 0.3) and reports no val_accuracy: the
    command trains to that target, as `converge` does, instead of the config's default."""
    from batchscale.cli import main

    config = tmp_path / "bs.yaml"
    config.write_text(yaml.safe_dump({**CONFIG, "convergence": {"lr_rules": ["linear"],
                                                                "base_lr": 0.1}}))
    code = main(["batch-schedule", "--config", str(config), "--workload",
                 "contract_workloads:loss_only", "--out", str(tmp_path / "out")])
    assert code == 0
    assert "reference run: batch 4, linear rule, to val_loss 0.3" in capsys.readouterr().err
    assert not (tmp_path / "out" / "data").exists()  # its own data: the config's not prepared
    # The stage itself (a study's variant, the pipeline) resolves it the same way.
    cfg = ExperimentConfig.model_validate({**CONFIG, "workload": "contract_workloads:loss_only",
                                           "convergence": {"lr_rules": ["linear"],
                                                           "base_lr": 0.1}})
    outcome = _measure(cfg, str(tmp_path / "unused"), tmp_path / "stage")
    assert (outcome.target.metric, outcome.target.value) == ("val_loss", 0.3)


def test_a_milestone_within_the_curves_own_scatter_is_not_branched():
    """The scatter between evaluations is read from each evaluation's distance to the line
    through its neighbours: a smooth fast fall (the first steps from random weights) is not
    noise, so its milestone is branched; on a noisy plateau a milestone 0.013 lower is within
    the noise, and the checkpoint says so instead of timing it."""
    steps = np.arange(0, 401, 10)
    smooth = 0.3 + 2.0 * np.exp(-steps / 60)
    bending = [{"step": int(s), "val_loss": float(v)} for s, v in zip(steps, smooth, strict=True)]
    scatter = measure.loss_scatter(bending, 50, 60)
    assert scatter < 0.02  # the bend between neighbours, a twentieth of the drop below
    assert fit.branchable(smooth[5], smooth[8], scatter)  # steps 50 -> 80: 0.47 lower

    plateaus = [[{"step": int(s), "val_loss": 0.25 + float(e)} for s, e in
                 zip(steps, np.random.default_rng(seed).normal(0, 0.03, len(steps)),
                     strict=True)] for seed in range(60)]
    estimates = [measure.loss_scatter(plateau, 300, 60) for plateau in plateaus]
    assert np.median(estimates) == pytest.approx(0.03, rel=0.15)  # the noise put in
    scatter = float(np.median(estimates))
    assert not fit.branchable(0.251, 0.238, scatter)
    assert fit.branchable(0.251, 0.238, math.nan)  # too few evaluations to tell: any fall
    assert math.isnan(measure.loss_scatter(plateaus[0][:5], 20, 60))
    row = fit.unbranched(300, {"val_loss": 0.251, "examples": 2400}, 0.238, 30, scatter)
    assert row.reason.startswith("the reference run's val_loss fell only 0.013 from step 300 "
                                 "(0.251) to step 330 (0.238), within its own scatter")
    assert row.batches_reached == 0 and math.isnan(row.b_crit)


def test_a_scheduled_batch_above_its_checkpoints_b_crit_is_marked_and_a_missing_b_simple_said():
    """The schedule never shrinks the batch, so an earlier checkpoint's bound can keep it above
    a later one's B_crit interval: the table says so. No B_simple at any checkpoint: said why."""
    from batchscale.batch_schedule.section import _scheduled_cell, _tracking_text

    row = {"scheduled_batch_size": 128, "b_crit_high": 81.0, "b_crit_bound": None}
    assert _scheduled_cell(row) == ("128 (kept from an earlier checkpoint: above this one's "
                                    "B_crit interval)")
    assert _scheduled_cell({**row, "scheduled_batch_size": 64}) == "64"
    assert _scheduled_cell({**row, "b_crit_bound": "above", "b_crit_high": float("nan")}) == "128"
    text = _tracking_text({"ratio_mean": None, "points": 0})
    assert "no checkpoint has both figures" in text and "nothing to compare" in text
