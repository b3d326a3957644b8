"""The recommendation card counts what it measured at its own cell: seeds of one (LR rule, batch,
workers) cell, the learning rates tried there and what became of them, and a time band from the
runs' measured times to target (analysis/expected.py, analysis/recommend.py). Known answers on
hand-made tables, in the shapes users brought."""

from __future__ import annotations

import pandas as pd
from test_analyze import run_row

from batchscale.analysis.analyze import analyze
from batchscale.analysis.expected import expected_text, steps_spread, versus_current
from batchscale.analysis.recommend import learning_rate, recommend
from batchscale.config import AnalysisConfig


def cell_table(cells: list[tuple[str, int, float, float]]) -> pd.DataFrame:
    """The analysis's cell table: (rule, batch, steps to target, step time in s)."""
    table = pd.DataFrame(cells, columns=["lr_rule", "batch_size", "steps_to_target",
                                         "step_time_s"])
    return table.assign(time_to_target_s=table["steps_to_target"] * table["step_time_s"])


# --------------------------------------------------------------------------- seeds, not runs


def combined_runs() -> pd.DataFrame:
    """1-worker runs joined with --workers 2 runs at batch 64 (seeds 0 and 1 each), and the
    1-worker runs at today's batch 16."""
    return pd.DataFrame(
        [run_row(64, "linear", 0.1, seed, 40, workers=workers, time=time)
         for workers, times in ((1, (0.050, 0.052)), (2, (0.060, 0.062)))
         for seed, time in enumerate(times)]
        + [run_row(16, "linear", 0.025, seed, 100, time=time)
           for seed, time in enumerate((0.090, 0.094))]
    )


def test_runs_with_another_worker_count_are_not_more_seeds():
    runs = combined_runs()
    assert steps_spread(runs, "linear", 64).seeds == 2
    assert steps_spread(runs, "linear", 64, workers=2).seeds == 2
    text = expected_text(runs, cell_table([("linear", 64, 40, 1.25e-3)]), "linear", 64)
    assert text.startswith("40 steps [40, 40] over 2 seeds with 1 worker;")
    assert "4 seeds" not in text and "over 4" not in text


def test_the_card_of_joined_worker_runs_counts_two_seeds_end_to_end():
    """`batchscale analyze combined_runs.parquet --current-batch-size 16`, as the user ran it."""
    result = analyze(None, combined_runs(), None, AnalysisConfig(current_batch_size=16))
    card = result.summary.recommendation
    assert card.batch_size == 64 and card.learning_rate == 0.1
    assert card.learning_rate_reason.startswith(
        "what the linear rule gave at batch 64 in all 2 reached runs")
    assert "over 2 seeds" in card.expected and "4 seeds" not in card.expected
    assert "4 reached runs" not in result.markdown and "over 4 seeds" not in result.markdown


def test_the_expectation_follows_the_recommended_worker_count():
    runs = combined_runs()
    table = cell_table([("linear", 64, 40, 1.25e-3), ("linear", 16, 100, 9.2e-4)])
    text = expected_text(runs, table, "linear", 64, workers=2)
    assert text.startswith("40 steps [40, 40] over 2 seeds with 2 workers; 0.061 s of training "
                           "[0.06, 0.062] over 2 seeds")


def test_runs_that_are_not_one_per_seed_are_counted_as_runs():
    """No seed recorded (a user's table): the count says runs, never seeds."""
    runs = pd.DataFrame([run_row(64, "linear", 0.1, seed, steps)
                         for seed, steps in enumerate((38, 40, 44))]).drop(columns="seed")
    spread = steps_spread(runs, "linear", 64)
    assert (spread.seeds, spread.counted) == (3, "run")
    assert spread.text(" steps") == "40 steps [38, 44] over 3 runs"


def test_the_tuned_expectation_is_of_the_recommended_learning_rate_only():
    """Three learning rates reached at batch 64, one seed each: not "3 seeds" of one LR."""
    runs = pd.DataFrame([run_row(64, "tuned", lr, 0, steps)
                         for lr, steps in ((0.05, 150), (0.2, 120), (0.8, 300))])
    table = cell_table([("tuned", 64, 120, 1e-3)])
    choice = recommend(table, runs)
    assert choice.learning_rate == 0.2
    assert choice.expected.startswith("120 steps (one seed: no spread)")
    assert steps_spread(runs, "tuned", 64).text(" steps") == "150 steps [120, 300] over 3 runs"


