"""Known-answer tests of the sweep-table fits shared by the sweep and the analysis
(batchscale.fits): saturation batch, step-time and memory lines, largest fitting batch."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from test_analyze import sweep_row

from batchscale.analysis.narrative import memory_line_text
from batchscale.analysis.summary import MemorySummary
from batchscale.config import AnalysisConfig
from batchscale.fits import (
    DEFAULT_SATURATION_TOLERANCE,
    find_saturation,
    fit_memory,
    fit_step_time,
    largest_fitting_batch,
    saturation_batch,
    throughput_curve,
    timing_mode,
)


def test_saturation_batch_on_constructed_curve():
    throughput = {1: 100, 2: 190, 4: 350, 8: 600, 16: 905, 32: 980, 64: 1000, 128: 995}
    rows = [sweep_row(b, b / s) for b, s in throughput.items()]
    rows += [sweep_row(256, None, status="oom"), sweep_row(8, 8 / 5000, mode="real")]
    sweep = pd.DataFrame(rows)
    assert saturation_batch(sweep) == 16
    assert saturation_batch(sweep, tolerance=0.05) == 32
    # one batch timed says nothing about where throughput stops growing
    assert saturation_batch(sweep, input_mode="real") is None
    assert "needs at least two" in find_saturation(sweep, input_mode="real")[1]
    assert saturation_batch(pd.DataFrame([sweep_row(4, None, status="oom")])) is None


def test_no_saturation_batch_while_samples_per_s_still_grows_at_the_largest_batch():
    """A user's sweep: 111,857 samples/s at 128, 223,860 at 512 (the largest measured). The
    first batch within 10 % of the best is the largest itself: no plateau was seen."""
    rows = [sweep_row(b, b / s) for b, s in {8: 9000, 32: 36000, 128: 111857,
                                              512: 223860}.items()]
    batch, reason = find_saturation(pd.DataFrame(rows))
    assert batch is None
    assert "still grows at 512, the largest batch measured" in reason
    rows.append(sweep_row(1024, 1024 / 230000))  # a larger batch within 10 %: now a plateau
    assert saturation_batch(pd.DataFrame(rows)) == 512


def test_larger_batches_flagged_unstable_are_named_not_called_unmeasured():
    """Timed at 4–128 on a busy machine, only 4 and 8 stable: growth is seen up to 8, and the
    reason says the larger batches were measured but left out, not that 8 was the largest."""
    rows = [sweep_row(b, b / s) for b, s in {4: 600, 8: 979}.items()]
    rows += [{**sweep_row(b, b / s), "quality": "unstable"}
             for b, s in {16: 1100, 64: 1300, 128: 1369}.items()]
    batch, reason = find_saturation(pd.DataFrame(rows))
    assert batch is None
    assert reason == ("samples/s still grows at 8, the largest batch measured stably (synthetic "
                      "input); batch 16, 64, 128 were timed but flagged unstable and left out, "
                      "so whether it goes on growing is not known: rerun the sweep on a quieter "
                      "machine")


def test_fit_step_time_recovers_line():
    batch = np.array([1, 4, 16, 64, 256])
    fit = fit_step_time(batch, 0.002 + 1e-5 * batch)
    assert fit.alpha_s == pytest.approx(0.002)
    assert fit.beta_s == pytest.approx(1e-5)
    assert fit.r2 == pytest.approx(1.0)
    assert fit.predict(128) == pytest.approx(0.002 + 1e-5 * 128)
    assert math.isnan(fit_step_time([4], [0.1]).alpha_s)


def test_fit_memory_predicts_largest_batch_under_budget():
    batch = np.array([1, 4, 16, 64])
    fit = fit_memory(batch, 1000 + 10 * batch, budget_bytes=2005)
    assert (fit.fixed_bytes, fit.per_sample_bytes) == pytest.approx((1000, 10))
    assert fit.b_max == 100
    assert "budget" in fit_memory(batch, 1000 + 10 * batch).reason
    assert math.isnan(fit_memory(batch, [5, 5, 5, 5], budget_bytes=10).b_max)


def test_the_memory_line_carries_its_standard_errors_where_the_batches_leave_any():
    """Four batches with scatter: both terms get a standard error (numpy's covariance of the
    same least-squares line gives the same), printed beside them; two batches fix the line
    exactly, and the text says it has no error estimate."""
    batch = np.array([16.0, 32.0, 64.0, 128.0])
    peak = 416 * 2**20 + 31.2 * 1024 * batch + np.array([3e5, -5e5, 4e5, -1e5])
    fit = fit_memory(batch, peak)
    _, cov = np.polyfit(batch, peak, 1, cov="unscaled")
    residual = np.sum((peak - fit.fixed_bytes - fit.per_sample_bytes * batch) ** 2) / 2
    assert fit.per_sample_se_bytes == pytest.approx(math.sqrt(cov[0, 0] * residual))
    assert fit.fixed_se_bytes == pytest.approx(math.sqrt(cov[1, 1] * residual))
    summary = MemorySummary(fit.fixed_bytes, fit.per_sample_bytes, fit.r2, "", math.inf, "",
                            fit.fixed_se_bytes, fit.per_sample_se_bytes)
    assert memory_line_text(summary) == ("416 MiB ± 422 KiB + 30.6 KiB ± 5.72 KiB per sample "
                                         "(± one standard error; R² 0.93)")
    two = fit_memory(batch[:2], peak[:2])
    assert math.isnan(two.fixed_se_bytes) and math.isnan(two.per_sample_se_bytes)
    assert memory_line_text(MemorySummary(two.fixed_bytes, two.per_sample_bytes, two.r2, "",
                                          math.inf, "")).endswith(
        "per sample (no error estimate: a line through two batch sizes fits them exactly)")


def test_largest_fitting_batch_is_below_the_smallest_oom():
    sweep = pd.DataFrame(
        [sweep_row(b, 0.01) for b in (16, 64, 256)]
        + [sweep_row(b, None, status="oom") for b in (512, 1024)]
    )
    assert largest_fitting_batch(sweep) == (256.0, "batch 512 ran out of memory")
    measured = sweep.iloc[:3].assign(peak_memory_bytes=[1e6, 2e6, 3e6])
    no_oom, reason = largest_fitting_batch(measured)
    assert no_oom == math.inf and "up to batch 256" in reason
    assert math.isnan(largest_fitting_batch(pd.DataFrame())[0])
    # A table from elsewhere with no peak memory and no out-of-memory row says nothing of
    # memory: not "nothing ran out".
    silent, reason = largest_fitting_batch(sweep.iloc[:3])
    assert math.isnan(silent) and reason == ("memory not measured: the sweep table records no "
                                             "peak memory and no out-of-memory row")


def test_an_oom_below_batches_that_fit_is_named_not_hidden():
    """A kernel's workspace can peak at one batch size (seen: batch 64 above 128 on CPU)."""
    sweep = pd.DataFrame([sweep_row(b, 0.01) for b in (16, 32, 128, 192)]
                         + [sweep_row(b, None, status="oom") for b in (64, 256)])
    wall, reason = largest_fitting_batch(sweep)
    assert wall == 32.0
    assert reason.startswith("batch 64 ran out of memory, although 128, 192 fit: peak memory "
                             "is not monotone in the batch size")


