"""Probes on a budget: with `adaptive_probe_budget_examples` the adaptive search's probes stop
(status `probed`) at their first evaluation past the budget or once B_simple is stable near the
target, whichever comes first; they have trial ids and a directory of their own, stay out of the
fit, say in their decision why they stopped, and a cell placed at a probe's batch size trains
anew; their cost still counts.

The search tests simulate the training (the claims corpus's stand-in for run_convergence, with
a probe stopped on the trainer's own rule, convergence/probe.py); the trainer tests run a real
probe trial in-process on digits, and the last test the real search through the CLI with
torchrun-launched trials."""

from __future__ import annotations

import math
from pathlib import Path
from unittest import mock

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from plan_tables import ENV
from test_claims_adaptive import BATCHES, EVAL_EVERY, SEEDS, simulated_cell

from batchscale.adaptive import driver
from batchscale.analysis.analyze import without_pruned
from batchscale.checks import validate_table
from batchscale.cli import build_parser
from batchscale.cliflags import config_from_args
from batchscale.config import parse_config
from batchscale.convergence import runner, train
from batchscale.convergence.distributed import Dist
from batchscale.convergence.probe import b_simple_stable, probe_done
from batchscale.convergence.runner import PROBE_SUFFIX
from batchscale.convergence.spec import ProbeSpec
from batchscale.data.prep import prepare
from batchscale.errors import BadInput
from batchscale.location import LocalLocation
from batchscale.schemas import make_table
from batchscale.storage import read_table_file
from batchscale.workloads import get_workload
from helpers import run_cli

BUDGET = 200
B_CRIT = 32.0
NOISE_SCALES = {"settles": lambda i: B_CRIT, "jumps": lambda i: (10.0, 40.0)[i % 2]}
"""B_simple along a simulated probe: constant (stable as soon as it is near the target), or
jumping ×4 from one evaluation to the next (never stable: the budget stops it)."""


def _probe_tables(curves: pa.Table, runs: pa.Table, probe: ProbeSpec,
                  noise: str) -> tuple[pa.Table, pa.Table]:
    """A simulated trial cut where the trainer would stop it as a probe (train.record_eval:
    reached first, then the probe's rule), with the trial id a probe has."""
    rows = curves.to_pylist()
    (run,) = runs.to_pylist()
    kept: list[dict] = []
    for i, row in enumerate(rows):
        kept.append({**row, "b_simple": NOISE_SCALES[noise](i),
                     "trial_id": run["trial_id"] + PROBE_SUFFIX})
        last = i == len(rows) - 1
        if not last and probe_done(probe, kept, row["step"] * run["batch_size"]):
            run = {**run, "status": "probed", "steps_to_target": None, "steps_run": row["step"]}
            break
    run["trial_id"] += PROBE_SUFFIX
    return pa.Table.from_pylist(kept), pa.Table.from_pylist([run])


def _search(budget: int | None, tmp_path: Path, probes=(4, 8),
            noise: str = "jumps") -> tuple[pd.DataFrame, pd.DataFrame, list[tuple]]:
    """(decisions, runs, launches: (batch, seed, out_dir, prune bound, probe)) of a search on
    simulated cells with B_crit 32."""
    cfg = parse_config({"convergence": {
        "strategy": "adaptive", "lr_rules": ["sqrt"], "seeds": SEEDS, "batch_sizes": BATCHES,
        "target_interval_ratio": 2.0, "target_val_accuracy": 0.9, "max_steps": 2000,
        "eval_every_steps": EVAL_EVERY, "adaptive_probe_batch_sizes": list(probes),
        "adaptive_probe_budget_examples": budget}})
    train_cell = simulated_cell(B_CRIT, 0.1, True, True, np.random.default_rng(5))
    launches = []

    def launch(cfg, batch_sizes, out_dir, prune_at_step=None, probe=None, **kwargs):
        launches.append((batch_sizes[0], cfg.convergence.seeds[0], out_dir, prune_at_step,
                         probe))
        curves, runs = train_cell(cfg, batch_sizes, prune_at_step=prune_at_step, **kwargs)
        if probe is not None:
            curves, runs = _probe_tables(curves, runs, probe, noise)
        # The runs schema as the trainer writes it: a stopped trial's steps_to_target is a null
        # integer, not a column of type null.
        return curves, runs.set_column(runs.schema.get_field_index("steps_to_target"),
                                       "steps_to_target",
                                       runs.column("steps_to_target").cast(pa.int64()))

    with mock.patch.object(driver, "run_convergence", launch), \
            mock.patch.object(driver, "_environment", lambda search, runs: {}), \
            mock.patch.object(driver, "make_table", lambda kind, rows, env: rows):
        curves, runs, decisions = driver.run_adaptive(cfg, data_dir="simulated",
                                                      run_id="probes", work_root=tmp_path,
                                                      echo=lambda line: None)
    return pd.DataFrame(decisions), runs.to_pandas(), launches


