"""End to end: the real pipeline under kfp.local, publishing to a real SeaweedFS, run as a
two-variant study: the tiny config on half the training rows, then on all of them.
The study is killed in the middle of its second variant's convergence and resumed with its id.
Most tests check the full-data variant's run as a single run's; the others check what the kill
left (rows kept, nothing half-published) and the study: resuming variant by variant, the
comparison, the `variant` columns.

The tiny config keeps each variant around a minute on 2 cores; the assertions read the
published tables back from the store and check their contents, not only that they exist.
"""

import html
import json
import os
import re
import signal
import subprocess
import time
import uuid

import pyarrow.dataset as ds
import pytest

from batchscale.config import load_config
from batchscale.config.variants import expand
from batchscale.lake.publish import LAKE_TABLES, run_manifest_key
from batchscale.storage import read_table_file, sha256_b64
from helpers import BATCHSCALE, cli_env, run_cli, store_env

pytestmark = pytest.mark.slow
PLANTED_SECRET = "planted-secret-7f3a9c1e5b"
STUDY_ID = "20261129T000000Z-e2etest"
STUDY_AXES = "study:\n  axes:\n    dataset_fraction: [0.5, 1.0]\n"
SCALING = "  scaling_workers: [2]\n  scaling_batch_sizes: [64]\n"
# The batch-schedule stage, small: three batches from two checkpoints, a check from two seeds.
SCHEDULE = """batch_schedule:
  enabled: true
  base_batch_size: 8
  branch_factors: [2, 4]
  checkpoint_steps: [20, 60]
  milestone_steps: 20
  branch_eval_every_steps: 4
  eval_every_steps: 10
  max_steps: 600
  check_seeds: [0, 1]
  val_rows: 128
"""


