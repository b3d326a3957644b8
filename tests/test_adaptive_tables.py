"""The adaptive search's table and its place in the pipeline: the decisions suite refuses what a
search cannot have written, the convergence fan-out gives the search one cell, and publish stores
the decisions of a search (and nothing for a grid)."""

from __future__ import annotations

import pytest

from batchscale.checks import validate_table
from batchscale.config import parse_config
from batchscale.lake.publish import publish_run, table_key
from batchscale.schemas import make_table
from batchscale.storage import write_table_atomic

ENV = {"run_id": "r", "config_hash": "h", "experiment": "e", "workload": "digits-mlp",
       "git_commit": "c", "batchscale_version": "0", "torch_version": "2", "python_version": "3",
       "device_name": "cpu", "threads": 2, "world_size": 1}


def decision(i: int, **changes) -> dict:
    row = {"decision": i, "action": "refine", "batch_size": 16, "seed": 1,
           "reason": "narrows the interval most per example", "lr_rule": "sqrt",
           "target_metric": "val_accuracy", "target_value": 0.9, "predicted_b_crit": 12.5,
           "predicted_low": 10.4, "predicted_high": 17.4, "prediction_method": "near target",
           "b_crit": 29.2, "b_crit_low": 21.2, "b_crit_high": 40.7, "interval_ratio": 1.92,
           "expected_ratio": 1.89, "examples_spent": 1000 * (i + 1), "device_s_spent": 1.5,
           "workers": 1}
    return {**row, **changes}


def test_a_searchs_decisions_pass_their_suite():
    rows = [decision(0, action="probe", b_crit=None, b_crit_low=None, b_crit_high=None,
                     interval_ratio=None, expected_ratio=None), decision(1),
            decision(2, action="stop", batch_size=None, seed=None)]
    assert validate_table("decisions", make_table("decisions", rows, ENV)).success
    grid = {"grid_batch_sizes": [4, 16, 64, 256], "grid_seeds": 3}  # layout 6 on
    assert validate_table("decisions", make_table("decisions", [r | grid for r in rows],
                                                  ENV)).success


@pytest.mark.parametrize("changes, needle", [
    ({"action": "guess"}, "action"),
    ({"b_crit_low": 50.0}, "b_crit_high"),
    ({"interval_ratio": 0.5}, "interval_ratio"),
    ({"examples_spent": -1}, "examples_spent"),
    ({"prediction_method": "magic"}, "prediction_method"),
    ({"decision": 0}, "decision"),
    ({"grid_seeds": 0}, "grid_seeds"),
    ({"grid_batch_sizes": [16, 64]}, "grid_batch_sizes_len"),
    ({"grid_batch_sizes": [0, 16, 64]}, "grid_batch_sizes_min"),
])
def test_the_suite_refuses_what_a_search_cannot_write(changes, needle):
    rows = [decision(0), decision(1, **changes)]
    report = validate_table("decisions", make_table("decisions", rows, ENV))
    assert not report.success and needle in report.failure_message()


def test_the_adaptive_search_is_one_cell_and_scaling_cells_stay_their_own():
    cfg = parse_config({"convergence": {"strategy": "adaptive", "scaling_workers": [2],
                                        "scaling_batch_sizes": [64]}})
    for one_per_cell in (True, False):
        assert cfg.convergence.fan_out(one_per_cell) == [
            {"batch_sizes": "adaptive", "workers": "1"}, {"batch_sizes": "64", "workers": "2"}]


def test_locally_a_worker_counts_batch_sizes_share_one_cell():
    cfg = parse_config({"convergence": {"batch_sizes": [16, 64, 256], "scaling_workers": [2],
                                        "scaling_batch_sizes": [64]}})
    assert cfg.convergence.fan_out(one_batch_size_per_cell=False) == [
        {"batch_sizes": "16,64,256", "workers": "1"}, {"batch_sizes": "64", "workers": "2"}]
    assert len(cfg.convergence.fan_out()) == 4


def test_an_adaptive_search_needs_batch_sizes_to_choose_from():
    with pytest.raises(Exception, match="adaptive needs at least 3 batch_sizes"):
        parse_config({"convergence": {"strategy": "adaptive", "batch_sizes": [16, 64]}})
    with pytest.raises(Exception, match="adaptive_probe_batch_sizes: 8 is not one of"):
        parse_config({"convergence": {"strategy": "adaptive", "adaptive_probe_batch_sizes": [8],
                                      "batch_sizes": [16, 32, 64]}})


def test_decisions_are_published_with_the_run(tmp_path, object_store):
    path = tmp_path / "decisions.parquet"
    write_table_atomic(path, make_table("decisions", [decision(0), decision(1)], ENV))
    manifest = publish_run(object_store, "20261201T101010Z-search", {"decisions": path})
    key = table_key(object_store, "decisions", manifest["date"], "20261201T101010Z-search")
    assert object_store.get_table(key).num_rows == 2
    assert [o["key"] for o in manifest["objects"]] == [key]


def test_the_searchs_pod_may_run_every_cell_it_is_allowed():
    """On a cluster the search's step runs its cells one after another: its pod deadline covers
    `adaptive_max_cells` trial timeouts (a grid cell's covers one)."""
    from batchscale.pipelines.cluster import deadline_s

    grid = parse_config({"convergence": {"timeout_s": 600}})
    search = parse_config({"convergence": {"timeout_s": 600, "strategy": "adaptive",
                                          "adaptive_max_cells": 10}})
    margin = grid.kubernetes.convergence_timeout_margin_s
    assert deadline_s("convergence", grid) == 600 + margin
    assert deadline_s("convergence", search) == 6000 + margin


def test_batchscale_validate_knows_every_table_kind():
    """`batchscale validate --table KIND` offers every table that has a suite (decisions and
    plan included), so a user can check a table they downloaded from the lake."""
    import argparse

    from batchscale.cli import build_parser
    from batchscale.schemas import TABLES

    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    validate = commands.choices["validate"]
    table = next(a for a in validate._actions if a.dest == "table")
    assert set(table.choices) == set(TABLES)


def test_a_report_rebuilt_from_the_lake_keeps_the_search_section(tmp_path, object_store):
    """`batchscale report --run-id` re-renders a published search: its decisions come back from
    the lake and the grid it is compared with from the run's manifest."""
    from test_adaptive_section import study_decisions, study_runs

    from batchscale.lake.summary import rebuild_report

    run_id = "20261201T111111Z-search"
    files = {}
    for name, frame in (("runs", study_runs().assign(train_time_s=1.0)),
                        ("decisions", study_decisions())):
        rows = [{k: v for k, v in r.items() if v == v} for r in frame.to_dict("records")]
        files[name] = tmp_path / f"{name}.parquet"
        write_table_atomic(files[name], make_table(name, rows, ENV))
    publish_run(object_store, run_id, files,
                extra={"convergence_grid": {"batch_sizes": [4, 16, 64, 256], "seeds": 2}})
    rebuild_report(object_store, run_id, tmp_path / "rebuilt.html")
    page = (tmp_path / "rebuilt.html").read_text()
    assert "<h2>Adaptive search</h2>" in page
    assert "a grid of 4 batch sizes × 2 seeds would have needed about" in page