def _probes(runs: pd.DataFrame) -> pd.DataFrame:
    return runs[runs["trial_id"].str.endswith(PROBE_SUFFIX)]


# ----------------------------------------------------------------------- the search, simulated
def test_probes_stop_at_their_budget_when_b_simple_never_settles_and_say_so(tmp_path):
    decisions, runs, launches = _search(BUDGET, tmp_path, noise="jumps")
    probes = _probes(runs)
    assert sorted(probes["batch_size"]) == [4, 8]
    for _, probe in probes.iterrows():  # the first evaluation at or past the budget
        first_eval = math.ceil(BUDGET / probe["batch_size"] / EVAL_EVERY) * EVAL_EVERY
        assert probe["status"] == "probed" and probe["steps_run"] == first_eval
    sent = [(b, p) for b, _, out, _, p in launches if "probe-" in str(out)]
    assert [b for b, _ in sent] == [4, 8]
    assert all(p == ProbeSpec(budget_examples=BUDGET, metric="val_accuracy", value=0.9)
               for _, p in sent)
    said = decisions[decisions["action"] == "probe"]["reason"].tolist()
    assert all(f"stopped at its probe budget of {BUDGET:,} examples in 1 of 1 trial(s), kept "
               "out of the fit" in r for r in said), said
    # Far from the target after 200 examples: the prediction is carried along B_simple's trend.
    predict = decisions[decisions["action"] == "predict"].iloc[0]
    assert predict["prediction_method"] == "extrapolated"


def test_probes_stop_once_b_simple_is_stable_near_the_target_before_their_budget(tmp_path):
    budget = 10**6  # far more than a probe needs to reach the target: stability stops it
    decisions, runs, _ = _search(budget, tmp_path, noise="settles")
    probes = _probes(runs)
    assert (probes["status"] == "probed").all()
    assert (probes["steps_run"] * probes["batch_size"] < budget).all()
    said = decisions[decisions["action"] == "probe"]["reason"].tolist()
    assert all("stopped once B_simple was stable near the target in 1 of 1 trial(s)" in r
               for r in said), said
    predict = decisions[decisions["action"] == "predict"].iloc[0]
    assert predict["prediction_method"] == "near target"
    assert predict["predicted_b_crit"] == pytest.approx(B_CRIT)


def test_probes_stay_out_of_the_fit_and_a_cell_at_their_batch_trains_anew(tmp_path):
    """Probes at 32 and 64 (around the simulated B_crit of 32, where placement goes): the cell
    placed there launches again, in its own directory, without the probe's rule, to the
    target."""
    decisions, runs, launches = _search(BUDGET, tmp_path, probes=(32, 64))
    cells = [(b, s, out, p) for b, s, out, _, p in launches if "probe-" not in str(out)]
    again = [c for c in cells if c[:2] in ((32, SEEDS[0]), (64, SEEDS[0]))]
    assert again and all(p is None for *_, p in again)
    placed = runs[~runs["trial_id"].str.endswith(PROBE_SUFFIX)]
    at_probes = placed[placed["batch_size"].isin((32, 64)) & (placed["seed"] == SEEDS[0])]
    assert not at_probes.empty and (at_probes["status"] == "reached").all()
    assert runs["trial_id"].is_unique
    # The fit is the cells': no probe counts, and no placed cell is probed.
    assert (_probes(runs)["status"] == "probed").all()
    assert (placed["status"] != "probed").all()
    # The cost counts every trial, probes included.
    spent = int((runs["steps_run"] * runs["batch_size"]).sum())
    assert decisions.iloc[-1]["examples_spent"] == spent


