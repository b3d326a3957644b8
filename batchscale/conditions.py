"""The conditions a measurement ran under, so a disturbed timing can be recognized.

A timing taken while other processes compete for the CPUs (or the GPU) looks as authoritative as
a quiet one. Each sweep trial therefore records (schemas.SWEEP, "The conditions the trial ran
under"):

- `load_avg_1m`: the kernel's 1-minute load average just before the trial. It counts every
  runnable thread on the machine, the sweep's own included (a trial's threads raise it for about
  a minute), so it is a coarse signal: compare it with `usable_cpus`.
- `usable_cpus`: CPUs this process may run on: its affinity mask, capped by the cgroup's CPU
  quota (v2 `cpu.max`, v1 `cpu.cfs_quota_us`), rounded down (1.5 CPUs of quota throttle two busy
  threads a quarter of the time).
- `threads_oversubscribed`: torch's intra-op threads exceed the usable CPUs.
- on CUDA, through NVML when `pynvml` is importable: other processes on the device, SM clock and
  temperature read right after the timed steps (the idle clock between trials would say nothing).
  `process_cpu_per_wall` and `cpu_wait_share` come from the timing helper
  (`timing.StepTimes`), which reads the CPU clock and `run_queue_wait_s` around the timed steps.

Everything here is best effort: what this machine cannot tell is None, never a guess.
"""

from __future__ import annotations

import math
import numbers
import os
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")
BUSY_LOAD_SHARE = 0.5
"""Warn before measuring when the load average is at least this share of the usable CPUs: the
sweep itself has not started its trials yet, so that load is someone else's."""
WHAT_TO_DO = ("rerun on a quiet node, pin the sweep to CPUs nothing else uses (taskset or a "
              "cpuset), or on Kubernetes request Guaranteed QoS (integer CPU requests equal to "
              "limits)")
IDLE_BUSY_SHARE = 0.25
"""The sweep's CPUs count as idle, for re-measuring a disturbed row, when other processes keep
them busy less than this share of the time."""
OTHERS_LOAD_SHARE = 1.0
"""A trial ran on an overloaded machine when the load average before it, less the CPUs the
trial itself kept busy (its process_cpu_per_wall), is at least this share of the usable CPUs:
other processes kept every usable CPU busy. Measured on a 2-CPU VM (digits-mlp, 2 torch
threads, the default run's sweep): quiet sweeps saw load 0.35-1.0 with trials using 1.0-2.0
CPUs (others' load <= 0); with a spinning process pinned to one CPU while another job ran, load
4.3-4.6 with trials using 0.6-0.7 CPUs (others' load about 3.7). There the two OpenMP threads
waited 100-300 ms at every barrier: steps 50-300x slower, yet steady (CV <= 0.3) and the same
in every round, so only this condition showed it. Lower shares would flag quiet rows right
after a busy trial (the load average lags by about a minute)."""
CPU_WAIT_SHARE = 0.1
"""A trial was starved of CPU when its threads spent at least this share of the time they were
runnable waiting in the kernel's run queue (`cpu_wait_share`; sweep.max_cpu_wait_share
overrides it). Unlike the load average this is the trial's own experience, over exactly its
timed steps, so it does not lag. Measured on a 2-CPU VM (resnet18 at 32 px, 2 torch threads, 10
steps): quiet 0.003 at B=2 and B=64; with one process spinning on core 0, 0.36 and 0.38 while
the steps ran 2.4x and 3.4x slower."""


def shares_apart(value: float, limit: float) -> tuple[str, str]:
    """`value` and `limit` as percentages with as many decimals as it takes (up to 2) for them
    to read differently: a wait share just above its limit reads "10.4%" against "10.0%", not
    "10%" against "10%"."""
    for digits in range(3):
        texts = f"{value:.{digits}%}", f"{limit:.{digits}%}"
        if texts[0] != texts[1]:
            break
    return texts


GPU_NOT_KNOWN = {"gpu_other_processes": None, "gpu_sm_clock_mhz": None, "gpu_temperature_c": None}


