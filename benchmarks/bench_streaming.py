"""Does a trial's memory stay flat as the dataset grows? A contract workload whose Dataset reads
rows from a file item by item (benchmarks/streaming_workload.py) is trained by `batchscale
converge` (a real torchrun trial, 1 worker, batch 64, a fixed number of steps) on a ~100 MB and
a ~2 GB generated file. Each run is wrapped in its own process, whose RUSAGE_CHILDREN maxrss is
the peak RSS of the largest process of the run (the trial). Paired, interleaved rounds; the
figure is the per-round difference (2 GB run - 100 MB run) in MB, goal < 100 MB.

What it does not cover: the built-in workloads' Parquet path, which still loads a split into
tensors (docs/your-model.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks import scaled
from benchmarks.stats import Goal, median_figure, paired_round
from benchmarks.streaming_workload import ROW_BYTES, ROW_FEATURES

SMALL_BYTES = 100 * 2**20
LARGE_BYTES = 2 * 2**30
STEPS = scaled(300, 40)
ROUNDS = scaled(5, 2)
GOAL_MB = Goal(100.0, at_least=False)
CHUNK_ROWS = 16384

WRAPPER = """
import json, resource, subprocess, sys
done = subprocess.run(sys.argv[1:], capture_output=True, text=True)
peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"rc": done.returncode, "peak_kib": peak_kib, "err": done.stderr[-2000:]}))
"""


def write_rows(path: Path, size_bytes: int) -> int:
    """A file of random float32 rows, about `size_bytes` long; its row count."""
    rows = size_bytes // ROW_BYTES
    gen = np.random.default_rng(0)
    with path.open("wb") as f:
        for start in range(0, rows, CHUNK_ROWS):
            n = min(CHUNK_ROWS, rows - start)
            f.write(gen.standard_normal((n, ROW_FEATURES), dtype=np.float32).tobytes())
    return rows


def peak_rss_mb(rows_file: Path, out: Path) -> float:
    """Peak RSS of the largest process of one `batchscale converge` run, MB."""
    cmd = [sys.executable, "-c", WRAPPER, sys.executable, "-m", "batchscale.cli", "converge",
           "--workload", "benchmarks.streaming_workload:workload", "--batch-sizes", "64",
           "--seeds", "0", "--lr-rules", "sqrt", "--max-steps", str(STEPS), "--out", str(out)]
    env = {**os.environ, "BATCHSCALE_BENCH_ROWS": str(rows_file)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # The run ends "not reached" by design (the target is out of reach): exit 1 is expected.
    if result["rc"] not in (0, 1):
        raise RuntimeError(f"converge failed ({result['rc']}): {result['err']}")
    return result["peak_kib"] / 1024


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        small, large = tmp / "small.f32", tmp / "large.f32"
        sizes = {"small_rows": write_rows(small, SMALL_BYTES),
                 "large_rows": write_rows(large, LARGE_BYTES)}
        small_mb, large_mb = [], []
        for i in range(ROUNDS):
            a, b = paired_round(i, lambda i=i: peak_rss_mb(small, tmp / f"s{i}"),
                                lambda i=i: peak_rss_mb(large, tmp / f"l{i}"))
            small_mb.append(a)
            large_mb.append(b)
    difference = median_figure([b - a for a, b in zip(small_mb, large_mb, strict=True)],
                               GOAL_MB, "paired rounds")
    print(f"   trial peak RSS: {SMALL_BYTES / 2**20:.0f} MB dataset "
          f"{', '.join(f'{v:.0f}' for v in small_mb)} MB; {LARGE_BYTES / 2**30:.0f} GB dataset "
          f"{', '.join(f'{v:.0f}' for v in large_mb)} MB")
    print(f"   difference (2 GB - 100 MB): {difference.text(1)}")
    return {**sizes, "steps": STEPS, "small_peak_rss_mb": small_mb,
            "large_peak_rss_mb": large_mb, "difference_mb": difference}