# --------------------------------------------------------------------------- the LRs tried


def tuned_at_32(statuses_of_200: tuple[str, ...] = ("diverged", "diverged")) -> pd.DataFrame:
    """`--lr-candidates 0.05 200` at batch 32: 0.05 reached on both seeds, 200 did not."""
    return pd.DataFrame(
        [run_row(32, "tuned", 0.05, seed, 60) for seed in (0, 1)]
        + [run_row(32, "tuned", 200.0, seed, 3, status=status)
           for seed, status in enumerate(statuses_of_200)]
    )


def test_a_learning_rate_that_diverged_is_named_not_denied():
    lr, reason = learning_rate(tuned_at_32(), "tuned", 32)
    assert lr == 0.05
    assert reason == ("the only one that reached the target at batch 32; 200 was tried and "
                      "diverged (all 2 runs)")
    assert "none other" not in reason


def test_the_card_says_what_each_failed_learning_rate_did():
    _, reason = learning_rate(tuned_at_32(("diverged", "not_reached")), "tuned", 32)
    assert reason.endswith("; 200 was tried: 1 run diverged, 1 run did not reach the target")
    recommended = recommend(cell_table([("tuned", 32, 60, 1e-3)]), tuned_at_32())
    assert recommended.learning_rate_reason.startswith(
        "the only one that reached the target at batch 32; 200 was tried and diverged")


def test_the_fewest_steps_choice_counts_only_the_learning_rates_that_reached():
    runs = pd.concat([tuned_at_32(), pd.DataFrame([run_row(32, "tuned", 0.1, 0, 50)])])
    lr, reason = learning_rate(runs, "tuned", 32)
    assert lr == 0.1
    assert reason == ("the learning rate of the fewest steps at batch 32 among the 2 that "
                      "reached the target; 200 was tried and diverged (all 2 runs)")


# --------------------------------------------------------------------------- the time band


def tied_runs(times_64=(0.0493, 0.0522), times_16=(0.090, 0.095)) -> pd.DataFrame:
    """Two seeds that tie on steps at batch 64 (40) and at batch 16 (80), with their measured
    times to target."""
    return pd.DataFrame(
        [run_row(64, "linear", 0.1, seed, 40, time=t) for seed, t in enumerate(times_64)]
        + [run_row(16, "linear", 0.025, seed, 80, time=t) for seed, t in enumerate(times_16)]
    )


TIED_TABLE = cell_table([("linear", 64, 40, 0.0506 / 40), ("linear", 16, 80, 0.0935 / 80)])


def test_tied_steps_do_not_make_a_zero_width_time_band():
    """The table's 0.0506 s, with the seeds' measured spread around it: 0.0493 and 0.0522
    are −2.9 % and +2.9 % of their median 0.05075."""
    text = expected_text(tied_runs(), TIED_TABLE, "linear", 64)
    assert "[0.0506, 0.0506]" not in text
    assert text.endswith("; 0.0506 s of training [0.0492, 0.052] over 2 seeds")


def test_the_saving_in_time_takes_its_band_from_the_measured_times():
    text = versus_current(tied_runs(), TIED_TABLE, "linear", 64, 16)
    # the table's times 0.0506 / 0.0935 = 0.54; each with its seeds' spread around it
    # (64: 0.0492–0.0520; 16: 0.0910–0.0960), the band is 0.0492/0.0960 .. 0.0520/0.0910
    assert text.endswith("0.50× [0.50, 0.50] the steps and 0.54× [0.51, 0.57] the training time")


def test_one_run_says_its_time_has_no_spread():
    text = expected_text(tied_runs(times_64=(0.0493,)), TIED_TABLE, "linear", 64)
    # the table's figure, as beside the card
    assert text == "40 steps (one seed: no spread); 0.0506 s of training (one seed: no spread)"


def test_without_measured_times_the_time_says_its_spread_is_unknown():
    runs = tied_runs().drop(columns="time_to_target_s")
    text = expected_text(runs, TIED_TABLE, "linear", 64)
    assert text == ("40 steps [40, 40] over 2 seeds; 0.0506 s of training (steps × one step "
                    "time: the runs record no time to target, so its spread is unknown)")
    against = versus_current(runs, TIED_TABLE, "linear", 64, 16)
    assert against.endswith("0.54× the training time (steps × one step time: the runs record "
                            "no time to target, so its spread is unknown)")


