"""batchscale.conditions: load, usable CPUs (affinity and cgroup quota), oversubscription, the
busy warning, and the GPU side read through NVML (a stand-in for NVML's API here; the real one
is tested only where a GPU is present)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from batchscale import conditions
from batchscale.conditions import (
    busy_warning,
    cgroup_cpu_quota,
    host_conditions,
    nvml_handle,
    parse_cfs_quota,
    parse_cpu_max,
    read_gpu_conditions,
    usable_cpus,
)

# Measures time: run alone, not beside other tests (the Makefile's serial phase).
pytestmark = pytest.mark.serial


# ---------------------------------------------------------------- cgroup quota
@pytest.mark.parametrize(("text", "cpus"), [
    ("max 100000\n", None), ("150000 100000\n", 1.5), ("200000 50000", 4.0), ("", None),
    ("lots 100000", None), ("0 100000", None),
])
def test_cpu_max_is_read_as_cpus(text, cpus):
    assert parse_cpu_max(text) == cpus


@pytest.mark.parametrize(("quota", "period", "cpus"), [
    ("-1\n", "100000\n", None), ("250000", "100000", 2.5), ("x", "100000", None),
])
def test_cfs_quota_is_read_as_cpus(quota, period, cpus):
    assert parse_cfs_quota(quota, period) == cpus


def write_cgroup_tree(root: Path) -> Path:
    """A cgroup v2 tree in its real file format: a pod capped at 4 CPUs, its container at 1.5;
    and /proc/self/cgroup saying this process is in the container."""
    container = root / "kubepods" / "pod1" / "ctr"
    container.mkdir(parents=True)
    (root / "cpu.max").write_text("max 100000\n")
    (root / "kubepods" / "pod1" / "cpu.max").write_text("400000 100000\n")
    (container / "cpu.max").write_text("150000 100000\n")
    proc = root / "proc-self-cgroup"
    proc.write_text("0::/kubepods/pod1/ctr\n")
    return proc


def test_the_tightest_quota_of_the_process_and_its_ancestors_applies(tmp_path):
    proc = write_cgroup_tree(tmp_path)
    assert cgroup_cpu_quota(tmp_path, proc) == 1.5
    # 1.5 CPUs of quota: two busy threads would be throttled, so one CPU is usable.
    assert usable_cpus(tmp_path, proc) == 1


def test_cgroup_v1_quota_is_read_too(tmp_path):
    cpu = tmp_path / "cpu" / "docker" / "abc"
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("300000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n1:name=systemd:/\n")
    assert cgroup_cpu_quota(tmp_path, proc) == 3.0


def test_no_quota_anywhere_leaves_the_affinity(tmp_path):
    proc = tmp_path / "cgroup"
    proc.write_text("0::/\n")
    assert cgroup_cpu_quota(tmp_path, proc) is None
    assert usable_cpus(tmp_path, proc) == conditions.affinity_cpus()


# ---------------------------------------------------------------- this machine
def test_host_conditions_on_this_machine_are_sane():
    found = host_conditions(threads=1)
    assert found["load_avg_1m"] is None or found["load_avg_1m"] >= 0
    assert 1 <= found["usable_cpus"] <= (os.cpu_count() or 1)
    assert found["threads_oversubscribed"] is False
    assert host_conditions(threads=found["usable_cpus"] + 1)["threads_oversubscribed"] is True


def test_busy_warning_names_the_figures_and_what_to_do():
    quiet = {"load_avg_1m": 0.4, "usable_cpus": 2, "threads_oversubscribed": False}
    assert busy_warning(quiet, threads=2) is None
    busy = {"load_avg_1m": 1.0, "usable_cpus": 2, "threads_oversubscribed": True}
    line = busy_warning(busy, threads=4)
    assert "\n" not in line
    assert "load average 1.00 with 2 usable CPUs (warn at 1)" in line
    assert "4 torch threads on 2 usable CPUs" in line
    assert "rerun on a quiet node" in line and "Guaranteed QoS" in line
    assert "1 other process(es) on the GPU" in busy_warning(
        {**quiet, "gpu_other_processes": 1}, threads=2)


def test_a_machine_is_overloaded_when_others_keep_every_usable_cpu_busy():
    """The load average counts the trial's own threads: they are taken out first."""
    assert conditions.overloaded(4.59, 0.65, 2)  # others ~3.9 on 2 CPUs
    assert not conditions.overloaded(1.0, 1.97, 2)  # a quiet sweep: the load is its own
    assert not conditions.overloaded(2.5, 0.6, 2)  # others ~1.9: one CPU left
    assert not conditions.overloaded(None, 0.6, 2) and not conditions.overloaded(5.0, None, 2)
    assert conditions.others_load(4.59, 0.65) == pytest.approx(3.94)