def test_saturation_default_is_the_configs():
    assert DEFAULT_SATURATION_TOLERANCE == AnalysisConfig().saturation_tolerance


def test_sweep_summary_uses_the_configured_tolerance():
    from batchscale.sweep.sweep import summarize

    throughput = {1: 100, 2: 190, 4: 350, 8: 600, 16: 905, 32: 980, 64: 1000}
    rows = [{**sweep_row(b, b / s), "mfu": 0.1, "memory_cap_bytes": None}
            for b, s in throughput.items()]
    assert summarize(rows)["saturation_batch"] == 16
    loose = summarize(rows, 0.5)
    assert (loose["saturation_batch"], loose["saturation_tolerance"]) == (8, 0.5)


# --------------------------------------------------------------------------- unstable rows


def flagged(row: dict, quality: str | None) -> dict:
    return {**row, "quality": quality, "quality_reason": "cv 0.9 > 0.5" if quality else None}


def test_an_unstable_row_does_not_set_the_saturation_batch():
    """Batch 32 read 2,000 samples/s in a disturbed window (twice its neighbours): counted, it
    would be the best and make 32 the saturation batch; flagged, it is left out."""
    throughput = {8: 600, 16: 905, 32: 2000, 64: 1000, 128: 995}
    rows = [sweep_row(b, b / s) for b, s in throughput.items()]
    trusted = pd.DataFrame([flagged(r, "ok") for r in rows])
    assert saturation_batch(trusted) == 32
    disturbed = pd.DataFrame([flagged(r, "unstable" if r["batch_size"] == 32 else "ok")
                              for r in rows])
    assert saturation_batch(disturbed) == 16
    assert 32 not in throughput_curve(disturbed)["batch_size"].tolist()
    assert 32 in throughput_curve(disturbed, include_unstable=True)["batch_size"].tolist()
    older = pd.DataFrame([flagged(r, None) for r in rows])  # no quality recorded: used
    assert saturation_batch(older) == 32


