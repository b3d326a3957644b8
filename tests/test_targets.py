"""Several targets per trial, any metric, and the generalization-gap budget:
the config, the trainer's bookkeeping (one trial, one rank, in this process) and the tables."""

from __future__ import annotations

import math
from contextlib import nullcontext
from pathlib import Path

import pyarrow as pa
import pytest

from batchscale.checks import validate_table
from batchscale.config import parse_config
from batchscale.convergence import runner, train
from batchscale.convergence.distributed import Dist
from batchscale.data.prep import prepare
from batchscale.errors import BadInput
from batchscale.location import LocalLocation
from batchscale.metrics import METRICS, target_label
from batchscale.schemas import SCHEMA_VERSION, make_table
from batchscale.tasks import classification
from batchscale.workloads import get_workload

BATCH = 64
FAST = {"max_steps": 300, "eval_every_steps": 5, "checkpoint_every_steps": 10, "seeds": [0],
        "lr_rules": ["linear"]}
ACCURACIES = (0.8, 0.9, 0.93)


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits")
    prepare(parse_config({}).dataset, out)
    return out


def targets(*pairs) -> list[dict]:
    return [{"metric": m, "value": v} for m, v in pairs]


def run_trial(tmp_path: Path, digits_dir: Path, **convergence):
    """One trial on one rank in this process; (trial, its runs rows)."""
    cfg = parse_config({"convergence": {**FAST, "batch_sizes": [BATCH], **convergence}})
    spec = runner.build_spec(cfg, [BATCH], data_dir=str(digits_dir), out_dir=str(tmp_path),
                             run_id="t")
    workload = get_workload(cfg.workload)
    data = train.load_data(spec.data_dir, workload)
    trial = train.Trial(spec, spec.trials[0], data, Dist(0, 1, "cpu"),
                        LocalLocation(tmp_path / "ckpt"), workload)
    return trial, train.summary_run_rows(trial.run())


def first_crossing(curve: list[dict], metric: str, value: float) -> int | None:
    steps = [c["step"] for c in curve if METRICS[metric].reached(c.get(metric), value)]
    return min(steps) if steps else None


# ------------------------------------------------------------------------------ config
def test_the_shorthand_stands_for_one_val_accuracy_target():
    cfg = parse_config({"convergence": {"target_val_accuracy": 0.9}})
    [only] = cfg.convergence.resolved_targets()
    assert (only.metric, only.value, only.label) == ("val_accuracy", 0.9, "val_accuracy >= 0.9")


def test_targets_and_the_shorthand_together_are_refused_naming_the_new_key():
    with pytest.raises(BadInput, match="target_val_accuracy is shorthand.*`targets`"):
        parse_config({"convergence": {"target_val_accuracy": 0.9,
                                      "targets": targets(("val_loss", 0.3))}})


@pytest.mark.parametrize(("target", "message"), [
    ({"metric": "val_f1", "value": 0.9}, "unknown metric 'val_f1'; allowed: val_accuracy"),
    ({"metric": "val_accuracy", "value": 1.5}, "is a share"),
    ({"metric": "val_loss", "value": 0.0}, "loss target must be above 0"),
    ({"metric": "val_loss", "value": float("nan")}, "finite"),
    ({"metric": "val_miou", "value": 0.5}, "digits-mlp does not measure val_miou; its metrics: "
                                           "val_accuracy, val_loss, train_loss"),
])
def test_a_bad_target_is_refused_naming_what_is_allowed(target, message):
    with pytest.raises(BadInput, match=message):
        parse_config({"convergence": {"targets": [target]}})


def test_two_primary_targets_or_a_repeated_target_are_refused():
    two = [{"metric": "val_accuracy", "value": 0.9, "primary": True},
           {"metric": "val_loss", "value": 0.3, "primary": True}]
    with pytest.raises(BadInput, match="at most one target can be primary"):
        parse_config({"convergence": {"targets": two}})
    with pytest.raises(BadInput, match="listed twice"):
        parse_config({"convergence": {"targets": targets(("val_loss", 0.3), ("val_loss", 0.3))}})


def test_a_dataset_of_another_task_is_refused_naming_the_fitting_ones():
    with pytest.raises(BadInput, match="dataset 'python-docs' is for language_model.*use "
                                       "digits"):
        parse_config({"dataset": {"name": "python-docs"}})
    with pytest.raises(BadInput, match="byte-transformer is language model: use python-docs, "
                                       "text"):
        parse_config({"workload": "byte-transformer"})


def test_one_val_accuracy_target_is_written_to_the_spec_as_before():
    """Old checkpoints resume: the identity of a one-target trial has no new values."""
    cfg = parse_config({"convergence": {"target_val_accuracy": 0.9}})
    spec = runner.build_spec(cfg, [64], data_dir="d", out_dir="o", run_id="r")
    identity = spec.identity(spec.trials[0])
    assert identity["target_val_accuracy"] == 0.9
    assert identity["targets"] is None and identity["train_eval_rows"] is None
    assert identity["gap_epochs"] is None


