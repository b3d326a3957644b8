"""`batchscale plan`: the what-if plan of a published run, read from the results
lake: time to target and device-hours for other worker counts, each with its band, the
time/cost Pareto front, a recommendation for a deadline or a device-hour budget, and, with
--check, the prediction against the data-parallel runs the run measured."""

from __future__ import annotations

import argparse
import math

from batchscale.cli.common import connect_store, refuse_analyze_run_id
from batchscale.cliflags import check_output_file
from batchscale.errors import BadInput
from batchscale.names import check_run_id

PLAN_HELP = ("what if the run had N workers: predicted time to target and device-hours per "
             "worker count and per-worker batch, from a published run")


def add_plan_parser(sub) -> None:
    """The `plan` subcommand and its flags."""
    plan = sub.add_parser("plan", help=PLAN_HELP)
    plan.add_argument("--run-id", required=True, help="the published run to plan from")
    plan.add_argument("--workers", type=worker_list, help="worker counts to plan, e.g. "
                      "1,2,4,8,64 (default: those the run measured, and 4 and 8)")
    plan.add_argument("--lr-rule", help="the LR rule whose S(B) fit to use (default: the one "
                      "with the fewest large-batch steps S_min)")
    plan.add_argument("--link-gbps", type=float, help="a link to plan for instead of the "
                      "measured one: bandwidth in Gbit/s (with --latency-us); marked assumed")
    plan.add_argument("--latency-us", type=float, help="latency per all-reduce hop in µs; "
                      "alone, it replaces the latency the run's data cannot separate")
    goal = plan.add_mutually_exclusive_group()
    goal.add_argument("--deadline", help="cheapest plan reaching the target within this "
                      "(90s, 30min, 2h, 1d; a bare number is seconds)")
    goal.add_argument("--budget-device-hours", type=float,
                      help="fastest plan within this many device-hours")
    plan.add_argument("--check", action="store_true", help="also compare predicted with "
                      "measured time to target where the run trained a batch with one worker "
                      "and more")
    plan.add_argument("--out", help="also write the plan table here (Parquet)")
    plan.set_defaults(func=cmd_plan)


MAX_PLAN_WORKERS = 65_536
"""The most workers a plan extrapolates to."""


def worker_list(text: str) -> list[int]:
    """'1,2,4' as [1, 2, 4]; each a whole number >= 1."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a comma-separated list of whole numbers") from None
    if not counts or min(counts) < 1 or max(counts) > MAX_PLAN_WORKERS:
        raise argparse.ArgumentTypeError(
            f"{text!r} needs worker counts from 1 to {MAX_PLAN_WORKERS:,} (beyond, the ring "
            "all-reduce model and a one-node measurement say nothing)")
    return counts


def _checked_link(args) -> None:
    for name, value in (("--link-gbps", args.link_gbps), ("--latency-us", args.latency_us)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise BadInput(f"{name}: must be a finite number >= 0, got {value}")
    if args.link_gbps is not None and args.link_gbps <= 0:
        raise BadInput(f"--link-gbps: must be positive, got {args.link_gbps}")
    budget = args.budget_device_hours
    if budget is not None and not (math.isfinite(budget) and budget > 0):
        raise BadInput(f"--budget-device-hours: must be a positive number, got {budget}")


def _checks(inputs, tables: dict, args) -> list[dict]:
    """Predicted vs measured for each LR rule the analysis fitted (a rule's S(B) is its own)."""
    import dataclasses

    from batchscale.planner.inputs import fitted_rules, steps_fit
    from batchscale.planner.table import check_rows

    checks = []
    for rule in fitted_rules(tables["analysis"]):
        _, fit, note = steps_fit(tables["analysis"], rule)
        rule_inputs = dataclasses.replace(inputs, lr_rule=rule, steps_fit=fit, band_note=note)
        checks += check_rows(rule_inputs, tables["runs"], args.link_gbps, args.latency_us)
    return checks


def cmd_plan(args) -> int:
    from batchscale.lake.plan_run import plan_inputs_of_run, run_env
    from batchscale.planner.comm import comm_model
    from batchscale.planner.model import (
        CHEAPEST_WITHIN_DEADLINE,
        FASTEST_WITHIN_BUDGET,
        Objective,
    )
    from batchscale.planner.table import (
        DEFAULT_EXTRA_WORKERS,
        check_lines,
        make_plan,
        plan_lines,
        table_rows,
    )
    from batchscale.schemas import make_table
    from batchscale.storage import write_table_atomic

    run_id = check_run_id(args.run_id)
    refuse_analyze_run_id(run_id, "plan.parquet")
    _checked_link(args)
    if args.out:
        check_output_file(args.out, "--out")
    objective = None
    if args.deadline is not None:
        from batchscale.planner.table import parse_duration

        objective = Objective(CHEAPEST_WITHIN_DEADLINE, parse_duration(args.deadline))
    elif args.budget_device_hours is not None:
        objective = Objective(FASTEST_WITHIN_BUDGET, args.budget_device_hours)
    inputs, tables = plan_inputs_of_run(connect_store(), run_id, args.lr_rule)
    comm = comm_model(inputs, args.link_gbps, args.latency_us)
    measured = {1, *(int(n) for n in inputs.data_parallel.get("workers", []))}
    workers = args.workers or sorted(measured | set(DEFAULT_EXTRA_WORKERS))
    plan = make_plan(inputs, comm, workers, objective)
    lines = [f"batchscale plan {run_id}", *plan_lines(plan)]
    if args.check:
        lines += ["", "prediction vs measurement (time to target, every LR rule with a fit):",
                  *check_lines(_checks(inputs, tables, args))]
    if args.out:
        write_table_atomic(args.out, make_table("plan", table_rows(plan), run_env(tables)))
        lines.append(f"plan table: {args.out}")
    print("\n".join(lines))
    # A deadline or budget no plan meets is an answer, printed above, but not a plan to act
    # on: a script sees it in the exit status.
    return 1 if objective is not None and plan.chosen is None else 0
