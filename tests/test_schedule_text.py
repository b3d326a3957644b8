"""What a batch-size schedule tells a user who applies it: each stage's learning rate, how far
an unreached reference run got, a reference run judged on the same evaluations as every run
it is compared with, and a plot that leaves a gap where the table shows no B_simple."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from batchscale.batch_schedule import measure, section
from batchscale.batch_schedule.measure import Target
from batchscale.batch_schedule.plot import _draw
from clean_tables import critical_over_training_rows, schedule_check_rows


def findings(crit: list[dict] | None = None, check: list[dict] | None = None):
    return section.Findings.from_tables(pd.DataFrame(crit or critical_over_training_rows()),
                                        pd.DataFrame(check or schedule_check_rows()))


def test_every_stage_names_the_learning_rate_it_trains_at():
    found = findings()
    assert found.schedule_text() == "8 at LR 0.05, 64 from val_loss 2.400 at LR 0.141"
    text = section.markdown(found, "w")
    assert ("**Schedule**: 8 at LR 0.05, 64 from val_loss 2.400 at LR 0.141. Each batch trains "
            "at the sqrt rule's peak learning rate") in text
    assert "the warm-up runs once, from the first step" in text
    assert "at LR 0.141" in section.answer_line(found)


def test_rows_written_before_the_learning_rates_were_recorded_read_without_them():
    old = [{k: v for k, v in r.items() if k not in ("base_batch_lr", "scheduled_lr")}
           for r in critical_over_training_rows()]
    found = findings(crit=old)
    assert found.schedule_text() == "8, 64 from val_loss 2.400"
    assert "peak learning rate" not in section.markdown(found, "w")


def test_an_unreached_target_says_how_far_the_reference_got_and_what_to_change():
    reference = {**next(r for r in schedule_check_rows() if r["reference"]),
                 "reached": False, "steps_to_target": math.nan, "examples_to_target": math.nan,
                 "steps_run": 400, "final_metric": 2.31, "target_metric": "val_loss"}
    text = section.markdown(findings(check=[reference]), "w")
    assert ("**Check**: not run, so the schedule above is untested — the reference run did not "
            "reach the target within batch_schedule.max_steps (it stopped at step 400 with "
            "val_loss 2.31, the target being 2), so there is no constant run to compare with. "
            "Raise batch_schedule.max_steps, or set a target the reference run reaches.") in text


def test_the_reference_run_reaches_its_target_on_the_check_runs_evaluation_grid_only():
    """An extra evaluation at a checkpoint or milestone (step 30) that meets the target does not
    count: every run of the check evaluates every 25 steps only, and the reference must not
    get more chances to cross the target than the runs it is set against."""
    curve = [{"step": s, "examples": 8 * s, "train_time_s": 0.01 * s, "batch_size": 8,
              "val_loss": 1.0, "val_accuracy": acc}
             for s, acc in ((0, 0.1), (25, 0.80), (30, 0.87), (50, 0.84), (75, 0.90))]
    target = Target("val_accuracy", 0.85)
    every = measure.to_target(curve, target)
    on_grid = measure.to_target(measure.on_grid(curve, 25), target)
    assert every["steps_to_target"] < 30  # the extra evaluation would have counted
    assert 50 < on_grid["steps_to_target"] < 75 and on_grid["reached"]


def test_the_plot_leaves_a_gap_where_no_b_simple_estimate_was_made():
    curve = [{"examples": x, "b_simple": b}
             for x, b in ((100, 50.0), (800, None), (1600, -3.0), (2400, 40.0))]
    fig = _draw(findings(), curve)
    line = next(ln for ln in fig.axes[0].get_lines() if ln.get_label().startswith("B_simple"))
    ys = np.asarray(line.get_ydata(), dtype=float)
    assert list(np.isnan(ys)) == [False, True, True, False]


def test_the_command_takes_the_training_settings_converge_takes():
    """--lr-rules, --base-lr and --target on the command line, as `converge` takes them; a
    user need not write a config for them."""
    from batchscale.cli import build_parser
    from batchscale.cli.schedule_cmd import schedule_config

    args = build_parser().parse_args([
        "batch-schedule", "--workload", "digits-mlp", "--lr-rules", "sqrt", "--base-lr", "0.2",
        "--target", "val_accuracy=0.9", "--out", "x"])
    cfg = schedule_config(args)
    assert cfg.convergence.lr_rules == ["sqrt"] and cfg.convergence.base_lr == 0.2
    assert [(t.metric, t.value) for t in cfg.convergence.resolved_targets()] == [
        ("val_accuracy", 0.9)]


def test_an_interval_cut_where_the_fit_stops_and_a_stage_on_a_bound_are_said():
    """A checkpoint whose interval's top reaches the fit's limit reads "≥" in the table with
    a note saying why; the stage chosen at a checkpoint that gave only a bound is named as
    what puts the prediction at its range's top; the examples carry their range."""
    from batchscale.analysis.critical import TOP_CUT

    crit = critical_over_training_rows()
    crit[0]["b_crit_interval_note"] = (f"{TOP_CUT} 128, 2× the largest batch measured: B_crit "
                                       "may lie higher")
    text = section.markdown(findings(crit=crit), "w")
    assert "| 13 [5.3, ≥ 25.5] |" in text
    assert "An interval end marked ≥ (≤) is cut where the fit stops" in text
    assert "9,122 examples [8,100, 9,700] against" in text
    assert ("A stage rests on a bound, not a number, at step 300 (B_crit above 64): the "
            "estimate takes B_crit at the bound") in text
    plain = section.markdown(findings(), "w")
    assert "≥" not in plain and "is cut where the fit stops" not in plain
