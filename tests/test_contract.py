"""The public workload contract (batchscale.Workload): a user's model, dataset, loss, metrics
and targets reach the sweep and the convergence trials through it alone, and a member that
cannot work is refused before any trial. The user workloads are in contract_workloads.py;
the CLI runs for real (torchrun process groups included)."""

from __future__ import annotations

import contextlib
import math
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from contract_workloads import Points, good

from batchscale.config import load_config
from batchscale.config.loading import with_overrides
from batchscale.contract_check import (
    check_workload,
    load_split,
    synthetic_batch,
    with_workload_targets,
)
from batchscale.errors import BadInput
from batchscale.workloads import get_workload
from helpers import run_cli

TESTS_DIR = Path(__file__).parent
EXAMPLE_DIR = TESTS_DIR.parent / "examples" / "plain_pytorch"


def test_a_contract_workload_is_resolved_from_an_object_or_a_function():
    for spec in ("contract_workloads:good", "contract_workloads:good_function"):
        workload = get_workload(spec)
        assert workload.contract is good and workload.has_own_data
        assert workload.metrics == ("val_loss", "val_accuracy", "train_loss")


def test_the_synthetic_batch_is_real_examples_cycled_to_the_batch_size():
    x, y = synthetic_batch(good, 5, "cpu")
    points = Points(600, 0)
    assert x.shape == (5, 2) and y.dtype == torch.int64
    assert torch.equal(x[3], points.x[3]) and torch.equal(y, points.y[:5])


def test_a_split_reads_only_the_examples_of_the_batch():
    split = load_split(good, "train")
    x, y = split.batch(torch.tensor([7, 3]), "cpu")
    assert split.dataset.reads == 2
    assert torch.equal(x, split.dataset.x[[7, 3]]) and torch.equal(y, split.dataset.y[[7, 3]])
    assert len(split.head(4)) == 4


def test_without_evaluate_the_metric_is_the_example_weighted_mean_loss():
    from contextlib import nullcontext

    from contract_workloads import cross_entropy, loss_only, mlp

    torch.manual_seed(0)
    model = mlp()
    split = load_split(loss_only, "val")
    got = split.evaluate(model, "cpu", nullcontext)
    with torch.no_grad():
        want = float(cross_entropy(model, (split.dataset.x, split.dataset.y)))
    assert got == {"loss": pytest.approx(want, rel=1e-5)}


def test_the_workload_owns_its_default_targets():
    cfg = with_overrides(load_config(None), {"workload": "contract_workloads:good"}, "test")
    assert [t.label for t in cfg.convergence.resolved_targets()] == ["val_accuracy >= 0.95"]
    own = with_workload_targets(cfg, get_workload("contract_workloads:good"))
    assert [t.label for t in own.convergence.resolved_targets()] == ["val_accuracy >= 0.9"]
    named = with_overrides(cfg, {"convergence": {"targets": [
        {"metric": "val_loss", "value": 0.2}], "target_val_accuracy": None}}, "test")
    kept = with_workload_targets(named, get_workload("contract_workloads:good"))
    assert [t.label for t in kept.convergence.resolved_targets()] == ["val_loss <= 0.2"]


def test_a_pipeline_steps_config_takes_the_workloads_targets_too():
    """A step of a study's variant gets its config as sections (StageConfig), with no targets
    resolved before it: the step resolves them itself (it crashed with AttributeError)."""
    from batchscale.config.stage_inputs import StageConfig, component_inputs

    cfg = with_overrides(load_config(None), {"workload": "contract_workloads:good"}, "test")
    inputs = component_inputs(cfg, ["experiment", "convergence_config"])
    step = StageConfig(inputs["experiment"], convergence=inputs["convergence_config"])
    own = with_workload_targets(step, get_workload("contract_workloads:good"))
    assert isinstance(own, StageConfig) and own.config_hash == cfg.config_hash
    assert [t.label for t in own.convergence.resolved_targets()] == ["val_accuracy >= 0.9"]


def test_a_builtin_workload_without_accuracy_gets_its_own_default_target():
    cfg = with_overrides(load_config(None), {"workload": "byte-transformer",
                                             "dataset": {"name": "python-docs"}}, "test")
    assert [t.label for t in cfg.convergence.resolved_targets()] == ["val_loss <= 2.6"]


