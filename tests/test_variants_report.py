"""The study report page (batchscale.study.report): the answer, the variants per target
with every B_crit as an interval, a bound or "not estimated", one embedded plot per axis with
its slope in words, the environment; values escaped."""

from __future__ import annotations

import base64
import html
import json
import re

import pandas as pd
from markupsafe import escape

from batchscale.analysis.targets import label_of
from batchscale.schemas import make_table
from batchscale.study.report import render_study_report

ENV = {"run_id": "study-7", "config_hash": "c0ffee", "experiment": "golmant",
       "workload": "digits-mlp", "git_commit": "deadbeef", "batchscale_version": "0.1.0",
       "torch_version": "2.14.1", "python_version": "3.11.9", "device_name": "cpu",
       "threads": 2, "world_size": 1, "study_id": "study-7"}
IMAGE = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
HOSTILE_VARIANT = '<script>alert("x")</script>'
HOSTILE_AXIS = "<b>$a_^{$</b>"  # markup for the page, broken mathtext for matplotlib
AXES_CONFIG = {"dataset_fraction": [0.25, 1.0], "model": ["digits-mlp", "digits-wide"]}
PARAMETERS = {"digits-mlp": 1_000, "digits-wide": 4_000}
FIRST, SECOND = ("val_accuracy", 0.9), ("val_accuracy", 0.95)


def study_row(variant: str, values: dict, target=FIRST, **figures) -> dict:
    row = {"variant": variant, "variant_run_id": f"study-7-{variant}",
           "axis_values": json.dumps(values), "target_metric": target[0],
           "target_value": target[1], "lr_rule": "sqrt", "b_crit": 100.0, "b_crit_low": 80.0,
           "b_crit_high": 130.0, "s_min": 200.0, "s_min_se": 12.0, "e_min": 6400.0,
           "e_min_se": 410.0, "b_simple": 50.0,
           "saturation_batch": 256, "b_star": 120.0, "b_star_low": 100.0, "b_star_high": 150.0,
           "parameters": PARAMETERS.get(values.get("model"), 1_000),
           "workload": values.get("model", "digits-mlp")}
    return {**row, **figures}


NOTHING = {"b_crit": None, "b_crit_low": None, "b_crit_high": None, "b_star": None,
           "b_star_low": None, "b_star_high": None}


def study_rows() -> list[dict]:
    mlp, wide = "digits-mlp", "digits-wide"
    return [
        study_row("fraction0.25_mlp", {"dataset_fraction": 0.25, "model": mlp}),
        study_row("fraction1_mlp", {"dataset_fraction": 1.0, "model": mlp}, b_crit=180.0,
                  b_crit_low=140.0, b_crit_high=240.0),
        study_row("fraction0.25_wide", {"dataset_fraction": 0.25, "model": wide},
                  b_crit_bound="above", b_crit_bound_batch=1024.0, **NOTHING),
        study_row("fraction1_wide", {"dataset_fraction": 1.0, "model": wide},
                  b_crit_reason="no batch size reached the target", **NOTHING),
        study_row("fraction0.25_mlp", {"dataset_fraction": 0.25, "model": mlp}, target=SECOND,
                  b_crit=300.0, b_crit_low=None, b_crit_high=None),
    ]


def axis_row(axis: str, verdict: str, target=FIRST, **fit) -> dict:
    row = {"axis": axis, "x_name": axis, "x_scale": "log", "target_metric": target[0],
           "target_value": target[1], "lr_rule": "sqrt", "variants_fitted": 3, "verdict": verdict}
    return {**row, **fit}


def axes_rows() -> list[dict]:
    return [
        axis_row("dataset_fraction", "grows", slope=0.42, slope_low=0.13, slope_high=0.69,
                 range_factor=1.8, range_factor_low=1.2, range_factor_high=2.6),
        axis_row("dataset_fraction", "no detectable change", target=SECOND, slope=0.05,
                 slope_low=-0.3, slope_high=0.4, range_factor=1.1, range_factor_low=0.8,
                 range_factor_high=1.5),
        axis_row("model", "not fitted: one variant with a B_crit", variants_fitted=1),
        axis_row("model", "shrinks", target=SECOND, x_name="parameters", slope=-0.5,
                 slope_low=-0.9, slope_high=-0.1, range_factor=0.5, range_factor_low=0.3,
                 range_factor_high=0.8),
    ]


