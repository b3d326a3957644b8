"""The `batchscale` command line: its commands and their parser, one concern (hence over ~400
lines: one short function per command plus the parser that documents each). The flags
that set config fields are generated from the config models (batchscale/cliflags.py). Heavy
imports (torch, kfp, great_expectations) happen inside the commands that need them, so
`batchscale --help` and `store` stay fast."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import secrets
import shutil
import sys
import traceback
from pathlib import Path

from batchscale.cliflags import (
    Parser,
    add_config_flags,
    check_output_dir,
    check_output_file,
    config_from_args,
    whole_number,
)
from batchscale.config import (
    DEFAULT_CONFIG_PATH,
    load_config,
    reference_markdown,
)
from batchscale.errors import BadInput, BatchscaleError
from batchscale.metrics import METRICS
from batchscale.names import check_name, check_run_id, check_workload, redact_url
from batchscale.schemas import RunStatus

STATE_DIR = Path(".batchscale")


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ-") + secrets.token_hex(3)


def given_run_id(args) -> str:
    """--run-id checked (it names directories and lake partitions: one safe path segment), or a
    new one when the flag is absent (an empty one is refused, not replaced)."""
    return new_run_id() if args.run_id is None else check_run_id(args.run_id)


# ------------------------------------------------------------------------------ the store
def connect_store():
    """The configured S3 store, or the local SeaweedFS (started if needed) when
    BATCHSCALE_S3_ENDPOINT is unset. Checks that it answers before any work starts."""
    from batchscale import localstore
    from batchscale.storage import ObjectStore, S3Settings, env_prefix

    if not os.environ.get("BATCHSCALE_S3_ENDPOINT"):
        prefix = env_prefix()  # a bad BATCHSCALE_S3_PREFIX is refused before the store starts
        info = localstore.up()
        settings = info.settings(prefix)
        # The pipeline's tasks are subprocesses: they find the store through the environment.
        os.environ.update({
            "BATCHSCALE_S3_ENDPOINT": info.endpoint_url, "BATCHSCALE_S3_BUCKET": info.bucket,
            "BATCHSCALE_S3_PREFIX": settings.prefix, "AWS_ACCESS_KEY_ID": info.access_key,
            "AWS_SECRET_ACCESS_KEY": info.secret_key,
        })
        print(f"store: local SeaweedFS at {info.endpoint_url} (pid {info.pid})", file=sys.stderr)
    store = ObjectStore(S3Settings.from_env())
    store.check()
    return store


def cmd_store(args) -> int:
    from batchscale import localstore

    if args.action == "up":
        info = localstore.up()
        print(f"SeaweedFS S3 at {info.endpoint_url}, bucket {info.bucket}, pid {info.pid}, "
              f"data in {info.data_dir}")
    elif args.action == "down":
        print("stopped" if localstore.down() else "not running (nothing to stop)")
    elif args.action == "status":
        info = localstore.status()
        print(f"running: {info.endpoint_url} pid {info.pid}" if info else "not running")
        return 0 if info else 1
    else:
        print("\n".join(localstore.env_lines()))
    return 0


# ------------------------------------------------------------------------------ run / compile
def cmd_run(args) -> int:
    from batchscale.workloads import check_builds, get_workload

    cfg = config_from_args(args)
    run_id = given_run_id(args)
    # A user factory that cannot be imported or returns no nn.Module fails here, not later.
    check_builds(get_workload(cfg.workload, image_size=cfg.sweep.image_size_px))
    store = connect_store()
    print(f"batchscale run {run_id}: {cfg.name} ({cfg.workload} on {cfg.dataset.name})",
          file=sys.stderr)
    from batchscale.pipelines.local import run_local

    try:
        run_local(cfg, run_id, STATE_DIR.resolve())
    except RuntimeError as err:
        if cfg.publish.fail_on_regression:
            _raise_if_regressed(store, run_id)
        reason = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
        raise BatchscaleError(f"pipeline run {run_id} failed: {reason} Tables already measured "
                              f"are kept under {STATE_DIR / 'work' / run_id}; rerun with "
                              f"--run-id {run_id} to resume.") from None
    from batchscale.lake.summary import print_run_summary

    print_run_summary(store, run_id, STATE_DIR / "runs" / run_id)
    return 0


def _raise_if_regressed(store, run_id: str) -> None:
    """A pipeline that failed only at the regression gate: print the published run and raise
    RegressionFound (exit 4) naming the cells, instead of a generic failure."""
    from batchscale.lake.publish import published_regressions, regression_message
    from batchscale.lake.regression import RegressionFound
    from batchscale.lake.summary import print_run_summary

    flagged = published_regressions(store, run_id)
    if flagged:
        print_run_summary(store, run_id, STATE_DIR / "runs" / run_id)
        raise RegressionFound(regression_message(flagged))


def cmd_history(args) -> int:
    from batchscale.lake.history import (
        critical_lines,
        default_plot_path,
        load_history,
        plot_history,
        throughput_lines,
    )

    if args.last is not None and args.last < 1:
        raise BadInput(f"--last: must be a positive number of runs, got {args.last}")
    workload = check_workload(args.workload, "--workload")
    plot_path = default_plot_path(workload) if args.plot is None else Path(args.plot)
    check_output_file(str(plot_path), "--plot")
    history = load_history(connect_store(), workload, args.device, args.precision, args.last)
    plot = plot_history(history, plot_path)
    print("\n".join([*throughput_lines(history), "", *critical_lines(history), "",
                     f"plot: {plot}"]))
    return 0


def cmd_report(args) -> int:
    from batchscale.lake.summary import rebuild_report

    run_id = check_run_id(args.run_id)
    check_output_file(args.out, "--out")
    print("\n".join(rebuild_report(connect_store(), run_id, Path(args.out))))
    return 0


def cmd_compile(args) -> int:
    from batchscale.images import CPU_IMAGE, GPU_IMAGE
    from batchscale.pipelines.batchscale_pipeline import compile_pipeline

    cfg = load_config(args.config)
    check_output_file(args.output, "--output").parent.mkdir(parents=True, exist_ok=True)
    print(f"wrote {compile_pipeline(cfg, args.output)} (images {CPU_IMAGE}, {GPU_IMAGE})")
    return 0


# ------------------------------------------------------------------- Kubeflow Pipelines
def _kfp_client(args):
    from batchscale.kfp_client import connect, resolve_auth

    auth = resolve_auth(args.token_env, args.token_file)
    print(f"KFP {redact_url(args.host)} ({auth.describe()})", file=sys.stderr)
    return connect(args.host, auth, args.namespace)


def cmd_submit(args) -> int:
    from batchscale.kfp_client import kfp_errors, submit_run

    cfg = load_config(args.config)
    run_name = args.run_name or f"{cfg.name} {new_run_id()}"
    with kfp_errors(args.host):
        run = submit_run(_kfp_client(args), cfg, args.experiment, run_name, args.namespace)
    k8s = cfg.kubernetes
    print(f"started run {run.run_id} ({run_name}) in experiment {args.experiment}")
    print(f"results: s3://{k8s.s3_bucket}/{k8s.s3_prefix}/<table>/date=<day>/"
          f"run_id={run.run_id}/ at {k8s.s3_endpoint_url}")
    return 0


def cmd_schedule(args) -> int:
    from batchscale.cron import check_cron
    from batchscale.kfp_client import create_schedule, kfp_errors

    cfg = load_config(args.config)
    cron = check_cron(args.cron)
    name = args.name or f"batchscale {cfg.name}"
    with kfp_errors(args.host):
        job, replaced = create_schedule(_kfp_client(args), cfg, args.experiment, name, cron,
                                        args.namespace, replace=args.replace)
    print(f"created recurring run {job.recurring_run_id} ({name}): cron '{cron}', one run at a "
          "time, no catch-up, caching off, a throughput regression fails the run"
          + "".join(f"; replaced {old}" for old in replaced))
    return 0


def cmd_schedules(args) -> int:
    from batchscale.kfp_client import change_schedule, kfp_errors, list_schedules, schedule_line

    if args.action != "list" and not args.recurring_run_id:
        raise BadInput(f"schedules {args.action}: give the recurring run id "
                       "(see `batchscale schedules list`)")
    if args.recurring_run_id is not None:  # it becomes part of the API's URL path
        check_name(args.recurring_run_id, "recurring run id")
    with kfp_errors(args.host):
        client = _kfp_client(args)
        if args.action == "list":
            lines = [schedule_line(job) for job in list_schedules(client, args.namespace)]
            print("\n".join(lines) if lines else "no recurring runs")
            return 0
        change_schedule(client, args.action, args.recurring_run_id)
    print(f"{args.action}: {args.recurring_run_id}")
    return 0


# ------------------------------------------------------------------------- single stages
def cmd_sweep(args) -> int:
    # Without a prepared dataset there are no real batches to time.
    cfg = config_from_args(args, {} if args.dataset_dir else
                           {"sweep": {"input_modes": ["synthetic"]}})
    run_id = given_run_id(args)
    check_output_file(args.out, "--out")
    from batchscale.sweep.sweep import run_stage  # torch: only once the input is known good

    rows = run_stage(cfg.to_json(), run_id, args.dataset_dir, args.out)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


def target_flag(text: str) -> dict:
    """--target METRIC=VALUE as a targets entry (the config then checks the metric and value)."""
    metric, sep, value = text.partition("=")
    try:
        if not sep:
            raise ValueError
        return {"metric": metric.strip(), "value": float(value)}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not METRIC=VALUE (e.g. val_loss=0.3); metrics: "
            f"{', '.join(METRICS)}") from None


def cmd_converge(args) -> int:
    from batchscale.workloads import check_builds, get_workload

    # No scaling runs (the pipeline's extra worker counts): here --workers sets the one count.
    fixed = {"scaling_workers": [], "scaling_batch_sizes": []}
    if args.target:  # they replace the config's targets (and its shorthand)
        fixed |= {"targets": args.target, "target_val_accuracy": None}
    cfg = config_from_args(args, {"convergence": fixed})
    run_id = given_run_id(args)
    check_output_dir(args.out, "--out")
    check_builds(get_workload(cfg.workload))  # before the dataset is prepared
    from batchscale.convergence.runner import run_convergence  # torch: input known good now
    from batchscale.data.prep import prepare
    from batchscale.storage import write_table_atomic

    out = Path(args.out)
    data_dir = args.dataset_dir or out / "data"
    if not args.dataset_dir:
        prepare(cfg.dataset, data_dir)
    print(f"batchscale converge {run_id} (rerun with --run-id {run_id} to resume)",
          file=sys.stderr)
    curves, runs = run_convergence(cfg, list(cfg.convergence.batch_sizes), data_dir=str(data_dir),
                                   out_dir=str(out / "work" / run_id), run_id=run_id)
    write_table_atomic(out / "curves.parquet", curves)
    write_table_atomic(out / "runs.parquet", runs)
    print(f"wrote {out / 'curves.parquet'} and {out / 'runs.parquet'}")
    if RunStatus.REACHED not in runs.column("status").to_pylist():
        wanted = " or ".join(t.label for t in cfg.convergence.resolved_targets())
        raise BatchscaleError(
            f"no trial reached {wanted} within max_steps {cfg.convergence.max_steps} (statuses "
            "and curves are in the tables above): lower the target, raise max_steps, or check "
            "the learning rates")
    return 0


def cmd_validate(args) -> int:
    from batchscale.checks import validate_table
    from batchscale.errors import ValidationFailed
    from batchscale.storage import read_table_file, write_bytes_atomic

    if args.html is not None:
        check_output_file(args.html, "--html")
    report = validate_table(args.table, read_table_file(args.file))
    if args.html:
        write_bytes_atomic(args.html, report.to_html().encode())
    if not report.success:
        raise ValidationFailed(f"{args.file}: {report.failure_message()}")
    for warning in report.warnings():
        print(f"{args.file}: warning: {warning}")
    print(f"{args.file}: {args.table} table passed "
          f"{report.statistics.get('evaluated_expectations', '?')} expectations")
    return 0


def cmd_analyze(args) -> int:
    """The analysis stage on a runs (and sweep) table a user brings: the same analysis table,
    summary and report as the pipeline, checked by the same suite."""
    from batchscale.analysis.external import (
        analyze_inputs,
        parse_column_mapping,
        read_inputs,
        write_outputs,
    )
    from batchscale.checks.stage import check_tables

    cfg = config_from_args(args)
    mapping = parse_column_mapping(args.column)
    if args.run_id is not None:
        check_run_id(args.run_id)
    if args.out is not None:
        check_output_dir(args.out, "--out")
    inputs = read_inputs(args.runs, args.sweep, mapping)
    run_id = args.run_id or inputs.default_run_id(cfg)
    out = check_output_dir(args.out or str(STATE_DIR / "analyze" / run_id), "--out")
    for note in inputs.notes:
        print(f"note: {note}", file=sys.stderr)
    analysis = analyze_inputs(inputs, cfg, run_id)
    paths = write_outputs(analysis, out)
    print(analysis.markdown)
    print("\n".join(f"{name}: {path}" for name, path in paths.items()))
    # The pipeline's validate step on the analysis table: same suite, same pages, exit 3.
    check_tables([("analysis", "analysis", analysis.table, {})],
                 str(out / "validation.json"), str(out / "validation.html"))
    return 0


def cmd_workloads(args) -> int:
    from batchscale.workloads import WORKLOAD_NAMES, get_workload

    for name in WORKLOAD_NAMES:
        w = get_workload(name)
        print(f"{name:40s} {w.kind:15s} input {w.input_shape}  {w.description}")
    print("package.module:factory                   your own nn.Module factory")
    return 0


def cmd_datasets(args) -> int:
    from batchscale.catalog import DATASETS

    width = max(map(len, DATASETS))
    print("\n".join(f"{name:{width}s}  {about}" for name, about in DATASETS.items()))
    return 0


def cmd_config(args) -> int:

    if args.action == "show":
        print(DEFAULT_CONFIG_PATH.read_text(), end="")
    else:
        print(reference_markdown())
    return 0


def cmd_clean(args) -> int:
    from batchscale import localstore

    localstore.down()
    for sub in ("pipeline_root", "work", "runs"):
        shutil.rmtree(STATE_DIR / sub, ignore_errors=True)
    print("removed local pipeline outputs (the store's data is kept; delete .batchscale/store "
          "by hand to drop it)")
    return 0


# ------------------------------------------------------------------------------ the parser
CONFIG_HELP = "experiment YAML (default: the embedded digits config, `batchscale config show`)"
CONFIG_FLAGS_NOTE = ("Flags named after a config field (--time-budget-s for sweep.time_budget_s) "
                     "replace that field's value in --config; see the README's Config reference.")


ANALYZE_DESCRIPTION = """\
Fit, recommend and report on training results you already have, as the pipeline does on its
own: writes analysis.parquet, summary.json and report.html (and the analysis table's
validation.json/.html) to --out.

