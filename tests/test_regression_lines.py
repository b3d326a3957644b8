"""Which bound set a regression line's allowed drop (batchscale/lake/verdicts.py)."""

from __future__ import annotations

import pandas as pd
import pytest
from test_regression import HISTORY, MEAN_RATE, sweep_frame

from batchscale.lake.regression import check_regressions
from batchscale.lake.verdicts import suspected_cells


@pytest.mark.parametrize(("scatter", "bound"), [
    (0.001, "the 8% floor, as this history scatters less"),
    (0.05, "2.5 robust standard deviations of this history"),
])
def test_a_suspected_line_names_the_bound_that_set_the_allowed_drop(scatter, bound):
    """A quiet history's allowed drop is the fixed floor, a noisy one's its own scatter; the
    line says which, so "noise allows a drop of X" is not read as this cell's interval."""
    history = pd.concat([sweep_frame(f"h{i:02d}", {64: MEAN_RATE * (1 + scatter * (-1) ** i
                                                                    * (1 + i % 3))})
                         for i in range(HISTORY)], ignore_index=True)
    table = check_regressions(sweep_frame("now", {64: MEAN_RATE * 0.4}), history, HISTORY)
    [line] = suspected_cells(table)
    assert bound in line, line
