"""Studies without running them: the `study:` section expanded into variants, the variants'
datasets (training subset, label noise) and models, the slope fit on known answers, and the
answer's sentences. The whole study runs end to end in tests/test_pipeline.py."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest

from batchscale.config import config_from_json, parse_config
from batchscale.config.variants import expand, study_id_of, variant_run_id
from batchscale.data.prep import noisy_labels, split_indices, train_rows
from batchscale.envinfo import environment
from batchscale.errors import BadInput
from batchscale.study.answer import answer_markdown, golmant_answer, kind_of
from batchscale.study.compare import axis_rows
from batchscale.study.slopes import AxisPoint, fit_slopes
from batchscale.workloads import get_workload
from helpers import run_cli

STUDY = {"study": {"axes": {"dataset_fraction": [0.25, 1.0], "model": ["digits-mlp",
                                                                       "digits-mlp-wide"]}}}


# ------------------------------------------------------------------ config and expansion
def test_axes_expand_to_their_product_each_a_valid_experiment():
    variants = expand(parse_config(STUDY))
    assert [v.name for v in variants] == [
        "fraction0.25_digits-mlp", "fraction0.25_digits-mlp-wide", "fraction1_digits-mlp",
        "fraction1_digits-mlp-wide"]
    wide = variants[1].config
    assert wide.workload == "digits-mlp-wide" and wide.dataset.train_fraction == 0.25
    assert wide.variant == variants[1].name and not wide.study.is_study


def test_variants_do_not_depend_on_the_order_axes_are_written_in():
    """The config's JSON (what a cluster's components and the comparison read) sorts keys: the
    variants, their names and their order must be the same from it as from the file."""
    cfg = parse_config({"study": {"axes": {"model": ["digits-mlp", "digits-mlp-wide"],
                                           "dataset_fraction": [0.5, 1.0]}}})
    names = [v.name for v in expand(cfg)]
    assert names == [v.name for v in expand(config_from_json(cfg.to_json()))]
    assert names[0] == "fraction0.5_digits-mlp"


def test_explicit_variants_keep_the_base_value_of_axes_they_leave_out():
    cfg = parse_config({"dataset": {"train_label_noise": 0.1},
                        "study": {"axes": {"label_noise": [0.1, 0.3], "convergence.base_lr":
                                           [0.05, 0.1]},
                                  "variants": [{}, {"label_noise": 0.3},
                                               {"convergence.base_lr": 0.1}]}})
    values = [v.values for v in expand(cfg)]
    assert values == [{"label_noise": 0.1, "convergence.base_lr": 0.05},
                      {"label_noise": 0.3, "convergence.base_lr": 0.05},
                      {"label_noise": 0.1, "convergence.base_lr": 0.1}]
    assert expand(cfg)[2].config.convergence.base_lr == 0.1


@pytest.mark.parametrize("study, message", [
    ({"axes": {"dataset.nope": [1, 2]}}, "'dataset.nope' is not a config key a study can vary"),
    ({"axes": {"convergence.base_lrr": [0.1, 0.2]}},
     "'convergence.base_lrr' is not a config key a study can vary (did you mean "
     "'convergence.base_lr'?)"),
    ({"axes": {"dataset_fraction": [0.5]}, "variants": [{"dataset_fracton": 0.5}]},
     "'dataset_fracton' is not an axis (did you mean 'dataset_fraction'?)"),
    ({"axes": {"kubernetes.namespace": ["a", "b"]}}, "is not a config key a study can vary"),
    ({"axes": {"dataset_fraction": [0.5, 1.5]}}, "dataset.train_fraction"),
    ({"axes": {"model": ["digits-mlp", "nonexistent-net"]}}, "unknown workload"),
    ({"axes": {"dataset_fraction": []}}, "has no values"),
    ({"axes": {"dataset_fraction": [0.5, 0.5]}}, "repeats a value"),
    ({"axes": {"dataset_fraction": [0.5]}, "variants": [{"label_noise": 0.1}]},
     "'label_noise' is not an axis"),
    ({"axes": {"dataset_fraction": [0.5]}, "variants": [{"dataset_fraction": 0.7}]},
     "not one of the axis's values"),
    ({"axes": {"dataset_fraction": [0.5, 1.0]}, "variants": [{}, {"dataset_fraction": 1.0}]},
     "repeats an earlier variant"),
    ({"axes": {"dataset_fraction": [0.5], "dataset.train_fraction": [1.0]}},
     "two axes set the same config key"),
    ({"axes": {"label_noise": [0.001, "1e-3"]}}, "repeats an earlier one once its values"),
])
def test_a_bad_study_is_refused_naming_the_problem(study, message):
    with pytest.raises(BadInput, match="invalid config") as err:
        parse_config({"study": study})
    assert message in str(err.value)


def test_label_noise_is_refused_for_data_without_class_labels():
    with pytest.raises(BadInput, match="train_label_noise: dataset 'python-docs' has no class"):
        parse_config({"workload": "byte-lstm", "dataset": {"name": "python-docs",
                                                           "train_label_noise": 0.1}})


def test_variant_run_ids_give_back_their_study_id():
    run_id = variant_run_id("20261201T000000Z-abc", "fraction0.25_digits-mlp")
    assert run_id == "20261201T000000Z-abc-fraction0.25_digits-mlp"
    assert study_id_of(run_id, "fraction0.25_digits-mlp") == "20261201T000000Z-abc"
    assert study_id_of(run_id, None) is None
    assert study_id_of("other-run", "fraction0.25_digits-mlp") is None
    env = environment(run_id=run_id, config_hash="h", experiment="e", workload="w",
                      variant="fraction0.25_digits-mlp")
    assert (env["study_id"], env["variant"]) == ("20261201T000000Z-abc",
                                                 "fraction0.25_digits-mlp")


# ------------------------------------------------------------------ the variants' data, models
def test_a_smaller_training_fraction_is_a_subset_and_validation_does_not_change():
    full = split_indices(1797, 0.2, 0)
    half = split_indices(1797, 0.2, 0, train_fraction=0.5)
    assert np.array_equal(full["val"], half["val"])
    assert set(half["train"]) < set(full["train"])
    assert len(half["train"]) == train_rows(1797, 0.2, 0.5) == round(len(full["train"]) / 2)


def test_label_noise_replaces_its_share_and_more_noise_a_superset():
    labels = np.arange(20000) % 10
    low, high = (noisy_labels(labels, 10, noise, seed=3) for noise in (0.1, 0.3))
    changed_low, changed_high = labels != low, labels != high
    # A replaced label is a random class: it stays the same one time in ten.
    assert changed_low.mean() == pytest.approx(0.1 * 0.9, abs=0.01)
    assert changed_high.mean() == pytest.approx(0.3 * 0.9, abs=0.015)
    assert not (changed_low & ~changed_high).any()
    assert noisy_labels(labels, 10, 0.0, seed=3) is labels


def test_the_mlp_widths_are_models_of_different_sizes():
    def count(name):
        return sum(p.numel() for p in get_workload(name).build().parameters())

    assert [count(n) for n in ("digits-mlp-narrow", "digits-mlp", "digits-mlp-wide")] == [
        64 * 32 + 32 + 32 * 32 + 32 + 32 * 10 + 10, 26_122,
        64 * 512 + 512 + 512 * 512 + 512 + 512 * 10 + 10]


# ------------------------------------------------------------------ slopes: known answers
def _power_law_points(exponents: dict[str, float], grid: dict[str, list[float]],
                      ratio: float = 1.3) -> list[AxisPoint]:
    """B_crit = 100 · Π x^exponent at every combination, each with a ×ratio interval."""
    points = []
    for combo in pd.MultiIndex.from_product(list(grid.values())):
        x = dict(zip(grid, combo, strict=True))
        b = 100 * math.prod(x[a] ** exponents[a] for a in grid)
        points.append(AxisPoint(x, b, b / ratio, b * ratio))
    return points


def test_slopes_recover_the_exponents_of_a_power_law():
    grid = {"fraction": [0.25, 0.5, 1.0], "parameters": [3e3, 3e4, 3e5]}
    slopes = fit_slopes(_power_law_points({"fraction": 0.5, "parameters": 0.0}, grid),
                        list(grid))
    fraction, size = slopes
    assert fraction.slope == pytest.approx(0.5) and fraction.verdict == "grows"
    assert fraction.slope_low < 0.5 < fraction.slope_high
    assert fraction.range_factor == pytest.approx(4 ** 0.5)
    assert size.slope == pytest.approx(0.0, abs=1e-9) and size.verdict == "no detectable change"
    assert size.slope_low < 0 < size.slope_high


def test_a_one_axis_at_a_time_design_separates_the_axes():
    base = {"fraction": 1.0, "noise": 0.0}
    design = [base, {**base, "fraction": 0.25}, {**base, "fraction": 0.5},
              {**base, "noise": 0.2}]
    points = [AxisPoint(x, 50 * x["fraction"] ** -0.7 * math.exp(4 * x["noise"]),
                        1, 1) for x in design]
    points = [AxisPoint(p.x, p.b_crit, p.b_crit / 1.2, p.b_crit * 1.2) for p in points]
    fraction, noise = fit_slopes(points, ["fraction", "noise"])
    assert fraction.slope == pytest.approx(-0.7) and fraction.verdict == "shrinks"
    assert noise.x_scale == "linear" and noise.slope == pytest.approx(4.0)


def test_axes_the_data_cannot_separate_are_not_fitted_with_the_reason():
    same = [AxisPoint({"a": 1.0}, 10, 8, 12), AxisPoint({"a": 1.0}, 11, 9, 13)]
    assert fit_slopes(same, ["a"])[0].verdict.startswith("not fitted: the variants with a "
                                                         "B_crit interval take one value")
    together = [AxisPoint({"a": v, "b": 2 * v}, 10 * v, 9 * v, 11 * v) for v in (1.0, 2.0, 4.0)]
    assert all("do not separate the axes" in s.verdict for s in fit_slopes(together, ["a", "b"]))
    bound_only = [AxisPoint({"a": 1.0}, 10, 8, 12), AxisPoint({"a": 2.0}, math.nan, math.nan,
                                                                math.nan)]
    verdict = fit_slopes(bound_only, ["a"])[0].verdict
    assert "1 variant(s) without a B_crit interval inside the measured batches left out" in verdict
    none = fit_slopes(bound_only[1:], ["a"])[0].verdict
    assert none.startswith("not fitted: no variant has a B_crit interval inside")
    cut = [AxisPoint({"a": 1.0}, 10, 8, 12), AxisPoint({"a": 2.0}, 20, 5, 40, False)]
    assert "1 variant(s) without" in fit_slopes(cut, ["a"])[0].verdict


# ------------------------------------------------------------------ the answer
def _study_frame() -> pd.DataFrame:
    rows = []
    for fraction, model, params, b in ((0.25, "digits-mlp", 26122, 40.0),
                                       (1.0, "digits-mlp", 26122, 42.0),
                                       (1.0, "digits-mlp-wide", 301066, 160.0)):
        rows.append({"variant": f"{fraction}-{model}", "target_metric": "val_accuracy",
                     "target_value": 0.9, "lr_rule": "sqrt", "parameters": params,
                     "axis_values": json.dumps({"dataset_fraction": fraction, "model": model}),
                     "b_crit": b, "b_crit_low": b / 1.15, "b_crit_high": b * 1.15})
    return pd.DataFrame(rows)


def test_the_answer_says_which_axis_moved_b_crit_with_numbers():
    study = _study_frame()
    axes = pd.DataFrame(axis_rows(study, ["dataset_fraction", "model"]))
    fraction, model = axes.to_dict("records")
    assert fraction["verdict"] == "no detectable change" and model["verdict"] == "grows"
    assert model["x_name"] == "parameters" and model["x_scale"] == "log"
    text = answer_markdown(study, axes)
    assert "**dataset_fraction**: no detectable change" in text
    assert "26,122 → 301,066 parameters" in text
    assert "Yes, here: B_crit moved with model (model: ×3.81" in text


def test_an_axis_no_variant_fitted_names_no_span_it_does_not_have():
    study = _study_frame().assign(b_crit=math.nan, b_crit_low=math.nan, b_crit_high=math.nan)
    axes = pd.DataFrame(axis_rows(study, ["dataset_fraction", "model"]))
    text = answer_markdown(study, axes)
    assert "**model**: not fitted: no variant has a B_crit interval inside" in text
    assert "(?)" not in text


def test_golmant_answer_needs_both_kinds_of_axis():
    row = {"axis": "label_noise", "verdict": "grows", "range_factor": 2.0,
           "range_factor_low": 1.5, "range_factor_high": 2.6}
    assert "no dataset size axis was fitted" in golmant_answer([row])
    size = {**row, "axis": "dataset_fraction", "range_factor": 2.1, "range_factor_low": 1.4,
            "range_factor_high": 3.0}
    assert golmant_answer([size, row]).startswith("Not distinguishable here: both")
    assert kind_of("convergence.base_lr") == "other" and kind_of("dataset.val_fraction") == (
        "other")
    assert kind_of("label_noise") == kind_of("dataset.synthetic_noise") == "data complexity"


def test_study_on_a_config_without_axes_exits_2_naming_the_section(tmp_path):
    (tmp_path / "plain.yaml").write_text("name: plain\n")
    result = run_cli(["study", "--config", "plain.yaml"], cwd=tmp_path)
    assert result.returncode == 2
    assert "the config has no study.axes" in result.stderr


def test_golmant_answer_does_not_say_yes_when_dataset_size_could_have_moved_as_much():
    """Dataset size undetected but with a wide interval: the detected axis's low end does not
    exceed what dataset size could still have done unseen."""
    size = {"axis": "dataset_fraction", "verdict": "no detectable change", "range_factor": 0.79,
            "range_factor_low": 0.55, "range_factor_high": 1.13}
    noise = {"axis": "label_noise", "verdict": "grows", "range_factor": 1.94,
             "range_factor_low": 1.34, "range_factor_high": 2.82}
    assert golmant_answer([size, noise]).startswith("Not distinguishable here, leaning yes")
    sharp = {**size, "range_factor_low": 0.95, "range_factor_high": 1.05}
    assert golmant_answer([sharp, noise]).startswith("Yes, here: B_crit moved with data "
                                                     "complexity (label_noise: ×1.94")


def test_a_variants_b_star_interval_carries_the_step_time_lines_uncertainty_too():
    """The study's B* per target is the variant's own report's: its interval holds the step-time
    line's uncertainty about α/β beside B_crit's, so on a scattered sweep it is wider than
    B_crit's interval pushed through sqrt(α·B_crit/β) alone."""
    from test_analyze import make_curves, make_runs, make_sweep

    from batchscale.analysis.timetotarget import optimal_batch
    from batchscale.fits import ensure_columns
    from batchscale.schemas import RUNS
    from batchscale.study.compare import variant_rows

    sweep = make_sweep(alpha=1e-2, beta=1e-4, batches=(4, 16, 64, 256, 1024))
    scatter = np.random.default_rng(1).uniform(0.85, 1.15, len(sweep))
    sweep["step_time_median_s"] *= scatter
    sweep["samples_per_s"] = sweep["batch_size"] / sweep["step_time_median_s"]
    runs = ensure_columns(make_runs(seeds=(0, 1), rules=("linear",)), RUNS)
    variant = expand(parse_config(STUDY))[0]
    rows = variant_rows(variant, "run-1", {"sweep": sweep, "runs": runs,
                                           "curves": make_curves(runs)})
    row = rows[0]
    alpha, beta = _device_line(sweep)
    b_crit_only = [optimal_batch(alpha, beta, row[k]) for k in ("b_crit_low", "b_crit_high")]
    assert row["b_star_low"] < row["b_star"] < row["b_star_high"]
    assert row["b_star_low"] < b_crit_only[0] and row["b_star_high"] > b_crit_only[1]


