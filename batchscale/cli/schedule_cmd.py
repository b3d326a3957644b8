"""`batchscale batch-schedule`: the critical batch over training and a batch-size schedule
checked against the constant batch (docs/batch-schedule.md). Rerun with the same --out to
resume: finished branches and check runs are kept, the reference run resumes from its newest
checkpoint."""

from __future__ import annotations

import base64
import sys
import time
from pathlib import Path

from batchscale.cli.common import given_run_id, terminal_text
from batchscale.cliflags import check_output_dir, config_from_args

OUTPUTS = ("critical_over_training.parquet", "schedule_check.parquet", "batch_schedule.md",
           "critical_over_training.png", "validation.json", "validation.html")


def schedule_config(args):
    """The config with the command's flags put in: --dataset, and --target replacing the
    config's targets (as `converge` takes it)."""
    overrides = {"dataset": {"name": args.dataset}} if args.dataset else {}
    if args.target:
        overrides["convergence"] = {"targets": args.target, "target_val_accuracy": None}
    return config_from_args(args, overrides, flags=["--target"] if args.target else [])


def cmd_batch_schedule(args) -> int:
    cfg = schedule_config(args)
    from batchscale.batch_schedule.stage import check_config
    from batchscale.contract_check import check_workload, with_workload_targets
    from batchscale.workloads import get_workload

    workload = get_workload(cfg.workload)
    cfg = with_workload_targets(cfg, workload)  # a user's Workload owns its targets
    check_config(cfg)  # before any data is prepared
    check_workload(workload, batch_sizes=cfg.batch_schedule.branch_batch_sizes,
                   convergence=True, targets=cfg.convergence.resolved_targets())
    out = check_output_dir(args.out, "--out")
    run_id = _run_id(args, out)
    from batchscale.batch_schedule.plot import plot
    from batchscale.batch_schedule.stage import run_stage
    from batchscale.data.prep import prepare

    data_dir = args.dataset_dir or str(out / "data")
    if not args.dataset_dir and not workload.has_own_data:
        prepare(cfg.dataset, Path(data_dir))
    print(f"batchscale batch-schedule {run_id}: {cfg.workload} (rerun with --out {out} to "
          "resume)", file=sys.stderr)
    started = time.monotonic()
    paths = [out / name for name in OUTPUTS]
    findings, outcome = run_stage(
        cfg.to_json(), run_id, data_dir, str(paths[0]), str(paths[1]), str(paths[2]),
        str(out / "work"), str(out), lambda line: print(
            f"[{time.monotonic() - started:6.0f} s] {line}", file=sys.stderr, flush=True))
    figure = plot(findings, outcome.curve)
    if figure.image_uri:
        paths[3].write_bytes(base64.b64decode(figure.image_uri.split(",", 1)[1]))
    print(terminal_text(paths[2].read_text()))
    print("wrote " + ", ".join(map(str, paths)))
    return 0


def _run_id(args, out: Path) -> str:
    """--run-id, else the one this output directory was started with (a rerun resumes)."""
    marker = out / "run_id"
    out.mkdir(parents=True, exist_ok=True)
    if args.run_id is None and marker.exists():
        return marker.read_text().strip()
    run_id = given_run_id(args)
    marker.write_text(run_id)
    return run_id