runs table, one row per training run:
  required  batch_size; steps_to_target or examples_to_target (the other is derived:
            steps = examples / batch, rounded up)
  optional  seed (default: each row is one run), lr_rule (constant, linear, sqrt, grid;
            default grid: the fewest steps over the learning rates given), lr, status
            (reached, not_reached, diverged; default: reached where steps are given; an empty
            or NaN step count is not reached), workers (1), time_to_target_s, train_time_s,
            steps_run, and any other column of batchscale's runs table
sweep table, one row per batch size:
  required  batch_size; step_time_median_s or samples_per_s (the other is derived)
  optional  input_mode (synthetic, real; default synthetic), status (ok, oom, error),
            peak_memory_bytes, and any other column of batchscale's sweep table

Columns with other names: --column NAME=SOURCE (sweep.NAME=SOURCE for the sweep only).
Each (lr_rule, batch_size, lr, seed, workers) appears once. Tables written by batchscale are
read as they are.

Flags named after an analysis config field (--bootstrap-samples for
analysis.bootstrap_samples) replace that field's value in --config.
"""


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="batchscale", description="Why doesn't training get faster with a bigger "
               "batch? Measure throughput, memory and critical batch size, and get a "
               "recommendation.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the whole pipeline locally (kfp.local)",
                         description=CONFIG_FLAGS_NOTE)
    run.add_argument("--config", help=CONFIG_HELP)
    run.add_argument("--run-id", help="reuse a run id to resume an interrupted run")
    add_config_flags(run, "publish", ["fail_on_regression"])
    run.set_defaults(func=cmd_run)

    hist = sub.add_parser("history", help="throughput and B_crit of a workload over time, "
                          "from the results lake (table and plot)")
    hist.add_argument("--workload", required=True, help="workload name as in the config")
    hist.add_argument("--device", help="only runs whose device name contains this (any case)")
    hist.add_argument("--precision", choices=["fp32", "bf16"],
                      help="only runs at this precision")
    hist.add_argument("--last", type=whole_number, help="only the most recent N runs")
    hist.add_argument("--plot", help="PNG to write (default: history-<workload>.png)")
    hist.set_defaults(func=cmd_history)

    rep = sub.add_parser("report", help="rebuild a run's HTML report from the results lake")
    rep.add_argument("--run-id", required=True, help="the run whose report to rebuild")
    rep.add_argument("--out", default="report.html", help="HTML file to write")
    rep.set_defaults(func=cmd_report)

    comp = sub.add_parser("compile", help="write the pipeline's IR YAML for a KFP cluster")
    comp.add_argument("--config", help=CONFIG_HELP)
    comp.add_argument("--output", default="pipeline.yaml", help="IR YAML file to write")
    comp.set_defaults(func=cmd_compile)

    kfp_conn = argparse.ArgumentParser(add_help=False)
    kfp_conn.add_argument("--host", required=True,
                          help="KFP API endpoint, e.g. http://localhost:8080 (port-forward) or "
                          "http://ml-pipeline.kubeflow:8888 (in cluster)")
    kfp_conn.add_argument("--namespace", help="KFP multi-user profile namespace")
    kfp_conn.add_argument("--token-env", help="environment variable holding a bearer token "
                          "(default: KF_PIPELINES_TOKEN when set)")
    kfp_conn.add_argument("--token-file", help="file holding a token, re-read on each request "
                          "(default in a pod: its service-account token)")
    submit = sub.add_parser("submit", parents=[kfp_conn],
                            help="compile and start one run on a KFP cluster")
    submit.add_argument("--config", help=CONFIG_HELP)
    submit.add_argument("--experiment", default="batchscale", help="KFP experiment to run in")
    submit.add_argument("--run-name", help="KFP run name (default: <config name> <run id>)")
    submit.set_defaults(func=cmd_submit)
    sched = sub.add_parser("schedule", parents=[kfp_conn],
                           help="create a recurring benchmark run on a KFP cluster")
    sched.add_argument("--config", help=CONFIG_HELP)
    sched.add_argument("--cron", required=True,
                       help="6-field KFP cron, seconds first: '0 0 2 * * *' = 02:00 daily")
    sched.add_argument("--experiment", default="batchscale",
                       help="KFP experiment the runs go in")
    sched.add_argument("--name", help="recurring run name (default: batchscale <config name>); "
                       "one per name in an experiment")
    sched.add_argument("--replace", action="store_true",
                       help="swap the recurring run of the same name in the experiment for this "
                       "one (paused first, deleted once the new one exists); without it, an "
                       "existing one is refused")
    sched.set_defaults(func=cmd_schedule)
    scheds = sub.add_parser("schedules", parents=[kfp_conn],
                            help="list, pause, resume or delete recurring runs")
    scheds.add_argument("action", choices=["list", "pause", "resume", "delete"],
                        help="what to do")
    scheds.add_argument("recurring_run_id", nargs="?",
                        help="the recurring run to change (not for list)")
    scheds.set_defaults(func=cmd_schedules)

    store = sub.add_parser("store", help="manage the local SeaweedFS object store")
    store.add_argument("action", choices=["up", "down", "status", "env"],
                       help="start (idempotent), stop (only the process it started), show, or "
                       "print `export` lines")
    store.set_defaults(func=cmd_store)

    sw = sub.add_parser("sweep", help="throughput sweep of one workload, outside the pipeline",
                        description=CONFIG_FLAGS_NOTE)
    sw.add_argument("--config", help=CONFIG_HELP)
    add_config_flags(sw, None, ["workload"])
    add_config_flags(sw, "sweep", ["batch_sizes", "device", "precision", "channels_last",
                                   "torch_compile", "memory_limit_bytes", "image_size_px",
                                   "max_batch_size", "time_budget_s"])
    sw.add_argument("--dataset-dir", help="prepared dataset: also time real input batches")
    sw.add_argument("--run-id", help="run id recorded in every row (default: a new one)")
    sw.add_argument("--out", required=True, help="output Parquet file")
    sw.set_defaults(func=cmd_sweep)

    cv = sub.add_parser("converge", help="train to the target per batch size, outside the "
                        "pipeline", description=CONFIG_FLAGS_NOTE)
    cv.add_argument("--config", help=CONFIG_HELP)
    add_config_flags(cv, None, ["workload"])
    add_config_flags(cv, "convergence", ["batch_sizes", "lr_rules", "lr_grid", "workers",
                                         "accumulation_steps", "checkpoint_uri",
                                         "max_restarts", "optimizer", "precision", "lr_decay",
                                         "weight_decay", "train_eval_rows", "gap_epochs"])
    cv.add_argument("--target", action="append", type=target_flag, metavar="METRIC=VALUE",
                    help="a target, e.g. val_accuracy=0.95 or val_loss=0.3 (repeat the flag for "
                    "several); replaces the config's targets. Metrics: " + ", ".join(METRICS))
    cv.add_argument("--dataset-dir", help="prepared dataset (default: prepare the config's)")
    cv.add_argument("--run-id", help="reuse a run id to resume from its checkpoints")
    cv.add_argument("--out", required=True, help="output directory")
    cv.set_defaults(func=cmd_converge)

    val = sub.add_parser("validate", help="run a table's great-expectations suite")
    val.add_argument("--table", required=True,
                     choices=["dataset", "manifest", "sweep", "curves", "runs", "analysis"],
                     help="which table's suite")
    val.add_argument("--html", help="also write the readable result page here")
    val.add_argument("file", help="the table's Parquet file")
    val.set_defaults(func=cmd_validate)

    an = sub.add_parser(
        "analyze", help="the analysis (table, summary, report) on a runs table you bring, "
        "from batchscale or elsewhere", description=ANALYZE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    an.add_argument("runs", help="runs table, .parquet or .csv: one row per training run")
    an.add_argument("--sweep", help="sweep table, .parquet or .csv: step time per batch size")
    an.add_argument("--column", action="append", metavar="NAME=SOURCE",
                    help="read batchscale's column NAME from your column SOURCE, e.g. "
                    "--column steps_to_target=steps (sweep.NAME or runs.NAME: that table only); "
                    "repeat for more")
    an.add_argument("--config", help=CONFIG_HELP + "; only its analysis section is used")
    add_config_flags(an, "analysis", ["saturation_tolerance", "bootstrap_samples",
                                      "b_crit_range_factor", "step_time_disagreement_factor"])
    an.add_argument("--run-id", help="run id of the analysis rows (default: external-<digest "
                    "of the inputs and settings>)")
    an.add_argument("--out", help="output directory (default: .batchscale/analyze/<run id>)")
    an.set_defaults(func=cmd_analyze)

    sub.add_parser("workloads", help="list the named workloads").set_defaults(func=cmd_workloads)
    sub.add_parser("datasets", help="list the named datasets").set_defaults(func=cmd_datasets)
    cfg = sub.add_parser("config", help="print the default config or the config reference")
    cfg.add_argument("action", choices=["show", "reference"],
                     help="show: the embedded default YAML; reference: every key, Markdown")
    cfg.set_defaults(func=cmd_config)
    sub.add_parser("clean", help="stop the local store, drop local pipeline outputs") \
        .set_defaults(func=cmd_clean)
    return p


def main(argv: list[str] | None = None) -> int:
    """Run one command. Whatever it prints on failure passes through names.redact_url, so a
    URL's user:password never reaches the terminal or a log; a bug still shows its traceback
    (redacted too), bad input never does."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BatchscaleError as err:
        print(f"batchscale: error: {redact_url(str(err))}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("batchscale: interrupted; results written so far are kept", file=sys.stderr)
        return 130
    except Exception:
        print(redact_url(traceback.format_exc()), file=sys.stderr, end="")
        return 1


if __name__ == "__main__":
    sys.exit(main())
