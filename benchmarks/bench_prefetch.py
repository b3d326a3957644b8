"""Does background reading (convergence.loader_workers) hide a slow __getitem__? The file-rows
workload of bench_streaming (benchmarks/streaming_workload.py), with a wait of ITEM_WAIT_S per
item (storage or decoding that does not use the CPU), is trained by `batchscale converge` (a
real torchrun trial, batch 64, a fixed number of steps) with 0 and with 2 loader workers.
Paired, interleaved rounds; the figure is the per-round ratio of samples/s (2 workers ÷ 0),
reported (no goal): with reading slower than the step, it approaches reading time ÷ step time.

    python -m benchmarks.run bench_prefetch
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq

from benchmarks import scaled
from benchmarks.bench_streaming import write_rows
from benchmarks.stats import median_figure, paired_round, ratio_figure

DATA_BYTES = 20 * 2**20
BATCH = 64
STEPS = scaled(150, 30)
ROUNDS = scaled(5, 2)
ITEM_WAIT_S = 50e-6
LOADER_WORKERS = 2


def samples_per_s(rows_file: Path, out: Path, loader_workers: int) -> float:
    """Training samples/s of one `batchscale converge` trial (its own train time)."""
    cmd = [sys.executable, "-m", "batchscale.cli", "converge", "--workload",
           "benchmarks.streaming_workload:workload", "--batch-sizes", str(BATCH), "--seeds",
           "0", "--lr-rules", "sqrt", "--max-steps", str(STEPS), "--loader-workers",
           str(loader_workers), "--out", str(out)]
    env = {**os.environ, "BATCHSCALE_BENCH_ROWS": str(rows_file),
           "BATCHSCALE_BENCH_ITEM_WAIT_S": str(ITEM_WAIT_S)}
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    # The run ends "not reached" by design (the target is out of reach): exit 1 is expected.
    if done.returncode not in (0, 1):
        raise RuntimeError(f"converge failed ({done.returncode}): {done.stderr[-2000:]}")
    run = pq.read_table(out / "runs.parquet").to_pylist()[0]
    return run["steps_run"] * BATCH / run["train_time_s"]


def run() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = tmp / "rows.f32"
        write_rows(rows, DATA_BYTES)
        inline, background = [], []
        for i in range(ROUNDS):
            a, b = paired_round(i, lambda i=i: samples_per_s(rows, tmp / f"a{i}", 0),
                                lambda i=i: samples_per_s(rows, tmp / f"b{i}", LOADER_WORKERS))
            inline.append(a)
            background.append(b)
    ratio = ratio_figure(background, inline)
    reading_ms = BATCH * ITEM_WAIT_S * 1e3
    print(f"   batch {BATCH}, {ITEM_WAIT_S * 1e6:.0f} µs wait per item ({reading_ms:.1f} ms of "
          f"reading per step): samples/s with 0 loader workers "
          f"{median_figure(inline).text(0)}, with {LOADER_WORKERS} "
          f"{median_figure(background).text(0)}")
    print(f"   {LOADER_WORKERS} workers ÷ 0: {ratio.text()}")
    return {"batch": BATCH, "steps": STEPS, "item_wait_s": ITEM_WAIT_S,
            "inline_samples_per_s": inline, "background_samples_per_s": background,
            "ratio": ratio}
