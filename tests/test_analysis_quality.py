"""Measurement quality end to end through `analyze` and the report: sweep rows flagged unstable
are left out of t(B), the saturation batch, B* and time to target; the report opens with a
quality box only when something is flagged; time to target uses the convergence runs' own step
times, with a flag where they disagree with the sweep (batchscale.analysis.quality,
batchscale.analysis.timetotarget)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from test_analyze import make_runs, make_sweep, run_row, sweep_line

from batchscale.analysis.analyze import analyze
from batchscale.analysis.quality import headline, note_items, quality_lines
from batchscale.analysis.summary import ExcludedRow
from batchscale.analysis.timetotarget import cell_step_times, convergence_step_times
from batchscale.config import AnalysisConfig
from batchscale.report.render import render_html

SETTINGS = AnalysisConfig(bootstrap_samples=20)
DISTURBED_BATCH = 4
DISTURBED_STEP_S = 9.2e-3  # the busy-neighbour row: ~9× the quiet 1.0 ms
REASON = "rounds disagree by 45 % (more than 15 %)"
QUIET = {"quality": "ok", "quality_reason": None, "rounds": 2, "round_spread": 0.02,
         "retries": 0, "load_avg_1m": 1.9, "usable_cpus": 2, "process_cpu_per_wall": 1.8,
         "threads_oversubscribed": False}


def measured_sweep(disturbed: bool, *, flagged: bool = True) -> pd.DataFrame:
    """make_sweep's rows with the quality columns of a quiet sweep; `disturbed`: synthetic
    batch 4 was timed under a busy neighbour (9.2 ms), flagged unstable unless not `flagged`
    (a table from before quality flags: every quality column null)."""
    sweep = make_sweep().assign(**QUIET)
    if disturbed:
        row = (sweep["input_mode"] == "synthetic") & (sweep["batch_size"] == DISTURBED_BATCH)
        sweep.loc[row, "step_time_median_s"] = DISTURBED_STEP_S
        sweep.loc[row, "samples_per_s"] = DISTURBED_BATCH / DISTURBED_STEP_S
        sweep.loc[row, ["quality", "quality_reason", "retries", "load_avg_1m"]] = [
            "unstable", REASON, 2, 3.1]
    if not flagged:
        sweep = sweep.assign(**{name: None for name in QUIET})
    return sweep


def untimed_runs() -> pd.DataFrame:
    """Trials without train times: time to target can only use the sweep's step times."""
    return make_runs(seeds=(0, 1)).assign(train_time_s=None)


# --------------------------------------------------------------------------- unstable rows


def test_unstable_rows_are_left_out_of_step_time_b_star_and_time_to_target():
    runs = untimed_runs()
    quiet = analyze(measured_sweep(False), runs, None, SETTINGS)
    busy = analyze(measured_sweep(True), runs, None, SETTINGS)
    unflagged = analyze(measured_sweep(True, flagged=False), runs, None, SETTINGS)
    # the disturbed row would move the line if it counted: the test can fail
    assert unflagged.summary.step_time.alpha_s != pytest.approx(quiet.summary.step_time.alpha_s)
    assert busy.summary.step_time.alpha_s == pytest.approx(quiet.summary.step_time.alpha_s)
    assert busy.summary.step_time.beta_s == pytest.approx(quiet.summary.step_time.beta_s)
    assert busy.summary.throughput.saturation_batch == quiet.summary.throughput.saturation_batch
    for rule, fit in busy.summary.critical_batch.items():
        assert fit.optimal_batch == pytest.approx(quiet.summary.critical_batch[rule].optimal_batch)
    at = {(r["lr_rule"], r["batch_size"]): r for r in busy.rows}
    quiet_at = {(r["lr_rule"], r["batch_size"]): r for r in quiet.rows}
    unflagged_at = {(r["lr_rule"], r["batch_size"]): r for r in unflagged.rows}
    cell = ("linear", DISTURBED_BATCH)
    assert at[cell]["step_time_source"] == "sweep_fit"  # the line, not the disturbed row
    assert quiet_at[cell]["step_time_source"] == "sweep"
    assert at[cell]["time_to_target_s"] == pytest.approx(quiet_at[cell]["time_to_target_s"])
    assert unflagged_at[cell]["time_to_target_s"] > 5 * quiet_at[cell]["time_to_target_s"]
    assert [r["steps_to_target"] for r in busy.rows] == [r["steps_to_target"] for r in quiet.rows]
    assert busy.summary.quality.excluded == (ExcludedRow("synthetic", DISTURBED_BATCH, REASON),)
    assert busy.metrics["sweep_rows_unstable"] == 1 and quiet.metrics["sweep_rows_unstable"] == 0