# ------------------------------------------------------------------------------ CPUs
def load_average_1m() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (all CPUs where the platform has no masks)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 `cpu.max` ("<quota> <period>" in microseconds, or "max <period>") as CPUs."""
    parts = text.split()
    if len(parts) != 2 or parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 `cpu.cfs_quota_us` / `cpu.cfs_period_us` as CPUs (-1: no quota)."""
    try:
        quota, period = int(quota_text), int(period_text)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _own_cgroup_dirs(root: Path, proc_cgroup: Path) -> list[Path]:
    """The directories whose CPU quota applies to this process: its v2 cgroup and every
    ancestor up to the root, and its v1 `cpu` controller's directory and the controller's root.
    A container usually sees its own cgroup as the root."""
    dirs = [root, root / "cpu"]
    try:
        lines = proc_cgroup.read_text().splitlines()
    except OSError:
        return dirs
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            base = root
        elif "cpu" in controllers.split(","):
            base = root / "cpu"
        else:
            continue
        here = base / path.lstrip("/")
        while here != base and base in here.parents:
            dirs.append(here)
            here = here.parent
    return dirs


def cgroup_cpu_quota(root: Path = CGROUP_ROOT,
                     proc_cgroup: Path = PROC_SELF_CGROUP) -> float | None:
    """The tightest CPU quota (in CPUs) over the cgroups that contain this process; None when
    there is none."""
    quotas = []
    for directory in _own_cgroup_dirs(root, proc_cgroup):
        try:
            quotas.append(parse_cpu_max((directory / "cpu.max").read_text()))
        except OSError:
            pass
        try:
            quotas.append(parse_cfs_quota((directory / "cpu.cfs_quota_us").read_text(),
                                          (directory / "cpu.cfs_period_us").read_text()))
        except OSError:
            pass
    found = [q for q in quotas if q is not None]
    return min(found) if found else None


def usable_cpus(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_SELF_CGROUP) -> int:
    """Affinity CPUs, capped by the cgroup quota rounded down (at least 1)."""
    cpus = affinity_cpus()
    quota = cgroup_cpu_quota(root, proc_cgroup)
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota)))
    return cpus


def others_load(load_avg_1m: float | None, cpu_per_wall: float | None) -> float | None:
    """Runnable threads of other processes, roughly: the load average less the CPUs this
    trial kept busy (the sweep's own threads are in the load average too)."""
    if load_avg_1m is None or cpu_per_wall is None:
        return None
    return load_avg_1m - cpu_per_wall


def overloaded(load_avg_1m: float | None, cpu_per_wall: float | None,
               usable: int | None, share: float | None = None) -> bool:
    """Other processes kept `share` (default OTHERS_LOAD_SHARE) of the usable CPUs busy while
    the trial ran; `share` None in the config (sweep.overload_cpu_share) is passed as inf."""
    share = OTHERS_LOAD_SHARE if share is None else share
    others = others_load(load_avg_1m, cpu_per_wall)
    return others is not None and usable is not None and others >= share * usable


