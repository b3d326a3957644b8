"""`batchscale study` (and `batchscale run` with a `study:` config): run every variant of a study
through the whole local pipeline, one after another, then compare them and publish the study.

Each variant is an ordinary run under `<study id>-<variant>`: an interrupted study resumes
variant by variant (a published variant is skipped, a half-run one resumes from its own
tables and checkpoints), and every variant's tables are in the lake before the comparison."""

from __future__ import annotations

import re
import sys
import time

from batchscale.cli.common import STATE_DIR, connect_store, given_run_id
from batchscale.cliflags import config_from_args
from batchscale.errors import BadInput, BatchscaleError
from batchscale.stopping import resumable


def cmd_study(args) -> int:
    cfg = config_from_args(args)
    if not cfg.study.is_study:
        raise BadInput("the config has no study.axes: a study needs at least one axis (see "
                       "docs/studies.md); `batchscale run` runs a single experiment")
    return run_study(cfg, given_run_id(args))


def run_study(cfg, study_id: str) -> int:
    from batchscale.config.variants import expand, variant_run_id
    from batchscale.lake.publish import run_manifest_key
    from batchscale.study.stage import (
        check_published_configs,
        check_study_id,
        published_variants,
    )

    variants = expand(cfg)
    check_axes_reach_the_data(cfg, variants)
    check_every_variant(variants)
    store = connect_store()
    check_study_id(store, cfg, study_id)
    done = published_variants(store, study_id, variants)
    check_published_configs(store, study_id, [v for v in variants if done[v.name]])
    print(f"batchscale study {study_id}: {cfg.name}, {len(variants)} variants over "
          f"{', '.join(sorted(cfg.study.axes))} ({sum(done.values())} already published)",
          file=sys.stderr)
    started = time.monotonic()
    with resumable(study_id):  # a stop resumes the study, not a study named after a variant
        for index, variant in enumerate(variants, start=1):
            run_id = variant_run_id(study_id, variant.name)
            head = f"[{index}/{len(variants)}] {variant.name} {variant.values}"
            if done[variant.name]:
                print(f"{head}: published as {run_id}, skipped", file=sys.stderr)
                continue
            print(f"{head}: run {run_id} ({_elapsed(started)} into the study)",
                  file=sys.stderr)
            _run_variant(store, variant.config, run_id, study_id)
        if store.exists(run_manifest_key(store, study_id)):
            return _already_compared(store, study_id)
        return _compare(cfg, study_id, started)


def check_every_variant(variants) -> None:
    """Each variant's workload checked as `batchscale run` checks its own, before the first
    variant trains: a misspelled workload in the last variant is refused now (exit 2), not
    after the others have run and been published."""
    from batchscale.cli.pipeline_cmds import checked_workload

    for variant in variants:
        try:
            checked_workload(variant.config)
        except BadInput as err:
            raise BadInput(f"study variant {variant.name} {variant.values}: {err}; no variant "
                           "was run") from None


def check_axes_reach_the_data(cfg, variants) -> None:
    """Refuse an axis on the config's dataset for a workload that brings its own data: the
    axis would change data no trial reads, and the study would compare identical trainings
    under the axis's name."""
    from batchscale.config.study import axis_key
    from batchscale.workloads import get_workload

    dataset_axes = [axis for axis in cfg.study.axes if axis_key(axis).startswith("dataset.")]
    for name in sorted({variant.config.workload for variant in variants}):
        if dataset_axes and get_workload(name).has_own_data:
            raise BadInput(
                f"study axis {', '.join(dataset_axes)} changes the config's dataset "
                f"({cfg.dataset.name}), which workload {name} does not read: it brings its own "
                "data (Workload.train_data). Vary your data through the workload instead, e.g. "
                "an axis on `workload` naming one module attribute per dataset size")


def _already_compared(store, study_id: str) -> int:
    """A study whose comparison is in the lake: rebuild its report from there, publish
    nothing."""
    from batchscale.study.stage import rebuild_study_report

    out = STATE_DIR / "studies" / study_id / "report.html"
    print(rebuild_study_report(store, study_id, out))
    print(f"\nstudy {study_id} was already compared and published; report rebuilt from the "
          f"lake: {out}", file=sys.stderr)
    return 0


def _run_variant(store, variant_cfg, run_id: str, study_id: str) -> None:
    from batchscale.lake.summary import print_run_summary
    from batchscale.pipelines.local import run_local

    try:
        run_local(variant_cfg, run_id, STATE_DIR.resolve())
    except RuntimeError as err:
        reason = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
        raise BatchscaleError(
            f"study {study_id}: variant run {run_id} failed: {reason} The variants published "
            f"so far stay in the lake and this one's tables under {STATE_DIR / 'work' / run_id}; "
            f"rerun with --run-id {study_id} to resume.") from None
    print_run_summary(store, run_id, STATE_DIR / "runs" / run_id)


def _compare(cfg, study_id: str, started: float) -> int:
    from batchscale.study.stage import run_compare_stage

    out = STATE_DIR / "studies" / study_id
    out.mkdir(parents=True, exist_ok=True)
    answer = run_compare_stage(cfg.to_json(), study_id, str(out / "study.parquet"),
                               str(out / "study_axes.parquet"), str(out / "report.html"))
    print(answer)
    print(f"\nstudy {study_id}: {len(cfg.study.axes)} axes compared in "
          f"{_elapsed(started)}; report: {out / 'report.html'}", file=sys.stderr)
    return 0


def _elapsed(started: float) -> str:
    seconds = int(time.monotonic() - started)
    return f"{seconds // 60} min {seconds % 60:02d} s"
