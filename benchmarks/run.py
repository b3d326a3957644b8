"""Run every benchmark module (or those named on the command line) and save the figures."""

from __future__ import annotations

import importlib
import json
import pkgutil
import sys
import time
from pathlib import Path

import benchmarks


def main(argv: list[str]) -> int:
    names = argv or sorted(m.name for m in pkgutil.iter_modules(benchmarks.__path__)
                           if m.name.startswith("bench_"))
    figures = {}
    for name in names:
        print(f"== {name}", flush=True)
        started = time.perf_counter()
        figures[name] = importlib.import_module(f"benchmarks.{name}").run()
        print(f"   ({time.perf_counter() - started:.0f} s)", flush=True)
    out = Path(".batchscale/bench.json")
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(figures, indent=1, default=str))
    print(f"figures saved to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
