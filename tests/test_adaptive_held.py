"""The device time the adaptive search holds: each cell's launch wall time × workers, kept beside
its trials so a resumed search counts it as it was, and a budget in those device-seconds.

The cells are simulated (the claims corpus's stand-in for run_convergence) with a sleep standing
in for a launch's start-up: no GPU or torchrun is needed to check the accounting; the real launch
is timed the same way in tests/test_adaptive_driver.py."""

from __future__ import annotations

import json
import math
import re
import time
from unittest import mock

import numpy as np
import pandas as pd
import pytest
from test_claims_adaptive import BATCHES, EVAL_EVERY, SEEDS, simulated_cell

from batchscale.adaptive import driver
from batchscale.adaptive.choice import STOP_DEVICE_BUDGET, Cell, CellCost
from batchscale.config import parse_config
from batchscale.fits import StepTimeFit

LAUNCH_S = 0.05


def _search(budget_s: float | None, tmp_path, echo=lambda line: None) -> pd.DataFrame:
    cfg = parse_config({"convergence": {
        "strategy": "adaptive", "lr_rules": ["sqrt"], "seeds": SEEDS, "batch_sizes": BATCHES,
        "target_interval_ratio": 1.01, "target_val_accuracy": 0.9, "max_steps": 2000,
        "eval_every_steps": EVAL_EVERY, "adaptive_budget_device_s": budget_s,
        # an interval of ×1.01 is out of any grid's reach: without this the search says so
        # and stops before its budget is spent
        "adaptive_futile_chance": None}})
    train = simulated_cell(32.0, 0.1, True, True, np.random.default_rng(3))

    def launch(*args, **kwargs):
        time.sleep(LAUNCH_S)
        return train(*args, **kwargs)

    with mock.patch.object(driver, "run_convergence", launch), \
            mock.patch.object(driver, "_environment", lambda search, runs: {}), \
            mock.patch.object(driver, "make_table", lambda kind, rows, env: rows):
        _, _, decisions = driver.run_adaptive(cfg, data_dir="simulated", run_id="held",
                                              work_root=tmp_path, echo=echo)
    return pd.DataFrame(decisions)


def test_the_search_stops_once_its_device_second_budget_is_held(tmp_path):
    budget_s = 8 * LAUNCH_S
    decisions = _search(budget_s, tmp_path)
    last = decisions.iloc[-1]
    assert last["reason"].startswith(f"{STOP_DEVICE_BUDGET}: {last['device_s_held']:,.1f} "
                                     f"device-seconds held against adaptive_budget_device_s "
                                     f"{budget_s:g} (a budget is checked before each refining")
    assert last["device_s_held"] >= budget_s
    cells = decisions["action"].isin(("probe", "place", "refine")).sum()
    assert last["device_s_held"] >= cells * LAUNCH_S  # every launch counted, start-up included
    # No refining cell ran once the budget was spent (probes and placed cells come first).
    refines = decisions[decisions["action"] == "refine"]
    assert (refines["device_s_held"].iloc[:-1] < budget_s).all()


def test_held_time_grows_with_each_cell_and_never_falls_below_the_launches(tmp_path):
    decisions = _search(None, tmp_path)
    held = decisions["device_s_held"].tolist()
    assert held == sorted(held)
    assert not decisions.iloc[-1]["reason"].startswith(STOP_DEVICE_BUDGET)


def test_a_cells_held_time_is_kept_beside_it_and_read_back_as_it_was(tmp_path):
    cell_dir = tmp_path / "cell"
    assert driver.held_wall_s(cell_dir, 0, 1.5) == 1.5  # no directory: nothing written
    assert not cell_dir.exists()
    cell_dir.mkdir()
    record = cell_dir / driver.held_record(0)
    assert driver.held_wall_s(cell_dir, 0, 12.0) == 12.0
    assert json.loads(record.read_text()) == {"wall_s": 12.0}
    assert driver.held_wall_s(cell_dir, 0, 0.01) == 12.0  # a resumed launch only reads it back
    record.write_text("{not json")
    assert driver.held_wall_s(cell_dir, 0, 3.0) == 3.0  # a damaged record is measured again
    record.write_text('{"wall_s": -1}')
    assert driver.held_wall_s(cell_dir, 0, 4.0) == 4.0