def run_queue_wait_s(task_dir: Path = Path("/proc/self/task")) -> float | None:
    """Seconds this process's threads have spent runnable but waiting for a CPU, summed over
    its live threads (Linux `/proc/<pid>/task/<tid>/schedstat`, second field, nanoseconds);
    None where the kernel does not report it. Threads that exited take their share with them,
    so read it around spans where the thread pool is steady (the timed steps)."""
    total, found = 0, False
    try:
        tasks = list(task_dir.iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
            total += int(fields[1])
            found = True
        except (OSError, IndexError, ValueError):
            continue  # the thread ended since the listing, or the field is missing
    return total / 1e9 if found else None


def cpu_times(stat: Path = Path("/proc/stat")) -> dict[int, tuple[int, int]] | None:
    """(busy, total) jiffies per CPU since boot, from /proc/stat; None where it is missing.
    Busy is everything but idle and iowait."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    times = {}
    for line in lines:
        name, *fields = line.split()
        if name.startswith("cpu") and name[3:].isdigit() and len(fields) >= 5:
            values = [int(v) for v in fields[:8]]
            idle = values[3] + values[4]
            times[int(name[3:])] = (sum(values) - idle, sum(values))
    return times


def busy_share(before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]],
               cpus: Collection[int]) -> float | None:
    """The share of `cpus`' time spent busy between two `cpu_times` readings (None: no time
    passed on them, or they are not in the readings)."""
    busy = total = 0
    for cpu in cpus:
        if cpu in before and cpu in after:
            busy += after[cpu][0] - before[cpu][0]
            total += after[cpu][1] - before[cpu][1]
    return busy / total if total > 0 else None


def wait_for_idle_cpus(max_wait_s: float, cpus: Collection[int] | None = None,
                       window_s: float = 1.0) -> tuple[bool, float, float | None]:
    """Wait, up to `max_wait_s`, until others use under IDLE_BUSY_SHARE of `cpus` (default:
    this process's) over a `window_s` window, while this process waits. (idle?, seconds
    waited, the last busy share); (True, 0, None) where /proc/stat cannot tell."""
    cpus = os.sched_getaffinity(0) if cpus is None else cpus
    started = time.monotonic()
    share = None
    while True:
        before = cpu_times()
        time.sleep(window_s)
        after = cpu_times()
        if before is None or after is None:
            return True, 0.0, None
        share = busy_share(before, after, cpus)
        waited = time.monotonic() - started
        if share is None or share < IDLE_BUSY_SHARE:
            return True, waited, share
        if waited + window_s > max_wait_s:
            return False, waited, share


def starved(cpu_wait_share: float | None, share: float | None = None) -> bool:
    """The trial's threads waited for a CPU at least `share` (default CPU_WAIT_SHARE) of their
    runnable time; `share` None in the config (sweep.max_cpu_wait_share) is passed as inf."""
    share = CPU_WAIT_SHARE if share is None else share
    return cpu_wait_share is not None and cpu_wait_share >= share


def host_conditions(threads: int) -> dict:
    """The CPU side of a trial's conditions, as sweep-table columns."""
    cpus = usable_cpus()
    return {"load_avg_1m": load_average_1m(), "usable_cpus": cpus,
            "threads_oversubscribed": threads > cpus}


# ------------------------------------------------------------------------------ GPU (NVML)
def _nvml() -> Any | None:
    """The NVML bindings (package nvidia-ml-py, module pynvml), initialized; None without."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # not installed, no driver, no device: the columns stay unknown
        return None
    return pynvml


def nvml_handle(nvml: Any, device_index: int, visible: str | None) -> Any:
    """NVML's handle for torch's device index: CUDA_VISIBLE_DEVICES renumbers devices (by index
    or UUID), NVML does not."""
    entries = [e.strip() for e in (visible or "").split(",") if e.strip()]
    if device_index < len(entries):
        entry = entries[device_index]
        if entry.isdigit():
            return nvml.nvmlDeviceGetHandleByIndex(int(entry))
        return nvml.nvmlDeviceGetHandleByUUID(entry)
    return nvml.nvmlDeviceGetHandleByIndex(device_index)


def read_gpu_conditions(nvml: Any, handle: Any, own_pids: Collection[int]) -> dict:
    """Other compute processes on the device, SM clock (MHz) and temperature (°C).

    A process in a container with its own PID namespace sees host PIDs in NVML's list; when
    none of `own_pids` (which hold a context on this device) is in it, ours cannot be told
    apart from the others, and the count is unknown rather than wrong."""
    pids = {p.pid for p in nvml.nvmlDeviceGetComputeRunningProcesses(handle)}
    others = len(pids - set(own_pids)) if pids & set(own_pids) else None
    return {
        "gpu_other_processes": others,
        "gpu_sm_clock_mhz": float(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
        "gpu_temperature_c": float(nvml.nvmlDeviceGetTemperature(handle,
                                                                 nvml.NVML_TEMPERATURE_GPU)),
    }


def gpu_conditions(device_index: int, own_pids: Collection[int]) -> dict:
    """The GPU side of a trial's conditions; all None when NVML is not available."""
    nvml = _nvml()
    if nvml is None:
        return dict(GPU_NOT_KNOWN)
    try:
        handle = nvml_handle(nvml, device_index, os.environ.get("CUDA_VISIBLE_DEVICES"))
        return read_gpu_conditions(nvml, handle, own_pids)
    except Exception:  # an NVML error (unsupported query, vanished device): unknown
        return dict(GPU_NOT_KNOWN)