def test_memory_keeps_the_unstable_rows():
    """Peak memory does not depend on CPU load: the memory model is the same either way."""
    quiet = analyze(measured_sweep(False), None, None, SETTINGS).summary.memory
    busy = analyze(measured_sweep(True), None, None, SETTINGS).summary.memory
    assert busy.per_sample_bytes == pytest.approx(quiet.per_sample_bytes)
    assert busy.fixed_bytes == pytest.approx(quiet.fixed_bytes)


def test_every_row_unstable_says_so():
    sweep = measured_sweep(False).assign(quality="unstable", quality_reason=REASON)
    result = analyze(sweep, None, None, SETTINGS)
    assert result.summary.throughput.saturation_batch is None
    assert "every timed batch size was flagged unstable" in result.markdown


# --------------------------------------------------------------------------- the quality box


def report_page(sweep: pd.DataFrame, runs: pd.DataFrame) -> str:
    return render_html(analyze(sweep, runs, None, SETTINGS), sweep, runs, None)


def test_the_report_says_what_was_flagged_in_one_line_above_the_answer_then_the_box():
    """The answer is never pushed down by the box: one line names what was flagged above the
    recommendation, the box with the details follows it."""
    runs = untimed_runs()
    page = report_page(measured_sweep(True), runs)
    box = page[page.index('<section class="quality"'):]
    box = box[:box.index("</section>")]
    line = page[page.index('<p class="quality-flagged">'):]
    line = line[:line.index("</p>")]
    assert "1 of 12 timed sweep rows unstable (left out)" in line
    assert page.index(line) < page.index("<h2>Recommendation</h2>") < page.index(box)
    assert "1 of 12 timed sweep rows unstable (left out)" in box
    assert f"ynthetic batch {DISTURBED_BATCH} — {REASON}" in box
    assert "Load average (1 min) up to 3.1 on 2 usable CPUs" in box
    assert "rerun on a quiet node" in box.lower() and "Guaranteed QoS" in box
    assert "Measurements look stable" not in page
    markdown = analyze(measured_sweep(True), runs, None, SETTINGS).markdown
    assert "**Measurement quality.** Some timings cannot be trusted: 1 of 12" in markdown
    assert f"Left out: synthetic {DISTURBED_BATCH}." in markdown


def test_no_box_on_clean_data_only_a_line():
    runs = untimed_runs()
    page = report_page(measured_sweep(False), runs)
    assert 'class="quality"' not in page
    assert "Measurements look stable: none of the 12 timed sweep rows flagged" in page
    old = report_page(measured_sweep(False, flagged=False), runs)
    assert 'class="quality"' not in old
    assert "Measurement quality was not recorded" in old


def test_a_cpu_sweep_on_two_threads_and_a_collecting_row_are_noted_not_flagged():
    """Neither makes a row untrustworthy, so the line stays "look stable"; but the rerun
    intervals cannot see a whole sweep's speed shift on several CPU threads, and the median
    leaves garbage-collection pauses out, so the box below the answer says both."""
    runs = untimed_runs()
    sweep = measured_sweep(False).assign(threads=2, cuda_version=None, gc_share=0.01)
    collecting = (sweep["input_mode"] == "real") & (sweep["batch_size"] == 64)
    sweep.loc[collecting, "gc_share"] = 0.12
    result = analyze(sweep, runs, None, SETTINGS)
    assert not result.summary.quality.flagged
    assert result.summary.quality.cpu_threads == 2
    assert result.summary.quality.gc_rows == ((0.12, "real", 64),)
    page = render_html(result, sweep, runs, None)
    line = page[page.index('<p class="quality-ok">'):]
    assert "Measurements look stable" in line[:line.index("</p>")]
    assert "notes below the recommendation" in line[:line.index("</p>")]
    box = page[page.index('<section class="quality notes-only"'):]
    box = box[:box.index("</section>")]
    assert page.index("<h2>Recommendation</h2>") < page.index(box)
    assert "ran on 2 CPU threads" in box and "sweep.threads: 1" in box
    assert "real batch 64 12%" in box and "gc.freeze()" in box
    assert ("Measurements look stable: none of the 12 timed sweep rows flagged; load average up"
            " to 1.9 on 2 usable CPUs. Threads: the trials ran on 2 CPU threads") in result.markdown
    lines = quality_lines(result.summary.quality)
    assert lines[0].startswith("measurement quality: Measurements look stable")
    assert [line.split(":")[0] for line in lines[1:]] == ["  threads", "  garbage collection"]


