"""Numbers in the analysis's prose: one way to write a count, a ratio or a size in sentences
(the narrative, the study report and the noise-scale paragraph share it)."""

from __future__ import annotations

import math

NOT_AVAILABLE = "n/a"


def number(value: float | int | None) -> str:
    """A number for prose: n/a for missing, ∞ for unbounded, thousands separated."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NOT_AVAILABLE
    if value == math.inf:
        return "∞"
    return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.3g}"


def bytes_text(value: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(value) >= size:
            return f"{value / size:.3g} {unit}"
    return f"{value:.3g} B"
