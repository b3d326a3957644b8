"""Figure plumbing of the report's plots: a fresh off-screen (Agg) figure with readable log
axes, and a figure as a base64 PNG `data:` URI, so the page carries it inside and fetches
nothing. matplotlib is imported inside the functions: only a report render pays for it."""

from __future__ import annotations

import base64
import io
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.axis import Axis
    from matplotlib.figure import Figure

FIGURE_SIZE_IN = (6.4, 3.8)
FIGURE_DPI = 100
CURVE_POINTS = 200
"""Points on each fitted line."""
MINOR_LOG_LABELS = (2, 5)
"""Minor ticks of a decade that carry a label on log axes."""
PNG_DATA_URI_PREFIX = "data:image/png;base64,"


@dataclass(frozen=True)
class Plot:
    """One plot of the report: its caption and image, or why it could not be drawn."""

    caption: str
    image_uri: str | None
    """A `data:image/png;base64,…` URI; None when there was nothing to draw."""
    missing: str
    """Why there is no plot (shown instead of it)."""


def make_plot(draw: Callable[[], Figure | None], caption: str, missing: str) -> Plot:
    fig = draw()
    return Plot(caption, None if fig is None else png_data_uri(fig), missing)


def png_data_uri(fig: Figure) -> str:
    """`fig` as a PNG `data:` URI (no timestamp or software metadata)."""
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        # a plot of one batch size: matplotlib widens the equal limits itself, and its warning
        # would reach the user's terminal through the logging of warnings
        warnings.filterwarnings("ignore", message="Attempting to set identical low and high")
        fig.savefig(buffer, format="png", metadata={"Software": None})
    return PNG_DATA_URI_PREFIX + base64.b64encode(buffer.getvalue()).decode("ascii")


def _plain_number(value: float, _pos: int | None = None) -> str:
    return f"{value:g}"


def _minor_log_label(value: float, _pos: int | None = None) -> str:
    """Label the 2× and 5× minor ticks of a log axis, so short ranges still read as numbers."""
    if value <= 0:
        return ""
    mantissa = round(value / 10 ** math.floor(math.log10(value)))
    return f"{value:g}" if mantissa in MINOR_LOG_LABELS else ""


def _log_axis(axis: Axis, base: float = 10) -> None:
    from matplotlib.ticker import FuncFormatter

    axis.set_major_formatter(FuncFormatter(_plain_number))
    axis.set_minor_formatter(FuncFormatter(_minor_log_label if base == 10 else lambda *_: ""))


def new_axes(
    xlabel: str, ylabel: str, *, x_base: float | None = 2, log_y: bool = False
) -> tuple[Figure, Axes]:
    """A fresh Agg figure and axes.

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


def geometric_grid(low: float, high: float) -> np.ndarray:
    return np.geomspace(low, high, CURVE_POINTS)
