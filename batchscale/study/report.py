"""The study report: one self-contained HTML page (`study.html.j2`) comparing a study's
variants (docs/architecture.md, "Studies"): the answer, a table of the variants per target and
LR rule, B_crit against each axis with the fitted slope in words, and the environment.

Like the analysis report it carries everything inside (plots as PNG `data:` URIs) and escapes
every value; the answer is the caller's Markdown, made safe by `markdown_html`. Numbers are
written as the analysis writes them (`narrative`): a B_crit is "123 [90, 170]", a bound in the
words every output uses, or "not estimated" with the reason."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pandas as pd

from batchscale.analysis.figures import Plot, make_plot, new_axes
from batchscale.analysis.narrative import b_crit_text
from batchscale.analysis.plots_targets import BOUND_ARROW_FACTOR
from batchscale.analysis.prose import number
from batchscale.analysis.targets import label_of
from batchscale.config.study import axis_key
from batchscale.html import markdown_html, render_page

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

TEMPLATE = "study.html.j2"
MODEL_X = "parameters"
"""The x of an axis whose values are workload names: the model's parameter count."""
MAX_LABELLED_TICKS = 8
"""An axis with at most this many distinct x values gets a tick labelled at each."""
FIGURE_HEADINGS = ("S_min ± standard error", "E_min ± standard error",
                   "B_simple (median over trials, no interval)",
                   "saturation batch (no interval)", "B* [90 % interval]")
ENV_LABELS = (("run_id", "study id"), ("experiment", "experiment"), ("workload", "workloads"),
              ("git_commit", "commit"), ("batchscale_version", "batchscale"),
              ("torch_version", "torch"), ("python_version", "python"), ("device_name", "device"),
              ("threads", "threads"), ("world_size", "workers"), ("config_hash", "config hash"))


def render_study_report(study: pd.DataFrame, axes: pd.DataFrame, answer_markdown: str,
                        axes_config: dict[str, list], title: str) -> str:
    """The whole page. `study`: rows of the "study" table; `axes`: of "study_axes";
    `axes_config`: {axis: [values]} as configured. The plots show the first target and LR
    rule of `study`; the tables show them all."""
    study = study.assign(values=[json.loads(v) for v in study["axis_values"]])
    names = list(dict.fromkeys([*axes_config, *axes["axis"]]))
    keys = list(dict.fromkeys(
        study[["target_metric", "target_value", "lr_rule"]].itertuples(index=False, name=None)))
    tables = [study[study["target_metric"].eq(metric) & study["target_value"].eq(value)
                    & study["lr_rule"].eq(rule)] for metric, value, rule in keys]
    return render_page(
        TEMPLATE, title=title, answer=markdown_html(answer_markdown),
        headings=["variant", *names, "B_crit [90 % interval] or bound", *FIGURE_HEADINGS],
        tables=[{"heading": _target_text(rows.iloc[0]),
                 "rows": [_variant_cells(r, names) for r in rows.to_dict("records")]}
                for rows in tables],
        axes=[_axis_section(tables[0] if tables else study, axes, name,
                            axes_config.get(name, [])) for name in names],
        environment=_environment(study))


def _target_text(row: dict | pd.Series) -> str:
    return f"{label_of((row['target_metric'], row['target_value']))}, {row['lr_rule']} rule"


# --------------------------------------------------------------------------- the table


def _variant_cells(row: dict, names: list[str]) -> list[tuple[str, bool]]:
    """(shown text, is text) per column; text cells align left."""
    figures = [_with_se(row, "s_min"), _with_se(row, "e_min"),
               number(_float(row["b_simple"])), number(_float(row["saturation_batch"])),
               b_star_cell(row)]
    return [(str(row["variant"]), True),
            *[(_value_text(row["values"].get(name, "")), True) for name in names],
            (b_crit_cell(row), True), *[(text, False) for text in figures]]


def b_crit_cell(row: dict) -> str:
    """"123 [90, 170]", "above 1,024: steps still fall like 1/B", or "not estimated: why"."""
    if _has_bound(row):
        return b_crit_text(math.nan, row["b_crit_bound"], _float(row["b_crit_bound_batch"]))
    if math.isfinite(_float(row["b_crit"])):
        text = _with_interval(row["b_crit"], row["b_crit_low"], row["b_crit_high"])
        note = _text(row.get("b_crit_interval_note"))
        return f"{text} (not in the slope fit: {note})" if note else text
    reason = _text(row.get("b_crit_reason"))
    return f"not estimated: {reason}" if reason else "not estimated"


def b_star_cell(row: dict) -> str:
    """B* with its interval, an end at the cap it may not pass said as a bound ("≥ 128,
    capped"), as the variant's own card says it."""
    cap, high = _float(row.get("b_star_cap")), _float(row["b_star_high"])
    text = _with_interval(row["b_star"], row["b_star_low"], row["b_star_high"])
    if math.isfinite(cap) and math.isfinite(high) and high >= cap and text.endswith("]"):
        return f"{text[:text.rindex(', ')]}, ≥ {number(cap)}, capped]"
    return text


