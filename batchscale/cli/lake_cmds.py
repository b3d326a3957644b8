"""`batchscale history`, `report`, `store` and `clean`: reading the results lake, and the local
SeaweedFS store and pipeline outputs it lives beside."""

from __future__ import annotations

import shutil
from pathlib import Path

from batchscale.cli.common import STATE_DIR, connect_store
from batchscale.cliflags import check_output_file
from batchscale.errors import BadInput
from batchscale.names import check_run_id, check_workload


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


def cmd_clean(args) -> int:
    from batchscale import localstore

    localstore.down()
    for sub in ("pipeline_root", "work", "runs"):
        shutil.rmtree(STATE_DIR / sub, ignore_errors=True)
    print("removed local pipeline outputs (the store's data is kept; delete .batchscale/store "
          "by hand to drop it)")
    return 0
