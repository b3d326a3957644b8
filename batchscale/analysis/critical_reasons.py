"""Why the critical batch fit gives no number: the reasons `critical.fit_critical_batch` states
when the data do not support B_crit, in words that agree with the steps table beside them."""

from __future__ import annotations

import numpy as np

MIN_CRITICAL_FIT_BATCHES = 3
"""Two parameters fit any two points exactly: a third batch size is the first check."""

FALL_SEEN_SE = 2.0
"""E_min this many standard errors above zero: the steps visibly fall with the batch, even
where too few batch sizes make it short of the fit's support rule."""


def neither_clear_reason(fits, needed: float, smallest: float, largest: float) -> str:
    """Why neither S_min nor E_min is clear. Where the fitted steps visibly fall with the batch
    (E_min at least FALL_SEEN_SE standard errors up: a few batch sizes, steps that halve) it
    says so with the figures, since "too much scatter to tell" would contradict the table
    beside it."""
    if not float(fits.t_e_min) >= FALL_SEEN_SE:
        return (f"the steps scatter too much (±{float(fits.scatter):.0%} about the fit) to tell "
                "whether a bigger batch saves steps")
    return (f"{fitted_fall(fits, smallest, largest)} neither the part that falls like 1/B "
            f"(E_min, {float(fits.t_e_min):.1f} standard errors from zero) nor the floor S_min "
            f"({float(fits.t_s_min):.1f}) is clear ({needed:.1f} needed); more batch sizes or "
            "seeds would tell")


def fitted_fall(fits, smallest: float, largest: float) -> str:
    """"the fitted steps fall from 137 at batch 8 to 31 at 128, but with 3 batch sizes and ±14%
    scatter about the fit": the start of a reason for a fall the fit cannot vouch for."""
    s_min, e_min = float(fits.s_min), float(fits.e_min)
    return (f"the fitted steps fall from {s_min + e_min / smallest:,.0f} at batch "
            f"{smallest:,.0f} to {s_min + e_min / largest:,.0f} at {largest:,.0f}, but with "
            f"{int(fits.points)} batch sizes and ±{float(fits.scatter):.0%} scatter about the "
            "fit")


def too_few_reason(batches_run: np.ndarray, reached: np.ndarray) -> str:
    """Why there are too few batch sizes to fit ("" when there are enough)."""
    run = np.unique(batches_run[np.isfinite(batches_run) & (batches_run > 0)])
    done = np.unique(reached)
    if done.size >= MIN_CRITICAL_FIT_BATCHES:
        return ""
    if run.size == 0:
        return "no trials with a batch size: nothing to fit"
    if run.size == 1:
        return (
            f"one batch size measured ({run[0]:,.0f}): B_crit needs steps to target at"
            f" {MIN_CRITICAL_FIT_BATCHES} or more batch sizes"
        )
    if done.size == 0:
        return f"no batch size reached the target (of {run.size} run): no steps to fit"
    listed = ", ".join(f"{value:,.0f}" for value in done)
    return (
        f"only {done.size} of {run.size} batch sizes reached the target ({listed}): B_crit"
        f" needs {MIN_CRITICAL_FIT_BATCHES} or more"
    )
