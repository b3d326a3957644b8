"""`batchscale submit`, `schedule` and `schedules`: runs and recurring runs on a Kubeflow
Pipelines cluster (kfp is imported only inside these commands)."""

from __future__ import annotations

import sys

from batchscale.cli.common import new_run_id
from batchscale.config import load_config
from batchscale.errors import BadInput
from batchscale.names import check_name, redact_url


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
    from batchscale.kfp_client import create_schedule, kfp_errors, scheduled_config

    cfg = load_config(args.config)
    cron = check_cron(args.cron)
    name = args.name or f"batchscale {cfg.name}"
    with kfp_errors(args.host):
        job, replaced = create_schedule(_kfp_client(args), cfg, args.experiment, name, cron,
                                        args.namespace, replace=args.replace)
    threads = scheduled_config(cfg).sweep.threads
    print(f"created recurring run {job.recurring_run_id} ({name}): cron '{cron}', one run at a "
          "time, no catch-up, caching off, a throughput regression fails the run, the sweep's "
          f"trials on {threads} thread{'s' if threads > 1 else ''} (sweep.threads)"
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
