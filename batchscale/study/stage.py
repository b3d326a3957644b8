"""The study's last step, the same locally and on a cluster: read every variant's published run
back from the lake, compare them, validate the two study tables, and publish the study as a lake
run of its own (its id the study id, its tables `study` and `study_axes`, its report the study
report), so `batchscale history --studies` finds it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pyarrow as pa

from batchscale.config import ExperimentConfig
from batchscale.config.stage_inputs import stage_config
from batchscale.config.variants import expand, sorted_axes, variant_run_id
from batchscale.envinfo import environment
from batchscale.errors import BadInput
from batchscale.schemas import make_table
from batchscale.storage import ObjectStore, S3Settings, read_table_file, write_table_atomic


def published_variants(store: ObjectStore, study_id: str, variants) -> dict[str, bool]:
    """Variant name → whether its run is complete in the lake."""
    from batchscale.lake.publish import run_manifest_key

    return {v.name: store.exists(run_manifest_key(store, variant_run_id(study_id, v.name)))
            for v in variants}


def check_published_configs(store: ObjectStore, study_id: str, variants) -> None:
    """Refuse to compare, or to resume, variants published under another config: the study
    would mix settings. Names the first variant that differs."""
    from batchscale.lake.publish import published_manifest

    for variant in variants:
        manifest = published_manifest(store, variant_run_id(study_id, variant.name)) or {}
        if manifest.get("config_hash") != variant.config.config_hash:
            raise BadInput(f"study {study_id}: variant {variant.name} was published with another "
                           f"config (hash {manifest.get('config_hash')}, now "
                           f"{variant.config.config_hash}); resume a study with the config it "
                           "started with, or start a new study (another --run-id)")


def check_study_id(store: ObjectStore, cfg, study_id: str) -> None:
    """Before any variant runs: the id must not be a single run's, nor a study published with
    another config (a changed axis would run new variants and then keep the old comparison)."""
    from batchscale.lake.publish import published_manifest

    manifest = published_manifest(store, study_id)
    if manifest is None:
        return
    if manifest.get("kind") != "study":
        raise BadInput(f"run id {study_id} is a published single run, not a study: give the "
                       "study another --run-id")
    if manifest.get("config_hash") != cfg.config_hash:
        raise BadInput(f"study {study_id} was published with another config (hash "
                       f"{manifest.get('config_hash')}, now {cfg.config_hash}); start a new "
                       "study (another --run-id)")


def _variant_frames(store: ObjectStore, run_id: str) -> dict[str, pd.DataFrame]:
    from batchscale.lake.summary import load_run

    _, tables = load_run(store, run_id)
    return {name: table.to_pandas() for name, table in tables.items()}


def compare(store: ObjectStore, cfg, study_id: str) -> tuple[pa.Table, pa.Table, str]:
    """The study and study_axes tables (with their environment columns) and the answer;
    BadInput naming the variants whose runs are not in the lake."""
    from batchscale.study.answer import answer_markdown
    from batchscale.study.compare import axis_rows, variant_rows

    variants = expand(cfg)
    done = published_variants(store, study_id, variants)
    missing = [name for name, ok in done.items() if not ok]
    if missing:
        raise BadInput(f"study {study_id}: {len(missing)} of {len(variants)} variants are not "
                       f"published yet ({', '.join(missing)}); run `batchscale study --run-id "
                       f"{study_id}` with the same config to finish them")
    check_published_configs(store, study_id, variants)
    rows = []
    for variant in variants:
        run_id = variant_run_id(study_id, variant.name)
        rows += variant_rows(variant, run_id, _variant_frames(store, run_id))
    env = {**environment(run_id=study_id, config_hash=cfg.config_hash, experiment=cfg.name,
                         workload=cfg.workload), "study_id": study_id}
    study = make_table("study", rows, env)
    axes = make_table("study_axes", axis_rows(study.to_pandas(), list(sorted_axes(cfg))), env)
    return study, axes, answer_markdown(study.to_pandas(), axes.to_pandas())


def run_compare_stage(config: str | ExperimentConfig, study_id: str, study_path: str,
                      axes_path: str, report_path: str) -> str:
    """Pipeline entry (and the CLI's last step): compare, validate, write the tables and the
    report, publish the study; returns the answer (Markdown)."""
    from batchscale.checks.stage import check_tables
    from batchscale.study.report import render_study_report

    cfg = stage_config(config)
    if not cfg.study.is_study:
        raise BadInput("the config has no study.axes: there is nothing to compare")
    store = ObjectStore(S3Settings.from_env())
    store.check()
    study, axes, answer = compare(store, cfg, study_id)
    paths = {"study": study_path, "study_axes": axes_path}
    for kind, table in (("study", study), ("study_axes", axes)):
        write_table_atomic(paths[kind], table)
    out = Path(study_path).parent
    check_tables([(kind, kind, read_table_file(path), {}) for kind, path in paths.items()],
                 str(out / "study-validation.json"), str(out / "study-validation.html"))
    Path(report_path).write_text(render_study_report(
        study.to_pandas(), axes.to_pandas(), answer, sorted_axes(cfg),
        title=f"batchscale study: {cfg.name} ({study_id})"))
    publish_study(store, cfg, study_id, paths, report_path)
    return answer


def publish_study(store: ObjectStore, cfg, study_id: str, files: dict[str, str],
                  report_path: str) -> dict:
    """The study as a lake run: create-only, so a repeat re-sends the same bytes."""
    from batchscale.lake.publish import publish_run

    variants = expand(cfg)
    extra = {"kind": "study", "experiment": cfg.name, "config_hash": cfg.config_hash,
             "axes": sorted_axes(cfg),
             "variants": {v.name: variant_run_id(study_id, v.name) for v in variants}}
    return publish_run(store, study_id, files, report_path, extra)


def is_study(store: ObjectStore, run_id: str) -> bool:
    """Whether a published run id is a study's (its manifest says so)."""
    from batchscale.lake.publish import published_manifest

    manifest = published_manifest(store, run_id)
    return bool(manifest) and manifest.get("kind") == "study"


def rebuild_study_report(store: ObjectStore, study_id: str, out: Path) -> str:
    """The study report rebuilt from the study's published tables; returns the answer."""
    from batchscale.lake.summary import load_run
    from batchscale.study.answer import answer_markdown
    from batchscale.study.report import render_study_report

    manifest, tables = load_run(store, study_id)
    missing = [name for name in ("study", "study_axes") if name not in tables]
    if manifest.get("kind") != "study" or missing:
        raise BadInput(f"run {study_id} is not a published study (no study tables in its "
                       "manifest)")
    study, axes = tables["study"].to_pandas(), tables["study_axes"].to_pandas()
    answer = answer_markdown(study, axes)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_study_report(
        study, axes, answer, manifest.get("axes", {}),
        title=f"batchscale study: {manifest.get('experiment', 'study')} ({study_id})"))
    return answer