def _device_line(sweep: pd.DataFrame) -> tuple[float, float]:
    """The device's t(B) as the analysis fits it: its stable synthetic rows."""
    from batchscale.fits import ensure_columns, fit_step_time, throughput_curve
    from batchscale.schemas import SWEEP

    rows = throughput_curve(ensure_columns(sweep, SWEEP), "synthetic")
    line = fit_step_time(list(rows["batch_size"]), list(rows["step_time_median_s"]))
    return line.alpha_s, line.beta_s


def test_a_variants_b_star_interval_is_null_where_two_timed_batches_leave_it_open():
    """A step-time line through two batch sizes pins nothing about α/β: the variant's own report
    says B*'s interval is open, and the study row stores no interval (never 0 to the cap; the
    study suite accepts the nulls: tests/test_study_suites.py)."""
    from test_analyze import make_curves, make_runs, make_sweep

    from batchscale.fits import ensure_columns
    from batchscale.schemas import RUNS
    from batchscale.study.compare import variant_rows

    runs = ensure_columns(make_runs(seeds=(0, 1), rules=("linear",)), RUNS)
    variant = expand(parse_config(STUDY))[0]
    rows = variant_rows(variant, "run-1", {"sweep": make_sweep(batches=(4, 64)), "runs": runs,
                                           "curves": make_curves(runs)})
    assert math.isfinite(rows[0]["b_star"]) and rows[0]["b_star"] > 0
    assert math.isnan(rows[0]["b_star_low"]) and math.isnan(rows[0]["b_star_high"])


