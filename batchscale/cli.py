"""The `batchscale` command line. Heavy imports (torch, kfp, great_expectations) happen inside
the commands that need them, so `batchscale --help` and `store` stay fast."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import re
import secrets
import shutil
import sys
from pathlib import Path

from batchscale.errors import BadInput, BatchscaleError

STATE_DIR = Path(".batchscale")


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ-") + secrets.token_hex(3)


def parse_batch_sizes(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise BadInput(f"--batch-sizes: {text!r} is not a comma-separated list of positive "
                       "integers (e.g. 1,2,4,8)") from None
    if not values or any(v <= 0 for v in values):
        raise BadInput(f"--batch-sizes: {text!r} must list at least one positive integer")
    return values


# ------------------------------------------------------------------------------ the store
def connect_store():
    """The configured S3 store, or the local SeaweedFS (started if needed) when
    BATCHSCALE_S3_ENDPOINT is unset. Checks that it answers before any work starts."""
    from batchscale import localstore
    from batchscale.storage import ObjectStore, S3Settings

    if not os.environ.get("BATCHSCALE_S3_ENDPOINT"):
        info = localstore.up()
        settings = info.settings(os.environ.get("BATCHSCALE_S3_PREFIX", "batchscale"))
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
    from batchscale.components.publish.publish import check_run_id
    from batchscale.config import load_config
    from batchscale.workloads import get_workload

    cfg = load_config(args.config)
    get_workload(cfg.workload)  # a user factory that cannot be imported fails here, not later
    run_id = check_run_id(args.run_id or new_run_id())
    store = connect_store()
    print(f"batchscale run {run_id}: {cfg.name} ({cfg.workload} on {cfg.dataset.name})",
          file=sys.stderr)
    from batchscale.pipelines.local import run_local

    try:
        run_local(cfg, run_id, STATE_DIR.resolve())
    except RuntimeError as err:
        reason = re.sub(r"\x1b\[[0-9;]*m", "", str(err))
        raise BatchscaleError(f"pipeline run {run_id} failed: {reason} Tables already measured "
                              f"are kept under {STATE_DIR / 'work' / run_id}; rerun with "
                              f"--run-id {run_id} to resume.") from None
    from batchscale.summary import print_run_summary

    print_run_summary(store, run_id, STATE_DIR / "runs" / run_id)
    return 0


def cmd_compile(args) -> int:
    from batchscale.config import load_config
    from batchscale.pipelines.batchscale_pipeline import compile_pipeline

    cfg = load_config(args.config)
    print(f"wrote {compile_pipeline(cfg, args.output)}")
    return 0


# ------------------------------------------------------------------------- single stages
def _config_with(args, section: str, **overrides):
    from batchscale.config import load_config, parse_config

    cfg = load_config(args.config)
    data = cfg.model_dump(mode="json")
    if getattr(args, "workload", None):
        data["workload"] = args.workload
    data[section].update({k: v for k, v in overrides.items() if v is not None})
    return parse_config(data, "command line")


def cmd_sweep(args) -> int:
    from batchscale.components.throughput_sweep.sweep import run_stage

    batch_sizes = None if args.batch_sizes is None else parse_batch_sizes(args.batch_sizes)
    cfg = _config_with(args, "sweep", batch_sizes=batch_sizes, device=args.device,
                       precision=args.precision,
                       input_modes=["synthetic"] if not args.dataset_dir else None)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    run_stage(cfg.to_json(), args.run_id or new_run_id(), args.dataset_dir, args.out)
    print(f"wrote {args.out}")
    return 0


def cmd_converge(args) -> int:
    from batchscale.components.convergence.runner import run_convergence
    from batchscale.components.data_prep.prep import prepare
    from batchscale.storage import write_table_atomic

    batch_sizes = None if args.batch_sizes is None else parse_batch_sizes(args.batch_sizes)
    cfg = _config_with(args, "convergence", batch_sizes=batch_sizes, workers=args.workers,
                       lr_rules=[args.lr_rule] if args.lr_rule else None)
    out = Path(args.out)
    data_dir = args.dataset_dir or out / "data"
    if not args.dataset_dir:
        prepare(cfg.dataset, data_dir)
    curves, runs = run_convergence(cfg, list(cfg.convergence.batch_sizes), data_dir=str(data_dir),
                                   out_dir=str(out / "work"), run_id=args.run_id or new_run_id())
    write_table_atomic(out / "curves.parquet", curves)
    write_table_atomic(out / "runs.parquet", runs)
    print(f"wrote {out / 'curves.parquet'} and {out / 'runs.parquet'}")
    return 0


def cmd_validate(args) -> int:
    from batchscale.components.validate.checks import validate_table
    from batchscale.errors import ValidationFailed
    from batchscale.storage import read_table_file

    report = validate_table(args.table, read_table_file(args.file))
    if args.html:
        Path(args.html).write_text(report.to_html())
    if not report.success:
        raise ValidationFailed(report.failure_message())
    print(f"{args.file}: {args.table} table passed "
          f"{report.statistics.get('evaluated_expectations', '?')} expectations")
    return 0


def cmd_workloads(args) -> int:
    from batchscale.workloads import WORKLOAD_NAMES, get_workload

    for name in WORKLOAD_NAMES:
        w = get_workload(name)
        print(f"{name:40s} {w.kind:15s} input {w.input_shape}  {w.description}")
    print("package.module:factory                   your own nn.Module factory")
    return 0


def cmd_datasets(args) -> int:
    from batchscale.components.data_prep.datasets import DATASET_NAMES

    print("\n".join(DATASET_NAMES))
    return 0


def cmd_config(args) -> int:
    from batchscale.config import DEFAULT_CONFIG_PATH, reference_markdown

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
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="batchscale", description="Why doesn't training get faster "
                                "with a bigger batch? Measure throughput, memory and critical "
                                "batch size, and get a recommendation.")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run the whole pipeline locally (kfp.local)")
    run.add_argument("--config", help="experiment YAML (default: the embedded digits config)")
    run.add_argument("--run-id", help="reuse a run id to resume an interrupted run")
    run.set_defaults(func=cmd_run)

    comp = sub.add_parser("compile", help="write the pipeline's IR YAML for a KFP cluster")
    comp.add_argument("--config")
    comp.add_argument("--output", default="pipeline.yaml")
    comp.set_defaults(func=cmd_compile)

    store = sub.add_parser("store", help="manage the local SeaweedFS object store")
    store.add_argument("action", choices=["up", "down", "status", "env"])
    store.set_defaults(func=cmd_store)

    sw = sub.add_parser("sweep", help="throughput sweep of one workload, outside the pipeline")
    sw.add_argument("--config")
    sw.add_argument("--workload")
    sw.add_argument("--batch-sizes", help="comma-separated, e.g. 1,2,4,8")
    sw.add_argument("--device", choices=["auto", "cpu", "cuda"])
    sw.add_argument("--precision", choices=["fp32", "bf16"])
    sw.add_argument("--dataset-dir", help="prepared dataset: also time real input batches")
    sw.add_argument("--run-id")
    sw.add_argument("--out", required=True, help="output Parquet file")
    sw.set_defaults(func=cmd_sweep)

    cv = sub.add_parser("converge", help="train to the target per batch size, outside the "
                        "pipeline")
    cv.add_argument("--config")
    cv.add_argument("--workload")
    cv.add_argument("--batch-sizes")
    cv.add_argument("--lr-rule", choices=["constant", "linear", "sqrt"])
    cv.add_argument("--workers", type=int)
    cv.add_argument("--dataset-dir", help="prepared dataset (default: prepare the config's)")
    cv.add_argument("--run-id")
    cv.add_argument("--out", required=True, help="output directory")
    cv.set_defaults(func=cmd_converge)

    val = sub.add_parser("validate", help="run a table's great-expectations suite")
    val.add_argument("--table", required=True,
                     choices=["dataset", "manifest", "sweep", "curves", "runs", "analysis"])
    val.add_argument("--html", help="also write the readable result page here")
    val.add_argument("file")
    val.set_defaults(func=cmd_validate)

    sub.add_parser("workloads", help="list the named workloads").set_defaults(func=cmd_workloads)
    sub.add_parser("datasets", help="list the named datasets").set_defaults(func=cmd_datasets)
    cfg = sub.add_parser("config", help="print the default config or the config reference")
    cfg.add_argument("action", choices=["show", "reference"])
    cfg.set_defaults(func=cmd_config)
    sub.add_parser("clean", help="stop the local store, drop local pipeline outputs") \
        .set_defaults(func=cmd_clean)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BatchscaleError as err:
        print(f"batchscale: error: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        print("batchscale: interrupted; results written so far are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