def _wait_for(predicate, timeout_s: float, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        if proc.poll() is not None:
            raise AssertionError(f"study ended early:\n{proc.stdout.read()[-3000:]}")
        time.sleep(0.2)
    raise AssertionError("timed out waiting")


@pytest.fixture(scope="module")
def killed(tmp_path_factory, seaweed):
    """The study killed (SIGTERM to its process group: the pipeline and its torchrun group)
    once its second variant has a finished trial; what it left behind."""
    from batchscale.storage import ObjectStore
    from helpers import TINY_CONFIG

    store = ObjectStore(seaweed.settings(prefix=f"e2e-{uuid.uuid4().hex[:8]}"))
    workdir = tmp_path_factory.mktemp("e2e")
    # Without the 2-worker cell (covered end to end by test_reliability_runs.py): a study runs
    # the pipeline three times here (two variants, one resumed), and CI has 30 minutes.
    assert SCALING in TINY_CONFIG
    (workdir / "tiny.yaml").write_text(TINY_CONFIG.replace(SCALING, "") + STUDY_AXES + SCHEDULE)
    env = {**store_env(store), "KF_PIPELINES_TOKEN": PLANTED_SECRET}
    last = f"{STUDY_ID}-{expand(load_config(workdir / 'tiny.yaml'))[-1].name}"
    trials = workdir / ".batchscale" / "work" / last
    proc = subprocess.Popen(BATCHSCALE + ["study", "--config", "tiny.yaml", "--run-id", STUDY_ID],
                            cwd=workdir, env=cli_env(env), text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    try:
        _wait_for(lambda: any(trials.glob("*/trials/*.run.parquet")), 1200, proc)
        os.killpg(proc.pid, signal.SIGTERM)
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    kept = {p: (p.stat().st_mtime_ns, read_table_file(p).to_pylist())
            for p in sorted(trials.glob("*/trials/*.run.parquet"))}
    return {"store": store, "workdir": workdir, "env": env, "run_id": last, "output": output,
            "returncode": proc.returncode, "kept": kept, "objects": store.list()}


@pytest.fixture(scope="module")
def published(killed):
    """The killed study resumed with its id (through `run`, which runs a study config as one):
    the full-data variant's run, as a single run's tests read it."""
    workdir = killed["workdir"]
    result = run_cli(["run", "--config", "tiny.yaml", "--run-id", STUDY_ID], cwd=workdir,
                     env=killed["env"], timeout_s=1500)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-5000:]
    full = expand(load_config(workdir / "tiny.yaml"))[-1]
    return killed["store"], killed["run_id"], workdir, result, full.config


@pytest.fixture(scope="module")
def variants(published):
    """The study's variants: name → run id."""
    _, _, workdir, _, _ = published
    return {v.name: f"{STUDY_ID}-{v.name}" for v in expand(load_config(workdir / "tiny.yaml"))}


def _table(store, name, run_id):
    key = store.key(name, "date=2026-11-29", f"run_id={run_id}", "part-0.parquet")
    return store.get_table(key).to_pylist()


def test_every_table_is_published_with_checksums(published):
    store, run_id, _, _, _ = published
    manifest = json.loads(store.get_bytes(run_manifest_key(store, run_id)))
    keys = {o["key"] for o in manifest["objects"]}
    for name in LAKE_TABLES:
        assert store.key(name, "date=2026-11-29", f"run_id={run_id}", "part-0.parquet") in keys
    for obj in manifest["objects"]:
        assert sha256_b64(store.get_bytes(obj["key"])) == obj["sha256"]


def test_dataset_manifest_covers_all_digits(published):
    store, run_id, _, _, cfg = published
    rows = _table(store, "dataset_manifest", run_id)
    assert sum(r["rows"] for r in rows) == 1797  # sklearn's bundled digits
    assert {r["split"] for r in rows} == {"train", "val"}
    assert all(len(r["sha256"]) == 64 for r in rows)


def test_sweep_measured_every_batch_and_mode(published):
    store, run_id, _, _, cfg = published
    rows = _table(store, "sweep", run_id)
    cells = {(r["input_mode"], r["batch_size"]) for r in rows}
    assert cells == {(m, b) for m in ("synthetic", "real") for b in cfg.sweep.batch_sizes}
    for r in rows:
        assert r["status"] == "ok"
        assert r["samples_per_s"] == pytest.approx(r["batch_size"] / r["step_time_median_s"])
        assert r["timed_steps"] >= cfg.sweep.min_timed_steps
        assert r["run_id"] == run_id and r["config_hash"] == cfg.config_hash
        assert r["torch_version"] and r["device_name"] and r["threads"] >= 1


def test_convergence_reaches_target_and_fewer_steps_at_larger_batch(published):
    store, run_id, _, _, cfg = published
    runs = _table(store, "runs", run_id)
    assert {r["batch_size"] for r in runs} == set(cfg.convergence.batch_sizes)
    assert all(r["status"] == "reached" for r in runs)
    steps = {r["batch_size"]: r["steps_to_target"] for r in runs}
    assert steps[16] > steps[256]  # the critical-batch curve falls
    curves = _table(store, "curves", run_id)
    for r in runs:
        curve = [c for c in curves if c["trial_id"] == r["trial_id"]]
        target = cfg.convergence.target_val_accuracy
        first = min(c["step"] for c in curve if c["val_accuracy"] >= target)
        assert first == r["steps_to_target"]
        assert r["examples_to_target"] == r["steps_to_target"] * r["batch_size"]


def test_analysis_fits_critical_batch(published):
    store, run_id, _, _, cfg = published
    rows = _table(store, "analysis", run_id)
    assert {r["batch_size"] for r in rows} >= set(cfg.convergence.batch_sizes)
    fit = rows[0]
    assert fit["b_crit"] > 0 and fit["s_min"] > 0
    assert fit["b_crit"] == pytest.approx(fit["e_min"] / fit["s_min"])


def test_summary_printed_and_report_saved(published):
    _, run_id, workdir, result, _ = published
    assert f"batchscale run {run_id}" in result.stdout
    assert "B_crit" in result.stdout and "samples/s" in result.stdout
    report = workdir / ".batchscale" / "runs" / run_id / "report.html"
    assert "<img" in report.read_text()
    # the summary's card (rebuilt from the lake) names the target as the report's card does
    target = re.search(r"^  For the target (.+) — (.+)\.$", result.stdout, re.MULTILINE)
    assert target, result.stdout[-3000:]
    page = html.unescape(re.sub(r"<[^>]+>", "", report.read_text()))
    assert f"For the target {target.group(1)} — {target.group(2)}." in page


def test_the_batch_schedule_stage_publishes_its_tables_and_a_report_section(published):
    """batch_schedule.enabled: the stage's two tables are in the lake with the run's id, agree
    with each other, and the report has their section (what the answer card links to)."""
    store, run_id, workdir, result, cfg = published
    assert "batch-size schedule: 8" in result.stdout
    crit = _table(store, "critical_over_training", run_id)
    check = _table(store, "schedule_check", run_id)
    assert [r["checkpoint_step"] for r in crit] == cfg.batch_schedule.checkpoint_steps
    assert all(r["run_id"] == run_id and r["base_batch_size"] == 8 for r in crit + check)
    reference = [r for r in check if r["reference"]]
    assert len(reference) == 1 and reference[0]["schedule"] == "constant"
    grows = [r["scheduled_batch_size"] for r in crit]
    assert grows == sorted(grows) and grows[0] >= 8
    if grows[-1] > 8:  # a schedule was found: it was checked from both seeds, also against
        assert {(r["schedule"], r["seed"]) for r in check} == {  # its last batch from step 0
            (s, seed) for s in ("scheduled", "constant", "constant_final") for seed in (0, 1)}
    report = (workdir / ".batchscale" / "runs" / run_id / "report.html").read_text()
    assert 'id="critical-over-training"' in report and "B_simple against B_crit" in report


def test_lake_reads_with_pyarrow_dataset_and_hive_partitions(published, variants):
    store, run_id, _, _, _ = published
    fs = store.pyarrow_filesystem()
    for name in LAKE_TABLES:
        table = ds.dataset(f"{store.settings.bucket}/{store.key(name)}", filesystem=fs,
                           format="parquet", partitioning="hive").to_table()
        assert table.num_rows > 0
        assert set(table.column("run_id").to_pylist()) == set(variants.values())
        assert set(table.column("date").to_pylist()) == {"2026-11-29"}


def test_no_secret_in_any_output(published):
    """Plant a recognizable secret in the environment, then search every output: logs, task
    artifacts, local report, and every published object (tables, report, manifest)."""
    store, run_id, workdir, result, _ = published
    secrets = [PLANTED_SECRET.encode(), store.settings.secret_key.encode()]
    assert all(s not in (result.stdout + result.stderr).encode() for s in secrets)
    files = [p for p in (workdir / ".batchscale").rglob("*") if p.is_file()]
    assert any(p.name == "pipeline.log" for p in files)
    for path in files:
        data = path.read_bytes()
        assert all(s not in data for s in secrets), path
    for key in store.list():
        data = store.get_bytes(key)
        assert all(s not in data for s in secrets), key


# ------------------------------------------------------------------ the study
def test_every_row_of_every_variant_names_its_variant_and_study(published, variants):
    store, _, _, _, _ = published
    for name, run_id in variants.items():
        for table in LAKE_TABLES:
            rows = _table(store, table, run_id)
            if table in ("dataset_manifest", "regressions"):
                continue  # not result tables: no environment columns
            assert {(r["variant"], r["study_id"]) for r in rows} == {(name, STUDY_ID)}, table


def test_the_half_data_variant_trained_on_half_the_rows(published, variants):
    store, _, _, _, _ = published
    rows = {name: sum(r["rows"] for r in _table(store, "dataset_manifest", run_id)
                      if r["split"] == "train") for name, run_id in variants.items()}
    assert rows == {"fraction0.5": 719, "fraction1": 1438}


def test_the_study_is_published_as_a_run_with_its_comparison(published, variants):
    store, _, workdir, result, _ = published
    manifest = json.loads(store.get_bytes(run_manifest_key(store, STUDY_ID)))
    assert manifest["kind"] == "study" and manifest["variants"] == variants
    study = _table(store, "study", STUDY_ID)
    assert {r["variant"] for r in study} == set(variants)
    assert {r["variant_run_id"] for r in study} == set(variants.values())
    # One seed: no B_crit interval, so the slope is refused with the reason, not printed.
    axes = _table(store, "study_axes", STUDY_ID)
    assert [r["axis"] for r in axes] == ["dataset_fraction"]
    assert axes[0]["verdict"].startswith("not fitted: ")
    assert "What moves the critical batch?" in result.stdout
    page = (workdir / ".batchscale" / "studies" / STUDY_ID / "report.html").read_text()
    assert "fraction0.5" in page and "dataset_fraction" in page


def test_a_finished_study_run_again_skips_its_variants_and_republishes_nothing(published):
    store, _, workdir, _, _ = published
    before = {key: store.get_bytes(key) for key in store.list()}
    again = run_cli(["study", "--config", "tiny.yaml", "--run-id", STUDY_ID], cwd=workdir,
                    env=store_env(store), timeout_s=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count(", skipped") == 2
    assert "(2 already published)" in again.stderr
    assert {key: store.get_bytes(key) for key in store.list()} == before
    changed = (workdir / "tiny.yaml").read_text().replace("bootstrap_samples: 20",
                                                          "bootstrap_samples: 21")
    (workdir / "changed.yaml").write_text(changed)
    refused = run_cli(["study", "--config", "changed.yaml", "--run-id", STUDY_ID], cwd=workdir,
                      env=store_env(store), timeout_s=600)
    assert refused.returncode == 2
    assert "was published with another config" in refused.stderr
    assert {key: store.get_bytes(key) for key in store.list()} == before


def test_history_lists_the_study_and_report_rebuilds_it(published, tmp_path):
    store, _, workdir, _, _ = published
    history = run_cli(["history", "--studies", "--experiment", "tiny"], cwd=workdir,
                      env=store_env(store), timeout_s=300)
    assert history.returncode == 0, history.stderr[-2000:]
    assert f"study {STUDY_ID} (2026-11-29, tiny," in history.stdout
    assert "dataset_fraction" in history.stdout and "not fitted: " in history.stdout
    other = run_cli(["history", "--studies", "--experiment", "other"], cwd=workdir,
                    env=store_env(store), timeout_s=300)
    assert "no published study in the lake" in other.stdout
    out = tmp_path / "study.html"
    report = run_cli(["report", "--run-id", STUDY_ID, "--out", str(out)], cwd=workdir,
                     env=store_env(store), timeout_s=300)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "What moves the critical batch?" in report.stdout
    assert "fraction0.5" in out.read_text()


def test_a_study_killed_in_convergence_keeps_its_rows_and_publishes_nothing_of_that_variant(
        killed, published, variants):
    store = killed["store"]
    assert killed["returncode"] != 0
    assert PLANTED_SECRET not in killed["output"]
    assert killed["kept"], "the killed variant kept no finished trial"
    first, last = variants.values()
    assert killed["run_id"] == last
    # The stop message resumes the study, not a new study named after its variant's run id.
    assert f"rerun the same command with --run-id {STUDY_ID}" in killed["output"], \
        killed["output"][-3000:]
    assert f"--run-id {last}" not in killed["output"]
    # The first variant was published before the kill; nothing of the second, nor the study.
    keys = killed["objects"]
    assert any(f"run_id={first}/" in k for k in keys)
    assert not any(f"run_id={last}/" in k or f"run_id={STUDY_ID}/" in k for k in keys)
    # Resumed: the first variant skipped, the second's finished trials kept, not re-run.
    _, _, _, result, _ = published
    assert "(1 already published)" in result.stderr
    assert f"published as {first}, skipped" in result.stderr
    for path, (mtime, rows) in killed["kept"].items():
        assert path.stat().st_mtime_ns == mtime
        assert read_table_file(path).to_pylist() == rows
    runs = {r["trial_id"] for r in _table(store, "runs", last)}
    assert runs >= {rows[0]["trial_id"] for _, rows in killed["kept"].values()}