def frame(kind: str, rows: list[dict]) -> pd.DataFrame:
    return make_table(kind, rows, ENV).to_pandas()


def render(rows=None, axes=None, config=None, answer="B_crit **grows** with the data.") -> str:
    return render_study_report(frame("study", study_rows() if rows is None else rows),
                               frame("study_axes", axes_rows() if axes is None else axes),
                               answer, AXES_CONFIG if config is None else config, "golmant")


def text_of(page: str) -> str:
    """The page's text as a reader sees it (tags dropped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_the_page_shows_the_answer_every_variant_and_each_b_crit_with_its_flag():
    page = render()
    assert "B_crit <strong>grows</strong> with the data." in page
    text = text_of(page)
    for variant in ("fraction0.25_mlp", "fraction1_mlp", "fraction0.25_wide", "fraction1_wide"):
        assert variant in text
    assert "100 [80, 130]" in text and "180 [140, 240]" in text
    assert "120 [100, 150]" in text  # B* with its interval
    assert "above 1,024: steps still fall like 1/B" in text
    assert "not estimated: no batch size reached the target" in text
    assert "300 (no interval)" in text
    assert "200 ± 12" in text and "6,400 ± 410" in text  # S_min, E_min with their errors
    old = render([{k: v for k, v in r.items() if not k.endswith("_se")} for r in study_rows()])
    assert "200 (no standard error)" in text_of(old)  # a table from before layout 10
    assert text.index(label_of(FIRST)) < text.index(label_of(SECOND))  # one table per target


def test_each_axis_says_its_verdict_with_the_interval():
    text = text_of(render())
    assert ("val_accuracy >= 0.9, sqrt rule: grows: B_crit ×1.8 [1.2, 2.6] over "
            "dataset_fraction 0.25 → 1 (slope 0.42 [0.13, 0.69] in log–log; 3 variants)") in text
    assert ("val_accuracy >= 0.95, sqrt rule: no detectable change: slope 0.05 [−0.3, 0.4] in "
            "log–log (B_crit ×1.1 [0.8, 1.5]") in text
    assert "sqrt rule: not fitted: one variant with a B_crit" in text
    assert ("shrinks: B_crit ×0.5 [0.3, 0.8] over model (parameters) 1,000 → 4,000 (slope −0.5"
            " [−0.9, −0.1] in log–log; 3 variants)") in text  # workloads sit at their size


def test_one_embedded_png_per_axis_for_the_first_target_only():
    page = render()
    images = IMAGE.findall(page)
    assert len(images) == page.count("<img") == len(AXES_CONFIG)
    assert all(base64.b64decode(image).startswith(PNG_SIGNATURE) for image in images)
    text = text_of(page)
    assert f"B_crit against model for {label_of(FIRST)}, sqrt rule" in text
    assert f"for {label_of(SECOND)}" not in text
    assert "Not drawn, not estimated: fraction1_wide" in text


def test_the_environment_names_the_study_commit_versions_and_device():
    text = text_of(render())
    for value in ("study-7", "deadbeef", "2.14.1", "3.11.9", "cpu", "digits-mlp, digits-wide"):
        assert value in text


def test_hostile_variant_and_axis_names_are_escaped_and_still_plotted():
    values = {HOSTILE_AXIS: 0.5}
    rows = [study_row(HOSTILE_VARIANT, values), study_row("plain", {HOSTILE_AXIS: 2.0})]
    axes = [axis_row(HOSTILE_AXIS, "grows", slope=0.5, slope_low=0.1, slope_high=0.9,
                     range_factor=2.0, range_factor_low=1.1, range_factor_high=3.5)]
    page = render(rows, axes, {HOSTILE_AXIS: [0.5, 2.0]})
    assert HOSTILE_VARIANT not in page and HOSTILE_AXIS not in page
    assert escape(HOSTILE_VARIANT) in page and escape(HOSTILE_AXIS) in page
    assert len(IMAGE.findall(page)) == 1


def test_a_single_variant_and_axis_without_a_slope_row_renders():
    rows = [study_row("only", {"dataset_fraction": 1.0})]
    page = render(rows, [], {"dataset_fraction": [1.0]})
    text = text_of(page)
    assert "only" in text and "100 [80, 130]" in text and "No slope for this axis." in text
    assert len(IMAGE.findall(page)) == 1


def test_a_plot_of_one_x_on_a_log_axis_is_saved_without_a_warning():
    """What an axis whose variants give one B_crit draws (`_draw_axis`: a log x, margins):
    matplotlib widens the equal limits itself, and its warning reached the user's terminal
    through `batchscale study` and `report`."""
    import warnings

    from batchscale.analysis.figures import new_axes, png_data_uri

    fig, ax = new_axes("parameters", "B_crit (batch size)", x_base=10, log_y=True)
    ax.plot([1234.0], [30.0], "-", label="B_crit")
    ax.errorbar([1234.0], [30.0], yerr=[[5.0], [5.0]], fmt="o", capsize=3)
    ax.margins(x=0.08)
    ax.legend(fontsize="small")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert png_data_uri(fig).startswith("data:image/png;base64,")


def test_an_axis_with_nothing_to_draw_says_why_instead_of_a_plot():
    rows = [study_row("none", {"label_noise": 0.1}, b_crit_reason="diverged", **NOTHING)]
    page = render(rows, [axis_row("label_noise", "not fitted: no B_crit")],
                  {"label_noise": [0.1]})
    assert "<img" not in page
    assert "no variant has a B_crit or a bound" in text_of(page)


def test_an_axis_with_a_zero_value_is_fitted_and_described_on_a_linear_scale():
    rows = [study_row("clean", {"label_noise": 0.0}),
            study_row("noisy", {"label_noise": 0.2}, b_crit=60.0, b_crit_low=40.0,
                      b_crit_high=90.0)]
    axes = [axis_row("label_noise", "shrinks", x_scale="linear", variants_fitted=2, slope=-2.5,
                     slope_low=-4.0, slope_high=-0.5, range_factor=0.6, range_factor_low=0.45,
                     range_factor_high=0.9)]
    text = text_of(render(rows, axes, {"label_noise": [0.0, 0.2]}))
    assert ("shrinks: B_crit ×0.6 [0.45, 0.9] over label_noise 0 → 0.2 (slope −2.5 [−4, −0.5]"
            " of ln B_crit per unit of label_noise; 2 variants)") in text


def test_an_interval_cut_at_the_measured_batches_says_it_is_not_in_the_slope_fit():
    rows = study_rows()
    rows[1]["b_crit_interval_note"] = "its top is cut at 2,048, 2× the largest batch measured"
    page = text_of(render(rows))
    assert ("180 [140, 240] (not in the slope fit: its top is cut at 2,048, 2× the largest "
            "batch measured)") in page


def test_a_b_star_interval_at_its_cap_reads_as_a_bound_as_on_the_variants_card():
    """B*'s top at the largest batch it may take is a bound: "≥ 150, capped", not "150"; rows
    written before the cap was recorded (no b_star_cap) show the interval as it is."""
    from batchscale.study.report import b_star_cell

    capped = study_row("v", {"dataset_fraction": 1.0}, b_star_cap=150.0)
    assert b_star_cell(capped) == "120 [100, ≥ 150, capped]"
    assert b_star_cell(study_row("v", {"dataset_fraction": 1.0}, b_star_cap=512.0)) == \
        "120 [100, 150]"
    assert b_star_cell(study_row("v", {"dataset_fraction": 1.0})) == "120 [100, 150]"
    rows = study_rows()
    rows[0]["b_star_cap"] = 150.0
    assert "120 [100, ≥ 150, capped]" in text_of(render(rows))
