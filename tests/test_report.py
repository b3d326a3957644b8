"""The HTML report: self-contained (no URL anywhere), one embedded PNG per plot, values escaped."""

from __future__ import annotations

import base64
import html
import re
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_analyze import make_curves, make_runs, make_sweep, run_row

from batchscale.analysis.analyze import analyze
from batchscale.analysis.plots import NOT_MEASURED, PNG_DATA_URI_PREFIX
from batchscale.config import AnalysisConfig, ExperimentConfig, parse_config
from batchscale.errors import BadInput
from batchscale.report.render import RegressionsSection, render_html
from batchscale.report.stage import run_stage

IMAGE = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOTS_WITHOUT_DP = 7  # throughput, step time, memory, steps, time, trade-off, B_simple
HOSTILE = '<script>alert("x")</script>'


def report(sweep, runs, curves, title="digits-mlp", regressions=None) -> str:
    result = analyze(sweep, runs, curves, AnalysisConfig(bootstrap_samples=20))
    return render_html(result, sweep, runs, curves, title=title, regressions=regressions)


def images(page: str) -> list[bytes]:
    return [base64.b64decode(data) for data in IMAGE.findall(page)]


class _ImageSources(HTMLParser):
    """Every <img> tag's src, as a browser would parse the page."""

    def __init__(self) -> None:
        super().__init__()
        self.sources: list[str | None] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "img":
            self.sources.append(dict(attrs).get("src"))


def image_sources(page: str) -> list[str | None]:
    parser = _ImageSources()
    parser.feed(page)
    return parser.sources


def assert_self_contained(page: str) -> None:
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page and "<link" not in page
    assert "//" not in re.sub(r"data:image/png;base64,[A-Za-z0-9+/=]+", "", page)


def test_report_has_one_png_per_plot_and_the_narrative():
    runs = make_runs()
    page = report(make_sweep(), runs, make_curves(runs))
    pngs = images(page)
    assert len(pngs) == PLOTS_WITHOUT_DP == page.count("<img ")
    assert all(png.startswith(PNG_SIGNATURE) for png in pngs)
    assert "Why doesn't training get faster" in html.unescape(page)
    assert "<strong>Batch size:" in page
    assert "B_crit" in page
    assert f"{NOT_MEASURED} (one worker count)" in page
    # without convergence.gap_epochs the section's heading names no number, not the field
    assert "<h2>At equal data seen</h2>" in page and "gap_epochs epochs" not in page
    assert_self_contained(page)


def test_every_image_is_an_embedded_png():
    runs = make_runs(rules=("linear",))
    two = pd.DataFrame([run_row(b, "linear", 0.1, 0, 200, workers=2, time=0.1) for b in (64, 256)])
    runs = pd.concat([runs, two], ignore_index=True)
    sources = image_sources(report(make_sweep(), runs, make_curves(runs)))
    assert len(sources) == PLOTS_WITHOUT_DP + 1
    for src in sources:
        assert src is not None and src.startswith(PNG_DATA_URI_PREFIX)
        assert base64.b64decode(src[len(PNG_DATA_URI_PREFIX):], validate=True).startswith(
            PNG_SIGNATURE
        )


def test_report_plots_data_parallel_efficiency_with_two_worker_counts():
    runs = make_runs(rules=("linear",))
    two = pd.DataFrame([run_row(b, "linear", 0.1, 0, 200, workers=2, time=0.1) for b in (64, 256)])
    runs = pd.concat([runs, two], ignore_index=True)
    page = report(make_sweep(), runs, make_curves(runs))
    assert len(images(page)) == PLOTS_WITHOUT_DP + 1
    assert NOT_MEASURED not in page
    assert_self_contained(page)


def test_report_escapes_values_from_the_tables():
    runs = make_runs(rules=("<b>evil</b>",), seeds=(0,))
    page = report(make_sweep(), runs, None, title=HOSTILE)
    assert "<b>evil</b>" not in page and "&lt;b&gt;evil&lt;/b&gt;" in page
    assert "<script>" not in page
    assert_self_contained(page)


def _write(path: Path, frame: pd.DataFrame) -> str:
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return str(path)


def test_a_hostile_experiment_name_never_reaches_a_page():
    """The experiment name is the page title: names.check_name refuses markup before any page
    is rendered (the template would escape it too: test_report_escapes_values_from_the_tables)."""
    with pytest.raises(BadInput, match="experiment name"):
        parse_config({"name": HOSTILE})


