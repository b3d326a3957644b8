"""Convergence core: LR rules and the tuned rule's candidates, data order, the noise scale,
accumulation, trial statuses (in-process, one rank), the spec file and checkpoints, and the
`batchscale converge` command with its bad inputs (the real CLI, which starts real torchrun
groups)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from plan_tables import ENV

from batchscale.checks import validate_table
from batchscale.cli.pipeline_cmds import raise_if_unreached
from batchscale.conditions import run_queue_wait_s
from batchscale.config import load_config, parse_config
from batchscale.convergence import checkpoint, runner, train
from batchscale.convergence.distributed import Dist
from batchscale.convergence.noise import NoiseScale
from batchscale.convergence.schedule import DataOrder, lr_at, scaled_lr
from batchscale.convergence.spec import LATER_SETTINGS
from batchscale.convergence.trialstate import TrialState
from batchscale.data.prep import prepare
from batchscale.errors import BadInput, BatchscaleError
from batchscale.fits import trained_trials
from batchscale.location import LocalLocation
from batchscale.schemas import make_table
from batchscale.workloads import get_workload
from helpers import run_cli

FAST = {"target_val_accuracy": 0.9, "max_steps": 300, "eval_every_steps": 5,
        "checkpoint_every_steps": 10, "seeds": [0]}


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits")
    prepare(parse_config({}).dataset, out)
    return out


def config(**convergence):
    return parse_config({"convergence": {**FAST, **convergence}})


def run_in_process(tmp_path: Path, digits_dir: Path, batch_size: int = 64, **convergence):
    """One trial on one rank inside the test process (no torchrun): the loop itself."""
    cfg = config(batch_sizes=[batch_size], **convergence)
    spec = runner.build_spec(cfg, [batch_size], data_dir=str(digits_dir),
                             out_dir=str(tmp_path), run_id="t")
    workload = get_workload(cfg.workload)
    data = train.load_data(spec.data_dir, workload)
    trial = train.Trial(spec, spec.trials[0], data, Dist(0, 1, "cpu"),
                        LocalLocation(tmp_path / "ckpt"), workload)
    return trial, train.summary_run_rows(trial.run())[0]


# ----------------------------------------------------------------------------- LR rules
def test_lr_rules_scale_from_the_reference_batch():
    assert scaled_lr("constant", 0.1, 128, 32) == pytest.approx(0.1)
    assert scaled_lr("linear", 0.1, 128, 32) == pytest.approx(0.4)
    assert scaled_lr("sqrt", 0.1, 128, 32) == pytest.approx(0.2)


def test_unknown_lr_rule_is_refused_with_the_allowed_ones():
    with pytest.raises(BadInput, match="allowed: constant, linear, sqrt"):
        scaled_lr("cubic", 0.1, 64, 32)
    with pytest.raises(BadInput, match=r"convergence\.lr_rules\.0"):
        config(lr_rules=["cubic"])


def test_the_learning_rates_are_said_and_an_sgd_scale_lr_under_adamw_is_noted():
    def convergence(**fields):
        return parse_config({"convergence": fields}).convergence

    plain = convergence()
    assert plain.lr_text() == "LR rules linear, sqrt from base_lr 0.05 at batch 32"
    assert plain.lr_note() is None  # SGD: 0.05 is its scale
    tuned = convergence(lr_rules=["sqrt", "tuned"], lr_candidates=[0.01, 0.1])
    assert tuned.lr_text() == ("LR rules sqrt from base_lr 0.05 at batch 32; tuned over LRs "
                               "0.01, 0.1")
    assert "AdamW usually wants about 1e-3" in convergence(optimizer="adamw").lr_note()
    assert convergence(optimizer="adamw", base_lr=0.001).lr_note() is None
    only_tuned = convergence(optimizer="adamw", lr_rules=["tuned"], lr_candidates=[0.1])
    assert only_tuned.lr_note() is None  # base_lr plays no part


def test_warmup_ramps_linearly_to_the_peak():
    assert [lr_at(s, 1.0, 4) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]


def test_tuned_rule_tries_every_lr_at_every_batch_size():
    cfg = config(batch_sizes=[16, 64], lr_rules=["tuned", "linear"], lr_candidates=[0.02, 0.1])
    trials = runner.build_trials(cfg, [16, 64], workers=1)
    tuned = [(t.batch_size, t.lr) for t in trials if t.lr_rule == "tuned"]
    assert tuned == [(16, 0.02), (16, 0.1), (64, 0.02), (64, 0.1)]
    assert len({t.trial_id for t in trials}) == len(trials) == 6
    assert "b16-tuned-lr0.02-s0-w1" in {t.trial_id for t in trials}


def test_rules_that_agree_at_the_reference_batch_train_it_once(tmp_path, digits_dir, capsys):
    """linear and sqrt give the same learning rate at their reference batch: one torchrun
    trial per seed there, recorded under both rules (the tuned rule's trials stay its own)."""
    cfg = config(batch_sizes=[32, 64], lr_rules=["linear", "sqrt", "tuned"],
                 lr_candidates=[0.05], reference_batch_size=32, base_lr=0.05)
    spec = runner.build_spec(cfg, [32, 64], data_dir="unused", out_dir="unused", run_id="t")
    assert [(t.trial_id, t.same_as) for t in spec.twins] == [("b32-sqrt-s0-w1",
                                                              "b32-linear-s0-w1")]
    assert "b32-sqrt-s0-w1" not in {t.trial_id for t in spec.trials}
    assert {"b32-tuned-lr0.05-s0-w1", "b64-sqrt-s0-w1"} <= {t.trial_id for t in spec.trials}
    curves, runs = runner.run_convergence(
        config(batch_sizes=[32], lr_rules=["linear", "sqrt"], reference_batch_size=32),
        [32], data_dir=str(digits_dir), out_dir=str(tmp_path / "out"), run_id="twins")
    rows = {r["lr_rule"]: r for r in runs.to_pylist()}
    assert set(rows) == {"linear", "sqrt"} and rows["sqrt"]["trial_id"] == "b32-sqrt-s0-w1"
    same = ("steps_to_target", "train_time_s", "lr", "seed", "status")
    assert [rows["sqrt"][k] for k in same] == [rows["linear"][k] for k in same]
    assert (rows["sqrt"]["trained_as"], rows["linear"]["trained_as"]) == ("b32-linear-s0-w1",
                                                                          None)
    assert list(trained_trials(runs.to_pandas())["trial_id"]) == ["b32-linear-s0-w1"]
    assert set(curves.column("lr_rule").to_pylist()) == {"linear", "sqrt"}
    assert validate_table("runs", runs).success and validate_table("curves", curves).success
    assert "[b32-sqrt-s0-w1] the same training as b32-linear-s0-w1" in capsys.readouterr().err
    # trained once: only the linear trial left result files
    assert sorted(p.name for p in (tmp_path / "out" / "trials").glob("*.run.parquet")) == [
        "b32-linear-s0-w1.run.parquet"]


def test_tuned_rule_without_lr_candidates_names_the_field():
    with pytest.raises(BadInput, match="lr_candidates: the tuned rule needs at least one"):
        config(lr_rules=["tuned"])


def test_batch_must_split_into_workers_and_micro_batches():
    with pytest.raises(BadInput, match="48 is not divisible by 1 workers x 32 accumulation"):
        config(batch_sizes=[48, 64], accumulation_steps=32)


def test_a_cell_whose_trials_all_finished_is_read_back_without_a_torchrun(tmp_path, digits_dir):
    """A resumed run (or an adaptive search replaying its cells) reads finished trials back: no
    process group starts, so the launch's spec file is not written again."""
    cfg = config(batch_sizes=[32, 64], max_steps=40)
    first = runner.run_convergence(cfg, [32, 64], data_dir=str(digits_dir),
                                   out_dir=str(tmp_path), run_id="again")
    spec_file = tmp_path / "spec.json"
    written = spec_file.stat().st_mtime_ns
    spec = runner.build_spec(cfg, [32, 64], data_dir=str(digits_dir), out_dir=str(tmp_path),
                             run_id="again")
    assert runner.finished(spec)
    second = runner.run_convergence(cfg, [32, 64], data_dir=str(digits_dir),
                                    out_dir=str(tmp_path), run_id="again")
    assert spec_file.stat().st_mtime_ns == written
    assert second[1].to_pylist() == first[1].to_pylist()
    assert not runner.finished(runner.build_spec(cfg, [16], data_dir=str(digits_dir),
                                                 out_dir=str(tmp_path), run_id="again"))


def test_workers_below_one_are_refused():
    with pytest.raises(BadInput, match=r"convergence\.workers"):
        config(workers=0)
    with pytest.raises(BadInput, match="workers: must be at least 1"):
        runner.run_convergence(config(), [64], data_dir="unused", out_dir="unused",
                               run_id="t", workers=0)


@pytest.mark.parametrize("run_id", ["../x", "/abs", "a/../../b", "run\n", ""])
def test_the_runner_refuses_a_run_id_that_is_not_one_path_segment(run_id):
    """The pipeline's entry checks too, not only the CLI: the run id names the work directory."""
    with pytest.raises(BadInput, match="run id"):
        runner.run_convergence(config(), [64], data_dir="unused", out_dir="unused",
                               run_id=run_id)
    with pytest.raises(BadInput, match="run id"):
        runner.work_dir(run_id, [64], 1)


# ---------------------------------------------------------------------- data order, noise
def test_data_order_is_a_function_of_seed_and_step_across_epochs():
    order, again = DataOrder(10, seed=3), DataOrder(10, seed=3)
    batches = [order.batch(step, 4) for step in range(5)]  # 20 rows: two whole epochs
    assert torch.equal(torch.cat(batches[:2] + [batches[2][:2]]).sort().values, torch.arange(10))
    assert torch.equal(again.batch(3, 4), batches[3])  # fresh object, same step: same rows


def test_noise_scale_recovers_a_known_gradient_noise():
    """|G_B|^2 = |G|^2 + tr(S)/B exactly: B_simple = tr(S)/|G|^2 = 8 / 2 = 4."""
    noise = NoiseScale()
    g2, trace = 2.0, 8.0
    for _ in range(50):
        noise.update(g2 + trace / 16, g2 + trace / 64, 16, 64)
    assert noise.b_simple == pytest.approx(trace / g2)


# --------------------------------------------------------------------- trials in-process
def test_trial_reaches_the_target_and_records_its_curve(tmp_path, digits_dir):
    trial, summary = run_in_process(tmp_path, digits_dir)
    assert summary["status"] == "reached"
    assert summary["steps_to_target"] == trial.state.curve[-1]["step"]
    # the evaluation before the one that met it: the target was crossed in between
    assert summary["steps_before_target"] == trial.state.curve[-2]["step"]
    assert summary["steps_to_target"] - summary["steps_before_target"] == 5
    assert summary["examples_to_target"] == 64 * summary["steps_to_target"]
    assert trial.state.curve[-1]["val_accuracy"] >= 0.9
    assert summary["b_simple"] is not None and summary["b_simple"] > 0
    assert [r["step"] for r in trial.state.curve][:3] == [0, 5, 10]
    # one worker: the gradient's bytes, no all-reduce to probe
    assert summary["gradient_bytes"] == 4 * sum(p.numel() for p in trial.params)
    assert summary["allreduce_gradient_s"] is None and summary["allreduce_backend"] is None
    # how long its threads waited for a CPU (the kernel's run-queue delay; None off Linux)
    if run_queue_wait_s() is None:
        assert summary["cpu_wait_share"] is None
    else:
        assert 0 <= summary["cpu_wait_share"] < 1


def test_a_trial_past_its_prune_bound_stops_as_pruned_and_its_suite_accepts_it(tmp_path,
                                                                               digits_dir):
    cfg = config(target_val_accuracy=1.0)  # out of reach in 300 steps
    spec = runner.build_spec(cfg, [64], data_dir=str(digits_dir), out_dir=str(tmp_path),
                             run_id="t", prune_at_step=12)
    workload = get_workload(cfg.workload)
    trial = train.Trial(spec, spec.trials[0], train.load_data(spec.data_dir, workload),
                        Dist(0, 1, "cpu"), LocalLocation(tmp_path / "ckpt"), workload)
    [row] = train.summary_run_rows(trial.run())
    # evaluations every 5 steps: the first at or past step 12 is step 15
    assert (row["status"], row["steps_run"], row["steps_to_target"]) == ("pruned", 15, None)
    report = validate_table("runs", make_table("runs", [row], ENV))
    assert report.success, report.failure_message()
    # the bound changes where a trial stops, not its trajectory: not part of the identity
    unbounded = runner.build_spec(cfg, [64], data_dir=str(digits_dir), out_dir=str(tmp_path),
                                  run_id="t")
    assert spec.identity(spec.trials[0]) == unbounded.identity(unbounded.trials[0])


def test_accumulation_gives_the_same_updates_as_one_big_batch(tmp_path, digits_dir):
    _, whole = run_in_process(tmp_path / "a1", digits_dir, gns_every_steps=1000)
    micro, split = run_in_process(tmp_path / "a4", digits_dir, gns_every_steps=1000,
                                  accumulation_steps=4)
    assert split["steps_to_target"] == whole["steps_to_target"]
    assert micro.local_batch == 64 and micro.accumulation == 4


def test_a_huge_learning_rate_is_a_diverged_result_not_a_crash(tmp_path, digits_dir):
    _, summary = run_in_process(tmp_path, digits_dir, lr_rules=["constant"], base_lr=50.0)
    assert summary["status"] == "diverged"
    assert summary["steps_to_target"] is None
    assert summary["stop_reason"].startswith("the training batches' loss")
    assert ("more than 10x its first value" in summary["stop_reason"]
            or "became nan" in summary["stop_reason"]), summary["stop_reason"]


def test_a_spent_step_budget_is_not_reached(tmp_path, digits_dir):
    _, summary = run_in_process(tmp_path, digits_dir, max_steps=10, target_val_accuracy=1.0)
    assert (summary["status"], summary["steps_run"]) == ("not_reached", 10)
    assert summary["stop_reason"] == ("ran convergence.max_steps (10 steps) without reaching "
                                      "every target")


def test_a_stalled_trial_says_so_with_its_best_value(tmp_path, digits_dir):
    trial, summary = run_in_process(tmp_path, digits_dir, patience_evals=2,
                                    target_val_accuracy=1.0)
    assert summary["status"] == "not_reached" and summary["steps_run"] < 300
    best = trial.state.best["val_accuracy"]
    assert summary["stop_reason"] == (
        "stalled: no target metric improved in 2 evaluations in a row "
        f"(convergence.patience_evals; best so far val_accuracy {best:.4g})")
    reached, _ = run_in_process(tmp_path / "reached", digits_dir)
    assert reached.state.stop_reason is None


def test_a_finished_trial_resumes_from_its_final_checkpoint(tmp_path, digits_dir):
    """A group killed after final.pt but before the result tables trains nothing again."""
    first, summary = run_in_process(tmp_path, digits_dir)
    again, resumed = run_in_process(tmp_path, digits_dir)
    assert resumed == summary
    assert again.state == first.state


def test_checkpoint_of_other_settings_names_the_differences(tmp_path, digits_dir):
    trial, _ = run_in_process(tmp_path, digits_dir, max_steps=10, target_val_accuracy=1.0)
    spec = trial.spec.model_copy(update={"checkpoint_dir": str(tmp_path / "ckpt")})
    runner.check_checkpoints(spec)  # same settings: accepted
    changed = spec.model_copy(update={
        "training": spec.training.model_copy(update={"momentum": 0.5}),
        "trials": [spec.trials[0].model_copy(update={"lr": 1.0})]})
    with pytest.raises(BadInput, match=r"momentum: checkpoint has 0\.9, this run has 0\.5.*"
                                       r"lr: checkpoint has"):
        runner.check_checkpoints(changed)


def test_checkpoint_state_is_stored_by_field_name(tmp_path, digits_dir):
    trial, _ = run_in_process(tmp_path, digits_dir, max_steps=10, target_val_accuracy=1.0)
    loc = LocalLocation(tmp_path / "ckpt")
    name = checkpoint.latest(loc, trial.t.trial_id)
    saved = checkpoint.load(loc, name, trial.identity)
    assert saved.trial_state == trial.state.to_dict()
    assert saved.trial_state["noise"]["updates"] == trial.state.noise.updates
    assert set(saved.trial_state) == {"step", "train_time_s", "first_loss", "loss_sum",
                                      "loss_count", "best_accuracy", "evals_since_best",
                                      "curve", "noise", "best", "reached", "stop_reason"}
    assert TrialState.from_dict(saved.trial_state) == trial.state


def test_old_or_damaged_checkpoints_are_refused_by_name(tmp_path):
    loc = LocalLocation(tmp_path)
    torch.save({"identity": {}, "step": 30, "best": [0.5, 2]}, tmp_path / "old.pt")
    with pytest.raises(BadInput, match=r"old\.pt has format 1, this version resumes format 2 "
                                       "only; use a new output directory"):
        checkpoint.load(loc, "old.pt", {})
    (tmp_path / "cut.pt").write_bytes((tmp_path / "old.pt").read_bytes()[:100])
    with pytest.raises(BadInput, match=r"cut\.pt cannot be read: it is damaged or was written"):
        checkpoint.load(loc, "cut.pt", {})


# -------------------------------------------------------------------------- the spec file
def test_spec_round_trips_through_json(tmp_path, digits_dir):
    spec = runner.build_spec(config(batch_sizes=[16, 64]), [16, 64], data_dir=str(digits_dir),
                             out_dir=str(tmp_path), run_id="t")
    (tmp_path / "spec.json").write_bytes(spec.to_json())
    assert train.read_spec(str(tmp_path / "spec.json")) == spec
    # the settings added later (optimizer, decay, precision) are None at their defaults, as
    # in a checkpoint written before they existed (tests/test_optimizers.py)
    assert spec.identity(spec.trials[1]) == {
        **spec.training.model_dump(), **dict.fromkeys(LATER_SETTINGS),
        "trial_id": "b16-sqrt-s0-w1", "batch_size": 16, "lr_rule": "sqrt",
        "lr": spec.trials[1].lr, "seed": 0}


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["training"].update(momentum="0.9"),
     r"training\.momentum: Input should be a valid number"),
    (lambda d: d["trials"][0].pop("seed"), r"trials\.0\.seed: Field required"),
    (lambda d: d.update(workers=2), r"workers: Extra inputs are not permitted"),
    (lambda d: d["training"].update(workers=0), r"training\.workers: Input should be greater"),
    (lambda d: d["training"].update(optimizer="adam"),
     r"training\.optimizer: Input should be 'sgd' or 'adamw'"),
    (lambda d: d["training"].update(precision="fp16"),
     r"training\.precision: Input should be 'fp32' or 'bf16'"),
])
def test_malformed_spec_is_refused_naming_the_field(tmp_path, digits_dir, edit, message):
    spec = runner.build_spec(config(batch_sizes=[64]), [64], data_dir=str(digits_dir),
                             out_dir=str(tmp_path), run_id="t")
    data = spec.model_dump()
    edit(data)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data))
    with pytest.raises(BadInput, match=f"spec {path} is not a valid convergence spec .*{message}"):
        train.read_spec(str(path))
    assert train.main(["--spec", str(path)]) == 2


