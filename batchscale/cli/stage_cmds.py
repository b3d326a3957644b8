"""One pipeline stage outside the pipeline: `batchscale sweep`, `converge`, `validate` and
`analyze`. torch and great_expectations are imported only once a command's input is checked."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from batchscale.cli.common import STATE_DIR, given_run_id, terminal_text
from batchscale.cliflags import (
    check_output_dir,
    check_output_file,
    config_from_args,
    flag_for,
)
from batchscale.errors import BadInput, BatchscaleError
from batchscale.loop import NO_HALVING
from batchscale.metrics import METRICS
from batchscale.names import check_run_id
from batchscale.schemas import RunStatus, StopKind, stop_kind

SCALING_FIELDS = ("scaling_workers", "scaling_batch_sizes")
NOT_FOR_A_LOOP = ("optimizer", "precision", "weight_decay", "accumulation_steps",
                  "loader_workers", "train_eval_rows")
"""Convergence fields a TrainingLoop does not use: they configure batchscale's own loop."""


def _dataset_flag(args) -> dict:
    """--dataset NAME as a config override."""
    return {"dataset": {"name": args.dataset}} if args.dataset else {}


def cmd_sweep(args) -> int:
    cfg = config_from_args(args, _dataset_flag(args))
    if not args.dataset_dir and not _brings_its_data(cfg.workload):
        # Without a prepared dataset there are no real batches to time.
        cfg = config_from_args(args, {**_dataset_flag(args),
                                      "sweep": {"input_modes": ["synthetic"]}})
    run_id = given_run_id(args)
    check_output_file(args.out, "--out")
    from batchscale.sweep.sweep import run_stage  # torch: only once the input is known good

    rows = run_stage(cfg.to_json(), run_id, args.dataset_dir, args.out)
    print(f"wrote {len(rows)} rows to {args.out}")
    return 0


def _brings_its_data(workload_name: str) -> bool:
    """Whether the workload is a user's batchscale.Workload with its own training data (its
    module is imported: the sweep imports it anyway)."""
    from batchscale import names

    if not names.is_factory_spec(workload_name):
        return False
    from batchscale.workloads import get_workload

    return get_workload(workload_name).has_own_data


def target_flag(text: str) -> dict:
    """--target METRIC=VALUE as a targets entry (the config then checks the metric and value).
    METRIC>=VALUE / METRIC<=VALUE, the way targets are printed, are taken too when the sign is
    the metric's own direction."""
    metric, sign, value = _split_target(text)
    try:
        if not sign:
            raise ValueError
        entry = {"metric": metric.strip(), "value": float(value)}
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not METRIC=VALUE (e.g. val_loss=0.3); metrics: "
            f"{', '.join(METRICS)}") from None
    known = METRICS.get(entry["metric"])
    if sign != "=" and known is not None and sign != known.comparison:
        raise argparse.ArgumentTypeError(
            f"{text!r}: {known.name} is reached when it is {known.comparison} the target; "
            f"write {known.name}={value.strip()} (or {known.name}{known.comparison}"
            f"{value.strip()})")
    return entry


def _split_target(text: str) -> tuple[str, str, str]:
    for sign in (">=", "<="):
        if sign in text:
            metric, _, value = text.partition(sign)
            return metric, sign, value
    return text.partition("=")


