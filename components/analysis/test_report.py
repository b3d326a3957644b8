"""The HTML report: self-contained (no URL anywhere), one embedded PNG per plot, values escaped."""

from __future__ import annotations

import base64
import re

import pandas as pd

from .analyze import analyze
from .report import (
    NOT_MEASURED,
    REGRESSIONS_SLOT,
    add_regressions,
    markdown_to_html,
    render_html,
)
from .test_analyze import make_curves, make_runs, make_sweep, run_row

IMAGE = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"')
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
PLOTS_WITHOUT_DP = 7  # throughput, step time, memory, steps, time, trade-off, B_simple


def report(sweep, runs, curves, title="digits-mlp") -> str:
    result = analyze(sweep, runs, curves, bootstrap_samples=20)
    return render_html(result, sweep, runs, curves, title=title)


def images(page: str) -> list[bytes]:
    return [base64.b64decode(data) for data in IMAGE.findall(page)]


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
    assert "Why doesn&#x27;t training get faster" in page
    assert "<strong>Batch size:" in page
    assert "B_crit" in page
    assert f"{NOT_MEASURED} (one worker count)" in page
    assert_self_contained(page)


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
    page = report(make_sweep(), runs, None, title='<script>alert("x")</script>')
    assert "<b>evil</b>" not in page and "&lt;b&gt;evil&lt;/b&gt;" in page
    assert "<script>" not in page
    assert_self_contained(page)


def test_report_with_no_data_explains_every_missing_plot():
    page = report(None, None, None, title="empty")
    assert images(page) == []
    assert page.count('class="missing"') == PLOTS_WITHOUT_DP + 2  # plots, DP, results table
    assert_self_contained(page)


def test_markdown_to_html_subset():
    text = "## Title <x>\n\n- **Bold** & item\n- second\n\nplain *text*\n"
    assert markdown_to_html(text) == (
        "<h3>Title &lt;x&gt;</h3>\n<ul>\n<li><strong>Bold</strong> &amp; item</li>\n"
        "<li>second</li>\n</ul>\n<p>plain *text*</p>"
    )


def test_recommendation_appears_once_and_regressions_fill_their_slot():
    runs = make_runs()
    page = report(make_sweep(), runs, make_curves(runs))
    assert page.count("<strong>Batch size:") == 1
    assert page.count("<h2>Recommendation</h2>") == 1
    markdown = "## Regressions\n\n**1 of 2 judged cells regressed**:\n\n- batch 64: −20 %\n"
    with_section = add_regressions(page, markdown)
    assert REGRESSIONS_SLOT not in with_section
    assert with_section.index("<h2>Regressions</h2>") < with_section.index("Throughput and")
    assert "<li>batch 64: −20 %</li>" in with_section
    assert "<h3>Regressions</h3>" not in with_section  # the title line is the section's h2
    older = page.replace(REGRESSIONS_SLOT, "")
    assert add_regressions(older, markdown).endswith("</section>\n</body>\n</html>\n")
    assert_self_contained(with_section)