def test_stage_report_is_titled_with_the_experiment_and_self_contained(tmp_path):
    runs = make_runs(rules=("linear",), seeds=(0, 1))
    config = ExperimentConfig(name="exp-1", analysis=AnalysisConfig(bootstrap_samples=10))
    report_path = tmp_path / "report.html"
    metrics = run_stage(
        config.to_json(),
        "20990101T000000Z-test",
        _write(tmp_path / "sweep.parquet", make_sweep()),
        _write(tmp_path / "curves.parquet", make_curves(runs)),
        _write(tmp_path / "runs.parquet", runs),
        str(tmp_path / "analysis.parquet"),
        str(report_path),
        str(tmp_path / "summary.md"),
    )
    page = report_path.read_text()
    assert "<script" not in page
    assert page.count("batchscale: exp-1 (20990101T000000Z-test)") == 2  # <title> and <h1>
    assert metrics["b_crit_linear"] > 0
    assert (tmp_path / "summary.md").read_text().startswith("## Why doesn't training get faster")
    assert_self_contained(page)


def test_report_with_no_data_explains_every_missing_plot():
    page = report(None, None, None, title="empty")
    assert images(page) == []
    # plots, DP, results table, and the generalization gap "not measured"
    assert page.count('class="missing"') == PLOTS_WITHOUT_DP + 3
    assert "set convergence.gap_epochs" in page
    assert_self_contained(page)


def test_narrative_and_recommendation_render_from_the_markdown():
    runs = make_runs()
    result = analyze(make_sweep(), runs, make_curves(runs), AnalysisConfig(bootstrap_samples=20))
    page = render_html(result, make_sweep(), runs, make_curves(runs))
    assert "<li><strong>Throughput.</strong> The best samples/s is" in page
    assert '<div class="recommendation"><ul>' in page
    for line in result.markdown.splitlines():
        if line.startswith("- **Batch size:"):
            reason = line.split("** — ", 1)[1]
            assert html.escape(reason, quote=False) in page  # the same words, rendered once


def test_each_recommendation_item_links_to_a_section_of_the_page():
    runs = make_runs()
    page = report(make_sweep(), runs, make_curves(runs))
    box = page[page.index('<div class="recommendation">'):]
    box = box[:box.index("</div>")]
    targets = re.findall(r'<a href="#([a-z-]+)">evidence</a>', box)
    assert len(targets) == box.count("<li>") - 1  # every item but the target's line
    for target in set(targets):
        assert f'<section id="{target}">' in page, target


def test_recommendation_appears_once_and_regressions_have_their_section():
    """The analysis step's page has no "Regressions" section (the check needs the lake); a
    page rendered with the verdicts has it after the narrative, titled once."""
    runs = make_runs()
    page = report(make_sweep(), runs, make_curves(runs))
    assert page.count("<strong>Batch size:") == 1
    assert page.count("<h2>Recommendation</h2>") == 1
    assert "Regressions" not in page
    markdown = "## Regressions\n\n**1 of 2 judged cells regressed**:\n\n- batch 64: −20 %\n"
    with_section = report(make_sweep(), runs, make_curves(runs),
                          regressions=RegressionsSection(markdown))
    assert with_section.index("<h2>Regressions</h2>") < with_section.index("Throughput and")
    assert "<li>batch 64: −20 %</li>" in with_section
    assert "<h3>Regressions</h3>" not in with_section  # the title line is the section's h2
    assert_self_contained(with_section)


def test_regressions_text_is_escaped():
    page = report(None, None, None,
                  regressions=RegressionsSection(f"## Regressions\n\n- {HOSTILE} on cpu\n"))
    assert "<script>" not in page and "&lt;script&gt;" in page