# ----------------------------------------------------------------------------- trainer
def test_a_trial_records_every_target_and_stops_at_the_hardest(tmp_path, digits_dir):
    pairs = [("val_accuracy", a) for a in ACCURACIES] + [("val_loss", 0.5)]
    trial, rows = run_trial(tmp_path, digits_dir, targets=targets(*pairs))
    curve = trial.state.curve
    assert [(r["target_metric"], r["target_value"]) for r in rows] == pairs
    assert {r["status"] for r in rows} == {"reached"}
    for row in rows:
        assert row["steps_to_target"] == first_crossing(curve, row["target_metric"],
                                                        row["target_value"])
        assert row["examples_to_target"] == BATCH * row["steps_to_target"]
        hit = next(c for c in curve if c["step"] == row["steps_to_target"])
        assert row["time_to_target_s"] == hit["train_time_s"]
    steps = [r["steps_to_target"] for r in rows[:3]]
    assert steps == sorted(steps) and steps[0] < steps[-1]  # a harder accuracy takes longer
    assert rows[0]["steps_run"] == max(r["steps_to_target"] for r in rows)


def test_an_unreached_target_does_not_undo_the_reached_ones(tmp_path, digits_dir):
    trial, rows = run_trial(tmp_path, digits_dir, max_steps=40,
                            targets=targets(("val_accuracy", 0.5), ("val_accuracy", 0.999)))
    easy, hard = rows
    assert easy["status"] == "reached" and easy["steps_to_target"] <= 40
    assert hard["status"] == "not_reached" and hard["steps_to_target"] is None
    assert hard["time_to_target_s"] is None and easy["steps_run"] == 40
    assert hard["final_metric_value"] == trial.state.curve[-1]["val_accuracy"] < 0.999


def test_train_loss_is_measured_on_a_fixed_training_subset(tmp_path, digits_dir):
    trial, rows = run_trial(tmp_path, digits_dir, train_eval_rows=100,
                            targets=targets(("train_loss", 0.5)))
    x, y = trial.train.dataset.x[:100], trial.train.dataset.y[:100]
    last = trial.state.curve[-1]
    again = classification.evaluate(trial.model, x, y, "cpu", nullcontext)["loss"]
    assert last["train_loss"] == pytest.approx(again, rel=1e-6)
    assert last["train_loss"] != last["train_batch_loss"]  # not the running batch mean
    assert rows[0]["status"] == "reached" and rows[0]["final_metric_value"] <= 0.5


def test_the_gap_budget_is_recorded_once_even_past_the_targets(tmp_path, digits_dir):
    train_rows = len(trial_rows(digits_dir))
    trial, rows = run_trial(tmp_path, digits_dir, gap_epochs=2.0,
                            targets=targets(("val_accuracy", 0.5)))
    gap_step = math.ceil(2.0 * train_rows / BATCH)
    at_budget = [c for c in trial.state.curve if c["at_gap_budget"]]
    assert [c["step"] for c in at_budget] == [gap_step]
    assert at_budget[0]["examples_seen"] >= 2 * train_rows > (gap_step - 1) * BATCH
    assert rows[0]["steps_to_target"] < gap_step == rows[0]["steps_run"]  # trained on to it


def trial_rows(digits_dir: Path):
    return train.load_data(str(digits_dir), get_workload("digits-mlp"))[0].dataset.x


def test_rows_of_several_targets_pass_the_suites_with_their_curves(tmp_path, digits_dir):
    trial, rows = run_trial(tmp_path, digits_dir, max_steps=60, targets=targets(
        ("val_accuracy", 0.8), ("val_loss", 0.4), ("train_loss", 0.01)))
    env = {"run_id": "t", "config_hash": "h", "experiment": "e", "workload": "digits-mlp",
           "git_commit": "c", "batchscale_version": "0", "torch_version": "2",
           "python_version": "3.11", "device_name": "cpu", "threads": 2, "world_size": 1}
    ident = {"trial_id": trial.t.trial_id, "batch_size": BATCH, "lr_rule": "linear", "seed": 0}
    curves = make_table("curves", [{**ident, **c} for c in trial.state.curve], env)
    runs = make_table("runs", rows, env)
    assert set(runs.column("schema_version").to_pylist()) == {SCHEMA_VERSION}
    assert runs.column("status").to_pylist()[2] == "not_reached"
    for kind, table, context in (("curves", curves, {"batch_sizes": [BATCH]}),
                                 ("runs", runs, {"curves": curves, "batch_sizes": [BATCH]})):
        report = validate_table(kind, table, context=context)
        assert report.success, report.failure_message()
    # a row whose steps disagree with its own metric's curve is caught
    bad = runs.set_column(runs.schema.get_field_index("steps_to_target"), "steps_to_target",
                          pa.array([rows[0]["steps_to_target"], 1, None], pa.int64()))
    report = validate_table("runs", bad, context={"curves": curves, "batch_sizes": [BATCH]})
    assert not report.success
    assert target_label("val_loss", 0.4) in report.failure_message()
