"""A workload whose own code fails inside a convergence trial, past the checks before any trial
(they read two examples): an item its dataset cannot give, a model that rejects the evaluation
batch size or a training batch size. The real CLI exits 2 with one message naming the Workload
member, the trial and the original error, without a traceback (the rank's or torchrun's), with
no restart, no process left behind and the finished trials kept. Ctrl-C says where the finished
trials are and how to resume."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from batchscale.config import parse_config
from batchscale.contract_check import load_split
from batchscale.convergence import runner, train
from batchscale.convergence.cell_server import CellServer
from batchscale.convergence.distributed import Dist
from batchscale.convergence.outcome import kept_text
from batchscale.convergence.usererror import UserCodeError
from batchscale.datasplit import _SeededSteps, failure_of
from batchscale.location import LocalLocation
from batchscale.workloads import get_workload
from helpers import BATCHSCALE, cli_env, processes_marked, run_cli

pytestmark = pytest.mark.slow
TESTS_DIR = Path(__file__).parent
MODULE = "user_code_error_workloads"
FEW_STEPS = ["--lr-rules", "sqrt", "--seeds", "0", "--max-steps", "50", "--run-id", "r1"]
RUN_TIMEOUT_S = 120


def converge(tmp_path: Path, workload: str, sizes: str = "8,32", *extra: str):
    out = tmp_path / "out"
    result = run_cli(["converge", "--workload", f"{MODULE}:{workload}", "--batch-sizes", sizes,
                      *FEW_STEPS, "--out", str(out), *extra], cwd=TESTS_DIR,
                     timeout_s=RUN_TIMEOUT_S)
    return out, result


def processes_of(out: Path) -> list[str]:
    """Command lines of live processes started for `out` (torchrun, ranks, loader workers: the
    spec path under it is in each one's command line)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (proc / "status").read_text().split("State:")[1].split()[0]
        except (OSError, IndexError):
            continue
        if str(out) in cmdline and state != "Z":
            found.append(cmdline)
    return found


def no_processes_left(out: Path) -> bool:
    deadline = time.monotonic() + 10  # ranks stop on their agent's death (die_with_parent)
    while processes_of(out) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not processes_of(out)


def assert_refused_cleanly(out: Path, result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "ChildFailedError" not in result.stderr and "torchrun exited" not in result.stderr
    assert result.stderr.count("batchscale: error:") == 1, result.stderr[-3000:]
    assert no_processes_left(out)
    assert kept_text(out / "work" / "r1") in result.stderr  # where, or that none had finished
    assert not (out / "runs.parquet").exists()


def test_an_item_the_dataset_cannot_give_is_named_with_its_index(tmp_path):
    out, result = converge(tmp_path, "bad_index")
    assert_refused_cleanly(out, result)
    err = result.stderr
    assert ("workload 'bad-index': Workload.train_data (its dataset's __getitem__) failed on "
            "index 101 in trial b8-sqrt-s0-w1 (batch size 8, seed 0) at step 0") in err, err
    assert "IndexError: point 101 is past the end of the file (101 points)" in err
    assert "The dataset must give an item for every index from 0 to 599 (its __len__ is 600)" in err
    # where in the user's code, and its whole traceback in torchrun's log, out of sight
    assert f"(at {Path(__file__).parent / (MODULE + '.py')}:" in err, err
    log = (out / "work" / "r1" / "torchrun.log").read_text()
    assert "traceback of the workload's error" in log and "Traceback (most recent" in log, log
    assert f"{MODULE}.py" in log and "IndexError: point 101" in log


def test_a_loss_that_returns_one_value_per_example_past_the_check_is_named(tmp_path):
    """The check before the trials saw a scalar on two examples; on a batch of 8 (halved by the
    noise-scale step) the loss gives 4 values: the message says what it returned, not torch's
    "grad can be implicitly created only for scalar outputs" from the backward pass."""
    out, result = converge(tmp_path, "per_example_loss", "8")
    assert_refused_cleanly(out, result)
    assert ("Workload.loss (the model's forward and the loss) failed in trial" in result.stderr
            and "Workload.loss returned Tensor of shape [4]" in result.stderr
            and "expected a scalar (the mean loss of the batch)" in result.stderr), \
        result.stderr[-3000:]


def test_a_model_that_rejects_the_evaluation_batch_size_is_named(tmp_path):
    out, result = converge(tmp_path, "big_eval")
    assert_refused_cleanly(out, result)
    err = result.stderr
    assert ("workload 'big-eval': Workload.evaluate failed in trial b8-sqrt-s0-w1 (batch size 8, "
            "seed 0) at step 0, evaluating the validation split (300 examples) in batches of "
            "up to Workload.eval_batch_size=256: RuntimeError: this model takes at most 200 "
            "examples at once, got 256") in err, err
    assert "lower Workload.eval_batch_size" in err


def test_a_failing_batch_size_keeps_the_trials_that_finished(tmp_path):
    out, result = converge(tmp_path, "small_train_batches")
    assert_refused_cleanly(out, result)
    err = result.stderr
    # (step 0 measures the noise scale in two halves of 16: step 1 is the first of 32)
    assert re.search(
        r"workload 'small-train-batches': Workload.loss \(the model's forward and the loss\) "
        r"failed in trial b32-sqrt-s0-w1 \(batch size 32, seed 0\) at step \d+, training, on a "
        r"micro-batch of 32 examples \(tensor \[32, 2\] float32, tensor \[32\] int64\): "
        r"ValueError: training batches of at most 16 examples, got 32 "
        r"\(at \S+user_code_error_workloads\.py:\d+\)\. The model and the loss "
        r"must accept every batch", err), err
    trials = out / "work" / "r1" / "trials"
    assert (trials / "b8-sqrt-s0-w1.run.parquet").is_file()
    assert not (trials / "b32-sqrt-s0-w1.run.parquet").exists()
    # the kept trial is read back by a rerun with the run id, without training again
    again = run_cli(["converge", "--workload", f"{MODULE}:small_train_batches", "--batch-sizes",
                     "8", *FEW_STEPS, "--out", str(out)], cwd=TESTS_DIR, timeout_s=RUN_TIMEOUT_S)
    assert again.returncode == 0, again.stderr[-3000:]
    assert (out / "runs.parquet").is_file()


def test_two_ranks_stop_at_once_without_a_restart(tmp_path):
    started = time.monotonic()
    out, result = converge(tmp_path, "bad_index", "8", "--workers", "2")
    assert_refused_cleanly(out, result)
    assert "in trial b8-sqrt-s0-w2 (batch size 8, seed 0) at step 0" in result.stderr
    # no restarted group trains again (max_restarts 2 by default): one attempt's time
    assert time.monotonic() - started < RUN_TIMEOUT_S / 2


def test_ctrl_c_says_where_the_finished_trials_are_and_how_to_resume(tmp_path):
    out = tmp_path / "out"
    config = tmp_path / "c.yaml"  # a trial that never ends by itself (no stall, no step cap)
    config.write_text("convergence:\n  patience_evals: 1000000\n  max_steps: 1000000\n")
    proc = subprocess.Popen(
        BATCHSCALE + ["converge", "--config", str(config), "--workload", f"{MODULE}:slow",
                      "--batch-sizes", "8", "--lr-rules", "sqrt", "--seeds", "0",
                      "--run-id", "r1", "--out", str(out)],
        cwd=TESTS_DIR, env=cli_env(), stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
        text=True)
    try:
        checkpoints = out / "work" / "r1" / "checkpoints"
        deadline = time.monotonic() + RUN_TIMEOUT_S / 2
        while not checkpoints.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert checkpoints.exists(), "no trial started"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 130, err[-3000:]
    assert kept_text(out / "work" / "r1") in err, err
    assert "rerun the same command with --run-id r1" in err
    assert "interrupted; results written so far are kept" in err
    assert "Traceback" not in err
    assert no_processes_left(out)


# --------------------------------------------------------------------- in-process paths
def test_a_data_failure_is_noted_on_the_unchanged_exception():
    from user_code_error_workloads import bad_index

    split = load_split(bad_index, "train")
    with pytest.raises(IndexError) as raised:  # the type the checks and the sweep report
        split.batch(torch.arange(99, 104), "cpu")
    failure = failure_of(raised.value)
    assert failure.member == "Workload.train_data (its dataset's __getitem__)"
    assert failure.where == "index 101"
    step, sent = _SeededSteps(split, seed=0)[(3, [(0, [5, 200])])]
    assert step == 3 and sent.where == "index 200" and sent.error.startswith("IndexError: ")


def one_trial(tmp_path: Path, attribute: str, batch: int, **convergence) -> train.Trial:
    """The first trial of one batch size of MODULE's `attribute`, in this process (rank 0 of
    1, on the CPU): a test runs it and reads what it raises."""
    name = f"{MODULE}:{attribute}"
    cfg = parse_config({"workload": name, "convergence": {
        "batch_sizes": [batch], "lr_rules": ["sqrt"], "seeds": [0], "max_steps": 20,
        **convergence}})
    spec = runner.build_spec(cfg, [batch], data_dir="unused", out_dir=str(tmp_path),
                             run_id="one")
    workload = get_workload(name)
    return train.Trial(spec, spec.trials[0], train.load_data("unused", workload),
                       Dist(0, 1, "cpu"), LocalLocation(tmp_path / "ckpt"), workload)


def test_a_loader_worker_names_the_item_it_could_not_read(tmp_path, monkeypatch):
    monkeypatch.chdir(TESTS_DIR)
    trial = one_trial(tmp_path, "bad_index", 16, targets=[{"metric": "val_accuracy",
                                                           "value": 1.0}],
                      train_eval_rows=50, loader_workers=1)
    with pytest.raises(UserCodeError, match=r"Workload.train_data \(its dataset's __getitem__\) "
                       r"failed on index \d+ in trial b16-sqrt-s0-w1 \(batch size 16, seed 0\) "
                       r"at step 0, reading the step's training examples: IndexError: point"):
        trial.run()


def test_a_loss_that_fails_on_half_the_batch_is_told_why_it_saw_half(tmp_path, monkeypatch):
    """On one process the noise scale's step runs the loss on each half of the batch: a model
    that takes 16 examples fails at step 0 on 32 of a batch of 64, and the message says why
    the loss saw 32 (a user read "micro-batch" at one worker without accumulation as a bug)."""
    monkeypatch.chdir(TESTS_DIR)
    trial = one_trial(tmp_path, "small_train_batches", 64)
    with pytest.raises(UserCodeError, match=r"at step 0, training, on a micro-batch of 32 "
                       r"examples .*\(half of the batch of 64: on one process the step that "
                       r"measures the gradient noise scale, every convergence.gns_every_steps "
                       r"steps, runs the loss on each half; gns_every_steps: null keeps "
                       r"batches whole and measures no noise scale\)"):
        trial.run()
    # the way out: no noise scale, whole batches at every step
    assert [len(part) for part in trial.micro_batches(0)] == [32, 32]
    whole = one_trial(tmp_path / "off", "small_train_batches", 64, gns_every_steps=None)
    assert [len(part) for part in whole.micro_batches(0)] == [64]
    assert not any(whole.measures_noise(step) for step in range(30))


@pytest.mark.parametrize("workers", [1, 2])
def test_the_cell_server_raises_a_user_error_instead_of_falling_back(tmp_path, monkeypatch,
                                                                   workers):
    monkeypatch.chdir(TESTS_DIR)  # the server imports the workload from here
    batch = 32 * workers  # each rank's batch is 32: more than the model takes
    cfg = parse_config({"workload": f"{MODULE}:small_train_batches", "convergence": {
        "batch_sizes": [batch], "lr_rules": ["sqrt"], "seeds": [0], "max_steps": 20}})
    out = tmp_path / f"b{batch}"
    server = CellServer(runner.torchrun_env(workers), workers)
    try:
        with pytest.raises(UserCodeError, match=r"Workload.loss \(the model's forward and the "
                           r"loss\) failed in trial "
                           rf"b{batch}-sqrt-s0-w{workers} .*ValueError: training "
                           r"batches of at most 16 examples, got 32 \(at \S+\.py:\d+\)\. "
                           r".*; no trial of this launch had finished \(those of earlier "
                           rf"launches are kept under {re.escape(str(tmp_path))}\)$"):
            runner.run_convergence(cfg, [batch], data_dir="unused", out_dir=str(out),
                                   run_id="served", workers=workers, server=server)
        assert server.proc is None
        assert not (out / runner.TORCHRUN_LOG).exists()  # no torchrun launched after it
    finally:
        server.close()


def test_a_user_error_on_rank_one_alone_is_raised_by_the_cell_server(tmp_path, monkeypatch):
    """Rank 0 hears of it only as its peer dying (or is stopped by torchrun first): the
    message comes from the file rank 1 left, with no torchrun launched after it and no rank
    left running."""
    monkeypatch.chdir(TESTS_DIR)
    cfg = parse_config({"workload": f"{MODULE}:rank_one_fails", "convergence": {
        "batch_sizes": [32], "lr_rules": ["sqrt"], "seeds": [0], "max_steps": 20}})
    out = tmp_path / "b32"
    marked = {**runner.torchrun_env(2), "BATCHSCALE_TEST_MARK": str(tmp_path)}
    with CellServer(marked, 2) as server:
        with pytest.raises(UserCodeError, match=r"failed in trial b32-sqrt-s0-w2 .*rank 1 "
                           r"cannot read its share of this batch.*; no trial of this launch "
                           r"had finished \(those of earlier launches are kept under "
                           rf"{re.escape(str(tmp_path))}\)$"):
            runner.run_convergence(cfg, [32], data_dir="unused", out_dir=str(out),
                                   run_id="served", workers=2, server=server)
        assert server.proc is None
    assert not (out / runner.TORCHRUN_LOG).exists()
    assert not processes_marked(f"BATCHSCALE_TEST_MARK={tmp_path}")  # agent and both ranks



def test_a_loss_failing_in_a_trial_on_a_field_stacked_per_list_position_says_why():
    """usererror.loss_failed adds the contract check's hint when the batch that failed has a
    field collated position by position (items past the two checked holding a Python list)."""
    from types import SimpleNamespace

    from batchscale.convergence import usererror

    trial = SimpleNamespace(t=SimpleNamespace(trial_id="b4-sqrt-s0-w1", batch_size=4, seed=0),
                            contract=SimpleNamespace(name="mine"),
                            state=SimpleNamespace(step=7), local_batch=4, accumulation=1,
                            d=SimpleNamespace(world_size=1), measures_noise=lambda step: False)
    column = torch.zeros(4)
    batch = {"x": [column, column], "y": column}
    with pytest.raises(UserCodeError, match=r"at step 7, training, on a micro-batch of 4 "
                       r"examples .* TypeError: not a list.*The field 'x' came out as 2 "
                       r"tensors of 4 values"):
        usererror.loss_failed(trial, TypeError("not a list"), 4, batch)


def test_the_kept_trials_are_named_only_where_some_finished(tmp_path):
    """A launch stopped before any trial finished names no `trials/` folder (it would not
    exist: a user went looking for one after a Ctrl-C in a scaling run's launch)."""
    launch = tmp_path / "r1-w2"
    launch.mkdir()
    assert kept_text(launch) == ("no trial of this launch had finished (those of earlier "
                                 f"launches are kept under {tmp_path})")
    (launch / "trials").mkdir()
    (launch / "trials" / "b32-sqrt-s0-w2.run.parquet").write_bytes(b"")
    assert kept_text(launch) == f"finished trials are kept in {launch / 'trials'}"