def test_timing_mode_skips_a_mode_whose_rows_are_all_unstable():
    rows = [flagged(sweep_row(b, 0.01), "unstable") for b in (4, 16)]
    rows += [flagged(sweep_row(b, 0.02, mode="real"), "ok") for b in (4, 16)]
    assert timing_mode(pd.DataFrame(rows)) == "real"
    assert timing_mode(pd.DataFrame(rows[:2])) is None


def test_largest_fitting_batch_counts_unstable_rows():
    """Whether a batch fits does not depend on CPU load: an unstable row still ran."""
    sweep = pd.DataFrame(
        [flagged(sweep_row(16, 0.01), "ok"), flagged(sweep_row(64, 0.05), "unstable"),
         flagged(sweep_row(128, None, status="oom"), None)]
    )
    assert largest_fitting_batch(sweep) == (64.0, "batch 128 ran out of memory")


def test_an_mfu_above_one_is_named_untrusted_not_printed_as_a_figure():
    """Seen on 2 cores: 'MFU 194.63%' for a segmentation sweep whose peak matmul was timed
    while other work ran. Above 100 % the figure cannot be true."""
    from batchscale.fits import mfu_text

    assert mfu_text(0.5412) == "MFU 54.1%"
    # with the row's rerun range of samples/s, which MFU moves with; never above 100 %
    assert mfu_text(0.4, (0.9, 1.1)) == "MFU 40.0% [36.0%, 44.0%]"
    assert mfu_text(0.95, (0.9, 1.2)) == "MFU 95.0% [85.5%, 100.0%]"
    assert mfu_text(0.4, (float("nan"), 1.1)) == "MFU 40.0%"
    assert mfu_text(None) == mfu_text(float("nan")) == "MFU not known"
    untrusted = mfu_text(1.9463)
    assert untrusted.startswith("MFU not trusted: 195% is above 100 %")
    assert "194.63" not in untrusted


def test_memory_that_does_not_grow_measurably_gives_no_per_sample_figure():
    """Peaks scattering by ±1 MiB around 425 MiB over 8…512: a slope of a few bytes per
    sample is noise, printed once as '1.38e-09 B per sample'. It is no figure, and no largest
    batch is predicted from it."""
    batch = np.array([8, 32, 128, 512])
    peaks = 425 * 2**20 + np.array([-1, 1, -1, 1]) * 2**20
    fit = fit_memory(batch, peaks, 2**33)
    assert not fit.per_sample_clear and math.isnan(fit.b_max)
    assert "does not grow measurably" in fit.reason
    growing = fit_memory(batch, 400 * 2**20 + 50_000 * batch + np.array([1, -1, 1, -1]) * 2**16,
                         500 * 2**20)
    assert growing.per_sample_clear and math.isfinite(growing.b_max)


