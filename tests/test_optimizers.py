"""Optimizers, LR decay and precision in convergence trials: the default
still trains exactly as the SGD loop did, AdamW reaches the digits target, a bf16 trial runs
(autocast forward, fp32 parameters and gradients, the noise scale still measured) and labels its
rows, the schedule is exact at its boundaries, an AdamW trial killed mid-decay resumes to the same
curve (real processes, the training script's own fault drill), checkpoints written before these
settings still resume with the defaults, and bad names are refused naming the field."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from batchscale.checks import validate_table
from batchscale.config import parse_config
from batchscale.convergence import checkpoint, faults, runner, train
from batchscale.convergence.distributed import Dist
from batchscale.convergence.schedule import LrSchedule, build_optimizer, lr_at
from batchscale.convergence.spec import LATER_SETTINGS, TrainingSettings
from batchscale.data.prep import prepare
from batchscale.errors import BadInput
from batchscale.location import LocalLocation
from batchscale.precision import autocast
from batchscale.schemas import make_table
from batchscale.workloads import get_workload

FAST = {"target_val_accuracy": 0.9, "max_steps": 300, "eval_every_steps": 5,
        "checkpoint_every_steps": 10, "seeds": [0]}
# AdamW on the digits MLP: LR ~3e-3 at batch 32 (sqrt rule) reaches 0.9 in ~50 steps at 64.
ADAMW = {"optimizer": "adamw", "base_lr": 3e-3, "lr_rules": ["sqrt"]}
RUN_TIMEOUT_S = 300
ENV = {"run_id": "t", "config_hash": "h", "experiment": "e", "workload": "digits-mlp",
       "git_commit": "c", "batchscale_version": "v", "torch_version": torch.__version__,
       "python_version": "3", "device_name": "cpu", "threads": 1, "world_size": 1}


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits")
    prepare(parse_config({}).dataset, out)
    return out


def make_spec(tmp_path: Path, digits_dir: Path, batch_size: int = 64, **convergence):
    cfg = parse_config({"convergence": {**FAST, "batch_sizes": [batch_size], **convergence}})
    return runner.build_spec(cfg, [batch_size], data_dir=str(digits_dir),
                             out_dir=str(tmp_path), run_id="t")


def make_trial(tmp_path: Path, digits_dir: Path, **convergence) -> train.Trial:
    """One trial on one rank inside the test process (no torchrun)."""
    spec = make_spec(tmp_path, digits_dir, **convergence)
    workload = get_workload(spec.training.workload)
    data = train.load_data(spec.data_dir, workload)
    return train.Trial(spec, spec.trials[0], data, Dist(0, 1, "cpu"),
                       LocalLocation(tmp_path / "ckpt"), workload)


def trajectory(curve: list[dict]) -> list[tuple]:
    """What an optimizer or an interruption decides: steps, losses, accuracies, LR, noise."""
    return [(c["step"], c["train_loss"], c["val_accuracy"], c["lr"], c["b_simple"])
            for c in curve]


# ----------------------------------------------------------------- the default is unchanged
def test_default_config_builds_sgd_fp32_without_decay():
    """The embedded defaults keep the steps-to-target table: SGD with the config's momentum
    and no weight decay, fp32, warm-up then constant."""
    c = parse_config({}).convergence
    assert (c.optimizer, c.weight_decay, c.lr_decay, c.precision) == ("sgd", 0.0, "none", "fp32")
    assert c.lr_rules == ["linear", "sqrt"]
    settings = runner.build_spec(parse_config({}), [64], data_dir="d", out_dir="o",
                                 run_id="t").training
    params = [torch.nn.Parameter(torch.zeros(3))]
    opt = build_optimizer(params, settings, 0.1)
    old = torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1, momentum=0.9)
    assert type(opt) is torch.optim.SGD
    assert {k: v for k, v in opt.param_groups[0].items() if k != "params"} == \
        {k: v for k, v in old.param_groups[0].items() if k != "params"}
    assert isinstance(autocast("cpu", settings.precision), contextlib.nullcontext)
    schedule = LrSchedule.of(0.1, settings)
    assert [schedule.at(s) for s in range(0, 3000, 7)] == \
        [0.1 * (s + 1) / 20 if s < 20 else 0.1 for s in range(0, 3000, 7)]


def test_default_trial_trains_exactly_as_the_old_sgd_loop(tmp_path, digits_dir):
    """The same trial with the optimizer and LR the loop built before these settings existed
    (torch.optim.SGD(lr, momentum); warm-up then constant) gives a bit-identical curve."""
    new = make_trial(tmp_path / "new", digits_dir, max_steps=40, target_val_accuracy=1.0)
    new.run()
    old = make_trial(tmp_path / "old", digits_dir, max_steps=40, target_val_accuracy=1.0)
    old.opt = torch.optim.SGD(old.params, lr=old.t.lr, momentum=0.9)
    old.schedule = LrSchedule(old.t.lr, old.settings.warmup_steps)
    old.autocast = contextlib.nullcontext
    old.run()
    assert trajectory(new.state.curve) == trajectory(old.state.curve)


# ----------------------------------------------------------------------------- the schedule
def test_warmup_then_cosine_decay_is_exact_at_its_boundaries():
    peak, warmup, end, floor = 0.8, 4, 12, 0.25
    at = [lr_at(s, peak, warmup, "cosine", end, floor) for s in range(16)]
    assert at[:warmup] == [0.2, 0.4, pytest.approx(0.6), 0.8]  # the last warm-up step: peak
    assert at[warmup] == peak  # the decay starts at the peak
    assert at[8] == pytest.approx(peak * (floor + (1 - floor) / 2), rel=1e-12)  # halfway
    assert at[end] == peak * floor and at[end:] == [peak * floor] * 4  # then constant
    assert all(a > b for a, b in zip(at[warmup:end], at[warmup + 1:end + 1], strict=True))


def test_linear_decay_is_exact_at_its_boundaries_and_without_warmup():
    at = [lr_at(s, 1.0, 0, "linear", 8, 0.0) for s in range(10)]
    assert at == [1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125, 0.0, 0.0]
    assert lr_at(5, 2.0, 4, "linear", 8, 0.5) == pytest.approx(2.0 * (0.5 + 0.5 * 0.75))
    assert [lr_at(s, 1.0, 4, "none", 8) for s in range(3, 9)] == [1.0] * 6


def test_the_schedule_is_a_function_of_the_step_only():
    """A resumed trial asks for step 57 first and gets what an uninterrupted one got."""
    schedule = LrSchedule(0.3, 10, "cosine", 100, 0.1)
    forward = [schedule.at(s) for s in range(120)]
    assert [schedule.at(s) for s in reversed(range(120))] == forward[::-1]
    assert LrSchedule(0.3, 10, "cosine", 100, 0.1).at(57) == forward[57]


def test_config_states_the_decay_horizon_in_the_spec():
    spec = runner.build_spec(parse_config({"convergence": {"lr_decay": "cosine"}}), [64],
                             data_dir="d", out_dir="o", run_id="t")
    assert (spec.training.lr_decay, spec.training.decay_steps) == ("cosine", 3000)  # max_steps
    spec = runner.build_spec(parse_config({"convergence": {"lr_decay": "linear",
                                                           "decay_steps": 500,
                                                           "min_lr_ratio": 0.1}}),
                             [64], data_dir="d", out_dir="o", run_id="t")
    assert (spec.training.decay_steps, spec.training.min_lr_ratio) == (500, 0.1)


# ------------------------------------------------------------------------ bad names refused
@pytest.mark.parametrize(("settings", "message"), [
    ({"optimizer": "adam"}, r"convergence\.optimizer: Input should be 'sgd' or 'adamw'"),
    ({"precision": "fp16"}, r"convergence\.precision: Input should be 'fp32' or 'bf16'"),
    ({"lr_decay": "step"},
     r"convergence\.lr_decay: Input should be 'none', 'cosine' or 'linear'"),
    ({"lr_decay": "cosine", "decay_steps": 20},
     r"convergence\.decay_steps: the cosine decay would end at step 20, within the 20 "
     "warmup_steps"),
    ({"lr_decay": "linear", "max_steps": 10},
     r"convergence\.max_steps: the linear decay would end at step 10 \(decay_steps is unset"),
    ({"adam_beta2": 1.0}, r"convergence\.adam_beta2: Input should be less than 1"),
    ({"weight_decay": -0.1}, r"convergence\.weight_decay: Input should be greater than or"),
    ({"min_lr_ratio": 1.5}, r"convergence\.min_lr_ratio: Input should be less than or"),
])
def test_bad_optimizer_settings_are_refused_naming_the_field(settings, message):
    with pytest.raises(BadInput, match=message):
        parse_config({"convergence": settings})


def test_the_trainer_refuses_names_it_does_not_know():
    """Past the config (a hand-written spec is parsed strictly too): each names the allowed."""
    with pytest.raises(BadInput, match="lr_decay: no decay 'step'; allowed: none, cosine"):
        lr_at(30, 0.1, 10, "step", 100)
    with pytest.raises(BadInput, match="precision: no precision 'fp16'; allowed: fp32, bf16"):
        autocast("cpu", "fp16")
    settings = TrainingSettings.model_construct(optimizer="lamb")
    with pytest.raises(BadInput, match="optimizer: no optimizer 'lamb'; allowed: sgd, adamw"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], settings, 0.1)


# ------------------------------------------------------------------------------------ AdamW
def test_adamw_reaches_the_digits_target_with_the_configured_settings(tmp_path, digits_dir):
    trial = make_trial(tmp_path, digits_dir, **ADAMW, adam_beta1=0.85, adam_beta2=0.99,
                       adam_eps=1e-7, weight_decay=0.01)
    group = trial.opt.param_groups[0]
    assert type(trial.opt) is torch.optim.AdamW
    assert (group["betas"], group["eps"], group["weight_decay"]) == ((0.85, 0.99), 1e-7, 0.01)
    summary = train.summary_run_rows(trial.run())[0]
    assert summary["status"] == "reached", summary
    assert summary["lr"] == pytest.approx(3e-3 * math.sqrt(64 / 32))
    assert summary["b_simple"] is not None and summary["b_simple"] > 0
    assert set(trial.opt.state[trial.params[0]]) >= {"exp_avg", "exp_avg_sq"}  # really Adam


# ------------------------------------------------------------------------------------- bf16
def test_bf16_trial_trains_with_fp32_state_and_labels_its_rows(tmp_path, digits_dir):
    trial = make_trial(tmp_path, digits_dir, precision="bf16")
    x = trial.train.dataset.x[:8]
    with trial.autocast():
        assert trial.model(x).dtype == torch.bfloat16  # the forward runs in bf16
    summary = train.summary_run_rows(trial.run())[0]
    assert summary["status"] == "reached", summary
    # parameters, gradients and momentum stay fp32; the noise scale is still measured
    assert {p.dtype for p in trial.params} == {torch.float32}
    assert {p.grad.dtype for p in trial.params} == {torch.float32}
    assert {s["momentum_buffer"].dtype for s in trial.opt.state.values()} == {torch.float32}
    assert summary["b_simple"] is not None and summary["b_simple"] > 0
    out = LocalLocation(tmp_path / "out")
    train.write_trial_results(out, trial.t, trial, summary, ENV)
    curves_name, run_name = train.trial_files(trial.t.trial_id)
    runs, curves = out.get_table(run_name), out.get_table(curves_name)
    assert runs.select(["optimizer", "precision"]).to_pylist() == \
        [{"optimizer": "sgd", "precision": "bf16"}]
    assert set(curves.column("precision").to_pylist()) == {"bf16"}
    assert set(curves.column("optimizer").to_pylist()) == {"sgd"}
    for kind, table, context in (("curves", curves, {}), ("runs", runs, {"curves": curves})):
        report = validate_table(kind, table, context=context)
        assert report.success, report.failure_message()


def test_the_suites_refuse_an_unknown_precision_or_optimizer(tmp_path, digits_dir):
    trial = make_trial(tmp_path, digits_dir, max_steps=5, target_val_accuracy=1.0)
    summary = train.summary_run_rows(trial.run())[0]
    bad = make_table("runs", [{**summary, "optimizer": "adam", "precision": "fp16"}], ENV)
    message = validate_table("runs", bad).failure_message()
    assert 'expect_column_values_to_be_in_set(optimizer) [value_set=["sgd", "adamw"]]: 1 of 1 ' \
        'unexpected; values ["adam"]' in message
    assert 'expect_column_values_to_be_in_set(precision) [value_set=["fp32", "bf16"]]: 1 of 1 ' \
        'unexpected; values ["fp16"]' in message
    unlabelled = make_table("runs", [summary], ENV)  # rows written before the columns: null
    assert validate_table("runs", unlabelled).success


# ------------------------------------------------------------------ resume and old checkpoints
def run_entry_point(spec_path: Path, kill_at_step: int | None = None):
    """The training script as its own process, one rank (no torchrun needed for one worker);
    with `kill_at_step` its fault drill SIGKILLs it after that step."""
    env = {k: v for k, v in os.environ.items()
           if k not in (faults.FAULT_KILL_AT_STEP_ENV, "TORCHELASTIC_RESTART_COUNT")}
    if kill_at_step is not None:
        env[faults.FAULT_KILL_AT_STEP_ENV] = str(kill_at_step)
    return subprocess.run([sys.executable, "-m", "batchscale.convergence.train",
                           "--spec", str(spec_path)], env=env, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S)


def test_adamw_trial_killed_mid_decay_resumes_to_the_same_curve(tmp_path, digits_dir):
    """Real processes: killed after step 33 (checkpoint at 30), resumed, the curve, its LRs
    (cosine decay) and the step to target equal an uninterrupted run's."""
    results = {}
    for name, kill in (("base", None), ("killed", 33)):
        spec = make_spec(tmp_path / name, digits_dir, **ADAMW, lr_decay="cosine",
                         decay_steps=120, warmup_steps=10)
        (tmp_path / name).mkdir()
        spec_path = tmp_path / name / "spec.json"
        spec_path.write_bytes(spec.to_json())
        first = run_entry_point(spec_path, kill)
        if kill is not None:
            assert first.returncode == -9, first.stderr
            assert f"fault drill: rank 0 kills itself after step {kill}" in first.stderr
            again = run_entry_point(spec_path)
            assert again.returncode == 0, again.stderr
            assert f"resumed from {spec.trials[0].trial_id}/step-00000030.pt (step 30)" in \
                again.stderr
        else:
            assert first.returncode == 0, first.stderr
        curves, runs = runner.collect(spec)
        results[name] = (curves.to_pylist(), runs.to_pylist()[0])
    (base_curves, base), (curves, run) = results["base"], results["killed"]
    assert base["status"] == "reached" and base["steps_to_target"] > 33
    assert (run["steps_to_target"], run["optimizer"]) == (base["steps_to_target"], "adamw")
    assert trajectory(curves) == trajectory(base_curves)
    assert len({c["lr"] for c in curves if c["step"] > 10}) > 3  # the LR did decay


