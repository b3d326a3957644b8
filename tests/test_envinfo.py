"""The software fields every result row records (envinfo): CUDA runtime, NVIDIA driver and the
image reference. No GPU here: the driver is read from a file laid out as the NVIDIA kernel
module writes /proc/driver/nvidia/version (the format is stood in, the parsing is real)."""

from __future__ import annotations

import pytest

from batchscale import envinfo
from batchscale.images import IMAGE_REF_ENV

PROC_TEXT = ("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 "
             "UTC 2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n")


@pytest.fixture(autouse=True)
def fresh_cache():
    envinfo.gpu_driver.cache_clear()
    yield
    envinfo.gpu_driver.cache_clear()


def test_the_driver_is_read_from_the_kernel_modules_version_file(tmp_path, monkeypatch):
    proc = tmp_path / "version"
    proc.write_text(PROC_TEXT)
    monkeypatch.setattr(envinfo, "NVIDIA_DRIVER_FILE", proc)
    assert envinfo.gpu_driver("cuda:0") == "550.54.15"


def test_without_the_file_or_nvidia_smi_the_driver_is_not_recorded(tmp_path, monkeypatch):
    monkeypatch.setattr(envinfo, "NVIDIA_DRIVER_FILE", tmp_path / "absent")
    monkeypatch.setenv("PATH", str(tmp_path))  # no nvidia-smi either
    assert envinfo.gpu_driver("cuda:0") is None


def test_a_cpu_row_has_no_driver_and_no_cuda_runtime():
    assert envinfo.gpu_driver("cpu") is None and envinfo.cuda_version("cpu") is None


def test_the_image_reference_comes_from_the_compiled_task_environment(monkeypatch):
    env = dict(run_id="r", config_hash="h", experiment="e", workload="w")
    monkeypatch.delenv(IMAGE_REF_ENV, raising=False)
    assert envinfo.environment(**env)["image"] is None
    monkeypatch.setenv(IMAGE_REF_ENV, "reg.example/batchscale-cpu@sha256:" + "a" * 64)
    row = envinfo.environment(**env)
    assert row["image"].endswith("@sha256:" + "a" * 64)
    assert row["gpu_driver"] is None and row["cuda_version"] is None
