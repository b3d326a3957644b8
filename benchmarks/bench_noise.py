"""Does the sweep notice when it is disturbed? The production sweep (default rounds,
max_cv, max_round_spread, max_retries) on digits-mlp and resnet18 at 32 px: quiet, then while
this benchmark runs a busy neighbour, then quiet again (quiet on both sides, so drift of the
machine does not pass for the neighbour's effect).

The neighbour is a process spinning on one core (pinned with sched_setaffinity, like
`taskset -c 0`), started and stopped here; it stops itself after NEIGHBOUR_LIMIT_S whatever
happens to this process, and is killed in a `finally`.

Figures:
- busy-run rows that are within 10 % of the quiet samples/s OR flagged unstable, goal 100 %
  (nothing silently wrong); the rows that fail are named;
- quiet-run rows flagged unstable, goal ≤ 5 % (no crying wolf), over every quiet sweep (six
  per workload: 60 rows, the fewest whose exact interval can establish 5 % with none flagged);
- how many busy rows the neighbour actually moved by more than 10 % (if none, the first figure
  tests nothing and says so).

Run: `python -m benchmarks.run bench_noise` (about 5 minutes on 2 CPU cores).
"""

from __future__ import annotations

import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from batchscale.config import SweepConfig
from batchscale.envinfo import environment
from batchscale.schemas import Quality, TrialStatus
from batchscale.sweep.sweep import sweep
from benchmarks import scaled
from benchmarks.stats import NOT_ESTABLISHED, Goal, share_figure

PLANS = {"digits-mlp": [1, 4, 16, 64, 256, 1024], "resnet18": [2, 4, 16, 64]}
IMAGE_PX = 32
QUIET_SWEEPS = scaled(6, 1)
WITHIN = 0.10
BUSY_GOAL = Goal(1.0)
QUIET_GOAL = Goal(0.05, at_least=False)
NEIGHBOUR_LIMIT_S = 600.0
UNSTABLE = Quality.UNSTABLE
# The neighbour: spin on one core until the deadline (no imports beyond the standard library,
# so it starts in milliseconds).
SPIN = """
import os, sys, time
core, limit_s = int(sys.argv[1]), float(sys.argv[2])
try:
    os.sched_setaffinity(0, {core})
except (AttributeError, OSError):
    pass
deadline = time.monotonic() + limit_s
while time.monotonic() < deadline:
    pass
"""


def _log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _quiet_log(_line: str) -> None:
    """Sweep log sink: this benchmark prints its own table."""


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def machine_state() -> dict:
    """Load average against usable CPUs: the figures mean 'quiet' only if this was low."""
    load1, load5, _ = os.getloadavg()
    return {"load_avg_1m": load1, "load_avg_5m": load5, "usable_cpus": usable_cpus()}


@contextlib.contextmanager
def busy_neighbour(limit_s: float = NEIGHBOUR_LIMIT_S) -> Iterator[dict]:
    """A process spinning on this process's first usable core for the duration of the block;
    yields what it was (core, pid), and whether it was still spinning at the end."""
    core = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    proc = subprocess.Popen([sys.executable, "-I", "-c", SPIN, str(core), str(limit_s)],
                            stdin=subprocess.DEVNULL)
    info = {"core": core, "pid": proc.pid, "limit_s": limit_s}
    try:
        yield info
        info["spinning_at_end"] = proc.poll() is None
    finally:
        proc.kill()
        proc.wait()


def run_sweeps(label: str, out_dir: Path) -> list[dict]:
    """One production-default sweep per workload; rows tagged with workload and phase."""
    rows = []
    for workload, batches in PLANS.items():
        cfg = SweepConfig(batch_sizes=batches, input_modes=["synthetic"], image_size_px=IMAGE_PX)
        env = environment(run_id="bench", config_hash="bench", experiment="bench_noise",
                          workload=workload)
        started = time.perf_counter()
        for row in sweep(cfg, workload, env, out_dir / f"{label}-{workload}.parquet",
                         log=_quiet_log):
            rows.append({**row, "workload": workload, "phase": label})
        _log(f"   {label}: {workload} swept in {time.perf_counter() - started:.0f} s")
    return rows


def _timed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if r["status"] == TrialStatus.OK and r.get("samples_per_s")]


def quiet_reference(quiet_rows: list[dict]) -> dict[tuple[str, int], float]:
    """Median samples/s over the quiet sweeps of each (workload, batch), from rows the sweep
    did not flag."""
    values: dict[tuple[str, int], list[float]] = {}
    for r in _timed(quiet_rows):
        if r.get("quality") != UNSTABLE:
            values.setdefault((r["workload"], r["batch_size"]), []).append(r["samples_per_s"])
    return {key: statistics.median(v) for key, v in values.items()}


