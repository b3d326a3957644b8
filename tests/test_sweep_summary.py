"""The sweep's own summary (batchscale/sweep/summary.py) says what its figures leave out: rows
whose trial raised, and a saturation batch it did not see."""

from __future__ import annotations

import math

from batchscale.sweep.summary import quality_summary, summary_lines


def _timed_summary(**changes) -> dict:
    summary = {"timed": True, "best_samples_per_s": 223860.0, "best_samples_per_s_low": 2e5,
               "best_samples_per_s_high": 2.4e5, "best_batch": 512, "best_mfu": math.nan,
               "saturation_batch": None,
               "saturation_reason": "samples/s still grows at 512, the largest batch measured",
               "saturation_tolerance": 0.1, "input_mode": "synthetic",
               "memory_fixed_bytes": math.nan, "memory_per_sample_bytes": math.nan,
               "predicted_reason": "one batch size", "largest_fitting_batch": math.inf,
               "largest_fitting_reason": "no cap", "timed_rows": 0}
    return summary | changes


def test_no_saturation_claim_when_the_sweep_saw_none():
    first = summary_lines(_timed_summary())[0]
    assert "saturates" not in first
    assert "no saturation batch: samples/s still grows at 512" in first
    plateau = summary_lines(_timed_summary(saturation_batch=128))[0]
    assert "the device saturates at batch ≈ 128" in plateau


def test_rows_whose_trial_raised_are_named_with_their_error():
    """A model that fails at batch 300 but not at 8: the summary of batch 8's figures must
    not read as if 300 was never run."""
    rows = [{"status": "ok", "batch_size": 8, "input_mode": "synthetic", "quality": "ok",
             "rounds": 2},
            {"status": "error", "batch_size": 300, "input_mode": "synthetic",
             "error": "RuntimeError: boom"},
            {"status": "oom", "batch_size": 4096, "input_mode": "synthetic", "error": "oom"}]
    lines = summary_lines(_timed_summary(**quality_summary(rows)))
    failed = [line for line in lines if line.startswith("FAILED")]
    assert failed == ["FAILED: 1 row(s) raised an error and are left out of every figure "
                      "(status error in the table): synthetic batch 300: RuntimeError: boom"]
    untimed = summary_lines({"timed": False, **quality_summary(rows[1:])})
    assert untimed[0] == "no batch size was timed successfully"
    assert untimed[1].startswith("FAILED: 1 row(s)")


def test_the_memory_line_gives_its_standard_errors_or_says_it_has_none():
    fitted = _timed_summary(memory_fixed_bytes=416 * 2**20, memory_per_sample_bytes=31.2 * 2**10,
                            memory_fit_r2=0.977, memory_per_sample_clear=True,
                            predicted_largest_batch=math.nan,
                            predicted_reason="no memory budget given")
    with_errors = fitted | {"memory_fixed_se_bytes": 2.1 * 2**20,
                            "memory_per_sample_se_bytes": 1.1 * 2**10}
    line = next(x for x in summary_lines(with_errors) if x.startswith("memory:"))
    assert line.startswith("memory: peak ≈ 416.0 ± 2.1 MiB + 31.2 ± 1.1 KiB × batch (± one "
                           "standard error; r² 0.977)")
    two = next(x for x in summary_lines(fitted | {"memory_fixed_se_bytes": math.nan,
                                                  "memory_per_sample_se_bytes": math.nan})
               if x.startswith("memory:"))
    assert "31.2 KiB × batch (two batch sizes: no error estimate; r² 0.977)" in two


def test_the_predicted_largest_batch_has_a_range_and_yields_to_a_measured_wall():
    """The trial's sweep: peak 412.8 ± 0.16 MiB + 4.4 ± 0.15 KiB × batch under a 480 MiB cap
    predicts about 15,000 — but batch 3,584 ran out of memory under that cap: said, and the
    measured wall stands."""
    from batchscale.fits import MemoryFit, b_max_interval

    fit = MemoryFit(412.8 * 2**20, 4.4 * 2**10, 0.99, 15_640.0, fixed_se_bytes=0.16 * 2**20,
                    per_sample_se_bytes=0.15 * 2**10)
    low, high = b_max_interval(fit, 480 * 2**20)
    assert low < 15_640 < high and high / low < 1.2
    base = _timed_summary(memory_fixed_bytes=fit.fixed_bytes,
                          memory_per_sample_bytes=fit.per_sample_bytes, memory_fit_r2=0.99,
                          memory_fixed_se_bytes=fit.fixed_se_bytes,
                          memory_per_sample_se_bytes=fit.per_sample_se_bytes,
                          predicted_largest_batch=15_640.0, predicted_reason="",
                          predicted_largest_batch_low=low, predicted_largest_batch_high=high)
    line = next(x for x in summary_lines(base | {"smallest_oom_batch": 3584.0})
                if x.startswith("memory:"))
    assert f"under the cap: 15640 [{low:.0f}, {high:.0f}] (90 %, from the terms' standard " \
           "errors)" in line
    assert "contradicted: batch 3584 ran out of memory under the same cap" in line
    quiet = next(x for x in summary_lines(base | {"smallest_oom_batch": math.nan})
                 if x.startswith("memory:"))
    assert "contradicted" not in quiet
    two_sizes = MemoryFit(fit.fixed_bytes, fit.per_sample_bytes, 1.0, 15_640.0)
    assert all(math.isnan(end) for end in b_max_interval(two_sizes, 480 * 2**20))


def test_a_row_line_says_when_its_spread_is_over_the_closest_majority_of_its_trials():
    """After a re-measurement the spread is over the closest 2 of 3 trials: said, so a row
    whose first trial was 45 % off does not read as all its trials agreeing within 0.5 %."""
    from batchscale.sweep.sweep import _spread_over

    assert _spread_over(2) == "over 2 trial(s)"
    assert _spread_over(3) == "(closest 2 of 3 trials)"
    assert _spread_over(4) == "(closest 3 of 4 trials)"
    assert _spread_over(1) == "over 1 trial(s)"
