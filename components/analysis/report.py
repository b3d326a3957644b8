"""The analysis report: one self-contained HTML page.

The page is opened from the KFP UI, from object storage or from a laptop, often offline, so it
carries everything inside: plots as base64 PNG `data:` URIs, inline CSS, no link to any CDN or
web font. Every value that comes from the tables is HTML-escaped.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from batchscale import schemas

if TYPE_CHECKING:
    from matplotlib.figure import Figure

from .analyze import (
    TIMING_MODES,
    AnalysisResult,
    data_parallel_efficiency,
    ensure_columns,
    narrative_markdown,
    throughput_curve,
)

FIGURE_SIZE_IN = (6.4, 3.8)
FIGURE_DPI = 100
CURVE_POINTS = 200
"""Points on each fitted line."""
BYTES_PER_MIB = 2**20
NOT_MEASURED = "not measured in this run"
MINOR_LOG_LABELS = (2, 5)
"""Minor ticks of a decade that carry a label on log axes."""
REGRESSIONS_SLOT = "<!-- regressions -->"
"""Where publish puts the "Regressions" section: the check needs the lake's history, which
the analysis step does not read, so the section is added to the rendered page afterwards."""
REGRESSIONS_TITLE = "Regressions"

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 2rem auto;
       max-width: 60rem; padding: 0 1rem; color: #1d2330; line-height: 1.45; }
h1 { font-size: 1.6rem; margin-bottom: 0.2rem; }
h2 { font-size: 1.25rem; border-bottom: 1px solid #d5d9e0; padding-bottom: 0.2rem;
     margin-top: 2rem; }
h3 { font-size: 1.05rem; }
.recommendation { background: #eef5ee; border: 1px solid #b9d6b9; border-radius: 6px;
                  padding: 0.6rem 1rem; }
.missing { color: #7a5300; background: #fff6e0; border-radius: 4px; padding: 0.4rem 0.6rem; }
figure { margin: 1rem 0; }
figure img { max-width: 100%; height: auto; border: 1px solid #e3e6eb; }
figcaption { font-size: 0.9rem; color: #4a5262; }
table { border-collapse: collapse; font-size: 0.85rem; }
th, td { border: 1px solid #d5d9e0; padding: 0.2rem 0.5rem; text-align: right; }
th { background: #f1f3f6; }
td.text { text-align: left; }
"""


# --------------------------------------------------------------------------- HTML helpers


def _escape(value: object) -> str:
    return html.escape(str(value), quote=True)


def _bold(escaped: str) -> str:
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", escaped)


def markdown_to_html(text: str) -> str:
    """Render the Markdown subset `analyze.render_markdown` writes, escaping every line first.

    Supported: `## ` headings, `- ` list items, `**bold**`, plain paragraphs. Anything else is
    shown as escaped text, so a value from the tables cannot inject markup.
    """
    out: list[str] = []
    in_list = False
    for line in text.splitlines():
        is_item = line.startswith("- ")
        if in_list and not is_item:
            out.append("</ul>")
            in_list = False
        if is_item:
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{_bold(_escape(line[2:]))}</li>")
        elif line.startswith("## "):
            out.append(f"<h3>{_bold(_escape(line[3:]))}</h3>")
        elif line.strip():
            out.append(f"<p>{_bold(_escape(line))}</p>")
    if in_list:
        out.append("</ul>")
    return "\n".join(out)


def _section(title: str, body: str) -> str:
    return f"<section>\n<h2>{_escape(title)}</h2>\n{body}\n</section>"


def _missing(text: str) -> str:
    return f'<p class="missing">{_escape(text)}</p>'


