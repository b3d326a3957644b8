"""Where the next scheduled run of a throughput cell will land, from this run and the cell's
history: the interval a user can hold the next sweep to.

A sweep row's own interval (`samples_per_s_low/high`, sweep/rounds.py) comes from its rounds,
seconds apart; on a shared machine whole sweeps also drift apart over minutes and hours, which
the rounds cannot see, so that interval alone under-covers the next sweep (docs/benchmarks.md).
The drift shows in the cell's series of earlier runs: the step from one run to the next. The
interval here is centred on this run's value and as wide as the wider of

- the row's own rerun interval (its rounds' disagreement), and
- the successive-difference interval: exp(log x_now ± t(m - 1) · sqrt(mean d²)), d the m steps
  log x_(i+1) - log x_i between consecutive comparable runs of the cell, this run's included.

The steps are exactly what is predicted (the next run minus this one), so a slow drift, which
moves the series' mean and would widen a spread around the mean (and centre it in the past),
costs this interval nothing; the mean of d is taken as zero (a run-to-run step has no favoured
sign unless the code changed, which the regression check looks for), and one degree of freedom
is given up because neighbouring steps share a run and are not independent. How often the next
sweep falls inside is measured by `bench_regressions` ("next-run interval").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from batchscale.tdist import t_quantile

NEXT_RUN_LEVEL = 0.9
"""Coverage the next-run interval aims at (that of the rows' own rerun interval)."""
MIN_STEPS = 3
"""Run-to-run steps (so MIN_STEPS + 1 runs, this one included) before the history says
anything; with fewer the interval is the row's own."""


ROUNDS_ALONE = f"this run's rounds alone (under {MIN_STEPS + 1} runs of history)"
"""The basis of a range with no history to widen it: the rows' own interval, which covers the
next sweep less often than it claims (docs/benchmarks.md)."""


def successive_half_width(values: Sequence[float], level: float = NEXT_RUN_LEVEL) -> float | None:
    """The half-width, in log units, of the successive-difference interval over `values` (a
    cell's samples/s in run order, this run last); None under MIN_STEPS steps or with a value
    that is not positive."""
    if len(values) < MIN_STEPS + 1 or min(values) <= 0:
        return None
    logs = [math.log(v) for v in values]
    steps = [after - before for before, after in zip(logs, logs[1:], strict=False)]
    rms = math.sqrt(sum(d * d for d in steps) / len(steps))
    return t_quantile(0.5 + level / 2, len(steps) - 1) * rms


def next_run_interval(values: Sequence[float],
                      own: tuple[float | None, float | None] | None = None,
                      level: float = NEXT_RUN_LEVEL) -> tuple[float, float, str] | None:
    """(low, high, source) for the next run's samples/s, centred on `values[-1]` (this run),
    as wide as the wider of the row's own interval `own` (its rounds; ignored unless both ends
    are positive numbers: not recorded, or a table before it) and the successive-difference
    interval of `values`; `source` says which set the width ("history of N runs", "this run's
    rounds, wider than …", or ROUNDS_ALONE). None when neither can be given."""
    if not values or values[-1] <= 0:
        return None
    now = values[-1]
    widths = []
    history = successive_half_width(values, level)
    if history is not None:
        widths.append((history, f"history of {len(values)} runs"))
    if own is not None and all(_positive(end) for end in own):
        rounds = (f"this run's rounds, wider than its history of {len(values)} runs"
                  if history is not None else ROUNDS_ALONE)
        widths.append((max(math.log(now / own[0]), math.log(own[1] / now), 0.0), rounds))
    if not widths:
        return None
    half, source = max(widths)
    return now * math.exp(-half), now * math.exp(half), source


def _positive(value: object) -> bool:
    return isinstance(value, int | float) and math.isfinite(value) and value > 0