def cmd_converge(args) -> int:
    from batchscale.contract_check import check_workload, with_workload_targets
    from batchscale.workloads import get_workload

    # The pipeline's extra worker counts run here only when their flags ask for them: the
    # embedded config's (2 workers at batch 256) would otherwise double a quick grid.
    fixed = {name: [] for name in SCALING_FIELDS if getattr(args, name) is None}
    if args.target:  # they replace the config's targets (and its shorthand)
        fixed |= {"targets": args.target, "target_val_accuracy": None}
    cfg = config_from_args(args, {**_dataset_flag(args), "convergence": fixed},
                           flags=["--target"] if args.target else [])
    run_id = given_run_id(args)
    check_output_dir(args.out, "--out")
    workload = get_workload(cfg.workload)
    cfg = with_workload_targets(cfg, workload)
    check_workload(workload, batch_sizes=_largest_batches(cfg), convergence=True,
                   targets=cfg.convergence.resolved_targets())  # before the dataset is prepared
    if workload.loop is not None and cfg.convergence.lr_halving_eta is not None:
        raise BadInput(NO_HALVING)
    if cfg.convergence.strategy == "adaptive" and cfg.convergence.scaling_workers:
        raise BadInput("--scaling-workers: scaling runs go with the grid strategy here; run "
                       "them in a second `batchscale converge` (--strategy grid) of their own")
    if args.dataset_dir:  # named here, not by every rank of a torchrun group and its restarts
        from batchscale.shards import read_manifest

        read_manifest(args.dataset_dir)
    from batchscale.data.prep import prepare  # torch: input known good now
    from batchscale.storage import write_table_atomic

    out = Path(args.out)
    data_dir = args.dataset_dir or out / "data"
    if not args.dataset_dir and not workload.has_own_data:
        prepare(cfg.dataset, data_dir)
    print(f"batchscale converge {run_id} (rerun with --run-id {run_id} to resume)",
          file=sys.stderr)
    c = cfg.convergence
    optimizer = "" if workload.loop is not None else f", {c.optimizer}"
    print(f"training to {' and '.join(t.label for t in c.resolved_targets())}, up to "
          f"{c.max_steps:,} steps per trial ({c.strategy}: batch sizes "
          f"{', '.join(map(str, c.batch_sizes))}; {c.lr_text()}{optimizer}; seeds "
          f"{', '.join(map(str, c.seeds))}){_scaling_text(c)}", file=sys.stderr)
    if workload.loop is None and (note := c.lr_note()):
        print(f"note: {note}", file=sys.stderr)
    if workload.loop is not None and (unused := [flag_for(name) for name in NOT_FOR_A_LOOP
                                                  if getattr(args, name, None) is not None]):
        verb = "does" if len(unused) == 1 else "do"
        print(f"note: {', '.join(unused)} {verb} not apply to a TrainingLoop: your loop builds "
              "its own optimizer, precision and data loading; batchscale gives it the batch "
              "size, the learning rate (trial.lr, trial.lr_at), the seed and when to stop",
              file=sys.stderr)
    written = [out / "curves.parquet", out / "runs.parquet"]
    if cfg.convergence.strategy == "adaptive":
        from batchscale.adaptive.driver import run_adaptive

        curves, runs, decisions = run_adaptive(cfg, data_dir=str(data_dir), run_id=run_id,
                                               work_root=out / "work",
                                               echo=lambda line: print(line, file=sys.stderr))
        written.append(out / "decisions.parquet")
        write_table_atomic(written[-1], decisions)
    else:
        curves, runs = _grid(cfg, str(data_dir), out / "work", run_id)
    write_table_atomic(written[0], curves)
    write_table_atomic(written[1], runs)
    print("wrote " + ", ".join(map(str, written)))
    if note := _failed_note(runs.to_pylist()):
        print(note, file=sys.stderr)
    if RunStatus.REACHED not in runs.column("status").to_pylist():
        wanted = " or ".join(t.label for t in cfg.convergence.resolved_targets())
        raise BatchscaleError(
            f"no trial reached {wanted}: {why_short(runs.to_pylist(), cfg.convergence)} "
            f"(each trial's stop_reason is in {written[1]}, its curve in {written[0]})")
    ran_with = _write_config(cfg, out)
    sweep = ("" if workload.loop is not None else  # a TrainingLoop has no throughput sweep
             "--sweep FILE with a `batchscale sweep` table for the step-time model and memory, ")
    print(f"next: batchscale analyze {written[1]} --config {ran_with} gives B_crit and the "
          f"batch size, learning rate and worker count to use (add {sweep}--current-batch-size "
          "N for the saving against today's)", file=sys.stderr)
    return 0


def _write_config(cfg, out: Path) -> Path:
    """config.yaml in `out`: the config the trials ran with (what differs from the defaults,
    flags included), which `analyze --config` reads for what the runs table does not record
    (the warm-up said with the learning rate, the analysis settings)."""
    import json

    import yaml

    from batchscale.storage import write_bytes_atomic

    path = out / "config.yaml"
    text = yaml.safe_dump(json.loads(cfg.to_compact_json()), sort_keys=False)
    write_bytes_atomic(path, ("# the config `batchscale converge` ran with (defaults left "
                              "out)\n" + text).encode())
    return path


def _failed_note(rows: list[dict], shown: int = 3) -> str:
    """"note: 2 of 16 trials failed …" naming the first few and why, where a TrainingLoop's
    trials failed (the command goes on with the others: exit 0 while any reached); "" else."""
    trials = {r["trial_id"]: r for r in rows}
    failed = [r for r in trials.values() if r["status"] == RunStatus.FAILED]
    if not failed:
        return ""
    named = "; ".join(f"{r['trial_id']}: {r.get('stop_reason') or 'no reason recorded'}"
                      for r in failed[:shown])
    more = f"; and {len(failed) - shown} more" if len(failed) > shown else ""
    return (f"note: {len(failed)} of {len(trials)} trials failed (status failed: the loop raised "
            f"or broke its contract; the analysis leaves them out): {named}{more}")