def _fmt(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"
    return "" if value is None else str(value)


# --------------------------------------------------------------------------- figures


def _plain_number(value: float, _pos: int | None = None) -> str:
    return f"{value:g}"


def _minor_log_label(value: float, _pos: int | None = None) -> str:
    """Label the 2× and 5× minor ticks of a log axis, so short ranges still read as numbers."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if mantissa in MINOR_LOG_LABELS else ""


def _log_axis(axis, base: float = 10) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(_plain_number))
    axis.set_minor_formatter(FuncFormatter(_minor_log_label if base == 10 else lambda *_: ""))


def _new_axes(xlabel: str, ylabel: str, *, x_base: float | None = 2, log_y: bool = False):
    """A fresh Agg figure and axes; matplotlib is imported here, only when a report is drawn.

    `x_base` is the log base of the x axis (None: linear). Log axes get plain number labels.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=FIGURE_SIZE_IN, dpi=FIGURE_DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    if x_base is not None:
        ax.set_xscale("log", base=x_base)
        _log_axis(ax.xaxis, x_base)
    if log_y:
        ax.set_yscale("log")
        _log_axis(ax.yaxis)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    return fig, ax


def _png_data_uri(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", metadata={"Software": None})
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(draw: Callable[[], Figure | None], caption: str, missing: str) -> str:
    """`<figure>` with the drawn plot, or a note saying why there is none."""
    fig = draw()
    if fig is None:
        return _missing(f"{caption} — {missing}.")
    uri = _png_data_uri(fig)
    return (
        f'<figure><img src="{uri}" alt="{_escape(caption)}">'
        f"<figcaption>{_escape(caption)}</figcaption></figure>"
    )


def _geometric_grid(low: float, high: float) -> np.ndarray:
    return np.geomspace(low, high, CURVE_POINTS)


def _oom_batches(sweep: pd.DataFrame) -> list[float]:
    rows = sweep[sweep["status"].eq("oom").to_numpy(dtype=bool, na_value=False)]
    return sorted(pd.to_numeric(rows["batch_size"], errors="coerce").dropna().unique())


def _plot_throughput(sweep: pd.DataFrame, summary: dict) -> Figure | None:
    curves = {mode: throughput_curve(sweep, mode) for mode in TIMING_MODES}
    curves = {mode: curve for mode, curve in curves.items() if not curve.empty}
    if not curves:
        return None
    fig, ax = _new_axes("batch size", "samples / s")
    for mode, curve in curves.items():
        ax.plot(curve["batch_size"], curve["samples_per_s"], "o-", label=f"{mode} input")
    saturation = summary["saturation_batch"]
    timing = curves.get(summary["timing_input_mode"])
    if saturation is not None and timing is not None:
        point = timing[timing["batch_size"] == saturation]["samples_per_s"]
        ax.plot([saturation], point, "*", markersize=16, color="C3", label="saturation batch")
        ax.axvline(saturation, color="C3", linestyle=":", linewidth=1)
    oom = _oom_batches(sweep)
    if oom:
        ax.axvline(oom[0], color="black", linestyle="--", linewidth=1, label="out of memory")
    ax.legend()
    return fig


def _plot_step_time(sweep: pd.DataFrame, summary: dict) -> Figure | None:
    mode = summary["timing_input_mode"]
    if mode is None:
        return None
    curve = throughput_curve(sweep, mode)
    fig, ax = _new_axes("batch size", "step time (ms)", log_y=True)
    median = 1e3 * curve["step_time_median_s"]
    spread = [
        (median - 1e3 * curve["step_time_p10_s"]).clip(lower=0).fillna(0),
        (1e3 * curve["step_time_p90_s"] - median).clip(lower=0).fillna(0),
    ]
    ax.errorbar(
        curve["batch_size"],
        median,
        yerr=spread,
        fmt="o",
        capsize=3,
        label=f"measured ({mode}, p10–p90)",
    )
    alpha, beta = summary["step_time_alpha_s"], summary["step_time_beta_s"]
    if math.isfinite(alpha) and math.isfinite(beta):
        grid = _geometric_grid(curve["batch_size"].min(), curve["batch_size"].max())
        model = 1e3 * (alpha + beta * grid)
        ax.plot(
            grid[model > 0],
            model[model > 0],
            "-",
            color="C1",
            label=f"t(B) = {1e3 * alpha:.3g} ms + {1e6 * beta:.3g} µs·B",
        )
    ax.legend()
    return fig


def _plot_memory(sweep: pd.DataFrame, summary: dict) -> Figure | None:
    curve = throughput_curve(sweep, summary["timing_input_mode"] or TIMING_MODES[0])
    curve = curve[np.isfinite(curve["peak_memory_bytes"])]
    if curve.empty:
        return None
    fig, ax = _new_axes("batch size", "peak memory (MiB)")
    ax.plot(curve["batch_size"], curve["peak_memory_bytes"] / BYTES_PER_MIB, "o", label="measured")
    fixed, per_sample = summary["memory_fixed_bytes"], summary["memory_per_sample_bytes"]
    if math.isfinite(fixed):
        grid = _geometric_grid(curve["batch_size"].min(), curve["batch_size"].max())
        ax.plot(
            grid, (fixed + per_sample * grid) / BYTES_PER_MIB, "-", label="fixed + per sample·B"
        )
    b_max = summary["largest_fitting_batch"]
    if math.isfinite(b_max):
        ax.axvline(
            b_max, color="black", linestyle="--", linewidth=1, label="largest batch that fits"
        )
    ax.legend()
    return fig


def _rule_cells(table: pd.DataFrame):
    """(index, rule, cells with finite steps) per LR rule, for the convergence plots."""
    for i, (rule, cells) in enumerate(table.groupby("lr_rule", sort=True)):
        cells = cells[np.isfinite(cells["steps_to_target"].astype(float))]
        if not cells.empty:
            yield i, rule, cells.sort_values("batch_size")


def _plot_steps(table: pd.DataFrame, summary: dict) -> Figure | None:
    drawn = list(_rule_cells(table))
    if not drawn:
        return None
    fig, ax = _new_axes("batch size", "steps to target", log_y=True)
    for i, rule, cells in drawn:
        color = f"C{i}"
        b, s = cells["batch_size"].astype(float), cells["steps_to_target"].astype(float)
        ax.plot(b, s, "o", color=color, label=f"{rule}: measured S(B)")
        ax.plot(
            b,
            s.iloc[0] * b.iloc[0] / b,
            "--",
            color=color,
            alpha=0.5,
            linewidth=1,
            label=f"{rule}: perfect scaling",
        )
        fit = summary["critical_batch"][rule]
        if math.isfinite(fit["b_crit"]):
            grid = _geometric_grid(b.min(), b.max())
            ax.plot(
                grid,
                fit["s_min"] + fit["e_min"] / grid,
                "-",
                color=color,
                label=f"{rule}: S_min + E_min/B, B_crit ≈ {fit['b_crit']:.3g}",
            )
            ax.axvline(fit["b_crit"], color=color, linestyle=":", linewidth=1)
    ax.legend(fontsize="small")
    return fig


def _plot_time_to_target(table: pd.DataFrame, summary: dict) -> Figure | None:
    drawn = [
        (i, rule, cells[np.isfinite(cells["time_to_target_s"].astype(float))])
        for i, rule, cells in _rule_cells(table)
    ]
    drawn = [item for item in drawn if not item[2].empty]
    if not drawn:
        return None
    fig, ax = _new_axes("batch size", "time to target (s)", log_y=True)
    for i, rule, cells in drawn:
        ax.plot(cells["batch_size"], cells["time_to_target_s"], "o-", color=f"C{i}", label=rule)
    batch, rule = summary["recommended_batch_size"], summary["recommended_lr_rule"]
    best = table[(table["batch_size"] == batch) & (table["lr_rule"] == rule)]
    if not best.empty:
        ax.plot(
            best["batch_size"],
            best["time_to_target_s"],
            "*",
            markersize=16,
            color="C3",
            label=f"recommended: {rule}, batch {batch}",
        )
    ax.legend()
    return fig


def _plot_tradeoff(table: pd.DataFrame, summary: dict) -> Figure | None:
    drawn = list(_rule_cells(table))
    if not drawn:
        return None
    fig, ax = _new_axes("steps to target", "examples to target", x_base=10, log_y=True)
    for i, rule, cells in drawn:
        color = f"C{i}"
        ax.plot(cells["steps_to_target"], cells["examples_to_target"], "o", color=color, label=rule)
        for batch, s, e in zip(
            cells["batch_size"], cells["steps_to_target"], cells["examples_to_target"], strict=True
        ):
            ax.annotate(
                f"{int(batch)}",
                (s, e),
                textcoords="offset points",
                xytext=(4, 4),
                fontsize="x-small",
                color=color,
            )
        fit = summary["critical_batch"][rule]
        if math.isfinite(fit["b_crit"]):
            grid = _geometric_grid(cells["batch_size"].min(), cells["batch_size"].max())
            ax.plot(
                fit["s_min"] + fit["e_min"] / grid,
                fit["s_min"] * grid + fit["e_min"],
                "-",
                color=color,
                alpha=0.7,
                label=f"{rule}: (S/S_min − 1)(E/E_min − 1) = 1",
            )
    ax.legend(fontsize="small")
    return fig


def _plot_b_simple(curves: pd.DataFrame, summary: dict) -> Figure | None:
    from matplotlib import colormaps
    from matplotlib.colors import LogNorm

    b_simple = pd.to_numeric(curves["b_simple"], errors="coerce")
    examples = pd.to_numeric(curves["examples_seen"], errors="coerce")
    logged = curves[np.isfinite(b_simple) & (b_simple > 0) & (examples > 0)]
    if logged.empty:
        return None
    fig, ax = _new_axes("examples seen", "B_simple", x_base=10, log_y=True)
    batches = sorted(logged["batch_size"].unique())
    norm = LogNorm(vmin=min(batches), vmax=max(batches) if len(batches) > 1 else min(batches) + 1)
    cmap = colormaps["viridis"]
    labelled: set = set()
    for _trial, points in logged.groupby(["batch_size", "trial_id"], sort=True):
        points = points.sort_values("step")
        batch = points["batch_size"].iloc[0]
        label = f"batch {batch}" if batch not in labelled else None
        labelled.add(batch)
        ax.plot(
            points["examples_seen"],
            points["b_simple"],
            "-",
            color=cmap(norm(batch)),
            linewidth=1,
            alpha=0.8,
            label=label,
        )
    for i, (rule, fit) in enumerate(summary["critical_batch"].items()):
        if math.isfinite(fit["b_crit"]):
            ax.axhline(
                fit["b_crit"],
                color=f"C{i + 3}",
                linestyle="--",
                linewidth=1,
                label=f"B_crit ({rule})",
            )
    ax.legend(fontsize="x-small", ncol=2)
    return fig


def _plot_dp_efficiency(runs: pd.DataFrame) -> Figure | None:
    table = data_parallel_efficiency(runs)
    if table["workers"].nunique() < 2:
        return None
    fig, ax = _new_axes("workers", "data-parallel efficiency")
    for batch, rows in table.groupby("batch_size", sort=True):
        ax.plot(rows["workers"], rows["efficiency"], "o-", label=f"batch {int(batch)}")
    ax.axhline(1.0, color="black", linestyle=":", linewidth=1)
    ax.legend(fontsize="small")
    return fig


# --------------------------------------------------------------------------- sections


def _recommendation_html(summary: dict) -> str:
    items = []
    for label, key in (
        ("Batch size", "recommended_batch_size"),
        ("LR rule", "recommended_lr_rule"),
        ("Workers", "recommended_workers"),
    ):
        value = summary[key]
        shown = "n/a" if value is None else value
        items.append(
            f"<li><strong>{_escape(label)}: {_escape(shown)}</strong> — "
            f"{_escape(summary[key + '_reason'])}</li>"
        )
    return f'<div class="recommendation"><ul>{"".join(items)}</ul></div>'


TABLE_COLUMNS = (
    ("lr_rule", "LR rule"),
    ("batch_size", "batch"),
    ("steps_to_target", "steps"),
    ("examples_to_target", "examples"),
    ("step_time_s", "step time (s)"),
    ("time_to_target_s", "time to target (s)"),
    ("samples_per_s", "samples/s"),
    ("regime", "regime"),
    ("b_simple", "B_simple"),
)


def _table_html(rows: list[dict]) -> str:
    if not rows:
        return _missing("No convergence results.")
    head = "".join(f"<th>{_escape(label)}</th>" for _, label in TABLE_COLUMNS)
    body = []
    for row in rows:
        cells = []
        for key, _ in TABLE_COLUMNS:
            value = row[key]
            css = ' class="text"' if isinstance(value, str) or value is None else ""
            cells.append(f"<td{css}>{_escape(_fmt(value))}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def render_html(
    result: AnalysisResult,
    sweep: pd.DataFrame | None,
    runs: pd.DataFrame | None,
    curves: pd.DataFrame | None,
    *,
    title: str = "batchscale report",
) -> str:
    """The whole report as one HTML string, with every plot embedded and nothing fetched."""
    sweep = ensure_columns(sweep, schemas.SWEEP)
    runs = ensure_columns(runs, schemas.RUNS)
    curves = ensure_columns(curves, schemas.CURVES)
    summary = result.summary
    table = pd.DataFrame(result.rows, columns=schemas.ANALYSIS.names)
    no_sweep = "the throughput sweep timed no batch size"
    no_runs = "no batch size reached the target"
    throughput = [
        _figure(
            lambda: _plot_throughput(sweep, summary),
            "Throughput vs batch size (saturation batch marked)",
            no_sweep,
        ),
        _figure(
            lambda: _plot_step_time(sweep, summary),
            "Step time vs batch size, with the linear model t(B) = α + βB",
            no_sweep,
        ),
        _figure(
            lambda: _plot_memory(sweep, summary),
            "Peak memory vs batch size",
            "peak memory was not recorded",
        ),
    ]
    convergence = [
        _figure(
            lambda: _plot_steps(table, summary),
            "Steps to target vs batch size: measured, perfect scaling and S_min + E_min/B",
            no_runs,
        ),
        _figure(
            lambda: _plot_time_to_target(table, summary),
            "Time to target vs batch size (steps × step time)",
            no_runs,
        ),
        _figure(
            lambda: _plot_tradeoff(table, summary),
            "Steps vs examples trade-off (batch sizes labelled)",
            no_runs,
        ),
        _figure(
            lambda: _plot_b_simple(curves, summary),
            "Gradient noise scale B_simple during training",
            "B_simple was not recorded",
        ),
    ]
    parallel = _figure(
        lambda: _plot_dp_efficiency(runs),
        "Data-parallel efficiency: throughput(N) / (N · throughput(1))",
        f"{NOT_MEASURED} (one worker count)",
    )
    body = "\n".join(
        [
            f"<h1>{_escape(title)}</h1>",
            _section("Recommendation", _recommendation_html(summary)),
            _section(
                "Why doesn't training get faster?",
                markdown_to_html(narrative_markdown(summary)),
            ),
            REGRESSIONS_SLOT,
            _section("Throughput and memory", "\n".join(throughput)),
            _section("Convergence", "\n".join(convergence)),
            _section("Data-parallel efficiency", parallel),
            _section("Results by LR rule and batch size", _table_html(result.rows)),
        ]
    )
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{_escape(title)}</title>\n<style>{CSS}</style>\n</head>\n"
        f"<body>\n{body}\n</body>\n</html>\n"
    )


def add_regressions(page: str, markdown: str) -> str:
    """`page` with a "Regressions" section rendered from `markdown` (its `## ` title line
    dropped), in the slot `render_html` leaves, or at the end of a page without one."""
    body = "\n".join(line for line in markdown.splitlines() if not line.startswith("## "))
    section = _section(REGRESSIONS_TITLE, markdown_to_html(body))
    if REGRESSIONS_SLOT in page:
        return page.replace(REGRESSIONS_SLOT, section, 1)
    return page.replace("</body>", f"{section}\n</body>", 1)