def test_one_thread_or_a_gpu_gets_no_threads_note():
    runs = untimed_runs()
    for extra in ({"threads": 1, "cuda_version": None},
                  {"threads": 8, "cuda_version": "12.8"}):
        sweep = measured_sweep(False).assign(**extra)
        quality = analyze(sweep, runs, None, SETTINGS).summary.quality
        assert quality.cpu_threads in (1, None) and not note_items(quality), extra
        assert 'class="quality"' not in render_html(
            analyze(sweep, runs, None, SETTINGS), sweep, runs, None)


def test_a_busy_machine_is_flagged_even_when_rows_agree():
    """Load above the usable CPUs on every row slows all rounds alike: no row is unstable, but
    the box says the machine was busy."""
    sweep = measured_sweep(False).assign(load_avg_1m=3.4)
    result = analyze(sweep, untimed_runs(), None, SETTINGS)
    assert result.summary.quality.busy_rows == 12 and not result.summary.quality.excluded
    page = render_html(result, sweep, untimed_runs(), None)
    assert 'class="quality"' in page and "something else was running" in page


def test_a_high_load_whose_rows_got_their_cpus_is_said_but_not_flagged():
    """The same load on rows whose threads' CPU wait the sweep recorded and judged (it passed
    them: most of their trials waited under 10 %, at worst 15 %): the rows count as measured
    well, so no "cannot be trusted" banner over rows the sweep called ok (a user's run said
    both); the conditions line says both. Without a recorded wait, the load decides."""
    sweep = measured_sweep(False).assign(load_avg_1m=3.4, cpu_wait_share=0.15)
    result = analyze(sweep, untimed_runs(), None, SETTINGS)
    quality = result.summary.quality
    assert quality.busy_rows == 0 and quality.loaded_rows_judged_by_wait == 12
    assert not quality.flagged
    assert "cannot be trusted" not in result.markdown
    assert ("above them in 12 of 12 rows that the sweep's own check of their threads' CPU wait "
            "passed (unstable only where most of a row's trials waited 10% of their runnable "
            "time or more), so those rows count as measured well") in result.markdown
    unknown = analyze(sweep.assign(cpu_wait_share=None), untimed_runs(), None, SETTINGS)
    assert unknown.summary.quality.busy_rows == 12 and unknown.summary.quality.flagged


# --------------------------------------------------------------------------- convergence timing


def test_time_to_target_uses_the_convergence_runs_step_time():
    """Convergence steps 1.5× the sweep's (inside the 2× allowed): T uses them, no flag."""
    line = sweep_line()
    runs = make_runs(seeds=(0, 1), step_time=lambda b: 1.5 * line(b))
    result = analyze(make_sweep(), runs, None, SETTINGS)
    for row in result.rows:
        assert row["step_time_source"] == "convergence"
        assert row["step_time_s"] == pytest.approx(1.5 * line(row["batch_size"]))
        assert row["sweep_step_time_s"] == pytest.approx(line(row["batch_size"]))
        assert row["time_to_target_s"] == pytest.approx(row["steps_to_target"] * row["step_time_s"])
        assert row["timing_flag"] is None
    assert not result.summary.quality.flagged
    reason = result.summary.recommendation.batch_reason
    assert "from the runs' own training time over their steps" in reason


def test_a_cell_whose_step_times_disagree_is_flagged():
    line = sweep_line()
    runs = make_runs(seeds=(0, 1), step_time=lambda b: line(b) * (10 if b == 16 else 1))
    result = analyze(make_sweep(), runs, None, SETTINGS)
    flagged = {r["batch_size"] for r in result.rows if r["timing_flag"]}
    assert flagged == {16}
    row = next(r for r in result.rows if r["batch_size"] == 16)
    # make_sweep's real input takes 1.2× the device's time: the slow side is judged against it
    assert "8.33× the sweep's 1.24 ms (real-input measurement)" in row["timing_flag"]
    assert "more than the 2× allowed" in row["timing_flag"]
    assert "thread(s)" not in row["timing_flag"]  # neither table says, or they agree
    assert row["step_time_s"] == pytest.approx(10 * line(16))
    # a one-thread sweep beside two-thread trials: the flag names both counts
    threads = analyze(make_sweep().assign(threads=1), runs.assign(threads=2), None, SETTINGS)
    flag = next(r["timing_flag"] for r in threads.rows if r["batch_size"] == 16)
    assert flag.endswith("; the sweep timed on 1 thread(s) and the convergence runs trained on "
                         "2, which alone moves a step time on a CPU (sweep.threads sets the "
                         "sweep's only: docs/sweep.md)")
    assert [flag.batch_size for flag in result.summary.quality.timing_flags] == [16]
    page = render_html(result, make_sweep(), runs, None)
    assert 'class="quality"' in page and "<strong>Timing.</strong> At batch 16" in page
    strict = analyze(make_sweep(), runs, None,
                     AnalysisConfig(bootstrap_samples=20, step_time_disagreement_factor=20))
    assert not any(r["timing_flag"] for r in strict.rows)