def _with_interval(centre: object, low: object, high: object) -> str:
    centre, low, high = _float(centre), _float(low), _float(high)
    if not math.isfinite(centre):
        return number(centre)
    if math.isfinite(low) and math.isfinite(high):
        return f"{number(centre)} [{number(low)}, {number(high)}]"
    return f"{number(centre)} (no interval)"


def _with_se(row: dict, name: str) -> str:
    """"40 ± 2.1", or the figure and "(no standard error)" in rows written before layout 10."""
    value, se = _float(row[name]), _float(row.get(f"{name}_se"))
    if not math.isfinite(value):
        return number(value)
    return (f"{number(value)} ± {number(se)}" if math.isfinite(se)
            else f"{number(value)} (no standard error)")


def _float(value: object) -> float:
    """A cell as a float; NaN for null (pandas reads a null int or string as None or NaN)."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _has_bound(row: dict) -> bool:
    return bool(_text(row.get("b_crit_bound")))


def _value_text(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _environment(study: pd.DataFrame) -> list[tuple[str, str]]:
    """(label, value) per environment column; several values joined, as variants may differ."""
    return [(label, ", ".join(map(str, dict.fromkeys(study[column].dropna()))) or "n/a")
            for column, label in ENV_LABELS if column in study.columns]


# --------------------------------------------------------------------------- per axis


class AxisX(NamedTuple):
    """Where each variant sits on an axis's plot."""

    x: pd.Series
    label: str
    log: bool
    positional: bool
    """The x is only the values' order (names that are no workloads): it has no range."""


def _axis_section(rows: pd.DataFrame, axes: pd.DataFrame, name: str, values: list) -> dict:
    axis_x = _axis_x(rows, name)
    span = name if axis_x.positional else _span(axis_x)
    return {"name": name, "studied": ", ".join(map(_value_text, values)),
            "sentences": [axis_sentence(r, span)
                          for r in axes[axes["axis"].eq(name)].to_dict("records")],
            "plot": _axis_plot(rows, name, axis_x)}


def _axis_x(rows: pd.DataFrame, name: str) -> AxisX:
    """The value itself where all are numbers (log where all are positive); for the model axis
    (it sets `workload`), the model's parameter count; else the values' order."""
    values = [v.get(name) for v in rows["values"]]
    if values and all(map(_is_number, values)):
        x = pd.Series(values, index=rows.index, dtype=float)
        return AxisX(x, name, bool((x > 0).all()), False)
    if axis_key(name) == "workload":
        x = pd.to_numeric(rows[MODEL_X], errors="coerce").astype(float)
        return AxisX(x.where(x > 0), f"{name} ({MODEL_X})", True, False)
    order = list(dict.fromkeys(map(str, values)))
    return AxisX(pd.Series([float(order.index(str(v))) for v in values], index=rows.index,
                           dtype=float), name, False, True)


def _span(axis_x: AxisX) -> str:
    finite = axis_x.x[np.isfinite(axis_x.x)]
    if finite.empty:
        return axis_x.label
    return f"{axis_x.label} {number(finite.min())} → {number(finite.max())}"


def axis_sentence(row: dict, span: str) -> str:
    """One row of `study_axes` in words: the factor over the axis's range with the slope, the
    slope where no change is detectable, or why it was not fitted."""
    head = f"{_target_text(row)}: "
    if not math.isfinite(_float(row["slope"])):
        return head + row["verdict"]
    scale = ("in log–log" if row["x_scale"] == "log"
             else f"of ln B_crit per unit of {row['x_name']}")
    slope = f"slope {_interval_text(row, 'slope')} {scale}"
    factor = f"B_crit ×{_interval_text(row, 'range_factor')} over {span}"
    fitted = f"{row['variants_fitted']} variants"
    if row["verdict"] == "no detectable change":
        return head + f"{row['verdict']}: {slope} ({factor}; {fitted})"
    return head + f"{row['verdict']}: {factor} ({slope}; {fitted})"


def _interval_text(row: dict, column: str) -> str:
    low, high = _float(row[f"{column}_low"]), _float(row[f"{column}_high"])
    interval = (f" [{_signed(low)}, {_signed(high)}]" if math.isfinite(low)
                and math.isfinite(high) else " (no interval)")
    return _signed(_float(row[column])) + interval


def _signed(value: float) -> str:
    """Two significant digits with a true minus sign (n/a for a missing value)."""
    if not math.isfinite(value):
        return number(value)
    return (f"{value:.2g}" if abs(value) < 100 else number(value)).replace("-", "−")


