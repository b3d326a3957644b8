"""`batchscale batch-schedule`: the critical batch over training and a batch-size schedule
checked against the constant batch (docs/batch-schedule.md). Rerun with the same --out to
resume: finished branches and check runs are kept, the reference run resumes from its newest
checkpoint."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from batchscale.cli.common import given_run_id
from batchscale.cliflags import check_output_dir, config_from_args

OUTPUTS = ("critical_over_training.parquet", "batch_schedule.md", "critical_over_training.png",
           "validation.json", "validation.html")


def cmd_batch_schedule(args) -> int:
    overrides = {"dataset": {"name": args.dataset}} if args.dataset else {}
    cfg = config_from_args(args, overrides)
    from batchscale.batch_schedule.stage import check_config

    rule, _ = check_config(cfg)  # before any data is prepared
    out = check_output_dir(args.out, "--out")
    run_id = _run_id(args, out)
    from batchscale.batch_schedule import report
    from batchscale.batch_schedule.stage import measure_schedule
    from batchscale.checks.stage import check_tables
    from batchscale.data.prep import prepare
    from batchscale.envinfo import environment
    from batchscale.storage import write_bytes_atomic, write_table_atomic

    data_dir = args.dataset_dir or str(out / "data")
    if not args.dataset_dir:
        prepare(cfg.dataset, Path(data_dir))
    print(f"batchscale batch-schedule {run_id}: {cfg.workload} (rerun with --out {out} to "
          "resume)", file=sys.stderr)
    started = time.monotonic()
    outcome = measure_schedule(cfg, data_dir, out / "work", run_id, lambda line: print(
        f"[{time.monotonic() - started:6.0f} s] {line}", file=sys.stderr, flush=True))
    env = environment(run_id=run_id, config_hash=cfg.config_hash, experiment=cfg.name,
                      workload=cfg.workload, device="cuda" if _cuda() else "cpu",
                      variant=cfg.variant)
    table = report.table(outcome, rule, env)
    write_table_atomic(out / OUTPUTS[0], table)
    text = report.markdown(outcome, cfg.workload, rule)
    write_bytes_atomic(out / OUTPUTS[1], text.encode())
    report.plot_png(outcome, out / OUTPUTS[2])
    print(text)
    print("wrote " + ", ".join(str(out / name) for name in OUTPUTS))
    check_tables([("critical_over_training", "critical_over_training", table, {})],
                 str(out / OUTPUTS[3]), str(out / OUTPUTS[4]))
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


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
