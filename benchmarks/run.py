"""Run every benchmark module (or those named on the command line) and save the figures, with
the machine's state (load average before and after each benchmark: the figures are quiet-machine
figures only if it stayed low) and each benchmark's wall time."""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import sys
import time
from pathlib import Path

import benchmarks


def _load() -> dict:
    load1, _, _ = os.getloadavg()
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"load_avg_1m": round(load1, 2), "usable_cpus": cpus}


def _plain(value):
    """Figures (benchmarks.stats.Figure) as their dicts; anything else as text."""
    return value.as_dict() if hasattr(value, "as_dict") else str(value)


def main(argv: list[str]) -> int:
    names = argv or sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__)
                           if m.name.startswith("bench_"))
    figures: dict = {"quick_mode": benchmarks.QUICK, "machine": {}, "wall_s": {}}
    started_all = time.perf_counter()
    for name in names:
        before = _load()
        print(f"== {name} (load average {before['load_avg_1m']} on {before['usable_cpus']} "
              "CPUs)", flush=True)
        started = time.perf_counter()
        figures[name] = importlib.import_module(f"benchmarks.{name}").run()
        wall = time.perf_counter() - started
        figures["wall_s"][name] = round(wall, 1)
        figures["machine"][name] = {"before": before, "after": _load()}
        print(f"   ({name}: {wall:.0f} s)", flush=True)
    total = time.perf_counter() - started_all
    figures["wall_s"]["total"] = round(total, 1)
    out = Path(".batchscale/bench.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(figures, indent=1, default=_plain))
    print(f"all: {total // 60:.0f} min {total % 60:.0f} s; figures saved to {out}"
          + (" (BENCH_QUICK=1: development figures, too loose to quote)" if benchmarks.QUICK
             else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