def test_the_fit_leaves_probes_out(tmp_path):
    """Search.target_runs, what every interval is computed from, holds no probe."""
    cfg = parse_config({"convergence": {"strategy": "adaptive", "batch_sizes": BATCHES,
                                        "adaptive_probe_budget_examples": BUDGET}})
    search = driver.Search(cfg, "probes", "simulated", 1, lambda line: None, tmp_path)
    row = {"batch_size": 8, "seed": 0, "lr_rule": "sqrt", "target_metric": "val_accuracy",
           "target_value": 0.95, "steps_run": 30}
    probe = pa.Table.from_pylist([{**row, "trial_id": "b8-probe", "status": "probed"}])
    cell = pa.Table.from_pylist([{**row, "trial_id": "b8", "status": "reached"}])
    search.probes[driver.Cell(8, 0)] = (pa.table({"x": [1]}), probe)
    search.cells[driver.Cell(8, 0)] = (pa.table({"x": [1]}), cell)
    assert search.target_runs()["trial_id"].tolist() == ["b8"]


def test_the_analysis_leaves_probes_out_of_its_fits():
    runs = pd.DataFrame({"trial_id": ["b8-probe", "b8", "b16"],
                         "status": ["probed", "reached", "pruned"]})
    assert without_pruned(runs)["trial_id"].tolist() == ["b8"]


def test_without_a_budget_probes_are_cells_of_the_fit_as_before(tmp_path):
    _, runs, launches = _search(None, tmp_path)
    assert not runs["trial_id"].str.endswith(PROBE_SUFFIX).any()
    assert "probed" not in set(runs["status"])
    assert all("probe-" not in str(out) and bound is None and probe is None
               for b, _, out, bound, probe in launches if b in (4, 8))


# ---------------------------------------------------------------------------- the config
@pytest.mark.parametrize("bad", [0, -5, 1.5, "many"])
def test_the_budget_must_be_a_positive_count_of_examples(bad):
    with pytest.raises(BadInput, match="adaptive_probe_budget_examples"):
        parse_config({"convergence": {"adaptive_probe_budget_examples": bad}})


def test_the_budget_is_unset_by_default_and_a_cli_flag():
    assert parse_config({}).convergence.adaptive_probe_budget_examples is None
    args = build_parser().parse_args(["converge", "--workload", "digits-mlp", "--out", "x",
                                      "--adaptive-probe-budget-examples", "4096"])
    assert config_from_args(args).convergence.adaptive_probe_budget_examples == 4096


# ---------------------------------------------------------------------------- the trainer
@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits")
    prepare(parse_config({}).dataset, out)
    return out


def _probe_trial(tmp_path: Path, digits_dir: Path, budget: int, target: float):
    cfg = parse_config({"convergence": {"target_val_accuracy": target, "max_steps": 300,
                                        "eval_every_steps": 5, "gns_every_steps": 1,
                                        "seeds": [0]}})
    probe = ProbeSpec(budget_examples=budget, metric="val_accuracy", value=target)
    spec = runner.build_spec(cfg, [64], data_dir=str(digits_dir), out_dir=str(tmp_path),
                             run_id="t", probe=probe)
    workload = get_workload(cfg.workload)
    trial = train.Trial(spec, spec.trials[0], train.load_data(spec.data_dir, workload),
                        Dist(0, 1, "cpu"), LocalLocation(tmp_path / "ckpt"), workload)
    [row] = train.summary_run_rows(trial.run())
    return spec, trial, row