def _grid(cfg, data_dir: str, work: Path, run_id: str):
    """The grid at convergence.workers, then its scaling runs, one torchrun group per worker
    count (convergence.fan_out); one curves and one runs table for all of them."""
    import pyarrow as pa

    from batchscale.convergence.runner import run_convergence

    c = cfg.convergence
    tables = []
    for cell in c.fan_out(one_batch_size_per_cell=False):
        workers = int(cell["workers"])
        folder = run_id if workers == c.workers else f"{run_id}-w{workers}"
        tables.append(run_convergence(cfg, [int(b) for b in cell["batch_sizes"].split(",")],
                                      data_dir=data_dir, out_dir=str(work / folder),
                                      run_id=run_id, workers=workers))
    curves, runs = zip(*tables, strict=True)
    return pa.concat_tables(curves), pa.concat_tables(runs)


def _scaling_text(c) -> str:
    """"; scaling runs: 2 workers at batch 64, 256" where the command runs them."""
    if not c.scaling_workers:
        return ""
    workers = ", ".join(map(str, c.scaling_workers))
    return (f"; scaling runs: {workers} workers at batch "
            f"{', '.join(map(str, c.scaling_batch_sizes))}")


def why_short(rows: list[dict], c) -> str:
    """How the trials ended short of the target, counted, each with what to change."""
    trials = {row["trial_id"]: row for row in rows}.values()
    kinds = [stop_kind(row.get("stop_reason")) for row in trials]
    ended = {
        "stalled": (kinds.count(StopKind.STALLED),
                    f"no target metric improved in {c.patience_evals} evaluations in a row: "
                    "raise convergence.patience_evals or try other learning rates"),
        "out of steps": (kinds.count(StopKind.OUT_OF_STEPS),
                         f"ran max_steps {c.max_steps:,}: raise max_steps or lower the target"),
        "diverged": (sum(row["status"] == RunStatus.DIVERGED for row in trials),
                     "lower the learning rates or lengthen the warm-up"),
    }
    parts = [f"{count} {name} ({advice})" for name, (count, advice) in ended.items() if count]
    other = len(trials) - sum(count for count, _ in ended.values())
    if other:
        parts.append(f"{other} ended otherwise (failed, pruned or probed)")
    return f"of {len(trials)} trials, " + "; ".join(parts) + _lrs_tried(trials)


def _lrs_tried(trials) -> str:
    """"; they ran sgd at peak LRs 0.025–0.2": what the trials tried, beside the advice."""
    lrs = [row["lr"] for row in trials if isinstance(row.get("lr"), float)
           and math.isfinite(row["lr"])]
    if not lrs:
        return ""
    optimizers = sorted({row["optimizer"] for row in trials if row.get("optimizer")})
    by = f"{'/'.join(optimizers)} " if optimizers else ""
    span = f"{min(lrs):.3g}" if min(lrs) == max(lrs) else f"{min(lrs):.3g}–{max(lrs):.3g}"
    return f"; they ran {by}at peak LRs {span}"


def _largest_batches(cfg) -> list[int]:
    """The convergence batch sizes a dataset must hold (none known before an adaptive search
    picks them: its probes are checked when they start)."""
    sizes = cfg.convergence.batch_sizes
    return [] if isinstance(sizes, str) else list(sizes)


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
    from batchscale.checks.stage import check_tables
    from batchscale.external.stage import (
        analyze_inputs,
        parse_column_mapping,
        read_inputs,
        write_outputs,
    )

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
    # The warm-up is not in the runs table: the config they ran with says it.
    warmup = cfg.convergence.warmup_steps if args.config else None
    table = inputs.runs.table
    if warmup is None and "optimizer" in table.column_names and any(
            value is not None for value in table.column("optimizer").to_pylist()):
        print("note: the learning rate is given without the warm-up the trials ran with (the "
              "runs table does not record convergence.warmup_steps): add --config with the "
              "config they ran with to have it said (`batchscale converge` writes it as "
              "config.yaml beside runs.parquet)", file=sys.stderr)
    analysis = analyze_inputs(inputs, cfg, run_id, warmup)
    paths = write_outputs(analysis, out)
    print(terminal_text(analysis.markdown))
    print("\n".join(f"{name}: {path}" for name, path in paths.items()))
    # The pipeline's validate step on the analysis table: same suite, same pages, exit 3.
    check_tables([("analysis", "analysis", analysis.table, {})],
                 str(out / "validation.json"), str(out / "validation.html"))
    return 0