def test_a_step_that_reads_its_data_is_judged_against_the_sweeps_real_input():
    """A trial reads its data in the step, as the sweep's real input does: convergence steps
    2.5× the device's time (synthetic) but 1.04× real input's are no disagreement; without
    real-input rows the same steps are flagged, naming the input pipeline as a cause; and a
    step faster than the device's own by more than the factor is flagged either way."""
    line = sweep_line()
    reading = make_sweep().assign(step_time_median_s=lambda t: t["step_time_median_s"].where(
        t["input_mode"] == "synthetic", 2.4 * t["step_time_median_s"] / 1.2))
    runs = make_runs(seeds=(0, 1), step_time=lambda b: 2.5 * line(b))
    assert not any(r["timing_flag"] for r in analyze(reading, runs, None, SETTINGS).rows)
    device_only = reading[reading["input_mode"] != "real"]
    flags = [r["timing_flag"] for r in analyze(device_only, runs, None, SETTINGS).rows]
    assert all("2.5× the sweep's" in f and "(synthetic-input " in f
               and "or the input pipeline" in f for f in flags)
    fast = make_runs(seeds=(0, 1), step_time=lambda b: line(b) / 3)
    flags = [r["timing_flag"] for r in analyze(reading, fast, None, SETTINGS).rows]
    assert all("3× less than the sweep's" in f and "(synthetic-input " in f
               for f in flags)


def test_convergence_step_time_pools_rules_and_seeds_with_the_fewest_workers():
    runs = pd.DataFrame(
        [
            run_row(64, "linear", 0.1, 0, 100, step_time=0.010),
            run_row(64, "sqrt", 0.1, 1, 100, step_time=0.012),
            run_row(64, "sqrt", 0.1, 2, 100, step_time=0.020, status="diverged"),
            run_row(64, "linear", 0.1, 0, 100, step_time=0.004, workers=2),  # not like the sweep
        ]
    )
    assert convergence_step_times(runs) == {64.0: pytest.approx(0.012)}
    times = cell_step_times(None, runs, [64, 128], 2.0)
    assert times["step_time_source"].tolist() == ["convergence", None]
    assert math.isnan(times["sweep_step_time_s"][0]) and math.isnan(times["step_time_s"][1])


def test_another_process_on_the_gpu_is_flagged_with_clock_and_temperature():
    sweep = measured_sweep(False).assign(gpu_other_processes=0, gpu_sm_clock_mhz=1980.0,
                                         gpu_temperature_c=55.0)
    quiet = analyze(sweep, untimed_runs(), None, SETTINGS).summary.quality
    assert not quiet.flagged and quiet.gpu_clock_temperature == (1980.0, 55.0)
    shared = sweep.assign(gpu_other_processes=[1, 1] + [0] * (len(sweep) - 2),
                          gpu_sm_clock_mhz=[1410.0] + [1980.0] * (len(sweep) - 1))
    result = analyze(shared, untimed_runs(), None, SETTINGS)
    assert result.summary.quality.gpu_shared_rows == 2
    page = render_html(result, shared, untimed_runs(), None)
    assert "other processes on the GPU" in page
    assert "another process was on the GPU in 2 of 12 rows" in page
    assert "the GPU ran at 1,410 MHz SM clock at the lowest and up to 55 °C" in page