def test_report_states_a_bound_and_never_the_past_b_crit_sentence():
    """S = 65536/B exactly: the page says "above 1,024: steps still fall like 1/B" in the
    narrative and the results table, and draws every plot without a B_crit number."""
    rows = [run_row(b, "linear", 0.1, seed, 65536 // b) for b in (4, 16, 64, 256, 1024)
            for seed in (0, 1)]
    runs = pd.DataFrame(rows)
    page = html.unescape(report(make_sweep(), runs, make_curves(runs)))
    assert "B_crit above 1,024: steps still fall like 1/B" in page
    assert "<td class=\"text\">above 1,024: steps still fall like 1/B</td>" in page
    assert "Past B_crit" not in page and "B_crit ≈" not in page
    assert len(images(page)) == PLOTS_WITHOUT_DP


def test_the_steps_plot_shows_each_trial_and_b_crits_interval_as_a_labelled_band():
    import matplotlib

    matplotlib.use("Agg")
    from batchscale.analysis.plots_convergence import draw_steps, draw_time_to_target

    runs = make_runs(seeds=(0, 1, 2))
    result = analyze(make_sweep(), runs, make_curves(runs), AnalysisConfig(bootstrap_samples=20))
    table = pd.DataFrame(result.rows)
    fit = result.summary.critical_batch["linear"]
    labels = [text.get_text() for text in draw_steps(table, result.summary, runs).axes[0]
              .get_legend().get_texts()]
    assert "linear: each trial" in labels and "linear: median over seeds S(B)" in labels
    assert (f"linear: B_crit 90 % interval [{fit.b_crit_low:.3g}, {fit.b_crit_high:.3g}]"
            in labels)
    axes = draw_steps(table, result.summary, runs).axes[0]
    trial_points = next(line for line in axes.get_lines()
                        if line.get_label() == "linear: each trial")
    assert len(trial_points.get_xdata()) == len(runs[runs["lr_rule"] == "linear"])
    times = draw_time_to_target(table, result.summary, runs).axes[0].get_legend().get_texts()
    assert "linear: each trial" in [text.get_text() for text in times]


def test_a_timing_flag_without_both_step_times_is_not_a_nan_ratio():
    from batchscale.report.render import _timing_cell

    flagged = {"timing_flag": "step times disagree", "sweep_step_time_s": 0.002}
    assert _timing_cell({**flagged, "step_time_s": 0.02}) == "10× the sweep"
    assert _timing_cell({**flagged, "step_time_s": float("nan")}) == "flagged (see the quality box)"
    assert _timing_cell({**flagged, "timing_flag": None, "step_time_s": 0.02}) is None
    # The ratio the flag's sentence gives, against the input it names (a real-input row, where
    # the table's sweep column holds the synthetic one): the table and the text agree.
    sentence = ("the convergence runs took 198 ms per step, 34.9× the sweep's 5.67 ms "
                "(real-input line): more than the 2× allowed, so one of them is off")
    assert _timing_cell({**flagged, "timing_flag": sentence, "step_time_s": 0.198}) == \
        "34.9× the sweep (real input)"
    faster = ("the convergence runs took 1 ms per step, 3.1× less than the sweep's 3.1 ms "
              "(synthetic-input measurement): more than the 2× allowed")
    assert _timing_cell({**flagged, "timing_flag": faster, "step_time_s": 0.001}) == \
        "3.1× less than the sweep (synthetic input)"


def test_a_sweep_step_time_from_its_line_is_marked_as_the_line():
    """Where the sweep did not time a batch, its line α + βB stands in for the results table's
    sweep column, marked so: a modelled figure must not read as a measured one."""
    from batchscale.report.render import _sweep_time_cell

    assert _sweep_time_cell({"sweep_step_time_s": 0.000404,
                             "sweep_step_time_source": "sweep_fit"}) == "0.000404 (line)"
    assert _sweep_time_cell({"sweep_step_time_s": 0.000524,
                             "sweep_step_time_source": "sweep"}) == 0.000524
    # the analysis records which, per batch
    table = analyze(make_sweep(batches=(16, 64)), make_runs(), None,
                    AnalysisConfig(bootstrap_samples=20)).rows
    sources = {r["batch_size"]: r["sweep_step_time_source"] for r in table}
    assert sources[16] == sources[64] == "sweep" and sources[32] == "sweep_fit", sources


def test_the_results_tables_step_time_and_samples_per_s_carry_the_trials_range():
    """A convergence step time is the median over its batch's trials: the table gives their
    lowest and highest beside it (and samples/s from them); a sweep's figure says it has no
    trials behind it."""
    from batchscale.report.render import _step_time_cells

    row = {"batch_size": 128, "step_time_s": 0.002, "samples_per_s": 64_000.0,
           "step_time_source": "convergence"}
    assert _step_time_cells(row, (0.0016, 0.0025, 4)) == ("0.002 [0.0016, 0.0025]",
                                                          "64,000 [51,200, 80,000]")
    assert _step_time_cells(row, (0.002, 0.002, 1)) == ("0.002 (one trial)",
                                                        "64,000 (one trial)")
    swept = dict(row, step_time_source="sweep")
    assert _step_time_cells(swept, None) == ("0.002 (the sweep's figure: no trials' range)",
                                             "64,000 (the sweep's figure)")
    page = html.unescape(report(make_sweep(), make_runs(seeds=(0, 1)), None))
    assert "step time (s) [trials' range]" in page and "samples/s [trials' range]" in page
    # make_runs' trials step alike: a range of one value, and samples/s from it
    assert "<td>0.001008 [0.001008, 0.001008]</td>" in page
    assert "<td>3,968 [3,968, 3,968]</td>" in page


def test_missing_plots_do_not_contradict_the_numbers_beside_them():
    """B_simple from the runs but no curves: the plot's place says the curves are what is
    missing, not that B_simple was never recorded."""
    runs = make_runs().assign(b_simple=40.0)
    page = html.unescape(report(make_sweep(), runs, pd.DataFrame()))
    assert "B_simple was not recorded" not in page
    assert "B_simple during training needs the curves table" in page


def test_the_efficiency_legend_lists_only_batches_run_with_several_worker_counts():
    import matplotlib

    matplotlib.use("Agg")
    from batchscale.analysis.plots import _draw_dp_efficiency

    runs = make_runs(rules=("linear",))
    two = pd.DataFrame([run_row(64, "linear", 0.1, 0, 200, workers=2, time=0.1)])
    legend = _draw_dp_efficiency(pd.concat([runs, two], ignore_index=True)).axes[0].get_legend()
    assert [text.get_text() for text in legend.get_texts()] == ["batch 64", "ideal"]
    # a point above the ideal (2 workers more than twice as fast) is marked, not just drawn
    fast = two.assign(train_time_s=1e-6)
    legend = _draw_dp_efficiency(pd.concat([runs, fast], ignore_index=True)).axes[0].get_legend()
    assert "above the ideal 1: NOT TRUSTED" in [text.get_text() for text in legend.get_texts()]


def test_the_step_time_plot_draws_the_line_b_star_sits_on():
    """Where the input pipeline is a bottleneck B* is placed on real input's line: the plot
    beside it draws that line and its points, and its caption says so; elsewhere it draws the
    device's line alone."""
    import matplotlib

    matplotlib.use("Agg")
    from test_analyze import sweep_line, sweep_row

    from batchscale import schemas
    from batchscale.analysis.plots import _draw_step_time, throughput_plots
    from batchscale.fits import ensure_columns

    batches = (4, 16, 64, 256, 1024)
    sweep = ensure_columns(pd.DataFrame(
        [sweep_row(b, 1e-3 + 1e-7 * b) for b in batches]
        + [sweep_row(b, 1e-3 + 4e-6 * b, mode="real") for b in batches]), schemas.SWEEP)
    runs = make_runs(noise=0.0, step_time=sweep_line(1e-3, 4e-6))
    summary = analyze(sweep, runs, make_curves(runs), AnalysisConfig(bootstrap_samples=20)).summary
    labels = [t.get_text() for t in _draw_step_time(sweep, summary, None).axes[0]
              .get_legend().get_texts()]
    assert "real input, B*'s line: t(B) = 1 ms + 4 µs·B" in labels
    assert "real input (median)" in labels
    assert "t(B) = 1 ms + 0.1 µs·B" in labels
    assert "which B* uses" in throughput_plots(sweep, summary)[1].caption

    device = ensure_columns(make_sweep(), schemas.SWEEP)
    plain = analyze(device, runs, None, AnalysisConfig(bootstrap_samples=20)).summary
    labels = [t.get_text() for t in _draw_step_time(device, plain, None).axes[0]
              .get_legend().get_texts()]
    assert not any("real input" in label for label in labels)
    assert "which B* uses" not in throughput_plots(device, plain)[1].caption


def test_runs_without_a_sweep_say_so_and_plot_the_trials_own_step_times():
    """A TrainingLoop's runs come without a sweep: the page says no sweep was given (not that
    the sweep timed nothing), and the step-time plot draws the trials' own step times with the
    t(B) line B* was read from."""
    runs = make_runs()
    page = html.unescape(report(None, runs, make_curves(runs)))
    assert ("No throughput sweep was given (batchscale analyze takes one with --sweep FILE; "
            "a pipeline run of a TrainingLoop has none): time to target uses the trials' own "
            "step times.") in page
    assert "Throughput.</strong> Not measured: no throughput sweep was given" in page
    assert "Memory not measured: no throughput sweep was given" in page
    assert "the throughput sweep timed no batch size" not in page
    assert "Step time vs batch size: the convergence runs' own" in page
    assert len(images(page)) == PLOTS_WITHOUT_DP - 2  # throughput and memory need the sweep


def test_the_step_time_line_carries_its_standard_errors():
    """The line t(B) = α + βB that B* and the throughput text use is a fit: its α and β are
    stated with their standard errors, or said to have none (two batch sizes)."""
    from batchscale.analysis.narrative import step_line_text
    from batchscale.analysis.summary import StepTimeSummary

    fitted = StepTimeSummary("synthetic", 3.86e-4, 2.24e-6, 0.85, "", 5e-5, 4.8e-7)
    assert step_line_text(fitted) == ("t(B) ≈ 0.386 ± 0.05 ms + 2.24 ± 0.48 µs × B (± one "
                                      "standard error; R² 0.85)")
    exact = StepTimeSummary("synthetic", 3.86e-4, 2.24e-6, 1.0, "")
    assert "no error estimate: a line through two batch sizes" in step_line_text(exact)
    # from a sweep of six batch sizes, the analysis fills them in
    summary = analyze(make_sweep(), make_runs(), None, AnalysisConfig(bootstrap_samples=20))
    assert " ± " in step_line_text(summary.summary.step_time)