def test_a_probe_trial_stops_as_probed_at_its_budget_and_its_suite_accepts_it(tmp_path,
                                                                              digits_dir):
    spec, trial, row = _probe_trial(tmp_path, digits_dir, budget=64 * 12, target=1.0)
    # evaluations every 5 steps: the first at or past 12 steps of batch 64 is step 15
    assert (row["status"], row["steps_run"], row["steps_to_target"]) == ("probed", 15, None)
    assert row["trial_id"].endswith(PROBE_SUFFIX) and spec.trials[0].probe is not None
    report = validate_table("runs", make_table("runs", [row], ENV))
    assert report.success, report.failure_message()
    # the probe changes where a trial stops, not its trajectory: not part of the identity
    cfg_trial = spec.trials[0].model_copy(update={"probe": None})
    assert spec.identity(spec.trials[0]) == spec.identity(cfg_trial)


def test_a_probe_trial_stops_once_b_simple_is_stable_before_the_target(tmp_path, digits_dir):
    """Digits at batch 64 reach 0.9 in ~60 steps; B_simple near the target settles first."""
    _, trial, row = _probe_trial(tmp_path, digits_dir, budget=10**9, target=0.9)
    curve = trial.state.curve
    stopped_stable = b_simple_stable(curve, "val_accuracy", 0.9)
    assert row["status"] in ("probed", "reached")
    # probed: only because B_simple was stable; reached: it never was before the target
    assert stopped_stable == (row["status"] == "probed")
    assert not any(b_simple_stable(curve[:i], "val_accuracy", 0.9) for i in range(len(curve)))


# ------------------------------------------------------------------ the real search (CLI)
@pytest.mark.slow
def test_a_real_search_with_budgeted_probes_writes_valid_tables_and_resumes(tmp_path):
    """`batchscale converge --strategy adaptive --adaptive-probe-budget-examples 400` on digits:
    the probes stop early as probed with their own trial ids and say why, the runs table passes
    its suite, the placed cells train to the target, and a second run with the same run id reads
    the probes back instead of training them again."""
    out = tmp_path / "out"
    args = ["converge", "--workload", "digits-mlp", "--strategy", "adaptive",
            "--batch-sizes", "8", "16", "32", "64", "128", "--seeds", "0", "1",
            "--lr-rules", "sqrt", "--target", "val_accuracy=0.9", "--max-steps", "600",
            "--adaptive-probe-budget-examples", "400", "--run-id", "20261204T120000Z-probes",
            "--out", str(out)]
    first = run_cli(args, cwd=tmp_path, timeout_s=600)
    assert first.returncode == 0, first.stderr[-2000:]
    runs = read_table_file(out / "runs.parquet").to_pandas()
    probes = _probes(runs)
    assert sorted(probes["batch_size"].unique()) == [8, 16]
    assert (probes["status"] == "probed").all()
    assert (probes["steps_run"] * probes["batch_size"] < 400 + 10 * 16 + 1).all()
    assert runs["trial_id"].is_unique
    cells = runs[~runs["trial_id"].str.endswith(PROBE_SUFFIX)]
    assert "reached" in set(cells["status"]) and "probed" not in set(cells["status"])
    assert validate_table("runs", read_table_file(out / "runs.parquet")).success
    decisions = read_table_file(out / "decisions.parquet")
    assert validate_table("decisions", decisions).success
    said = [r["reason"] for r in decisions.to_pylist() if r["action"] == "probe"]
    assert len(said) == 2 and all(
        "stopped at its probe budget of 400 examples" in r
        or "stopped once B_simple was stable near the target" in r for r in said), said
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("probe-b*/trials/*.run.parquet")}
    assert len(files) == 2 and all(p.name.endswith("-probe.run.parquet") for p in files)
    second = run_cli(args, cwd=tmp_path, timeout_s=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in files} == files
    again = read_table_file(out / "decisions.parquet").to_pylist()
    assert [r["reason"] for r in again] == [r["reason"] for r in decisions.to_pylist()]
