"""`batchscale history`, `report`, `store` and `clean`: reading the results lake, and the local
SeaweedFS store and pipeline outputs it lives beside."""

from __future__ import annotations

import shutil
from pathlib import Path

from batchscale.cli.common import STATE_DIR, connect_store, refuse_analyze_run_id
from batchscale.cliflags import check_output_file
from batchscale.errors import BadInput
from batchscale.names import check_name, check_run_id, check_workload


def cmd_history(args) -> int:
    from batchscale.lake.history import critical_lines, load_history, throughput_lines
    from batchscale.lake.history_chart import default_plot_path, plot_history

    if args.last is not None and args.last < 1:
        raise BadInput(f"--last: must be a positive number of runs, got {args.last}")
    if args.studies:
        return _study_history(args)
    if args.experiment is not None:
        raise BadInput("--experiment: applies to --studies only")
    if args.workload is None:
        raise BadInput("history needs --workload NAME (or --studies)")
    workload = check_workload(args.workload, "--workload")
    plot_path = default_plot_path(workload) if args.plot is None else Path(args.plot)
    check_output_file(str(plot_path), "--plot")
    history = load_history(connect_store(), workload, args.device, args.precision, args.last)
    plot = plot_history(history, plot_path)
    print("\n".join([*throughput_lines(history), "", *critical_lines(history), "",
                     f"plot: {plot}"]))
    return 0


def _study_history(args) -> int:
    from batchscale.study.history import study_history, study_history_lines

    for flag, value in (("--workload", args.workload), ("--device", args.device),
                        ("--precision", args.precision), ("--plot", args.plot)):
        if value is not None:
            raise BadInput(f"{flag}: does not apply to --studies (use --experiment, --last)")
    experiment = None if args.experiment is None else check_name(args.experiment, "--experiment")
    print("\n".join(study_history_lines(study_history(connect_store(), experiment, args.last))))
    return 0


def cmd_report(args) -> int:
    from batchscale.lake.summary import rebuild_report
    from batchscale.study.stage import is_study, rebuild_study_report

    run_id = check_run_id(args.run_id)
    check_output_file(args.out, "--out")
    refuse_analyze_run_id(run_id, "report.html")
    store = connect_store()
    if is_study(store, run_id):
        print(rebuild_study_report(store, run_id, Path(args.out)))
        print(f"report: {args.out} (the study's, rebuilt from the lake)")
        return 0
    print("\n".join(rebuild_report(store, run_id, Path(args.out))))
    return 0


def cmd_store(args) -> int:
    from batchscale import localstore

    if args.action == "up":
        info = localstore.up()
        print(f"SeaweedFS S3 at {info.endpoint_url}, bucket {info.bucket}, pid {info.pid}, "
              f"data in {info.data_dir}")
        print(localstore.reach(info))
    elif args.action == "down":
        print("stopped" if localstore.down() else "not running (nothing to stop)")
    elif args.action == "status":
        info = localstore.status()
        print(f"running: {info.endpoint_url} pid {info.pid}" if info else "not running")
        if info:
            print(localstore.reach(info))
        return 0 if info else 1
    else:
        print("\n".join(localstore.env_lines()))
    return 0


def cmd_clean(args) -> int:
    from batchscale import localstore

    localstore.down()
    for sub in ("pipeline_root", "work", "runs"):
        shutil.rmtree(STATE_DIR / sub, ignore_errors=True)
    print("removed local pipeline outputs (the store's data is kept; delete .batchscale/store "
          "by hand to drop it)")
    return 0