def judge_busy(busy_rows: list[dict], reference: dict) -> list[dict]:
    """Each timed busy row: its ratio to the quiet figure, whether it was flagged, and whether
    it passes (within WITHIN of quiet, or flagged)."""
    judged = []
    for r in _timed(busy_rows):
        ref = reference.get((r["workload"], r["batch_size"]))
        ratio = r["samples_per_s"] / ref if ref else None
        flagged = r.get("quality") == UNSTABLE
        within = ratio is not None and abs(ratio - 1) <= WITHIN
        judged.append({"workload": r["workload"], "batch_size": r["batch_size"],
                       "ratio_to_quiet": ratio, "flagged": flagged, "within": within,
                       # flagged: never silently wrong; unflagged without a trusted quiet
                       # figure: cannot be judged (left out of the share, listed)
                       "judged": flagged or ratio is not None,
                       "passes": flagged or within, "quality_reason": r.get("quality_reason"),
                       "process_cpu_per_wall": r.get("process_cpu_per_wall"),
                       "cpu_wait_share": r.get("cpu_wait_share"),
                       "load_avg_1m": r.get("load_avg_1m")})
    return judged


def _row_name(j: dict) -> str:
    ratio = j["ratio_to_quiet"]
    head = f"{j['workload']} B={j['batch_size']}: "
    head += "no quiet reference" if ratio is None else f"{ratio:.2f}× quiet"
    return head + (f", flagged ({j['quality_reason']})" if j["flagged"] else ", quality ok")


def run() -> dict:
    started = time.perf_counter()
    before = machine_state()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        quiet = run_sweeps("quiet1", out)
        with busy_neighbour() as neighbour:
            _log(f"   busy neighbour: pid {neighbour['pid']} spinning on core "
                 f"{neighbour['core']}")
            busy = run_sweeps("busy", out)
        for i in range(2, QUIET_SWEEPS + 1):
            quiet += run_sweeps(f"quiet{i}", out)
    judged = judge_busy(busy, quiet_reference(quiet))
    quiet_timed = _timed(quiet)
    quiet_flagged = [r for r in quiet_timed if r.get("quality") == UNSTABLE]
    if not judged or not quiet_timed:
        raise RuntimeError(f"bench_noise: no timed rows to judge ({len(judged)} busy, "
                           f"{len(quiet_timed)} quiet): see the sweep's errors above")
    moved = [j for j in judged if not j["within"] and j["ratio_to_quiet"] is not None]
    unjudged = [j for j in judged if not j["judged"]]
    judged = [j for j in judged if j["judged"]]
    if not judged:
        raise RuntimeError("bench_noise: no busy row could be judged (no trusted quiet figure)")
    busy_fig = share_figure(sum(j["passes"] for j in judged), len(judged), BUSY_GOAL)
    if not moved:  # a neighbour that disturbed nothing leaves nothing to catch
        busy_fig = replace(busy_fig, verdict=NOT_ESTABLISHED)
    quiet_fig = share_figure(len(quiet_flagged), len(quiet_timed), QUIET_GOAL)
    failed = [j for j in judged if not j["passes"]]
    print(f"machine before: load average {before['load_avg_1m']:.2f} (1 min) on "
          f"{before['usable_cpus']} usable CPUs; busy neighbour: one spinning process on core "
          f"{neighbour['core']} (spinning to the end: {neighbour.get('spinning_at_end')})")
    print(f"busy-run rows within {WITHIN:.0%} of quiet or flagged unstable: {busy_fig.text()}")
    for j in failed:
        print(f"   silently wrong: {_row_name(j)}")
    print(f"   the neighbour moved {len(moved)} of {len(judged)} busy rows by more than "
          f"{WITHIN:.0%}" + ("" if moved else ": nothing to catch, the figure above tests "
                             "nothing"))
    for j in judged:
        print(f"   {_row_name(j)}")
    for j in unjudged:
        print(f"   not judged (unflagged, no trusted quiet figure): {_row_name(j)}")
    print(f"quiet-run rows flagged unstable ({QUIET_SWEEPS} quiet sweeps per workload): "
          f"{quiet_fig.text()}")
    for r in quiet_flagged:
        print(f"   flagged while quiet: {r['workload']} B={r['batch_size']} "
              f"({r.get('quality_reason')})")
    return {
        "machine_before": before, "neighbour": neighbour, "quiet_sweeps": QUIET_SWEEPS,
        "busy_rows_correct_or_flagged": busy_fig.as_dict(),
        "quiet_rows_flagged": quiet_fig.as_dict(),
        "busy_rows_moved_beyond_10pct": len(moved),
        "silently_wrong_rows": [_row_name(j) for j in failed],
        "busy_rows": judged, "busy_rows_not_judged": [_row_name(j) for j in unjudged],
        "quiet_flagged_rows": [f"{r['workload']} B={r['batch_size']}: {r.get('quality_reason')}"
                               for r in quiet_flagged],
        "wall_s": time.perf_counter() - started,
    }