def test_each_seed_of_a_batch_size_keeps_its_own_held_time(tmp_path):
    """The cells of one batch size share a directory: a second seed's launch is measured, not
    given the first seed's record (which it was, before the record was kept per seed)."""
    cell_dir = tmp_path / "convergence-b16-w1"
    cell_dir.mkdir()
    assert driver.held_wall_s(cell_dir, 0, 5.0) == 5.0
    assert driver.held_wall_s(cell_dir, 1, 0.2) == 0.2
    assert driver.held_wall_s(cell_dir, 0, 9.0) == 5.0
    assert driver.held_wall_s(cell_dir, 1, 9.0) == 0.2


def test_the_stop_line_says_the_level_its_interval_was_read_at(tmp_path):
    """The search narrows the 90 % interval but reports the stopped one read at 98 %: the
    progress line says so beside the wider interval, the lines before it do not."""
    lines = []
    decisions = _search(None, tmp_path, lines.append)
    assert len(lines) == len(decisions)
    assert decisions.iloc[-1]["action"] == "stop" and "stop" in lines[-1]
    assert "(×" in lines[-1] and ", read at 98%, the level a stopped search's 90% claim " \
        "needs; ×" in lines[-1], lines[-1]
    if "narrow enough at 90 %" in lines[-1]:  # the 90 % ratio it narrowed is said, at most ×2
        narrowed = float(re.search(r"needs; ×([\d.]+) at 90%", lines[-1]).group(1))
        assert narrowed <= 2.0, lines[-1]
    assert not any("read at" in line for line in lines[:-1])


def test_a_progress_lines_interval_ratio_keeps_few_digits_however_wide():
    """An early B* interval on a step-time line of one degree of freedom spans ×3e5: the line
    prints ×3.24e+05, not ×323847.09; a usual ratio keeps its two decimals."""
    assert driver._ratio(1.92) == "1.92" and driver._ratio(99.5) == "99.50"
    assert driver._ratio(323847.09) == "3.24e+05"


def test_a_launchs_own_share_is_read_after_the_first_launch():
    """held − trained over the launches after the first: the first also paid the start-up."""
    search = driver.Search(parse_config({"convergence": {"strategy": "adaptive"}}), "t", "data", 1,
                    echo=lambda line: None)
    assert math.isnan(search.cell_cost().overhead_s)
    for i, (held, trained) in enumerate([(5.0, 0.1), (0.6, 0.2), (0.9, 0.3), (0.5, 0.2)]):
        key = (f"b{i}", Cell(2**i, 0))
        search.held_s[key], search.trained_s[key] = held, trained
    assert search.cell_cost().overhead_s == pytest.approx(0.4)  # median of 0.4, 0.6, 0.3


def test_a_cell_is_priced_for_the_trials_it_trains_the_reference_batch_once():
    """At the reference batch the linear and sqrt rules give one learning rate: that cell
    trains one trial, not two, and is priced so; the tuned rule trains every candidate."""
    config = {"convergence": {"strategy": "adaptive", "lr_rules": ["linear", "sqrt"],
                              "reference_batch_size": 32, "batch_sizes": [8, 32, 128]}}
    cost = driver.Search(parse_config(config), "t", "data", 1, echo=lambda line: None).cell_cost()
    assert cost.trainings == {8: 2, 32: 1, 128: 2}
    line = StepTimeFit(1e-3, 0.0, 1.0)
    priced = CellCost(line, 0.0, rules=2, trainings=cost.trainings)
    assert priced.device_s(32, 100) == pytest.approx(0.1)
    assert priced.device_s(8, 100) == pytest.approx(0.2)
    tuned = {"convergence": {**config["convergence"], "lr_rules": ["linear", "tuned"],
                             "lr_candidates": [0.01, 0.1, 1.0]}}
    assert driver.Search(parse_config(tuned), "t", "data", 1,
                  echo=lambda line: None).cell_cost().trainings == {8: 4, 32: 4, 128: 4}