def test_the_largest_batch_is_not_predicted_far_past_the_measured_ones():
    """A budget reached near batch 1,000,000 from batches up to 512 (a user's sweep printed
    1053957): that far out the line's slope error dominates; the fit says so instead."""
    batch = np.array([8, 32, 128, 512])
    fit = fit_memory(batch, 400 * 2**20 + 1_000 * batch, 400 * 2**20 + 1_000 * 1_000_000)
    assert math.isnan(fit.b_max)
    assert "more than 8× the largest batch measured (512)" in fit.reason
    near = fit_memory(batch, 400 * 2**20 + 1_000 * batch, 400 * 2**20 + 1_000 * 2_000)
    assert near.b_max in (1_999, 2_000)  # floor of a ratio that round-off can put below


def test_the_saturation_batch_says_where_the_rows_rerun_ranges_could_put_it():
    """The trial's sweep: best 371,892 samples/s, the 10 % line near 334,700; batch 1024's
    range 314,853–369,345 straddles it, 512's stays below: the point is 1024, the rows allow
    1024 or 2048 (the first whose whole range clears the line). Narrow ranges: nothing said."""
    from batchscale.fits import saturation_range

    figures = {256: (200_000, 0.03), 512: (300_000, 0.03), 1024: (340_000, 0.08),
               2048: (371_892, 0.02)}
    rows = [{**sweep_row(b, b / s), "samples_per_s_low": s * (1 - w),
             "samples_per_s_high": s * (1 + w)} for b, (s, w) in figures.items()]
    sweep = pd.DataFrame(rows)
    assert saturation_batch(sweep) == 1024
    assert saturation_range(sweep) == "the rows' rerun ranges put it anywhere from 1,024 to 2,048"
    narrow = sweep.assign(samples_per_s_low=sweep["samples_per_s"] * 0.995,
                          samples_per_s_high=sweep["samples_per_s"] * 1.005)
    assert saturation_range(narrow) == ""
    no_ranges = sweep.assign(samples_per_s_low=math.nan)
    assert saturation_range(no_ranges) == ""


def test_the_saturation_range_compares_rows_of_one_sweep_by_its_trials():
    """The same rows with `trial_log_sd` recorded: each row's ratio to the best gets the
    sweep's trial-to-trial range (t with the pool's 4 degrees of freedom, both rows averaging
    two trials), whatever their rerun intervals say. Trials 1 % apart (in log sd) leave 1,024
    (91 % of the best) able to fall below the line; 0.2 % pins it; 10 % reaches back to 512."""
    from batchscale.fits import saturation_range

    figures = {256: 200_000, 512: 300_000, 1024: 340_000, 2048: 371_892}
    rows = [{**sweep_row(b, b / s), "samples_per_s_low": s * 0.5, "samples_per_s_high": s * 2,
             "rounds": 2, "retries": 0} for b, s in figures.items()]
    sweep = pd.DataFrame(rows)
    assert saturation_range(sweep.assign(trial_log_sd=0.01)) == \
        "the sweep's trials put it anywhere from 1,024 to 2,048"
    assert saturation_range(sweep.assign(trial_log_sd=0.002)) == ""
    assert saturation_range(sweep.assign(trial_log_sd=0.1)) == \
        "the sweep's trials put it anywhere from 512 to past 2,048, the largest measured"
    # without the column: the rerun intervals (here ×2 either way) as before
    assert saturation_range(sweep).startswith("the rows' rerun ranges put it anywhere from 256")
