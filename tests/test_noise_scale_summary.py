"""The summary of the gradient noise scale over trials (batchscale/analysis/parallel.py): a
final estimate ≤ 0 is a failed estimate, left out and counted; the median comes with the
trials' spread."""

from __future__ import annotations

import math

import pandas as pd

from batchscale.analysis.noise_text import b_simple_text
from batchscale.analysis.parallel import noise_scale


def _runs(values: dict[str, tuple[int, float]]) -> pd.DataFrame:
    return pd.DataFrame([{"trial_id": tid, "batch_size": batch, "b_simple": b}
                         for tid, (batch, b) in values.items()])


def test_negative_final_estimates_are_left_out_and_counted():
    """From a user's run: b16 seed 0 ended at −1.85 beside seed 1's 1,810.9."""
    runs = _runs({"a": (16, -1.85), "b": (16, 1810.9), "c": (32, 20.0), "d": (32, 30.0),
                  "e": (64, 40.0)})
    by_batch, summary = noise_scale(runs, pd.DataFrame())
    assert (summary.trials, summary.dropped) == (4, 1)
    assert summary.b_simple_median == 35.0
    assert (summary.quartile_low, summary.quartile_high) == (27.5, 482.725)
    # The failed estimate does not pull its batch's median, nor widen its range.
    assert by_batch.loc[16].to_dict() == {"median": 1810.9, "low": 1810.9, "high": 1810.9,
                                          "trials": 1}
    assert by_batch.loc[32].to_dict() == {"median": 25.0, "low": 20.0, "high": 30.0,
                                          "trials": 2}
    text = b_simple_text(summary)
    assert "median 35 over 4 trials (half of them between 27.5 and 483)" in text
    assert text.endswith("; 1 more trial left out: 1 ended with an estimate ≤ 0 (the gradient "
                         "noise swamped |G|²).")


def test_trials_that_recorded_no_estimate_are_counted_with_the_failed_ones():
    """From a user's GRU: 7 estimates, one ≤ 0 and two trials whose runs rows record none (the
    training records none where |G|² ≤ 0): all ten trials accounted for."""
    trials = {f"t{i}": (16 * 2 ** (i % 3), 10.0 + i) for i in range(7)}
    trials |= {"neg": (16, -2.0), "none1": (16, math.nan), "none2": (32, math.nan)}
    _, summary = noise_scale(_runs(trials), pd.DataFrame())
    assert (summary.trials, summary.dropped, summary.unrecorded) == (7, 1, 2)
    assert ("; 3 more trials left out: 1 ended with an estimate ≤ 0 and 2 recorded none (the "
            "gradient noise swamped |G|², or the trial ended before its first estimate).") \
        in b_simple_text(summary)


def test_only_failed_estimates_give_no_figure():
    _, summary = noise_scale(_runs({"a": (16, -3.0), "b": (32, 0.0)}), pd.DataFrame())
    assert math.isnan(summary.b_simple_median) and summary.dropped == 2
    assert b_simple_text(summary).startswith("Not available: every trial's final estimate (2)")


def test_the_rules_shared_reference_trial_counts_once():
    """At the reference batch the linear and sqrt rules give the same learning rate: their
    trials there are one measurement under two ids, and count once."""
    rows = [{"trial_id": f"{rule}-{batch}", "lr_rule": rule, "batch_size": batch, "lr": lr,
             "seed": 0, "workers": 1, "b_simple": value}
            for rule, batch, lr, value in [("linear", 32, 0.1, 50.0), ("sqrt", 32, 0.1, 50.0),
                                           ("linear", 64, 0.2, 70.0), ("sqrt", 64, 0.14, 90.0)]]
    by_batch, summary = noise_scale(pd.DataFrame(rows), pd.DataFrame())
    assert summary.trials == 3 and summary.b_simple_median == 70.0
    assert by_batch.loc[32, "median"] == 50.0 and by_batch.loc[32, "trials"] == 1


def test_the_b_simple_plot_says_how_many_failed_estimates_its_log_axis_leaves_out():
    from batchscale.analysis.plots import _failed_estimates

    curves = pd.DataFrame({"b_simple": [12.0, -3.0, 40.0, 0.0, None]})
    assert _failed_estimates(curves) == (" (2 of 4 estimates ≤ 0, failed where the noise swamped "
                                         "|G|², are not shown)")
    assert _failed_estimates(pd.DataFrame({"b_simple": [1.0]})) == ""
    assert _failed_estimates(pd.DataFrame()) == ""


def test_no_b_simple_at_all_says_why_it_can_be_missing():
    runs = pd.DataFrame([{"trial_id": "a", "batch_size": 16, "b_simple": None}])
    by_batch, summary = noise_scale(runs, pd.DataFrame())
    assert by_batch.empty and math.isnan(summary.b_simple_median)
    assert b_simple_text(summary).startswith(
        "Not available: no B_simple recorded with the runs (a table from elsewhere seldom has one")
    assert "which a TrainingLoop on one worker lacks: run it on two workers" in summary.reason


def test_diverged_trials_give_no_noise_scale():
    """A user's runs at a learning rate that blew up by step 7: their last estimates (68 here)
    are a model blowing up, not the noise scale of a training that reaches the target."""
    runs = _runs({"a": (16, 68.1), "b": (64, 70.0), "c": (64, 30.0)}).assign(
        status=["diverged", "diverged", "reached"])
    curves = pd.DataFrame({"trial_id": ["a", "b"], "batch_size": [16, 64], "step": [6, 7],
                           "b_simple": [68.1, 70.0]})
    by_batch, summary = noise_scale(runs, curves)
    assert summary.trials == 1 and summary.b_simple_median == 30.0
    assert list(by_batch.index) == [64] and by_batch.loc[64, "trials"] == 1
    _, none = noise_scale(runs.iloc[:2], curves)
    assert math.isnan(none.b_simple_median)
    assert none.reason.startswith("every trial diverged (2): a diverging run's gradients")


def test_the_noise_scale_is_judged_against_the_fitted_b_crit():
    """A user's GRU: B_simple median 18.6 beside B_crit 79.3 [70.1, 90.5]: the report says the
    predictor is off there, not only the two numbers in separate lines."""
    from types import SimpleNamespace

    from batchscale.analysis.noise_text import against_b_crit
    from batchscale.analysis.summary import NoiseScaleSummary

    noise = NoiseScaleSummary(18.6, 7, "")
    fit = SimpleNamespace(b_crit=79.3, b_crit_low=70.1, b_crit_high=90.5, bound="")
    assert against_b_crit(noise, {"sqrt": fit}) == (
        " It lies outside B_crit's 90% interval (below sqrt: 70.1–90.5, 0.23× the fit): as a "
        "predictor it is off there by more than the fit's uncertainty, so go by the fitted "
        "B_crit (McCandlish et al. 2018 give B_simple as a rough guide to it).")
    near = SimpleNamespace(b_crit=20.0, b_crit_low=15.0, b_crit_high=25.0, bound="")
    assert against_b_crit(noise, {"linear": near, "sqrt": fit}) == (
        " It lies inside B_crit's 90% interval (linear: 15–25): the two agree; and outside it "
        "(below sqrt: 70.1–90.5, 0.23× the fit): as a predictor it is off there by more than "
        "the fit's uncertainty, so go by the fitted B_crit (McCandlish et al. 2018 give "
        "B_simple as a rough guide to it).")
    bound = SimpleNamespace(b_crit=math.nan, b_crit_low=math.nan, b_crit_high=math.nan,
                            bound="above")
    assert against_b_crit(noise, {"sqrt": bound}) == ""