def test_a_misspelled_workload_in_a_later_variant_is_refused_before_any_variant_runs(
        tmp_path, monkeypatch, capsys):
    """A user's `module:attribute` is imported only when a variant runs: every variant's
    workload is checked first, so the typo in the second does not cost the first's run."""
    from batchscale.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "study.yaml").write_text(
        "name: typo\nconvergence:\n  batch_sizes: [16, 64]\nstudy:\n  axes:\n    model: "
        "[contract_workloads:good, contract_workloads:goood]\n")
    assert main(["study", "--config", "study.yaml"]) == 2
    err = capsys.readouterr().err
    assert "study variant" in err and "goood" in err and "no variant was run" in err
    assert "Traceback" not in err and not (tmp_path / ".batchscale").exists()


def _timed(study: pd.DataFrame, times: list[tuple[float, float, float]]) -> pd.DataFrame:
    return study.assign(answer_batch_size=[32, 64, 128],
                        answer_time_to_target_s=[t for t, _, _ in times],
                        answer_time_to_target_s_low=[lo for _, lo, _ in times],
                        answer_time_to_target_s_high=[hi for _, _, hi in times])


def test_the_answer_names_the_fastest_variant_only_where_its_seeds_range_is_apart():
    study = _timed(_study_frame(), [(0.0345, 0.0257, 0.0376), (0.0433, 0.0325, 0.0484),
                                    (0.09, 0.08, 0.1)])
    axes = pd.DataFrame(axis_rows(study, ["dataset_fraction", "model"]))
    text = answer_markdown(study, axes)
    assert "- 0.25-digits-mlp: batch 32, 0.0345 s [0.0257, 0.0376]" in text
    assert ("**0.25-digits-mlp** is fastest at its point, but its seeds' range overlaps "
            "1.0-digits-mlp's: these seeds do not tell them apart (more seeds would).") in text
    apart = _timed(_study_frame(), [(0.03, 0.028, 0.032), (0.05, 0.045, 0.055),
                                    (0.09, 0.08, 0.1)])
    assert ("**0.25-digits-mlp** reaches the target soonest: its seeds' range lies below every "
            "other variant's.") in answer_markdown(apart, axes)
    one_seed = apart.assign(answer_time_to_target_s_low=math.nan)
    assert "a variant has one seed, so no range over seeds tells them apart" in \
        answer_markdown(one_seed, axes)
    # One seed whose range is only the gap between its evaluations: a range, not a spread.
    gap_only = apart.assign(answer_seeds=[1, 2, 2])
    text = answer_markdown(gap_only, axes)
    assert "0.03 s [0.028, 0.032] (one seed: only the gap between its evaluations)" in text
    assert "a variant has one seed" in text and "reaches the target soonest" not in text
    # A variant's time flagged untrusted: said beside it, and no variant is called faster.
    flagged = apart.assign(answer_seeds=2, answer_timing_flag=[
        None, "the convergence runs took 3.7 ms per step, 3.3× the sweep's 1.1 ms", None])
    text = answer_markdown(flagged, axes)
    assert ("1.0-digits-mlp: batch 64, 0.05 s [0.045, 0.055] — NOT TRUSTED: the convergence "
            "runs took 3.7 ms per step") in text
    assert ("the time of 1.0-digits-mlp is NOT TRUSTED (above): no variant is shown faster"
            in text) and "reaches the target soonest" not in text