# ---------------------------------------------------------------- GPU through NVML
class StandInNvml:
    """Stand-in for the pynvml module (no GPU here): the calls and constants read_gpu_conditions
    and nvml_handle use, answering like NVML does."""

    NVML_CLOCK_SM = 1
    NVML_TEMPERATURE_GPU = 0

    def __init__(self, pids: list[int]):
        self.pids = pids
        self.handles: list[tuple[str, object]] = []

    def nvmlDeviceGetHandleByIndex(self, index: int):  # noqa: N802 (NVML's name)
        self.handles.append(("index", index))
        return f"handle-{index}"

    def nvmlDeviceGetHandleByUUID(self, uuid: str):  # noqa: N802
        self.handles.append(("uuid", uuid))
        return f"handle-{uuid}"

    def nvmlDeviceGetComputeRunningProcesses(self, handle):  # noqa: N802
        return [SimpleNamespace(pid=p, usedGpuMemory=2**30) for p in self.pids]

    def nvmlDeviceGetClockInfo(self, handle, clock):  # noqa: N802
        assert clock == self.NVML_CLOCK_SM
        return 1980

    def nvmlDeviceGetTemperature(self, handle, sensor):  # noqa: N802
        assert sensor == self.NVML_TEMPERATURE_GPU
        return 41


def test_gpu_conditions_count_the_processes_that_are_not_ours():
    nvml = StandInNvml(pids=[100, 200, 300])
    found = read_gpu_conditions(nvml, "h", own_pids=(100, 101))
    assert found == {"gpu_other_processes": 2, "gpu_sm_clock_mhz": 1980.0,
                     "gpu_temperature_c": 41.0}


def test_host_pids_we_cannot_match_give_an_unknown_count_not_a_wrong_one():
    """In a container with its own PID namespace NVML lists host PIDs: none is ours."""
    found = read_gpu_conditions(StandInNvml(pids=[5000, 6000]), "h", own_pids=(12,))
    assert found["gpu_other_processes"] is None
    assert found["gpu_sm_clock_mhz"] == 1980.0


def test_torch_device_index_maps_through_cuda_visible_devices():
    nvml = StandInNvml(pids=[])
    nvml_handle(nvml, 1, "2,3")
    nvml_handle(nvml, 0, "GPU-1234-abcd")
    nvml_handle(nvml, 0, None)
    assert nvml.handles == [("index", 3), ("uuid", "GPU-1234-abcd"), ("index", 0)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_gpu_conditions_on_a_real_gpu():
    """With a CUDA context of our own, NVML (when installed) lists this process."""
    torch.ones(1, device="cuda")
    found = conditions.gpu_conditions(0, (os.getpid(),))
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert found == conditions.GPU_NOT_KNOWN
        return
    assert found["gpu_sm_clock_mhz"] > 0 and 0 < found["gpu_temperature_c"] < 150
    assert found["gpu_other_processes"] is None or found["gpu_other_processes"] >= 0


def test_the_overload_share_setting_moves_or_turns_off_the_check():
    """sweep.overload_cpu_share reaches conditions.overloaded: null in the config is inf."""

    from batchscale.config import SweepConfig
    from batchscale.sweep.sweep import _off_as_inf

    assert conditions.overloaded(4.5, 0.5, 2, share=1.0)
    assert not conditions.overloaded(4.5, 0.5, 2, share=2.5)
    assert not conditions.overloaded(4.5, 0.5, 2, share=_off_as_inf(
        SweepConfig(overload_cpu_share=None).overload_cpu_share))
    assert _off_as_inf(SweepConfig().overload_cpu_share) == 1.0


def test_the_cpu_wait_setting_moves_or_turns_off_the_starvation_check():
    """sweep.max_cpu_wait_share reaches conditions.starved: null in the config is inf."""
    from batchscale.config import SweepConfig
    from batchscale.sweep.sweep import _off_as_inf

    assert conditions.starved(0.36) and not conditions.starved(0.003)
    assert not conditions.starved(None)
    assert not conditions.starved(0.36, share=0.5)
    assert SweepConfig().max_cpu_wait_share == conditions.CPU_WAIT_SHARE
    assert not conditions.starved(0.99, share=_off_as_inf(
        SweepConfig(max_cpu_wait_share=None).max_cpu_wait_share))


def test_run_queue_wait_sums_the_threads_and_skips_what_it_cannot_read(tmp_path):
    """schedstat's second field is the thread's run-queue delay in nanoseconds."""
    for tid, text in (("101", "5000 1500000000 7\n"), ("102", "10 500000000 2\n"),
                      ("103", "garbage\n")):
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "schedstat").write_text(text)
    (tmp_path / "104").mkdir()  # a thread that ended between the listing and the read
    assert conditions.run_queue_wait_s(tmp_path) == pytest.approx(2.0)
    assert conditions.run_queue_wait_s(tmp_path / "missing") is None
    (tmp_path / "empty").mkdir()
    assert conditions.run_queue_wait_s(tmp_path / "empty") is None