# ------------------------------------------------------------------------------ warning
def busy_reasons(conditions: dict, threads: int) -> list[str]:
    """What makes the machine visibly busy, with the figures; empty when it looks quiet."""
    reasons = []
    load, cpus = conditions.get("load_avg_1m"), conditions["usable_cpus"]
    if load is not None and load >= BUSY_LOAD_SHARE * cpus:
        reasons.append(f"load average {load:.2f} with {cpus} usable CPUs (warn at "
                       f"{BUSY_LOAD_SHARE * cpus:g})")
    if conditions.get("threads_oversubscribed"):
        reasons.append(f"{threads} torch threads on {cpus} usable CPUs")
    others = conditions.get("gpu_other_processes")
    if others:
        reasons.append(f"{others} other process(es) on the GPU")
    return reasons


def busy_warning(conditions: dict, threads: int) -> str | None:
    """One line for stderr before measuring, or None when the machine looks quiet."""
    reasons = busy_reasons(conditions, threads)
    if not reasons:
        return None
    return (f"warning: the machine is busy before measuring ({'; '.join(reasons)}): timings "
            f"will be disturbed and rows may be flagged unstable; {WHAT_TO_DO}")


# ------------------------------------------------------------------------------ notes
# Said wherever a sweep's rows are shown (the sweep's summary, the analysis report): neither
# makes a row untrustworthy, but each bounds what its figures can say.
GC_NOTE_SHARE = 0.05
"""Rows whose trials spent at least this share of their timed spans in Python's garbage
collector are named; the young generations alone took about 4 % in a loop of a small tabular
`Dataset` here, with its full collections 16 % (benchmarks/bench_gc.py)."""


def gc_note(gc_rows: Collection[tuple[float, str, int]]) -> str:
    """Where Python's garbage collector took a visible share of the timed steps, from
    (gc_share, input mode, batch size) per row."""
    rows = ", ".join(f"{mode} batch {batch} {share:.0%}" for share, mode, batch in gc_rows)
    return ("Python's collector ran for a share of the timed steps' span "
            f"(a row's trials pooled; rough: a short span holds one full collection or none): "
            f"{rows}. Its full collections rescan every object the process "
            "holds (torch's and yours) and stop a step for tens to hundreds of milliseconds; "
            "the median step time leaves them out, a training loop that allocates like this "
            "one pays them. gc.freeze() once the model and data are built exempts those "
            "objects (docs/sweep.md)")


def threads_note(cpu_threads: int | None) -> str:
    """A CPU trial on several threads runs at the pace of its slowest thread's CPU; on a shared
    virtual machine whole sweeps then land at one of two speeds, tens of per cent apart, which a
    row's rerun interval (one sweep's rounds and a drift of a few per cent) does not cover
    (docs/sweep.md, "Threads, and rows that repeat").
    `cpu_threads` as `cpu_threads_of` gives it; "" on one thread or on a GPU (None)."""
    if not cpu_threads or cpu_threads < 2:
        return ""
    return (f"the trials ran on {cpu_threads} CPU threads; on a shared virtual machine "
            "a whole sweep can then run at one of two speeds (whether the other CPUs are "
            "running), which the rerun intervals (this sweep's rounds and "
            "sweep.between_sweep_cv) do not cover. sweep.threads: 1 (--threads 1) avoids that "
            "switch, on one CPU; a noisy host still moves whole sweeps (docs/sweep.md)")


def gc_rows_of(rows: Collection[dict]) -> list[tuple[float, str, int]]:
    """(gc_share, input mode, batch size) of the rows at or above GC_NOTE_SHARE, largest
    first."""
    return sorted(((float(r["gc_share"]), r["input_mode"], int(r["batch_size"])) for r in rows
                   if _finite(r.get("gc_share")) and r["gc_share"] >= GC_NOTE_SHARE),
                  reverse=True)


def cpu_threads_of(rows: Collection[dict]) -> int | None:
    """The most torch threads a row's trials ran on, when every row ran on the CPU (no
    cuda_version); None on a GPU or when not recorded."""
    if not rows or any(isinstance(r.get("cuda_version"), str) for r in rows):
        return None
    return max((int(r["threads"]) for r in rows if _finite(r.get("threads"))), default=None)


def _finite(value: Any) -> bool:
    """A number (numpy's included) that is neither NaN nor infinite; None and text are not."""
    return (isinstance(value, numbers.Real) and not isinstance(value, bool)
            and math.isfinite(value))