def strip_later_settings(location: LocalLocation, name: str) -> None:
    """Rewrite a checkpoint as a batchscale from before these settings wrote it: the same
    format, its identity without their keys."""
    payload = torch.load(io.BytesIO(location.get_bytes(name)), weights_only=True)
    payload["identity"] = {k: v for k, v in payload["identity"].items()
                           if k not in LATER_SETTINGS}
    location.remove(name)
    checkpoint.save(location, name, checkpoint.Checkpoint(
        **{k: v for k, v in payload.items() if k != "format"}))


def test_checkpoint_from_before_the_settings_resumes_with_the_defaults_only(tmp_path,
                                                                            digits_dir):
    trial = make_trial(tmp_path, digits_dir, max_steps=10, target_val_accuracy=1.0)
    trial.run()
    loc = LocalLocation(tmp_path / "ckpt")
    strip_later_settings(loc, checkpoint.latest(loc, trial.t.trial_id))
    spec = trial.spec.model_copy(update={"checkpoint_dir": str(tmp_path / "ckpt")})
    runner.check_checkpoints(spec)  # the defaults: what the old checkpoint trained with
    for setting, value in (("optimizer", "adamw"), ("precision", "bf16"),
                           ("weight_decay", 0.01)):
        changed = spec.model_copy(update={
            "training": spec.training.model_copy(update={setting: value})})
        with pytest.raises(BadInput, match=f"{setting}: checkpoint has the default, this run has "
                                           f"{value!r}"):
            runner.check_checkpoints(changed)


def test_an_adamw_checkpoint_is_not_resumed_by_an_sgd_run(tmp_path, digits_dir):
    trial = make_trial(tmp_path, digits_dir, **ADAMW, max_steps=10, target_val_accuracy=1.0)
    trial.run()
    spec = trial.spec.model_copy(update={
        "checkpoint_dir": str(tmp_path / "ckpt"),
        "training": trial.spec.training.model_copy(update={"optimizer": "sgd"})})
    with pytest.raises(BadInput,
                       match="optimizer: checkpoint has 'adamw', this run has the default"):
        runner.check_checkpoints(spec)


def test_a_spec_written_before_the_settings_parses_with_the_defaults(tmp_path, digits_dir):
    spec = make_spec(tmp_path, digits_dir)
    data = spec.model_dump(mode="json")
    for name in LATER_SETTINGS:
        del data["training"][name]
    assert type(spec).parse(json.dumps(data), "old.json") == spec