def test_convergence_runs_starved_of_cpu_flag_their_cells_and_the_recommendation():
    """Convergence trials that waited for a CPU (a busy neighbour) time their steps slower than
    the machine can: the cells they time are flagged, and a recommendation made from them says
    it is not trusted, even where their step times agree with the sweep's."""
    line = sweep_line()
    runs = make_runs(seeds=(0, 1), step_time=line)
    quiet = analyze(make_sweep(), runs.assign(cpu_wait_share=0.004), None, SETTINGS)
    assert not any(r["timing_flag"] for r in quiet.rows) and not quiet.summary.quality.flagged
    assert "NOT TRUSTED" not in quiet.summary.recommendation.batch_reason
    waits = runs["batch_size"].map(lambda b: 0.38 if b == 16 else 0.004)
    busy = analyze(make_sweep(), runs.assign(cpu_wait_share=waits), None, SETTINGS)
    flagged = {r["batch_size"]: r["timing_flag"] for r in busy.rows if r["timing_flag"]}
    assert set(flagged) == {16}
    assert "waited for a CPU up to 38% of their runnable time" in flagged[16]
    assert [flag.batch_size for flag in busy.summary.quality.timing_flags] == [16]
    assert "1 batch size whose convergence step times are flagged" in headline(
        busy.summary.quality)
    # the chosen batch's own times are clean, but a batch it beat was slowed: not trusted
    chosen = busy.summary.recommendation
    assert chosen.batch_size != 16
    assert chosen.batch_reason.endswith(
        " — NOT TRUSTED: the step times of batch 16, which it was compared with, are flagged "
        "(see the results table's timing column): a busy machine that slowed them may have "
        "made this batch the fastest; rerun on a quiet machine")
    # one worker count: the worker line compared no times, so it has nothing to distrust
    assert busy.summary.recommendation.workers_reason == "only 1 worker measured"
    # two: how many trials, and of which worker count (not every trial was slowed)
    two = pd.concat([runs, runs.assign(workers=2, trial_id=runs["trial_id"] + "-w2")])
    two_waits = np.where((two["batch_size"] == 16) & (two["workers"] == 2), 0.38, 0.004)
    compared = analyze(make_sweep(), two.assign(cpu_wait_share=two_waits), None, SETTINGS)
    starved = int((two_waits >= 0.1).sum())
    assert (f"NOT TRUSTED: {starved} of {len(two)} convergence trials (2-worker) waited for a "
            "CPU up to 38%") in compared.summary.recommendation.workers_reason
    everywhere = analyze(make_sweep(), runs.assign(cpu_wait_share=0.38), None, SETTINGS)
    assert "NOT TRUSTED: the convergence runs' threads waited" in \
        everywhere.summary.recommendation.batch_reason
    off = analyze(make_sweep(), runs.assign(cpu_wait_share=0.38), None,
                  AnalysisConfig(bootstrap_samples=20, max_cpu_wait_share=None))
    assert not any(r["timing_flag"] for r in off.rows)
    assert "NOT TRUSTED" not in off.summary.recommendation.workers_reason


def test_one_stable_batch_size_gives_no_saturation_batch():
    """Every row but the smallest batch flagged: where throughput stops growing is unknown."""
    sweep = measured_sweep(False)
    smallest = sweep["batch_size"].min()
    others = sweep["batch_size"] != smallest
    sweep.loc[others, ["quality", "quality_reason"]] = ["unstable", REASON]
    throughput = analyze(sweep, untimed_runs(), None, SETTINGS).summary.throughput
    assert throughput.saturation_batch is None
    assert f"only batch {smallest} was measured stable" in throughput.saturation_reason


def test_no_step_time_line_from_starved_convergence_runs():
    """Every sweep row flagged and every convergence trial starved of CPU: no t(B) line, so no
    B* — not a line through times a busy machine slowed (seen beside a spinning neighbour: B*
    ≈ 130 from such times)."""
    sweep = measured_sweep(False).assign(quality="unstable", quality_reason=REASON)
    runs = make_runs(seeds=(0, 1), step_time=sweep_line())
    fed = analyze(sweep, runs.assign(cpu_wait_share=0.004), None, SETTINGS).summary
    assert fed.step_time.source == "convergence runs (train time per step)"
    assert all(math.isfinite(fit.optimal_batch) for fit in fed.critical_batch.values())
    starved = analyze(sweep, runs.assign(cpu_wait_share=0.5), None, SETTINGS).summary
    assert "every convergence trial waited for a CPU" in starved.step_time.source
    assert math.isnan(starved.step_time.alpha_s)
    assert all(math.isnan(fit.optimal_batch) for fit in starved.critical_batch.values())
    assert "model optimum" not in starved.recommendation.batch_reason
