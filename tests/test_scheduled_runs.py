"""A recurring run on a busy node: its disturbed sweep passes validation with a visible warning
and is not judged by the regression check, so the run publishes and pages no one; only a
confirmed regression fails it (`scheduled_config`)."""

from __future__ import annotations

from batchscale.checks import validate_table
from batchscale.config import parse_config
from batchscale.kfp_client import scheduled_config
from batchscale.lake.regression import check_regressions
from batchscale.schemas import make_table
from clean_tables import BATCH_SIZES, ENV, sweep_row


def disturbed_sweep():
    rows = [sweep_row("synthetic", b, quality="unstable",
                      quality_reason="rounds disagree: spread 0.41 (> 0.10)") for b in BATCH_SIZES]
    return make_table("sweep", rows, ENV)


def test_a_scheduled_run_fails_only_on_a_confirmed_regression():
    cfg = scheduled_config(parse_config({}))
    assert cfg.publish.fail_on_regression and not cfg.sweep.unstable_fails
    assert cfg.sweep.idle_wait_s == 120 > parse_config({}).sweep.idle_wait_s == 0
    longer = scheduled_config(parse_config({"sweep": {"idle_wait_s": 600}}))
    assert longer.sweep.idle_wait_s == 600  # a longer wait of the user's is kept
    # one thread unless the user names a count (an ad-hoc run keeps torch's default)
    assert cfg.sweep.threads == 1 and parse_config({}).sweep.threads is None
    assert scheduled_config(parse_config({"sweep": {"threads": 4}})).sweep.threads == 4
    assert not parse_config({}).sweep.unstable_fails  # an ad-hoc run gets its answer too
    assert parse_config({"sweep": {"unstable_fails": True}}).sweep.unstable_fails


def test_a_disturbed_sweep_passes_a_scheduled_runs_validation_with_a_warning():
    ctx = {"batch_sizes": BATCH_SIZES, "max_unstable_share": 0.25}
    stops = validate_table("sweep", disturbed_sweep(), context={**ctx, "unstable_fails": True})
    assert not stops.success and "expect_unstable_share_to_be_at_most" in stops.failure_message()
    passes = validate_table("sweep", disturbed_sweep(), context={**ctx, "unstable_fails": False})
    assert passes.success
    assert any("MEASUREMENT DISTURBED: 3 of 3 timed rows unstable" in w
               for w in passes.warnings())


def test_the_regression_check_does_not_judge_a_disturbed_run():
    verdicts = check_regressions(disturbed_sweep().to_pandas(), None, history_runs=5)
    assert verdicts["verdict"].eq("not_judged").all()
    assert verdicts["reason"].str.contains("measurement disturbed").all()
