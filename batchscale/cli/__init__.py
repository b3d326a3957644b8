"""The `batchscale` command line. The commands live in modules by group: `pipeline_cmds` (run,
compile), `kfp_cmds` (submit, schedule, schedules on a KFP cluster), `lake_cmds` (history,
report, store, clean), `stage_cmds` (sweep, converge, validate, analyze), `info_cmds`
(workloads, datasets, config), and what they share in `common`. This module assembles the
parser that documents them all and runs one (`main`); the flags that set config fields are
generated from the config models (batchscale/cliflags.py). Heavy imports (torch, kfp,
great_expectations) happen inside the commands that need them, so `batchscale --help` and
`store` stay fast.

build_parser takes each `cmd_*` from this module's namespace, so replacing
`batchscale.cli.cmd_<name>` (as tests/test_cli.py does) replaces that command. The shared
names (STATE_DIR, connect_store, ...) are re-exported for callers such as
benchmarks/bench_regressions.py; the commands read them from `common`, so patch them there.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback

from batchscale.cli.common import (
    CONFIG_FLAGS_NOTE,
    CONFIG_HELP,
    STATE_DIR,
    connect_store,
    given_run_id,
    new_run_id,
)
from batchscale.cli.info_cmds import cmd_config, cmd_datasets, cmd_workloads
from batchscale.cli.kfp_cmds import cmd_schedule, cmd_schedules, cmd_submit
from batchscale.cli.lake_cmds import cmd_clean, cmd_history, cmd_report, cmd_store
from batchscale.cli.pipeline_cmds import cmd_compile, cmd_run
from batchscale.cli.plan_cmd import add_plan_parser
from batchscale.cli.schedule_cmd import cmd_batch_schedule
from batchscale.cli.stage_cmds import (
    cmd_analyze,
    cmd_converge,
    cmd_sweep,
    cmd_validate,
    target_flag,
)
from batchscale.cli.study_cmd import cmd_study
from batchscale.cliflags import Parser, add_config_flags, whole_number
from batchscale.errors import BatchscaleError
from batchscale.metrics import METRICS
from batchscale.names import redact_url
from batchscale.schemas import TABLES
from batchscale.stopping import (
    EXIT_SIGINT,
    EXIT_SIGTERM,
    Terminated,
    exit_process,
    sigterm_raises,
)

__all__ = [
    "CONFIG_FLAGS_NOTE", "CONFIG_HELP", "STATE_DIR", "build_parser", "cmd_analyze",
    "cmd_batch_schedule", "cmd_clean",
    "cmd_compile", "cmd_config", "cmd_converge", "cmd_datasets", "cmd_history", "cmd_report",
    "cmd_run", "cmd_schedule", "cmd_schedules", "cmd_store", "cmd_study", "cmd_submit", "cmd_sweep",
    "cmd_validate", "cmd_workloads", "connect_store", "given_run_id", "main", "new_run_id",
    "target_flag",
]


# ------------------------------------------------------------------------------ the parser
ANALYZE_DESCRIPTION = """\
Fit, recommend and report on training results you already have, as the pipeline does on its
own: writes analysis.parquet, summary.json, report.html and plan.parquet (the what-if plan of
worker counts, also in the report; `batchscale plan` reads published runs only) (and the
analysis table's validation.json/.html) to --out. --config: the config the runs trained with
(its analysis section, and its warm-up, said with the learning rate).

runs table, one row per training run:
  required  batch_size; steps_to_target or examples_to_target (the other is derived:
            steps = examples / batch, rounded up)
  optional  seed (default: each row is one run), lr_rule (constant, linear, sqrt, tuned;
            default tuned: the fewest steps over the learning rates given), lr, status
            (reached, not_reached, diverged; default: reached where steps are given; an empty
            or NaN step count is not reached), target_metric and target_value (what the
            steps are to, e.g. val_loss 3.2; unnamed otherwise), workers (1),
            time_to_target_s, train_time_s,
            steps_run, and any other column of batchscale's runs table
sweep table, one row per batch size:
  required  batch_size; step_time_median_s or samples_per_s (the other is derived)
  optional  input_mode (synthetic, real; default synthetic), status (ok, oom, error),
            peak_memory_bytes, and any other column of batchscale's sweep table

Columns with other names: --column NAME=SOURCE (sweep.NAME=SOURCE for the sweep only).
Each (lr_rule, batch_size, lr, seed, workers) appears once. Tables written by batchscale are
read as they are. An adaptive search's output (`converge --strategy adaptive --out DIR`):
analyze DIR/runs.parquet; its decisions.parquet beside it adds the report's "Adaptive search"
section and reads B_crit's interval at the search's level.

Flags named after an analysis config field (--bootstrap-samples for
analysis.bootstrap_samples) replace that field's value in --config.
"""


TARGET_HELP = ("a target, e.g. val_accuracy=0.95 or val_loss=0.3 (also as printed: "
               "'val_accuracy>=0.95'; repeat the flag for several); replaces the config's "
               "targets. Metrics: " + ", ".join(METRICS))


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
    add_config_flags(run, "analysis", ["current_batch_size", "current_lr"])
    run.set_defaults(func=cmd_run)

    study = sub.add_parser("study", help="run every variant of a study config locally, then "
                           "compare them (also what `run` does with a study config)",
                           description=CONFIG_FLAGS_NOTE)
    study.add_argument("--config", help=CONFIG_HELP)
    study.add_argument("--run-id", help="the study id: reuse it to resume an interrupted study "
                       "(published variants are skipped)")
    study.set_defaults(func=cmd_study, config_fields=[])

    hist = sub.add_parser("history", help="throughput and B_crit of a workload over time, "
                          "or the studies' answers over time (--studies), from the results "
                          "lake")
    hist.add_argument("--workload", help="workload name as in the config (required unless "
                      "--studies)")
    hist.add_argument("--studies", action="store_true",
                      help="list the published studies instead: each axis's answer per study")
    hist.add_argument("--experiment", help="with --studies: only studies of this experiment")
    hist.add_argument("--device", help="only runs whose device name contains this (any case)")
    hist.add_argument("--precision", choices=["fp32", "bf16"],
                      help="only runs at this precision")
    hist.add_argument("--last", type=whole_number, help="only the most recent N runs (or "
                      "studies)")
    hist.add_argument("--plot", help="PNG to write (default: history-<workload>.png)")
    hist.set_defaults(func=cmd_history)

    rep = sub.add_parser("report", help="rebuild a run's HTML report from the results lake")
    rep.add_argument("--run-id", required=True, help="the run whose report to rebuild")
    rep.add_argument("--out", default="report.html", help="HTML file to write")
    rep.set_defaults(func=cmd_report)

    comp = sub.add_parser(
        "compile", help="write the pipeline's IR YAML for a KFP cluster",
        description="Write the pipeline's IR YAML for a KFP cluster. Its tasks run the images "
        "named by BATCHSCALE_IMAGE (CPU) and BATCHSCALE_GPU_IMAGE (the GPU sweep), default "
        "batchscale's own: a workload of your own must be installed in them (docs/kubeflow.md)."
        " No credential is written: tasks read S3 keys from a Kubernetes Secret.")
    comp.add_argument("--config", help=CONFIG_HELP)
    comp.add_argument("--output", default="pipeline.yaml",
                      help="IR YAML file to write (default: pipeline.yaml)")
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
    scheds = sub.add_parser("schedules", help="list, pause, resume or delete recurring runs")
    # One sub-command per action, so the id may come before or after --host (with the action
    # and an optional id as two positionals, argparse binds both before the first flag and
    # refuses an id given after it).
    actions = scheds.add_subparsers(dest="action", metavar="ACTION", required=True,
                                    help="what to do")
    for action, what in (("list", "list the recurring runs"), ("pause", "pause one"),
                         ("resume", "resume one"), ("delete", "delete one")):
        one = actions.add_parser(action, parents=[kfp_conn], help=what)
        if action != "list":
            one.add_argument("recurring_run_id", nargs="?",
                             help="the recurring run (`batchscale schedules list` shows ids)")
        one.set_defaults(func=cmd_schedules, recurring_run_id=None)

    store = sub.add_parser("store", help="manage the local SeaweedFS object store")
    store.add_argument("action", choices=["up", "down", "status", "env"],
                       help="start (idempotent), stop (only the process it started), show "
                       "(exit 0 when it runs, 1 when it does not), or print `export` lines")
    store.set_defaults(func=cmd_store)

    sw = sub.add_parser("sweep", help="throughput sweep of one workload, outside the pipeline",
                        description=CONFIG_FLAGS_NOTE)
    sw.add_argument("--config", help=CONFIG_HELP)
    add_config_flags(sw, None, ["workload"])
    add_config_flags(sw, "sweep", ["batch_sizes", "device", "precision", "channels_last",
                                   "torch_compile", "memory_limit_bytes", "image_size_px",
                                   "max_batch_size", "time_budget_s", "threads"])
    sw.add_argument("--dataset", metavar="NAME",
                    help="the config's dataset.name (see `batchscale datasets`): the dataset "
                    "the workload is for (e.g. shapes for a detector); with --dataset-dir its "
                    "prepared shards are also timed as real input")
    sw.add_argument("--dataset-dir", help="prepared dataset: also time real input batches")
    sw.add_argument("--run-id", help="run id recorded in every row (default: a new one)")
    sw.add_argument("--out", required=True, help="output Parquet file")
    sw.set_defaults(func=cmd_sweep)

    cv = sub.add_parser("converge", help="train to the target per batch size, outside the "
                        "pipeline", description=CONFIG_FLAGS_NOTE)
    cv.add_argument("--config", help=CONFIG_HELP)
    add_config_flags(cv, None, ["workload"])
    add_config_flags(cv, "convergence", ["batch_sizes", "lr_rules", "lr_candidates",
                                         "base_lr", "reference_batch_size", "warmup_steps",
                                         "workers", "accumulation_steps", "checkpoint_uri",
                                         "max_restarts", "optimizer", "precision", "lr_decay",
                                         "weight_decay", "train_eval_rows", "gap_epochs",
                                         "seeds", "max_steps", "strategy",
                                         "target_interval_ratio", "adaptive_objective",
                                         "adaptive_budget_examples",
                                         "adaptive_probe_budget_examples",
                                         "adaptive_budget_device_s", "lr_halving_eta",
                                         "lr_halving_first_rung_steps", "loader_workers",
                                         "eval_every_steps", "patience_evals",
                                         "scaling_workers", "scaling_batch_sizes"])
    cv.add_argument("--target", action="append", type=target_flag, metavar="METRIC=VALUE",
                    help=TARGET_HELP)
    cv.add_argument("--dataset", metavar="NAME",
                    help="the config's dataset.name (see `batchscale datasets`), prepared "
                    "unless --dataset-dir is given or the workload brings its own data")
    cv.add_argument("--dataset-dir", help="prepared dataset (default: prepare the config's)")
    cv.add_argument("--run-id", help="reuse a run id to resume from its checkpoints")
    cv.add_argument("--out", required=True, help="output directory")
    cv.set_defaults(func=cmd_converge)

    bsch = sub.add_parser("batch-schedule", help="the critical batch over training, and a "
                          "batch-size schedule checked against the constant batch",
                          description=CONFIG_FLAGS_NOTE + " Training settings (optimizer, LR "
                          "rule, base LR, warm-up, target) come from the convergence section; "
                          "see docs/batch-schedule.md.")
    bsch.add_argument("--config", help=CONFIG_HELP)
    add_config_flags(bsch, None, ["workload"])
    add_config_flags(bsch, "batch_schedule", ["base_batch_size", "branch_factors",
                                              "checkpoint_steps", "milestone_steps",
                                              "max_steps", "check_seeds", "val_rows"])
    # the training settings a schedule is measured with, as `converge` takes them (the first
    # of --lr-rules is the one used)
    add_config_flags(bsch, "convergence", ["lr_rules", "base_lr", "reference_batch_size",
                                           "warmup_steps", "optimizer"])
    bsch.add_argument("--target", action="append", type=target_flag, metavar="METRIC=VALUE",
                      help=TARGET_HELP + " The first target is the one the check trains to.")
    bsch.add_argument("--dataset", metavar="NAME",
                      help="the config's dataset.name (see `batchscale datasets`), prepared "
                      "unless --dataset-dir is given")
    bsch.add_argument("--dataset-dir", help="prepared dataset (default: prepare the config's)")
    bsch.add_argument("--run-id", help="run id recorded in every row (default: the one --out "
                      "was started with, else a new one)")
    bsch.add_argument("--out", required=True, help="output directory; rerun with the same one "
                      "to resume")
    bsch.set_defaults(func=cmd_batch_schedule)

    val = sub.add_parser("validate", help="run a table's great-expectations suite")
    val.add_argument("--table", required=True,
                     choices=list(TABLES),
                     help="which table's suite")
    val.add_argument("--html", help="also write the readable result page here")
    val.add_argument("file", help="the table's Parquet file")
    val.set_defaults(func=cmd_validate)

    an = sub.add_parser(
        "analyze", help="the analysis (table, summary, report) on a runs table you bring, "
        "from batchscale or elsewhere", description=ANALYZE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    an.add_argument("runs", help="runs table, .parquet or .csv (a Parquet file without an "
                    "extension, as a pipeline run's artifacts are, reads as Parquet): one row per "
                    "training run")
    an.add_argument("--sweep", help="sweep table, .parquet or .csv (the same): step time per "
                    "batch size")
    an.add_argument("--column", action="append", metavar="NAME=SOURCE",
                    help="read batchscale's column NAME from your column SOURCE, e.g. "
                    "--column steps_to_target=steps (sweep.NAME or runs.NAME: that table only); "
                    "repeat for more")
    an.add_argument("--config", help=CONFIG_HELP + "; only its analysis section is used")
    add_config_flags(an, "analysis", ["saturation_tolerance", "bootstrap_samples",
                                      "b_crit_range_factor", "step_time_disagreement_factor",
                                      "current_batch_size", "current_lr"])
    an.add_argument("--run-id", help="run id of the analysis rows (default: external-<digest "
                    "of the inputs and settings>)")
    an.add_argument("--out", help="output directory (default: .batchscale/analyze/<run id>)")
    an.set_defaults(func=cmd_analyze)

    add_plan_parser(sub)

    sub.add_parser("workloads", help="list the named workloads").set_defaults(func=cmd_workloads)
    sub.add_parser("datasets", help="list the named datasets").set_defaults(func=cmd_datasets)
    cfg = sub.add_parser("config", help="print the default config or the config reference")
    cfg.add_argument("action", choices=["show", "reference"],
                     help="show: the embedded default YAML; reference: every key, Markdown")
    cfg.set_defaults(func=cmd_config)
    sub.add_parser("clean", help="stop the local store, drop local pipeline outputs") \
        .set_defaults(func=cmd_clean)
    return p


NEGATIVE_LIST = re.compile(r"^-\d[\d.]*(,|$)")
"""A list value whose first item is negative ("-8,16"): argparse takes it for an option."""


def _negative_lists_attached(argv: list[str]) -> list[str]:
    """`--batch-sizes -8,16` as `--batch-sizes=-8,16`, so the value reaches the config check,
    which names the field and what it allows, instead of argparse's "expected one argument"."""
    out: list[str] = []
    for token in argv:
        if (out and out[-1].startswith("--") and "=" not in out[-1]
                and NEGATIVE_LIST.match(token)):
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run one command. Whatever it prints on failure passes through names.redact_url, so a
    URL's user:password never reaches the terminal or a log; a bug still shows its traceback
    (redacted too), bad input never does."""
    args = build_parser().parse_args(_negative_lists_attached(
        sys.argv[1:] if argv is None else argv))
    try:
        with sigterm_raises():  # SIGTERM (timeout, systemd, a pod deletion) stops like Ctrl-C
            code = args.func(args)
            sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
            return code
    except BatchscaleError as err:
        print(f"batchscale: error: {redact_url(str(err))}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("batchscale: interrupted; results written so far are kept", file=sys.stderr)
        return EXIT_SIGINT
    except Terminated:
        print("batchscale: stopped by SIGTERM; results written so far are kept", file=sys.stderr)
        return EXIT_SIGTERM
    except BrokenPipeError:  # stdout closed early (`batchscale ... | head`): a normal end
        _silence_stdout()
        return 0
    except Exception:
        print(redact_url(traceback.format_exc()), file=sys.stderr, end="")
        return 1


def entry() -> None:
    """The `batchscale` command (and `python -m batchscale.cli`): `main`, then the process ends
    with its status without the native libraries' teardown (stopping.exit_process)."""
    try:
        code = main()
    except SystemExit as stop:  # argparse's usage errors and --help; a refusal raised as exit
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    exit_process(code)


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush of what the closed pipe did
    not take raises nothing at exit."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
