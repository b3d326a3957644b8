#!/usr/bin/env bash
# GPU check of the throughput sweep, for one run on a CUDA machine (an H200).
#
#   bash benchmarks/gpu_check.sh            # from the repository root; writes to $OUT or ./gpu_check
#
# 1. finds a python3 whose torch sees CUDA (installs torch only if none does),
# 2. installs this repo without dependencies, and small missing dependencies only if imports fail,
# 3. CUDA timing sanity: the timing helper's CUDA-event step time vs a synchronized host clock,
# 4. the GPU tests (pytest -m gpu) when pytest is available,
# 5. resnet50 sweep in bf16 with channels_last and auto batch sizes: samples/s, MFU against the
#    H200's declared bf16 peak, the largest batch that fits.
# Each phase has its own timeout; the whole script stays under 6 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR=${OUT:-gpu_check}
mkdir -p "$OUT_DIR"
SWEEP_TIMEOUT_S=300
SANITY_TIMEOUT_S=60
TESTS_TIMEOUT_S=120

has_cuda_torch() { "$1" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' \
    >/dev/null 2>&1; }

PY=""
for candidate in "${PYTHON:-}" python3 python3.12 python .venv/bin/python; do
    if [ -n "$candidate" ] && command -v "$candidate" >/dev/null && has_cuda_torch "$candidate"; then
        PY=$(command -v "$candidate"); break
    fi
done
if [ -z "$PY" ]; then
    PY=$(command -v python3)
    echo "no python with CUDA torch found; installing torch into $PY" >&2
    "$PY" -m pip install --quiet torch==2.14.1 torchvision==0.29.1 || true
    has_cuda_torch "$PY" || { echo "torch with CUDA is not available: stopping" >&2; exit 1; }
fi
echo "python: $PY ($("$PY" -c 'import torch; print(torch.__version__, torch.cuda.get_device_name())'))"

"$PY" -c 'import torchvision' 2>/dev/null || "$PY" -m pip install --quiet --no-deps torchvision==0.29.1
for module in pydantic:pydantic yaml:pyyaml pyarrow:pyarrow pandas:pandas numpy:numpy tqdm:tqdm; do
    "$PY" -c "import ${module%%:*}" 2>/dev/null || "$PY" -m pip install --quiet "${module##*:}"
done
SWEEP_MODULE=batchscale.sweep.sweep
"$PY" -c "import $SWEEP_MODULE" 2>/dev/null \
    || "$PY" -m pip install --quiet --no-deps --no-build-isolation -e . \
    || "$PY" -m pip install --quiet --no-deps -e .
if ! "$PY" -c "import $SWEEP_MODULE" 2>/dev/null; then
    # No installer worked (no network for build tools): a symlinked package tree on PYTHONPATH
    # reproduces pyproject's package mapping (batchscale.components = components/).
    SHIM=$(mktemp -d)
    cp -rs "$PWD/batchscale" "$SHIM/batchscale"
    ln -s "$PWD/components" "$SHIM/batchscale/components"
    ln -s "$PWD/pipelines" "$SHIM/batchscale/pipelines"
    export PYTHONPATH="$SHIM${PYTHONPATH:+:$PYTHONPATH}"
fi
"$PY" -c "import $SWEEP_MODULE" || { echo "batchscale does not import: stopping" >&2; exit 1; }

echo "== CUDA timing sanity"
timeout "$SANITY_TIMEOUT_S" "$PY" - <<'EOF'
import time

import torch

from batchscale.timing import time_steps

N = 8192
a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
step = lambda: a @ b  # noqa: E731
times = time_steps(step, device="cuda", untimed_steps=5, min_steps=50, max_steps=50)
torch.cuda.synchronize()
start = time.perf_counter()
for _ in range(50):
    step()
torch.cuda.synchronize()
host = (time.perf_counter() - start) / 50
print(f"bf16 matmul {N}: CUDA events median {times.median_s * 1e3:.3f} ms, cv {times.cv:.3f}; "
      f"host clock around 50 synchronized steps {host * 1e3:.3f} ms per step; ratio "
      f"{times.median_s / host:.3f} (expect about 1); {2 * N**3 / times.median_s / 1e12:.0f} "
      "TFLOP/s")
EOF

echo "== GPU tests"
if "$PY" -c 'import pytest' 2>/dev/null; then
    timeout "$TESTS_TIMEOUT_S" "$PY" -m pytest -q -m gpu -p no:cacheprovider \
        tests/test_sweep.py tests/test_timing.py 2>&1 | tail -5
else
    echo "pytest not installed: skipped"
fi

echo "== resnet50 sweep: bf16, channels_last, auto batch sizes"
cat > "$OUT_DIR/gpu_sweep.yaml" <<'EOF'
name: gpu-check
workload: resnet50
sweep:
  batch_sizes: auto
  max_batch_size: 8192
  device: cuda
  precision: bf16
  channels_last: true
  input_modes: [synthetic]
  warmup_steps: 5
  min_timed_steps: 10
  time_budget_s: 2.0
EOF
timeout -s INT "$SWEEP_TIMEOUT_S" "$PY" -m batchscale.cli sweep --config "$OUT_DIR/gpu_sweep.yaml" \
    --out "$OUT_DIR/resnet50_sweep.parquet"
echo "sweep exit status $? (130: stopped by the time limit; the rows measured are kept)"

"$PY" - "$OUT_DIR/resnet50_sweep.parquet" <<'EOF'
import sys

import pyarrow.parquet as pq

rows = pq.ParquetFile(sys.argv[1]).read().to_pylist()
print(f"device {rows[0]['device_name']}; peak {rows[0]['peak_flops_per_s'] / 1e12:.0f} TFLOP/s")
print("batch  status  samples/s   MFU     peak GiB  phase")
for r in sorted(rows, key=lambda r: r["batch_size"]):
    sps = f"{r['samples_per_s']:9.1f}" if r["samples_per_s"] else "        -"
    mfu = f"{r['mfu']:6.1%}" if r["mfu"] else "     -"
    mem = f"{r['peak_memory_bytes'] / 2**30:8.2f}" if r["peak_memory_bytes"] else "       -"
    print(f"{r['batch_size']:5d}  {r['status']:6s}  {sps}  {mfu}  {mem}  {r['search_phase']}")
ok = [r for r in rows if r["status"] == "ok"]
best = max(ok, key=lambda r: r["samples_per_s"])
failing = [r["batch_size"] for r in rows if r["status"] != "ok"]
print(f"best {best['samples_per_s']:.1f} samples/s at batch {best['batch_size']} "
      f"(MFU {best['mfu']:.1%} of the declared bf16 peak); largest batch that fits "
      f"{max(r['batch_size'] for r in ok)}; smallest failing {min(failing) if failing else None}; "
      f"{len(rows)} trials")
EOF
