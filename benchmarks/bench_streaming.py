"""Does a trial's memory stay flat as the dataset grows? Two data paths, each trained by
`batchscale converge` (a real torchrun trial, 1 worker, batch 64, a fixed number of steps) on
~100 MB and ~2 GB of generated rows of 4 KiB:

- `dataset`: a contract workload whose Dataset reads rows from a file item by item
  (benchmarks/streaming_workload.py);
- `parquet`: a prepared dataset (Parquet shards and a manifest, as data prep writes them) that
  a model factory trains on through the built-in path (batchscale/shards.py: a spill file the
  trial maps and releases at each evaluation).

Each run is wrapped in its own process, whose RUSAGE_CHILDREN maxrss is the peak RSS of the
largest process of the run (the trial). Paired, interleaved rounds; the figure is the per-round
difference (2 GB run - 100 MB run) in MB, goal < 100 MB.
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
from benchmarks.streaming_workload import CLASSES, ROW_BYTES, ROW_FEATURES, VAL_ROWS

SMALL_BYTES = 100 * 2**20
LARGE_BYTES = 2 * 2**30
STEPS = scaled(300, 40)
ROUNDS = scaled(5, 2)
GOAL_MB = Goal(100.0, at_least=False)
CHUNK_ROWS = 16384  # also the rows of one Parquet shard (64 MiB)
PATHS = ("dataset", "parquet")

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


def write_prepared(out: Path, size_bytes: int) -> int:
    """A prepared dataset of random rows (train shards of CHUNK_ROWS, one val shard of
    VAL_ROWS), about `size_bytes` in all; its training row count."""
    from batchscale.data.prep import row_group_rows, to_arrow
    from batchscale.schemas import make_table
    from batchscale.shards import MANIFEST_FILE, sha256_file
    from batchscale.storage import write_table_atomic

    out.mkdir()
    rows = size_bytes // ROW_BYTES
    gen, entries = np.random.default_rng(0), []
    parts = [("val", 0, VAL_ROWS)] + [("train", start, min(CHUNK_ROWS, rows - start))
                                      for start in range(0, rows, CHUNK_ROWS)]
    for split, start, n in parts:
        name = f"{split}-{start // CHUNK_ROWS:05d}.parquet"
        labels = np.arange(start, start + n) % CLASSES
        features = gen.standard_normal((n, ROW_FEATURES), dtype=np.float32)
        write_table_atomic(out / name, to_arrow(features, labels),
                           row_group_size=row_group_rows((ROW_FEATURES,), n))
        entries.append({"dataset": "bench-rows", "source": "generated", "split": split,
                        "shard": name, "rows": n, "sha256": sha256_file(out / name),
                        "feature_shape": [ROW_FEATURES], "feature_dtype": "float32",
                        "num_classes": CLASSES, "class_histogram": [0] * CLASSES,
                        "split_seed": 0})
    write_table_atomic(out / MANIFEST_FILE, make_table("manifest", entries))
    return rows


def peak_rss_mb(path: str, data: Path, out: Path) -> float:
    """Peak RSS of the largest process of one `batchscale converge` run, MB."""
    if path == "dataset":
        source = ["--workload", "benchmarks.streaming_workload:workload"]
        env = {**os.environ, "BATCHSCALE_BENCH_ROWS": str(data)}
    else:
        source = ["--workload", "benchmarks.streaming_workload:linear", "--dataset-dir",
                  str(data), "--target", "val_loss=1e-6"]
        env = dict(os.environ)
    cmd = [sys.executable, "-c", WRAPPER, sys.executable, "-m", "batchscale.cli", "converge",
           *source, "--batch-sizes", "64", "--seeds", "0", "--lr-rules", "sqrt",
           "--max-steps", str(STEPS), "--out", str(out)]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # The run ends "not reached" by design (the target is out of reach): exit 1 is expected.
    if result["rc"] not in (0, 1):
        raise RuntimeError(f"converge failed ({result['rc']}): {result['err']}")
    return result["peak_kib"] / 1024


def measure(path: str, small: Path, large: Path, tmp: Path) -> dict:
    small_mb, large_mb = [], []
    for i in range(ROUNDS):
        a, b = paired_round(i, lambda i=i: peak_rss_mb(path, small, tmp / f"{path}-s{i}"),
                            lambda i=i: peak_rss_mb(path, large, tmp / f"{path}-l{i}"))
        small_mb.append(a)
        large_mb.append(b)
    difference = median_figure([b - a for a, b in zip(small_mb, large_mb, strict=True)],
                               GOAL_MB, "paired rounds")
    print(f"   {path}: trial peak RSS, {SMALL_BYTES / 2**20:.0f} MB "
          f"{', '.join(f'{v:.0f}' for v in small_mb)} MB; {LARGE_BYTES / 2**30:.0f} GB "
          f"{', '.join(f'{v:.0f}' for v in large_mb)} MB")
    print(f"   {path}: difference (2 GB - 100 MB): {difference.text(1)}")
    return {"small_peak_rss_mb": small_mb, "large_peak_rss_mb": large_mb,
            "difference_mb": difference}


def run() -> dict:
    results: dict = {"steps": STEPS}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        small, large = tmp / "small.f32", tmp / "large.f32"
        results["dataset_rows"] = [write_rows(small, SMALL_BYTES), write_rows(large, LARGE_BYTES)]
        results["dataset"] = measure("dataset", small, large, tmp)
        small.unlink()
        large.unlink()  # one 2 GB copy on disk at a time
        small, large = tmp / "small-prepared", tmp / "large-prepared"
        results["parquet_rows"] = [write_prepared(small, SMALL_BYTES),
                                   write_prepared(large, LARGE_BYTES)]
        results["parquet"] = measure("parquet", small, large, tmp)
    return results
