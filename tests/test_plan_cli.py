"""`batchscale plan` on runs published to a real SeaweedFS (tests/conftest.py): the plan with
its bands and assumptions, the check, the Parquet output through its suite, and clear errors for
an unknown run and for a run without the measurements a plan needs."""

from __future__ import annotations

import argparse
from pathlib import Path

import plan_tables as pt
import pyarrow.parquet as pq
import pytest

from batchscale.checks import validate_table
from batchscale.cli import main
from batchscale.lake.publish import publish_run
from batchscale.storage import write_table_atomic
from helpers import store_env


def publish(store, tmp: Path, run_id: str, tables: dict) -> None:
    files = {}
    for name, table in tables.items():
        files[name] = tmp / f"{run_id}-{name}.parquet"
        write_table_atomic(files[name], table)
    publish_run(store, run_id, files)


@pytest.fixture
def lake(object_store, monkeypatch, tmp_path):
    for name, value in store_env(object_store).items():
        monkeypatch.setenv(name, value)
    publish(object_store, tmp_path, "plan-run", pt.tables(parallel_batches=(64, 128)))
    no_parallel = pt.tables(parallel_batches=())
    publish(object_store, tmp_path, "one-worker-run", no_parallel)
    publish(object_store, tmp_path, "sweep-only-run", {"sweep": no_parallel["sweep"]})
    return object_store


def test_plan_prints_bands_assumptions_recommendation_and_check(lake, capsys, tmp_path):
    out = tmp_path / "plan.parquet"
    code = main(["plan", "--run-id", "plan-run", "--workers", "1,2,4,64", "--deadline", "1h",
                 "--check", "--out", str(out)])
    captured = capsys.readouterr()
    text = captured.out
    assert code == 0, text + captured.err
    assert "B_crit interval 48-96" in text
    assert "latency 0 µs per hop (assumed)" in text
    assert ("not measured: link bandwidth (effective), latency (assumed), hidden share "
            "(assumed)") in text
    assert "recommendation: Cheapest within the deadline of 60 min" in text
    assert "communication fitted without this cell" in text and "goal ±25% met" in text
    table = pq.read_table(out)
    assert sorted(set(table.column("workers").to_pylist())) == [1, 2, 4, 64]
    assert set(table.column("run_id").to_pylist()) == {"plan-run"}
    assert validate_table("plan", table).success


def test_a_stated_link_is_used_without_data_parallel_runs(lake, capsys):
    code = main(["plan", "--run-id", "one-worker-run", "--link-gbps", "100", "--latency-us",
                 "5", "--budget-device-hours", "1"])
    text = capsys.readouterr().out
    assert code == 0, text
    assert ("not measured: link bandwidth (assumed), latency (assumed), hidden share "
            "(assumed)") in text
    assert "Fastest within the budget of 1 device-hours" in text


def test_a_deadline_no_plan_meets_prints_the_nearest_and_exits_1(lake, capsys):
    """The table and the nearest plan are still printed; the status says no plan fits, so a
    script does not act on it."""
    code = main(["plan", "--run-id", "one-worker-run", "--link-gbps", "100", "--latency-us",
                 "5", "--deadline", "1e-9"])
    text = capsys.readouterr().out
    assert code == 1, text
    assert "No plan fits the deadline" in text


@pytest.mark.parametrize(("argv", "message"), [
    (["--run-id", "no-such-run"], "no published run 'no-such-run' in the lake"),
    (["--run-id", "sweep-only-run"], "has no runs or analysis table"),
    (["--run-id", "one-worker-run"], "no data-parallel runs"),
    (["--run-id", "plan-run", "--link-gbps", "10"], "--link-gbps needs --latency-us"),
    (["--run-id", "plan-run", "--budget-device-hours", "-1"], "--budget-device-hours"),
    (["--run-id", "../x"], "run id '../x' is not allowed"),
])
def test_errors_name_what_is_missing(lake, capsys, argv, message):
    assert main(["plan", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("rows", ["plan", "empty"])
def test_publish_stores_a_plan_table_with_rows_and_skips_an_empty_one(
        object_store, monkeypatch, tmp_path, rows):
    from test_publish import config_json, write_run_files

    from batchscale.lake.publish import run_stage, table_key
    from batchscale.schemas import make_table
    from clean_tables import ROWS

    for name, value in store_env(object_store).items():
        monkeypatch.setenv(name, value)
    run_id = "20260301T120000Z-plan00"
    paths = write_run_files(tmp_path / run_id, run_id, {4: 1000.0, 64: 9000.0})
    plan = tmp_path / "plan.parquet"
    write_table_atomic(plan, make_table("plan", ROWS["plan"]() if rows == "plan" else [],
                                        pt.ENV))
    manifest = run_stage(config_json(), run_id, regressions_path=str(tmp_path / "r.parquet"),
                         markdown_path=str(tmp_path / "r.md"), plan_path=str(plan), **paths)
    keys = {o["key"] for o in manifest["objects"]}
    assert (table_key(object_store, "plan", "2026-03-01", run_id) in keys) == (rows == "plan")


def test_worker_counts_beyond_what_the_model_can_say_are_refused():
    from batchscale.cli.plan_cmd import MAX_PLAN_WORKERS, worker_list

    assert worker_list(f"1,2,{MAX_PLAN_WORKERS}") == [1, 2, MAX_PLAN_WORKERS]
    for text in ("1,100000000", "0,2", "", "two"):
        with pytest.raises(argparse.ArgumentTypeError):
            worker_list(text)