@pytest.mark.skipif(conditions.run_queue_wait_s() is None,
                    reason="the kernel reports no per-thread run-queue delay here")
def test_this_kernel_reports_run_queue_wait():
    assert conditions.run_queue_wait_s() >= 0


STAT_BEFORE = "cpu  10 0 10 100 0 0 0 0 0 0\ncpu0 5 0 5 50 0 0 0 0 0 0\ncpu1 5 0 5 50 0 0 0 0\n"
STAT_AFTER = "cpu  100 0 10 110 0 0 0 0 0 0\ncpu0 95 0 5 50 0 0 0 0 0 0\ncpu1 5 0 5 60 0 0 0 0\n"


def test_busy_share_is_read_per_cpu_from_proc_stat(tmp_path):
    before, after = tmp_path / "before", tmp_path / "after"
    before.write_text(STAT_BEFORE)
    after.write_text(STAT_AFTER)
    first, then = conditions.cpu_times(before), conditions.cpu_times(after)
    assert first == {0: (10, 60), 1: (10, 60)}
    assert conditions.busy_share(first, then, {0}) == 1.0  # 90 busy jiffies of 90
    assert conditions.busy_share(first, then, {1}) == 0.0  # 10 idle of 10
    assert conditions.busy_share(first, then, {0, 1}) == 0.9
    assert conditions.busy_share(first, then, {7}) is None
    assert conditions.cpu_times(tmp_path / "missing") is None


def test_waiting_for_idle_cpus_sees_a_spinning_neighbour_and_stops_at_its_bound():
    """A real process spinning on one CPU: that CPU is busy, and the wait ends at its bound
    without calling it idle."""
    cpu = min(os.sched_getaffinity(0))
    spin = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})"
                             "\nwhile True: pass"])
    try:
        time.sleep(0.3)
        idle, waited_s, share = conditions.wait_for_idle_cpus(2.5, cpus={cpu}, window_s=0.5)
    finally:
        spin.kill()
        spin.wait()
    assert not idle and share is not None and share > 0.6
    assert 2.0 <= waited_s <= 2.5 + 1.0  # its bound, give or take one late window


@pytest.mark.parametrize(("value", "limit", "texts"), [
    (0.36, 0.1, ("36%", "10%")),        # far apart: whole percent
    (0.104, 0.1, ("10.4%", "10.0%")),   # "10% above 10%" would contradict itself
    (0.1004, 0.1, ("10.04%", "10.00%")),
    (0.1, 0.1, ("10.00%", "10.00%")),   # at the limit (the flags use >=): said as equal
])
def test_a_share_beside_its_limit_reads_apart_from_it(value, limit, texts):
    assert conditions.shares_apart(value, limit) == texts
