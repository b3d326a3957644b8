"""The batch-size schedule against a constant run at its own last batch (`constant_final`):
the fixed batch a user would otherwise jump to. The check gives the paired ratios, the card
names both constant batches, and a schedule that the last batch alone beats in steps without
costing more examples is not put on the card. The measurement itself runs these rows in
test_batch_schedule.py (the command's table passes its suite with them)."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from batchscale.batch_schedule import section
from batchscale.batch_schedule.check import FINAL_CONSTANT, check_summary
from clean_tables import critical_over_training_rows, schedule_check_rows


def with_final(steps: tuple[float, float], examples: tuple[float, float],
               reached: tuple[bool, bool] = (True, True)) -> pd.DataFrame:
    """The clean check (scheduled 371/372 steps, 8,100 examples) and constant runs at 64."""
    rows = schedule_check_rows()
    for seed in (0, 1):
        constant = next(r for r in rows if r["schedule"] == "constant" and r["seed"] == seed)
        rows.append({**constant, "schedule": FINAL_CONSTANT, "reference": False,
                     "batch_sizes": "64", "reached": reached[seed],
                     "diverged": not reached[seed],
                     "steps_to_target": steps[seed] if reached[seed] else math.nan,
                     "examples_to_target": examples[seed] if reached[seed] else math.nan})
    return pd.DataFrame(rows)


def findings(check: pd.DataFrame) -> section.Findings:
    return section.Findings.from_tables(pd.DataFrame(critical_over_training_rows()), check)


def test_the_schedule_is_set_against_a_constant_run_at_its_last_batch():
    check = with_final(steps=(412.0, 413.0), examples=(26_368.0, 26_432.0))
    final = check_summary(check)["final"]
    assert (final["batch_size"], final["runs"], final["reached"], final["paired"]) == (64, 2, 2, 2)
    assert final["steps_to_target"][0] == pytest.approx(math.sqrt(371 / 412 * 372 / 413))
    assert final["examples_to_target"][0] == pytest.approx(
        math.sqrt(8100 / 26_368 * 8100 / 26_432))
    found = findings(check)
    text = section.markdown(found, "w")
    assert ("Against a constant 64 from the first step (the schedule's last batch; 2 of 2 seeds "
            "reached the target): the schedule took 0.90 [") in text
    assert "take the constant" not in text
    assert "the schedule needed fewer steps than the constant 64 too." in text
    # The card names both fixed batches; the old caveat is gone.
    assert found.wins and "of a constant 64, its last batch" in section.answer_line(found)
    assert "no other fixed batch" not in section.answer_line(found)
    assert "of a constant 64, its last batch" in section.summary_line(found)


def test_a_schedule_its_last_batch_beats_is_not_put_on_the_card():
    """Fewer steps than the constant B0, but the constant 64 needs fewer steps still and no
    more examples: the schedule is no answer to take."""
    check = with_final(steps=(200.0, 205.0), examples=(8_100.0, 8_100.0))
    found = findings(check)
    assert check_summary(check)["steps_to_target"][2] < 1  # it beats the constant 8 ...
    assert not found.wins and section.answer_line(found) is None  # ... not the constant 64
    assert ("the constant 64 needed fewer steps, and the schedule no fewer examples: take the "
            "constant 64 rather than the schedule.") in section.markdown(found, "w")


def test_fewer_steps_at_the_last_batch_and_no_shown_saving_in_examples_is_a_verdict_too():
    """The constant 64 needs clearly fewer steps; the seeds disagree on examples: the schedule
    is not shown to save anything over it, and the text says what would tell."""
    check = with_final(steps=(200.0, 205.0), examples=(4_000.0, 20_000.0))
    found = findings(check)
    low, high = check_summary(check)["final"]["examples_to_target"][1:]
    assert low < 1 < high
    assert not found.wins and section.answer_line(found) is None
    assert ("the schedule is not shown to need fewer examples (more batch_schedule.check_seeds "
            "would tell): take the constant 64 rather than the schedule.") in section.markdown(
        found, "w")


def test_a_trade_of_steps_for_examples_is_named_as_one():
    check = with_final(steps=(200.0, 205.0), examples=(26_000.0, 26_500.0))
    found = findings(check)
    assert found.wins  # it still beats the constant 8, and saves examples against the 64
    assert ("the constant 64 needed fewer steps and the schedule fewer examples: the constant "
            "64 where device time costs most, the schedule where data does.") in section.markdown(
        found, "w")


def test_a_last_batch_that_never_reached_the_target_gives_no_ratio():
    check = with_final(steps=(0.0, 0.0), examples=(0.0, 0.0), reached=(False, False))
    found = findings(check)
    assert check_summary(check)["final"]["paired"] == 0
    assert ("A constant 64 from the first step (the schedule's last batch) reached the target in "
            "0 of 2 seeds, 2 diverged, none of them beside a scheduled run that reached it: no "
            "ratio to give.") in section.markdown(found, "w")
    assert found.wins  # what the schedule saves against the constant 8 still stands
    assert "no other fixed batch was run beside it" in section.answer_line(found)


def test_a_table_from_before_these_runs_reads_as_it_did():
    found = findings(pd.DataFrame(schedule_check_rows()))
    assert check_summary(pd.DataFrame(schedule_check_rows()))["final"] is None
    assert "Against a constant" not in section.markdown(found, "w")
    assert "(where it starts; no other fixed batch was run beside it)" in section.answer_line(found)


def test_a_schedule_not_shown_better_than_its_last_batch_stays_off_the_card():
    """Fewer steps than the constant B0, but against the constant 64 neither ratio's interval
    lies below 1: the simpler fixed batch is as good as far as the seeds tell."""
    check = with_final(steps=(300.0, 480.0), examples=(6_000.0, 11_000.0))
    found = findings(check)
    final = check_summary(check)["final"]
    assert final["steps_to_target"][1] < 1 < final["steps_to_target"][2]
    assert final["examples_to_target"][1] < 1 < final["examples_to_target"][2]
    assert not found.wins and section.answer_line(found) is None
    assert ("neither is shown to need fewer steps than the other (more "
            "batch_schedule.check_seeds would tell), so the simpler constant 64 is as good an "
            "answer as far as these seeds show.") in section.markdown(found, "w")


def test_a_verdict_from_one_seed_says_it_has_no_interval_behind_it():
    check = with_final(steps=(200.0, 205.0), examples=(26_000.0, 26_500.0))
    found = findings(check[check["seed"] == 0])
    assert ("examples; from one seed, with no interval to show it: the constant 64 needed fewer "
            "steps and the schedule fewer examples") in section.markdown(found, "w")