def _rows(workload, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n dataset rows of a built-in: features in its example shape (a class-id channel or the
    next byte inside where its target is dense) and labels."""
    gen = torch.Generator().manual_seed(0)
    if workload.kind == "language_model":
        x = torch.randint(0, 256, (n, *workload.example_shape), generator=gen).float()
        return x, x[:, -1].long()
    if workload.kind == "classification":
        return (torch.randn((n, *workload.example_shape), generator=gen),
                torch.randint(0, workload.num_classes, (n,), generator=gen))
    channels, h, w = workload.example_shape
    image = torch.rand((n, channels - 1, h, w), generator=gen)
    mask = torch.zeros((n, 1, h, w))
    mask[:, :, 4:12, 4:12] = 1.0  # one object per image: a detector needs a box
    return torch.cat([image, mask], dim=1), torch.ones(n, dtype=torch.long)


@pytest.mark.parametrize(("name", "options"), [
    ("digits-mlp", {}), ("byte-transformer", {"seq_len": 16}),
    ("lraspp_mobilenet_v3_large", {"image_size": 32}),
    ("fasterrcnn_mobilenet_v3_large_320_fpn", {"image_size": 32, "num_classes": 4}),
])
def test_every_kind_of_builtin_is_a_workload_of_the_public_contract(name, options):
    """A built-in is a batchscale.Workload like a user's: its loss is a finite scalar on its own
    collated rows, its evaluate returns exactly the metrics it declares, train_loss is its
    evaluate's loss, and reading rows in one batched call gives the batch item-by-item reading
    gives."""
    import batchscale
    from batchscale.datasplit import DatasetSplit
    from batchscale.tasks.builtin import PreparedRows

    workload = get_workload(name, **options)
    contract = workload.contract_for()
    assert isinstance(contract, batchscale.Workload) and contract.train_data is None
    torch.manual_seed(0)
    model = contract.model()
    rows = PreparedRows(*_rows(workload, 6))
    split = DatasetSplit(contract, rows, "val_data")
    loss = contract.loss(model, split.batch(torch.arange(4), "cpu"))
    assert loss.dim() == 0 and loss.requires_grad and math.isfinite(float(loss.detach()))
    metrics = split.evaluate(model, "cpu", contextlib.nullcontext)
    assert {f"val_{k}" for k in metrics} == set(contract.metrics)
    assert split.loss_metric(model, "cpu", contextlib.nullcontext) == metrics["loss"]
    assert [t for t, _ in contract.targets][0] in contract.metrics
    one_by_one = _leaves(split.collate([rows[1], rows[3]]))
    for indices in ([1, 3], torch.tensor([1, 3])):  # torch's list, or the trainer's tensor
        batched = _leaves(split.collate(rows.__getitems__(indices)))
        assert len(batched) == len(one_by_one) > 0
        assert all(torch.equal(torch.as_tensor(a), torch.as_tensor(b))
                   for a, b in zip(batched, one_by_one, strict=True))
    with pytest.raises(IndexError, match="rows 0..2 of the first 2"):
        split.head(2).batch(torch.arange(3), "cpu")


def _leaves(batch) -> list:
    if isinstance(batch, dict):
        return [leaf for v in batch.values() for leaf in _leaves(v)]
    if isinstance(batch, list | tuple):
        return [leaf for v in batch for leaf in _leaves(v)]
    return [batch]


@pytest.mark.parametrize(("name", "sizes", "message"), [
    ("wrong_input", (), r"Workload.loss failed on a batch of 2 training examples "
                        r"\(tensor \[2, 2\] float32, tensor \[2\] int64\)"),
    ("list_features", (), r"linear\(\): argument 'input' .* must be Tensor, not list\. The "
                          r"field 'x' came out as 2 tensors of 2 values, one per list position"
                          r".* return a tensor from __getitem__"),
    ("vector_loss", (), r"Workload.loss returned Tensor of shape \[2\] \(torch.float32\) .*"
                        "expected a scalar floating-point tensor"),
    ("nan_loss", (), "expected a finite value"),
    ("no_accuracy", (), "must return accuracy"),
    ("unknown_metric", (), "Workload.metrics names 'val_f1'; allowed: val_accuracy"),
    ("unreported_target", (), "a target is on val_accuracy, which the workload does not "
                              "report; its metrics .*: val_loss, train_loss"),
    ("tiny_data", (4, 16), "has 5 examples, fewer than the largest global batch 16"),
    ("no_val", (), "Workload.val_data is not given"),
    ("zero_eval_batch", (), "Workload.eval_batch_size is 0; expected a whole number"),
    ("failing_data", (), "Workload.train_data failed: FileNotFoundError"),
])
def test_a_member_that_cannot_work_is_refused_naming_it(name, sizes, message):
    with pytest.raises(BadInput, match=message):
        check_workload(get_workload(f"contract_workloads:{name}"), batch_sizes=sizes,
                       convergence=True)


def test_converge_refuses_a_broken_workload_before_any_trial(tmp_path):
    out = tmp_path / "out"
    result = run_cli(["converge", "--workload", "contract_workloads:wrong_input",
                      "--batch-sizes", "8", "--out", str(out)], cwd=TESTS_DIR)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "Workload.loss failed" in result.stderr and "the model must accept" in result.stderr
    assert not (out / "runs.parquet").exists() and not (out / "work").exists()


def test_run_refuses_a_workload_whose_evaluation_cannot_work_before_any_stage(tmp_path):
    """`run` checks the evaluation and the data as the convergence stage will, before it
    prepares data, starts the store or sweeps: nothing is written."""
    config = tmp_path / "mine.yaml"
    config.write_text("workload: contract_workloads:no_accuracy\n"
                      "convergence: {batch_sizes: [8, 32]}\n")
    result = run_cli(["run", "--config", str(config)], cwd=tmp_path,
                     env={"PYTHONPATH": str(TESTS_DIR)})
    assert result.returncode == 2, result.stderr
    assert "must return accuracy" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / ".batchscale").exists()


def test_sweep_of_a_factory_that_rejects_its_input_exits_2(tmp_path):
    """The 1-channel CNN given as a bare model factory: fed 3-channel images, refused."""
    out = tmp_path / "sweep.parquet"
    result = run_cli(["sweep", "--workload", "contract_workloads:one_channel_cnn",
                      "--batch-sizes", "2", "--out", str(out)], cwd=TESTS_DIR)
    assert result.returncode == 2, result.stderr
    assert "rejected a synthetic batch (tensor [2, 3, 224, 224] float32" in result.stderr
    assert "batchscale.Workload" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_a_sweep_whose_trials_make_semaphores_ends_without_a_leak_warning(tmp_path):
    """A trial whose libraries make a multiprocessing semaphore (tqdm's lock, which Hugging Face
    datasets makes on every read) exits on its own once it has sent its result, releasing it;
    killed at once, it left the resource tracker to warn of "leaked semaphore objects"."""
    result = run_cli(["sweep", "--workload", "contract_workloads:progress_bar_lock",
                      "--batch-sizes", "4", "--time-budget-s", "0.2",
                      "--out", str(tmp_path / "sweep.parquet")], cwd=TESTS_DIR)
    assert result.returncode == 0, result.stderr
    assert "leaked semaphore" not in result.stderr


def test_a_sweep_that_times_no_batch_exits_non_zero(tmp_path):
    out = tmp_path / "sweep.parquet"
    result = run_cli(["sweep", "--workload", "contract_workloads:fails_in_trials",
                      "--batch-sizes", "4,8", "--time-budget-s", "0.2", "--out", str(out)],
                     cwd=TESTS_DIR)
    assert result.returncode == 1, result.stderr
    assert "no batch size of contract_workloads:fails_in_trials was timed" in result.stderr
    assert "batch 4: RuntimeError: this loss takes at most 3 examples, got 4" in result.stderr
    assert pq.read_table(out).num_rows >= 2  # the error rows are kept


def test_two_workers_train_a_contract_workload_to_its_own_target(tmp_path):
    """A real 2-process torchrun group, each rank reading its slice of the user's Dataset."""
    out = tmp_path / "conv"
    result = run_cli(["converge", "--workload", "contract_workloads:good", "--batch-sizes",
                      "8,32", "--workers", "2", "--lr-rules", "sqrt", "--seeds", "0",
                      "--out", str(out)], cwd=TESTS_DIR)
    assert result.returncode == 0, result.stderr
    # the workload's own target, said before any training
    assert "training to val_accuracy >= 0.9, up to" in result.stderr
    runs = pq.read_table(out / "runs.parquet").to_pandas()
    assert set(runs["workers"]) == {2} and set(runs["target_value"]) == {0.9}
    assert set(runs["target_metric"]) == {"val_accuracy"} and set(runs["status"]) == {"reached"}
    curves = pq.read_table(out / "curves.parquet").to_pandas()
    assert curves["val_accuracy"].notna().all() and curves["train_loss"].notna().all()


def test_the_plain_pytorch_example_gives_b_crit_and_a_recommendation(tmp_path):
    """examples/plain_pytorch from its README commands, on a copy (a user's own directory)."""
    work = tmp_path / "example"
    shutil.copytree(EXAMPLE_DIR, work)
    sweep = run_cli(["sweep", "--config", "config.yaml", "--batch-sizes", "8,128",
                     "--time-budget-s", "0.3", "--out", "sweep.parquet"], cwd=work)
    assert sweep.returncode == 0, sweep.stderr
    rows = pq.read_table(work / "sweep.parquet").to_pandas()
    assert set(rows["input_mode"]) == {"synthetic", "real"} and set(rows["status"]) == {"ok"}
    # Three batch sizes, one seed: the README's commands at a CI-sized grid.
    conv = run_cli(["converge", "--config", "config.yaml", "--batch-sizes", "8,32,128",
                    "--seeds", "0", "--out", "conv"], cwd=work)
    assert conv.returncode == 0, conv.stderr
    analysis = run_cli(["analyze", "conv/runs.parquet", "--sweep", "sweep.parquet",
                        "--out", "analysis"], cwd=work)
    assert analysis.returncode == 0, analysis.stderr
    text = analysis.stdout
    assert "for val_accuracy >= 0.9" in text
    assert "B_crit = E_min/S_min ≈" in text or "B_crit not estimated" in text
    assert "Batch size:" in text and "**" not in text


def test_the_hugging_face_example_trains_a_gpt2_to_its_own_loss_target(tmp_path):
    """examples/huggingface: transformers' GPT2LMHeadModel from a config (random weights, no
    download), its own outputs.loss, a Dataset of dict items; B_crit or a bound, and a
    recommendation."""
    work = tmp_path / "example"
    shutil.copytree(TESTS_DIR.parent / "examples" / "huggingface", work)
    conv = run_cli(["converge", "--config", "config.yaml", "--batch-sizes", "4,16,64",
                    "--seeds", "0", "--out", "conv"], cwd=work)
    assert conv.returncode == 0, conv.stderr
    runs = pq.read_table(work / "conv" / "runs.parquet").to_pandas()
    assert set(runs["target_metric"]) == {"val_loss"} and set(runs["target_value"]) == {3.0}
    assert (runs["status"] == "reached").sum() >= 2
    curves = pq.read_table(work / "conv" / "curves.parquet").to_pandas()
    first = curves[curves["step"] == 0]["val_loss"]
    assert (first > 5.0).all()  # untrained: about ln 256 = 5.55 nats per byte
    assert (curves["val_perplexity"] - curves["val_loss"].map(math.exp)).abs().max() < 1e-6
    analysis = run_cli(["analyze", "conv/runs.parquet", "--out", "analysis"], cwd=work)
    assert analysis.returncode == 0, analysis.stderr
    assert "for val_loss <= 3" in analysis.stdout and "Batch size:" in analysis.stdout


def test_a_killed_contract_trial_resumes_to_the_identical_curve(tmp_path, monkeypatch):
    """Rank 1 of a 2-worker group SIGKILLs itself after step 33 (the fault drill); torchrun
    restarts the group, which resumes from the step-30 checkpoint reading the user's Dataset
    in the same order: the curve equals an uninterrupted run's."""
    from batchscale.config import parse_config
    from batchscale.convergence import faults, runner

    monkeypatch.chdir(TESTS_DIR)  # the workers import contract_workloads from here
    cfg = parse_config({"workload": "contract_workloads:good", "convergence": {
        "batch_sizes": [16], "lr_rules": ["sqrt"], "seeds": [0], "max_steps": 60,
        "targets": [{"metric": "val_accuracy", "value": 1.0}], "eval_every_steps": 5,
        "checkpoint_every_steps": 10, "workers": 2}})

    def curve(out: Path, kill: bool) -> list[tuple]:
        if kill:
            monkeypatch.setenv(faults.FAULT_KILL_AT_STEP_ENV, "33")
            monkeypatch.setenv(faults.FAULT_KILL_RANK_ENV, "1")
        spec = runner.build_spec(cfg, [16], data_dir="unused", out_dir=str(out), run_id="ct")
        runner.launch_local(spec, 300, max_restarts=1 if kill else 0)
        curves, _ = runner.collect(spec)
        return [(c["step"], c["train_loss"], c["val_accuracy"], c["b_simple"])
                for c in curves.to_pylist()]

    plain = curve(tmp_path / "plain", kill=False)
    resumed = curve(tmp_path / "killed", kill=True)
    assert [row[0] for row in plain] == list(range(0, 61, 5))
    assert resumed == plain


def test_the_list_hint_names_only_a_field_collated_position_by_position():
    """transposed_list_hint: a list of equal 1-D tensors, one per list position, each as long
    as the batch; not a batch of whole tensors, nor a list of one."""
    from batchscale.contract_check import transposed_list_hint

    rows = torch.zeros(4)
    assert "field 'x' came out as 3 tensors of 4" in transposed_list_hint(
        {"x": [rows, rows, rows], "y": rows}, 4)
    assert "field at position 0" in transposed_list_hint(([rows, rows], rows), 4)
    assert transposed_list_hint((torch.zeros(4, 2), rows), 4) == ""
    assert transposed_list_hint({"x": [rows]}, 4) == ""
    assert transposed_list_hint({"x": [torch.zeros(3), torch.zeros(3)]}, 4) == ""
    assert transposed_list_hint(torch.zeros(4, 2), 4) == ""


def test_an_auto_sweep_times_real_input_only_at_batches_its_data_can_fill(tmp_path,
                                                                           monkeypatch):
    """The search finds batch 1,024 fits; the workload's training split has 600 examples, so
    real input is timed up to 512 and the larger batch is named with why, not run as an
    error row."""
    monkeypatch.chdir(TESTS_DIR)  # the trials import contract_workloads from here
    lines: list[str] = []
    from test_sweep import ENV, FAST

    from batchscale.config import SweepConfig
    from batchscale.sweep.sweep import sweep

    cfg = SweepConfig(batch_sizes="auto", max_batch_size=1024, rounds=1, **FAST)
    rows = sweep(cfg, "contract_workloads:good", ENV, tmp_path / "a.parquet", log=lines.append)
    synthetic = {r["batch_size"] for r in rows if r["input_mode"] == "synthetic"}
    real = {r["batch_size"] for r in rows if r["input_mode"] == "real"}
    assert 1024 in synthetic and real == {b for b in synthetic if b <= 600}
    assert {r["status"] for r in rows} == {"ok"}
    assert ("real input not timed at batch 1024: the training split has 600 examples, fewer "
            "than one batch") in lines


def test_an_auto_sweep_reads_a_prepared_datasets_size_from_its_manifest(tmp_path):
    """A built-in workload on prepared digits (1,438 training rows): real input stops at 1,024,
    the split's size taken from the manifest (its shards are not read for it)."""
    from test_sweep import ENV, FAST

    from batchscale.config import SweepConfig, parse_config
    from batchscale.data.prep import prepare
    from batchscale.sweep.sweep import sweep

    prepare(parse_config({}).dataset, tmp_path / "digits")
    lines: list[str] = []
    cfg = SweepConfig(batch_sizes="auto", max_batch_size=2048, rounds=1, **FAST)
    rows = sweep(cfg, "digits-mlp", ENV, tmp_path / "a.parquet",
                 dataset_dir=str(tmp_path / "digits"), log=lines.append)
    assert max(r["batch_size"] for r in rows if r["input_mode"] == "real") == 1024
    assert ("real input not timed at batch 2048: the training split has 1,438 examples, fewer "
            "than one batch") in lines