def test_a_learning_rate_next_to_one_that_failed_says_so():
    """The linear rule reached at 128 (lr 0.2) on both seeds, and at 256 (lr 0.4) on one."""
    runs = pd.DataFrame([run_row(128, "linear", 0.2, seed, 60) for seed in (0, 1)]
                        + [run_row(256, "linear", 0.4, 0, 50),
                           run_row(256, "linear", 0.4, 1, 500, status="not_reached")])
    table = cell_table([("linear", 128, 60, 1e-3), ("linear", 256, 50, 1.5e-3)])
    card = recommend(table, runs, current=(None, 0.05))
    assert (card.batch_size, card.learning_rate) == (128, 0.2)
    assert card.learning_rate_reason.endswith(
        "; 4× your current 0.05; at batch 256, the next the rule ran (learning rate 0.4), 1 of 2 "
        "runs did not reach the target: the rule's next learning rate did not train every "
        "seed, so this one sits near its edge")
    alone = recommend(table[table["batch_size"] == 128], runs[runs["batch_size"] == 128])
    assert "edge" not in alone.learning_rate_reason
    # the constant rule's next batch has the same learning rate: nothing to say of it
    constant = runs.assign(lr_rule="constant", lr=0.2)
    card = recommend(table.assign(lr_rule="constant"), constant)
    assert card.batch_size == 128 and "edge" not in card.learning_rate_reason


def test_the_tuned_expectation_is_on_its_own_learning_rate_steps():
    """The table's tuned cell is the LR of the fewest median steps (0.1: 245); the card's LR is
    the single fastest run's (0.4: 90 and 400 steps, median 245 as well here, but its own
    times): the time is that LR's median steps × the batch's step time, not the other LR's."""
    runs = pd.DataFrame([run_row(64, "tuned", 0.1, seed, steps, time=steps * 0.01)
                         for seed, steps in enumerate((240, 250))]
                        + [run_row(64, "tuned", 0.4, seed, steps, time=steps * 0.01)
                           for seed, steps in enumerate((90, 500))])
    table = cell_table([("tuned", 64, 245, 0.01)])
    text = expected_text(runs, table, "tuned", 64, lr=0.4)
    assert text.startswith("295 steps [90, 500] over 2 seeds; 2.95 s of training [0.9, 5]"), text


def test_a_step_time_from_the_sweeps_line_past_the_batches_it_timed_is_flagged_extrapolated():
    """A table from elsewhere: the sweep timed batches 32 and 64, the runs go to 4,096. The
    card's batch sits where only the line t(B) gives a step time: it says so, and how far."""
    from batchscale.analysis.analyze import analyze
    from batchscale.analysis.recommend import extrapolated_text
    from batchscale.config import AnalysisConfig

    batches = [32, 64, 128, 256, 512, 1024, 2048, 4096]
    runs = pd.DataFrame([{"trial_id": f"t{b}", "batch_size": b, "lr_rule": "sqrt", "lr": 0.1,
                          "seed": 0, "workers": 1, "status": "reached",
                          "steps_to_target": round(2000 * (1 + 500 / b))} for b in batches])
    sweep = pd.DataFrame([{"input_mode": "synthetic", "batch_size": b, "status": "ok",
                           "step_time_median_s": 0.05 + 0.0002 * b} for b in (32, 64)])
    result = analyze(sweep, runs, None, AnalysisConfig(bootstrap_samples=20))
    card = result.summary.recommendation
    assert card.batch_size > 64
    assert ("— EXTRAPOLATED: the sweep timed batches 32–64 only, so this step time is its line "
            f"t(B) {card.batch_size / 64:.2g}× past them") in card.batch_reason
    inside = pd.Series({"batch_size": 48, "step_time_source": "sweep_fit",
                        "sweep_timed_low": 32.0, "sweep_timed_high": 64.0})
    assert extrapolated_text(inside) == ""  # between the batches timed: interpolated
    below = inside.copy()
    below["batch_size"] = 8
    assert "4× past them" in extrapolated_text(below)
    measured = inside.copy()
    measured["step_time_source"], measured["batch_size"] = "sweep", 128
    assert extrapolated_text(measured) == ""
