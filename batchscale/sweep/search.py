"""The largest batch that fits: doubling, then bisection, within a fixed number of trials.

Doubling from the smallest batch brackets the memory wall and, on the way, measures the
throughput curve at powers of two (which the sweep wants anyway). Bisection then narrows the
bracket until it is within `tolerance` of the largest fitting batch. The whole search never
spends more than floor(log2(max_batch / min_batch)) + 2 trials: doubling takes at most
log2(range) + 1 of them, bisection gets what is left.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

FITS = "fits"
DOES_NOT_FIT = "does_not_fit"
FAILED = "failed"
"""A probe that failed for a reason other than memory: bisecting on it would be meaningless."""
PHASE_DOUBLING = "doubling"
PHASE_BISECTION = "bisection"


@dataclass(frozen=True)
class SearchResult:
    """Bracket of the memory wall: `largest_fitting` ran, `smallest_failing` did not."""

    largest_fitting: int | None
    smallest_failing: int | None
    trials: int
    trial_budget: int
    stopped_by: str


def trial_budget(min_batch: int, max_batch: int) -> int:
    """floor(log2(range)) + 2 trials: the search's promised bound."""
    return int(math.floor(math.log2(max_batch / min_batch))) + 2


def search_largest_batch(
    probe: Callable[[int, str], str], *, min_batch: int = 1, max_batch: int, tolerance: float,
) -> SearchResult:
    """Find the largest batch for which `probe(batch, phase)` returns FITS.

    `probe` runs one trial and returns FITS, DOES_NOT_FIT (out of memory) or FAILED (any other
    failure, which stops the search).
    """
    if not 1 <= min_batch <= max_batch:
        raise ValueError(f"need 1 <= min_batch <= max_batch, got {min_batch}, {max_batch}")
    budget = trial_budget(min_batch, max_batch)
    lo: int | None = None
    hi: int | None = None
    trials = 0
    batch = min_batch
    while trials < budget:
        trials += 1
        outcome = probe(batch, PHASE_DOUBLING)
        if outcome == FAILED:
            return SearchResult(lo, hi, trials, budget, f"batch {batch} failed")
        if outcome == DOES_NOT_FIT:
            hi = batch
            break
        lo = batch
        if batch == max_batch:
            return SearchResult(lo, hi, trials, budget, f"max_batch_size {max_batch} fits")
        batch = min(2 * batch, max_batch)
    if lo is None:
        return SearchResult(lo, hi, trials, budget, f"the smallest batch {min_batch} does not fit")
    if hi is None:
        return SearchResult(lo, hi, trials, budget, "trial budget spent")
    while hi - lo > max(1, lo * tolerance):
        if trials >= budget:
            return SearchResult(lo, hi, trials, budget, "trial budget spent")
        mid = (lo + hi) // 2
        trials += 1
        outcome = probe(mid, PHASE_BISECTION)
        if outcome == FAILED:
            return SearchResult(lo, hi, trials, budget, f"batch {mid} failed")
        if outcome == FITS:
            lo = mid
        else:
            hi = mid
    return SearchResult(lo, hi, trials, budget, f"bracket within {tolerance:.0%}")
