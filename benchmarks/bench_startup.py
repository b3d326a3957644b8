"""What does a local pipeline task cost before it does any work? Under kfp.local every task is a
fresh Python process: the executor imports kfp, the component's body imports its stage, and
some stages import more on first use (a validate task creates its great-expectations context
before its first check; the analysis imports torch for its environment columns; data prep of
digits imports scikit-learn's loader). Each of those start-ups is timed here in fresh
processes (interpreter start included, no table read), all of them once per round in a
rotating order, so load from other processes falls on every figure alike.

The cut made in the validate tasks is measured as a paired ratio in the same rounds: the GX
context with great_expectations imported as the tasks do it (checks/gx.py DEFERRED_MODULES
loaded lazily) ÷ with the eager import (DEFERRED_MODULES emptied).

Run: `python -m benchmarks.run bench_startup` (about 3 minutes on 2 CPU cores).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from benchmarks import scaled
from benchmarks.stats import median_figure, ratio_figure

ROUNDS = scaled(5, 2)
KFP = ("import kfp\nfrom kfp import dsl\nfrom kfp.dsl import *\n"
       "from kfp.dsl import executor\n")
"""What kfp.dsl.executor_main and the ephemeral component module import before the body."""
GX_DEFERRED = "from batchscale.checks import gx\ngx.gx_context()\n"
GX_EAGER = "from batchscale.checks import gx\ngx.DEFERRED_MODULES = ()\ngx.gx_context()\n"
VALIDATE = KFP + "from batchscale.checks.stage import validate_dataset\n"
ANALYSIS = KFP + "from batchscale.report.stage import run_stage\n"
DATA_PREP = KFP + "from batchscale.data.prep import run_stage\n"
STARTUPS = {
    "interpreter": "pass\n",
    "executor (kfp; every task)": KFP,
    "data-prep": DATA_PREP,
    "data-prep + sklearn.datasets (digits)": DATA_PREP + "import sklearn.datasets\n",
    "validate": VALIDATE,
    "validate + GX context": VALIDATE + GX_DEFERRED,
    "validate + GX context, eager GX import": VALIDATE + GX_EAGER,
    "analysis": ANALYSIS,
    "analysis + torch (envinfo.environment)": ANALYSIS + "import torch\n",
    "publish, regression-gate": KFP + "from batchscale.lake.publish import run_stage, gate_stage\n",
}
PAIRED = ("validate + GX context", "validate + GX context, eager GX import")


def startup_s(code: str) -> float:
    """Wall seconds of a fresh `python -c code`, interpreter start and exit included."""
    env = {**os.environ, "GX_ANALYTICS_ENABLED": "false"}
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, env=env,
                   stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def measure_rounds(rounds: int) -> dict[str, list[float]]:
    """Every start-up once per round; round r starts at the r-th one (rotating order)."""
    names = list(STARTUPS)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            seconds[name].append(startup_s(STARTUPS[name]))
    return seconds


def run() -> dict:
    load_before = os.getloadavg()[0]
    seconds = measure_rounds(ROUNDS)
    load_after = os.getloadavg()[0]
    figures = {name: median_figure(values) for name, values in seconds.items()}
    deferred_share = ratio_figure(seconds[PAIRED[0]], seconds[PAIRED[1]])
    for name, figure in figures.items():
        print(f"   {name:42s} {figure.text(2)} s")
    print(f"   validate start-up, deferred ÷ eager GX import: {deferred_share.text(3)}")
    print(f"   (load average {load_before:.2f} before, {load_after:.2f} after: figures taken "
          "on a busy machine are upper bounds)")
    return {"rounds": ROUNDS, "seconds": seconds,
            "startup_s": {name: f.as_dict() for name, f in figures.items()},
            "validate_deferred_to_eager": deferred_share.as_dict(),
            "load_avg_1m": {"before": load_before, "after": load_after}}


if __name__ == "__main__":
    run()
