"""Real input against synthetic: the share of synthetic-input samples/s lost to the input
pipeline at each batch, and its range.

The two rows of a batch are timed in the same sweep, their rounds interleaved, so what separates
them is the sweep's trial-to-trial noise, not the drift between sweeps that a row's rerun
interval must also cover. The range therefore comes from the trials' own disagreement
(`trial_log_sd`), pooled over the sweep's stable timed rows of both input modes (they ran on
the same host, in the same minutes): a Student-t interval on the log of real ÷ synthetic with
the pool's degrees of freedom. A row's rerun interval (widened by the sweep's pooled
disagreement at one degree of freedom and by `sweep.between_sweep_cv`) would make that range
span most of [0, 1] on a noisy host even where the rows clearly differ. Tables written before
`trial_log_sd` was recorded fall back to the two rows' rerun intervals, each at its far end.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from batchscale.fits import pair_half_width, throughput_curve, trial_pool

BASIS_TRIALS = "the sweep's trials"
BASIS_RERUN = "the two rows' rerun intervals"
"""What a share's range was computed from, as the narrative names it."""


def input_pipeline_share(sweep: pd.DataFrame) -> pd.DataFrame:
    """Per batch: share of synthetic-input throughput lost with real input (1 − real/synthetic),
    with `share_low`, `share_high` at 90 % and `basis` (BASIS_TRIALS, or BASIS_RERUN for
    older tables: the real row's slow end against the synthetic row's fast end, and the
    reverse); NaN where neither can be had.

    Near 0 the input pipeline keeps up; a large share means the device waits for data. Below 0
    real input was timed faster, which reading data cannot make a step: the rows then differ by
    the machine's speed between their trials.
    """
    columns = ["samples_per_s", "samples_per_s_low", "samples_per_s_high", "trials"]
    synthetic = throughput_curve(sweep, "synthetic").set_index("batch_size")[columns]
    real = throughput_curve(sweep, "real").set_index("batch_size")[columns]
    both = synthetic.join(real, how="inner", suffixes=("_synthetic", "_real"))
    both = both.dropna(subset=["samples_per_s_synthetic", "samples_per_s_real"])
    ratio = both["samples_per_s_real"] / both["samples_per_s_synthetic"]
    out = pd.DataFrame({"synthetic": both["samples_per_s_synthetic"],
                        "real": both["samples_per_s_real"], "share": 1.0 - ratio})
    low, high = share_range(ratio.to_numpy(), trial_pool(sweep),
                            both["trials_real"].to_numpy(), both["trials_synthetic"].to_numpy())
    pooled = np.isfinite(low)
    rerun_low = 1.0 - both["samples_per_s_high_real"] / both["samples_per_s_low_synthetic"]
    rerun_high = 1.0 - both["samples_per_s_low_real"] / both["samples_per_s_high_synthetic"]
    out["share_low"] = np.where(pooled, low, rerun_low)
    out["share_high"] = np.where(pooled, high, rerun_high)
    out["basis"] = np.where(pooled, BASIS_TRIALS, BASIS_RERUN)
    return out.reset_index(names="batch_size")


def share_range(ratio: np.ndarray, pool: tuple[float, int], trials_real: np.ndarray,
                trials_synthetic: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(low, high) of the share 1 − ratio at 90 %, from the log ratio ± `fits.pair_half_width`
    (`pool` from `fits.trial_pool`); NaN without a pool."""
    half = pair_half_width(pool, trials_real, trials_synthetic)
    return 1.0 - ratio * np.exp(half), 1.0 - ratio * np.exp(-half)