# ---------------------------------------------------------------------------- the CLI
def fast_config(tmp_path: Path, **extra) -> str:
    """A YAML config with the quick trial settings (one seed, target 0.9)."""
    lines = ["convergence:"] + [f"  {k}: {v}" for k, v in {**FAST, **extra}.items()]
    path = tmp_path / "fast.yaml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_converge_cli_runs_the_tuned_rule_on_two_workers(tmp_path, digits_dir):
    """Spelled as before the rename (rule `grid`, flag --lr-grid): still run, with notes."""
    result = run_cli(["converge", "--config", fast_config(tmp_path), "--batch-sizes", "64",
                      "--lr-rule", "grid", "--lr-grid",
                      "0.05", "0.2", "--workers", "2", "--dataset-dir", str(digits_dir),
                      "--out", str(tmp_path / "out"), "--run-id", "tuned"], cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "convergence.lr_rules: 'grid' is now 'tuned'" in result.stderr
    assert "--lr-grid is deprecated and goes in the next release; use --lr-candidates" \
        in result.stderr
    runs = pq.read_table(tmp_path / "out" / "runs.parquet").to_pylist()
    assert sorted(r["lr"] for r in runs) == [0.05, 0.2]
    assert {(r["lr_rule"], r["workers"], r["world_size"]) for r in runs} == {("tuned", 2, 2)}
    # the worst of the two ranks' waits for a CPU, reduced over the process group
    assert all(r["cpu_wait_share"] is None or 0 <= r["cpu_wait_share"] < 1 for r in runs)
    # the group's bare all-reduce, probed over gloo at a small message and at the gradient's
    # bytes (the digits MLP's trainable parameters in fp32)
    model = train.workload_for_data(runs[0]["workload"], str(digits_dir)).build()
    grad_bytes = 4 * sum(p.numel() for p in model.parameters())
    for r in runs:
        assert (r["gradient_bytes"], r["allreduce_backend"]) == (grad_bytes, "gloo")
        assert r["allreduce_small_bytes"] == 1024 < grad_bytes
        assert 0 < r["allreduce_small_s"] and 0 < r["allreduce_gradient_s"]
        assert r["allreduce_cv"] >= 0
    curves = pq.read_table(tmp_path / "out" / "curves.parquet").to_pylist()
    assert {c["world_size"] for c in curves} == {2}
    assert all(c["examples_seen"] == 64 * c["step"] for c in curves)


@pytest.mark.parametrize("args, message", [
    (["--lr-rule", "cubic"], "invalid choice: 'cubic'"),
    (["--workers", "0"], "convergence.workers: Input should be greater than 0"),
    (["--base-lr", "0"], "convergence.base_lr"),
    (["--scaling-workers", "2"], "scaling_workers: must be given together with "
                                 "scaling_batch_sizes"),
    (["--strategy", "adaptive", "--batch-sizes", "16,64,256", "--scaling-workers", "2",
      "--scaling-batch-sizes", "64"], "--scaling-workers: scaling runs go with the grid "
                                      "strategy here"),
    (["--patience-evals", "0"], "convergence.patience_evals: Input should be greater than 0"),
    (["--lr-rule", "tuned"], "lr_candidates: the tuned rule needs at least one learning rate"),
    (["--run-id", "../../escaped"], "run id '../../escaped' is not allowed"),
    (["--run-id", "/tmp/abs"], "run id '/tmp/abs' is not allowed"),
    (["--lr-rules", "tuned", "--lr-candidates", "inf"],
     "--lr-candidates: 'inf' is not a finite number"),
    (["--batch-sizes", "64,,256"], "--batch-sizes: '64,,256' has an empty item"),
    (["--workload", "builtins:breakpoint"], "standard library"),
    (["--dataset-dir", "nowhere"], "has no manifest.parquet: not a batchscale dataset directory"),
])
def test_converge_cli_refuses_bad_input_and_writes_nothing(tmp_path, args, message):
    result = run_cli(["converge", "--batch-sizes", "64", "--out", str(tmp_path / "out"),
                      *args], cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "out").exists()


def test_converge_runs_the_scaling_runs_its_flags_ask_for_into_one_table(tmp_path,
                                                                          digits_dir):
    """--scaling-workers/--scaling-batch-sizes add the pipeline's extra worker counts (each in
    a torchrun group of its own) to the grid's tables, which is what the planner and the
    worker recommendation read; without the flags the embedded config's scaling runs do not
    run here."""
    result = run_cli(["converge", "--config", fast_config(tmp_path), "--batch-sizes", "32,64",
                      "--lr-rules", "sqrt", "--scaling-workers", "2", "--scaling-batch-sizes", "64",
                      "--dataset-dir", str(digits_dir), "--out", str(tmp_path / "out")],
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "; scaling runs: 2 workers at batch 64" in result.stderr
    out = tmp_path / "out"
    assert (f"next: batchscale analyze {out / 'runs.parquet'} --config {out / 'config.yaml'} "
            "gives B_crit") in result.stderr
    # The config it ran with, flags included, reads back as the same config.
    from batchscale.config import load_config

    ran_with = load_config(out / "config.yaml")
    assert ran_with.convergence.batch_sizes == [32, 64]
    assert ran_with.convergence.scaling_workers == [2]
    runs = pq.read_table(tmp_path / "out" / "runs.parquet").to_pylist()
    assert sorted((r["batch_size"], r["workers"]) for r in runs) == [(32, 1), (64, 1), (64, 2)]
    assert len({r["run_id"] for r in runs}) == 1
    curves = pq.read_table(tmp_path / "out" / "curves.parquet").to_pylist()
    assert {c["trial_id"] for c in curves} == {r["trial_id"] for r in runs}


def test_unreachable_target_exits_non_zero_and_keeps_the_tables(tmp_path, digits_dir):
    cfg = fast_config(tmp_path, target_val_accuracy=1.0, max_steps=20, lr_rules="[sqrt]")
    result = run_cli(["converge", "--config", cfg, "--batch-sizes", "64",
                      "--optimizer", "adamw", "--base-lr", "0.05", "--reference-batch-size", "64",
                      "--dataset-dir", str(digits_dir), "--out", str(tmp_path / "out")],
                     cwd=tmp_path)
    assert result.returncode == 1
    assert "LR rules sqrt from base_lr 0.05 at batch 64, adamw; seeds" in result.stderr
    # An SGD-scale learning rate under AdamW is the likeliest cause; it is named up front.
    assert "note: convergence.base_lr 0.05 with adamw: 0.05 is an SGD learning rate" \
        in result.stderr
    assert ("no trial reached val_accuracy >= 1: of 1 trials, 1 out of steps (ran max_steps 20:"
            " raise max_steps or lower the target); they ran adamw at peak LRs 0.05") \
        in result.stderr
    # where to read each trial's stop reason: the files, since no table was printed
    assert f"(each trial's stop_reason is in {tmp_path / 'out' / 'runs.parquet'}, its curve in " \
           f"{tmp_path / 'out' / 'curves.parquet'})" in result.stderr
    assert "next: batchscale analyze" not in result.stderr  # nothing reached: nothing to analyze
    runs = pq.read_table(tmp_path / "out" / "runs.parquet").to_pylist()
    assert [r["status"] for r in runs] == ["not_reached"]
    assert runs[0]["stop_reason"].startswith("ran convergence.max_steps (20 steps)")
    assert "not_reached at step 20 (0 of 1 targets" in result.stderr
    assert "s): ran convergence.max_steps (20 steps)" in result.stderr
    assert math.isclose(runs[0]["target_val_accuracy"], 1.0)
    # `batchscale run` ends the same way once it has published such a run (its last step,
    # given the run's published runs table): exit 1 with how the trials ended.
    with pytest.raises(BatchscaleError) as refused:
        raise_if_unreached(pq.read_table(tmp_path / "out" / "runs.parquet"), load_config(cfg),
                           "20261206T000000Z-abc123")
    assert refused.value.exit_code == 1
    assert str(refused.value).startswith(
        "run 20261206T000000Z-abc123 is published, but no trial reached val_accuracy >= 1, so "
        "it answers nothing: of 1 trials, 1 out of steps (ran max_steps 20: raise max_steps")
