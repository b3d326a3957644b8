"""Student's t quantiles, for the intervals of the few-degrees-of-freedom estimates batchscale
makes (B_crit's Fieller interval, the gap to target, a sweep row's rerun interval).

A core module because the sweep and the analysis both need it and stages do not import each
other (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import math
from statistics import NormalDist


def t_quantile(p: float, dof: int) -> float:
    """Quantile `p` of Student's t with `dof` degrees of freedom (exact for 1 and 2; the
    Cornish–Fisher expansion of Abramowitz & Stegun 26.7.5 above, within 0.1 % for p ≤ 0.975).
    Here rather than scipy: callers need one number and scipy.stats takes a second to
    import."""
    if dof < 1:
        return math.inf
    if dof == 1:
        return math.tan(math.pi * (p - 0.5))
    if dof == 2:
        return (2 * p - 1) * math.sqrt(2 / (4 * p * (1 - p)))
    z = NormalDist().inv_cdf(p)
    terms = (
        (z**3 + z) / 4,
        (5 * z**5 + 16 * z**3 + 3 * z) / 96,
        (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384,
        (79 * z**9 + 776 * z**7 + 1482 * z**5 - 1920 * z**3 - 945 * z) / 92160,
    )
    return z + sum(term / dof ** (k + 1) for k, term in enumerate(terms))
