"""Probes on a budget: with `adaptive_probe_budget_examples` the adaptive search's probes stop at
their first evaluation past the budget, only measure the noise scale, stay out of the fit, and a
cell placed at a probe's batch size trains anew; their cost still counts.

The first tests simulate the training (the claims corpus's stand-in for run_convergence, which
honours the prune bound as the trainer does); the last runs the real search through the CLI on
digits with torchrun-launched trials."""

from __future__ import annotations

import math
from unittest import mock

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
from test_claims_adaptive import BATCHES, EVAL_EVERY, SEEDS, simulated_cell

from batchscale.adaptive import driver
from batchscale.checks import validate_table
from batchscale.config import parse_config
from batchscale.errors import BadInput
from batchscale.storage import read_table_file
from helpers import run_cli

BUDGET = 200


def _search(budget: int | None, tmp_path, probes=(4, 8)) -> tuple[pd.DataFrame, pd.DataFrame,
                                                                   list[tuple]]:
    cfg = parse_config({"convergence": {
        "strategy": "adaptive", "lr_rules": ["sqrt"], "seeds": SEEDS, "batch_sizes": BATCHES,
        "target_interval_ratio": 2.0, "target_val_accuracy": 0.9, "max_steps": 2000,
        "eval_every_steps": EVAL_EVERY, "adaptive_probe_batch_sizes": list(probes),
        "adaptive_probe_budget_examples": budget}})
    train = simulated_cell(32.0, 0.1, True, True, np.random.default_rng(5))
    launches = []

    def launch(cfg, batch_sizes, out_dir, prune_at_step=None, **kwargs):
        launches.append((batch_sizes[0], cfg.convergence.seeds[0], out_dir, prune_at_step))
        # The trainer stops a trial at its first evaluation from the bound on.
        at_eval = (None if prune_at_step is None
                   else math.ceil(prune_at_step / EVAL_EVERY) * EVAL_EVERY)
        curves, runs = train(cfg, batch_sizes, prune_at_step=at_eval, **kwargs)
        # The runs schema as the trainer writes it: a stopped trial's steps_to_target is a null
        # integer, not a column of type null.
        return curves, runs.set_column(runs.schema.get_field_index("steps_to_target"),
                                       "steps_to_target",
                                       runs.column("steps_to_target").cast(pa.int64()))

    with mock.patch.object(driver, "run_convergence", launch), \
            mock.patch.object(driver, "_environment", lambda search, runs: {}), \
            mock.patch.object(driver, "make_table", lambda kind, rows, env: rows):
        _, runs, decisions = driver.run_adaptive(cfg, data_dir="simulated", run_id="probes",
                                                 work_root=tmp_path, echo=lambda line: None)
    return pd.DataFrame(decisions), runs.to_pandas(), launches


def test_budgeted_probes_stop_at_the_first_evaluation_past_the_budget_and_say_so(tmp_path):
    decisions, runs, launches = _search(BUDGET, tmp_path)
    probes = runs[runs["trial_id"].str.endswith(driver.PROBE_SUFFIX)]
    assert sorted(probes["batch_size"]) == [4, 8]
    for _, probe in probes.iterrows():
        bound = math.ceil(BUDGET / probe["batch_size"])
        first_eval_past = math.ceil(bound / EVAL_EVERY) * EVAL_EVERY
        assert probe["status"] == "pruned" and probe["steps_run"] == first_eval_past
    probe_launches = [(b, out, bound) for b, _, out, bound in launches if "probe-" in str(out)]
    assert [(b, bound) for b, _, bound in probe_launches] == [(4, 50), (8, 25)]
    said = decisions[decisions["action"] == "probe"]["reason"].tolist()
    assert all(f"stopped at its budget of {BUDGET:,} examples" in r for r in said)
    assert decisions[decisions["action"] == "predict"]["prediction_method"].iloc[0] != "none"


def test_probes_stay_out_of_the_fit_and_a_cell_at_their_batch_trains_anew(tmp_path):
    """Probes at 32 and 64 (around the simulated B_crit of 32, where placement goes): the cell
    placed there launches again, in its own directory, to the target."""
    decisions, runs, launches = _search(BUDGET, tmp_path, probes=(32, 64))
    cell_launches = [(b, s) for b, s, out, _ in launches if "probe-" not in str(out)]
    assert (32, SEEDS[0]) in cell_launches or (64, SEEDS[0]) in cell_launches
    placed = runs[~runs["trial_id"].str.endswith(driver.PROBE_SUFFIX)]
    again = placed[placed["batch_size"].isin((32, 64)) & (placed["seed"] == SEEDS[0])]
    assert not again.empty and (again["status"] == "reached").all()
    assert runs["trial_id"].is_unique
    # The cost counts every trial, probes included.
    spent = int((runs["steps_run"] * runs["batch_size"]).sum())
    assert decisions.iloc[-1]["examples_spent"] == spent


def test_without_a_budget_probes_are_cells_of_the_fit_as_before(tmp_path):
    _, runs, launches = _search(None, tmp_path)
    assert not runs["trial_id"].str.endswith(driver.PROBE_SUFFIX).any()
    assert all("probe-" not in str(out) and bound is None
               for b, _, out, bound in launches if b in (4, 8))


def test_the_budget_must_be_a_positive_count_of_examples():
    with pytest.raises(BadInput, match="adaptive_probe_budget_examples"):
        parse_config({"convergence": {"adaptive_probe_budget_examples": 0}})


@pytest.mark.slow
def test_a_real_search_with_budgeted_probes_writes_valid_tables_and_resumes(tmp_path):
    """`batchscale converge --strategy adaptive --adaptive-probe-budget-examples 400` on digits:
    the probes stop early with their own trial ids, the runs table passes its suite, and a
    second run with the same run id reads the probes back instead of training them again."""
    out = tmp_path / "out"
    args = ["converge", "--workload", "digits-mlp", "--strategy", "adaptive",
            "--batch-sizes", "8", "16", "32", "64", "128", "--seeds", "0", "1",
            "--lr-rules", "sqrt", "--target", "val_accuracy=0.9", "--max-steps", "600",
            "--adaptive-probe-budget-examples", "400", "--run-id", "20261204T120000Z-probes",
            "--out", str(out)]
    first = run_cli(args, cwd=tmp_path, timeout_s=600)
    assert first.returncode == 0, first.stderr[-2000:]
    runs = read_table_file(out / "runs.parquet").to_pandas()
    probes = runs[runs["trial_id"].str.endswith("-probe")]
    assert sorted(probes["batch_size"].unique()) == [8, 16]
    assert (probes["status"] == "pruned").all()
    assert (probes["steps_run"] * probes["batch_size"] < 400 + 10 * 16 + 1).all()
    assert validate_table("runs", read_table_file(out / "runs.parquet")).success
    assert validate_table("decisions", read_table_file(out / "decisions.parquet")).success
    files = {p: p.stat().st_mtime_ns for p in tmp_path.rglob("probe-b*/trials/*.run.parquet")}
    assert len(files) == 2
    second = run_cli(args, cwd=tmp_path, timeout_s=600)
    assert second.returncode == 0, second.stderr[-2000:]
    assert {p: p.stat().st_mtime_ns for p in files} == files