def _axis_plot(rows: pd.DataFrame, name: str, axis_x: AxisX) -> Plot:
    target = _target_text(rows.iloc[0]) if len(rows) else "no target"
    caption = (f"B_crit against {name} for {target}; one colour per combination of the other"
               " axes' values (bars: 90 % interval; open circles with arrows: bounds, B_crit"
               " lies beyond; crosses: no interval)" + _not_drawn(rows, axis_x))
    return make_plot(lambda: _draw_axis(rows, name, axis_x), caption,
                     "no variant has a B_crit or a bound")


def _not_drawn(rows: pd.DataFrame, axis_x: AxisX) -> str:
    """The variants missing from the plot, and why, for its caption."""
    records = rows.assign(x=axis_x.x).to_dict("records")
    unestimated = [str(r["variant"]) for r in records if not _drawable(r)]
    no_x = [str(r["variant"]) for r in records if _drawable(r) and not math.isfinite(r["x"])]
    return "".join(f". Not drawn, {why}: {', '.join(names)}" for why, names in (
        ("not estimated", unestimated), (f"no {axis_x.label}", no_x)) if names)


def _drawable(row: dict) -> bool:
    return _has_bound(row) or math.isfinite(_float(row["b_crit"]))


def _draw_axis(rows: pd.DataFrame, name: str, axis_x: AxisX) -> Figure | None:
    drawn = rows.assign(x=axis_x.x, others=[_series_label(v, name) for v in rows["values"]])
    drawable = np.array([_drawable(r) for r in drawn.to_dict("records")], dtype=bool)
    drawn = drawn[np.isfinite(drawn["x"].to_numpy(float)) & drawable]
    if drawn.empty:
        return None
    fig, ax = new_axes(_plain(axis_x.label), "B_crit (batch size)",
                       x_base=10 if axis_x.log else None, log_y=True)
    for i, (label, series) in enumerate(drawn.groupby("others", sort=False)):
        _draw_series(ax, f"C{i}", _plain(label), series.sort_values("x"))
    _label_ticks(ax, drawn, name)
    ax.margins(x=0.08)  # markers at the ends stay whole
    ax.legend(fontsize="small")
    return fig


def _series_label(values: dict, name: str) -> str:
    others = [f"{axis}={_value_text(v)}" for axis, v in values.items() if axis != name]
    return ", ".join(others) or "B_crit"


def _plain(text: str) -> str:
    """`text` as matplotlib prints it verbatim: a `$` in a name would start mathtext."""
    return text.replace("$", r"\$")


def _draw_series(ax: Axes, color: str, label: str, series: pd.DataFrame) -> None:
    """Numbers joined by a line (bars: interval; a cross: none), bounds as open circles with an
    arrow pointing where B_crit lies."""
    records = series.to_dict("records")
    numbers = pd.DataFrame([r for r in records if not _has_bound(r)], columns=series.columns)
    x, b_crit, low, high = (pd.to_numeric(numbers[k], errors="coerce").to_numpy(float)
                            for k in ("x", "b_crit", "b_crit_low", "b_crit_high"))
    has = np.isfinite(low) & np.isfinite(high)
    ax.plot(x, b_crit, "-", color=color, label=label)
    ax.errorbar(x[has], b_crit[has], fmt="o", color=color, capsize=3,
                yerr=np.vstack([b_crit[has] - low[has], high[has] - b_crit[has]]).clip(0))
    ax.plot(x[~has], b_crit[~has], "x", color=color)
    for r in filter(_has_bound, records):
        at = _float(r["b_crit_bound_batch"])
        tip = at * (BOUND_ARROW_FACTOR if r["b_crit_bound"] == "above" else 1 / BOUND_ARROW_FACTOR)
        ax.annotate("", (r["x"], tip), (r["x"], at),
                    arrowprops={"arrowstyle": "->", "color": color})
        ax.plot([r["x"]], [at], "o", mfc="none", color=color)
        ax.plot([r["x"]], [tip], alpha=0)  # annotations do not widen the axes' limits


def _label_ticks(ax: Axes, drawn: pd.DataFrame, name: str) -> None:
    """A labelled tick at each x drawn: the value, the name, or for workloads the name and its
    parameter count (the x)."""
    from matplotlib.ticker import NullFormatter

    ticks = dict(zip(drawn["x"], (v.get(name) for v in drawn["values"]), strict=True))
    if not 1 < len(ticks) <= MAX_LABELLED_TICKS:  # one x: matplotlib widens the limits
        return
    workloads = axis_key(name) == "workload"
    labels = [number(x) if _is_number(v) else f"{v}\n{number(x)}" if workloads else str(v)
              for x, v in ticks.items()]
    ax.set_xticks(list(ticks), [_plain(label) for label in labels])
    ax.xaxis.set_minor_formatter(NullFormatter())
