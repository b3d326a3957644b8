"""The environment columns every result row carries (see schemas.ENV_FIELDS)."""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from pathlib import Path

import batchscale
from batchscale.config.variants import study_id_of
from batchscale.images import IMAGE_REF_ENV


@functools.cache
def git_commit() -> str:
    """Commit of the code that produced a row: the image sets BATCHSCALE_GIT_COMMIT, a checkout
    asks git (the package's own source tree, not the caller's working directory)."""
    if os.environ.get("BATCHSCALE_GIT_COMMIT"):
        return os.environ["BATCHSCALE_GIT_COMMIT"]
    src = Path(batchscale.__file__).resolve().parent
    try:
        out = subprocess.run(
            ["git", "-C", str(src), "rev-parse", "--short=12", "HEAD"],
            capture_output=True, text=True, timeout=10, check=True,
        )
        dirty = subprocess.run(
            ["git", "-C", str(src), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, timeout=10,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def device_name(device: str = "cpu") -> str:
    """A human-readable accelerator or CPU model name."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu: " + (platform.processor() or platform.machine())


NVIDIA_DRIVER_FILE = Path("/proc/driver/nvidia/version")


def cuda_version(device: str = "cpu") -> str | None:
    """The CUDA runtime torch was built with, where the rows were measured on a GPU."""
    if not device.startswith("cuda"):
        return None
    import torch

    return torch.version.cuda


@functools.cache
def gpu_driver(device: str = "cpu") -> str | None:
    """The NVIDIA kernel driver's version (e.g. "550.54.15") on a GPU, else None: from
    /proc/driver/nvidia/version, or nvidia-smi where /proc does not show it (some containers)."""
    if not device.startswith("cuda"):
        return None
    try:
        found = re.search(r"Kernel Module\s+(\S+)", NVIDIA_DRIVER_FILE.read_text())
        if found:
            return found.group(1)
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
        return out.split()[0] if out.split() else None
    except (OSError, subprocess.SubprocessError):
        return None


def image_reference() -> str | None:
    """The container image the row was measured in (IMAGE_REF_ENV), None outside a pipeline."""
    return os.environ.get(IMAGE_REF_ENV) or None


def environment(
    *, run_id: str, config_hash: str, experiment: str, workload: str,
    device: str = "cpu", world_size: int = 1, variant: str | None = None,
) -> dict:
    """The environment columns; `variant`: the config's (a study's variant), from which with
    the run id the row's study_id follows."""
    import torch

    return {
        "run_id": run_id,
        "config_hash": config_hash,
        "experiment": experiment,
        "workload": workload,
        "git_commit": git_commit(),
        "batchscale_version": batchscale.__version__,
        "torch_version": torch.__version__,
        "cuda_version": cuda_version(device),
        "gpu_driver": gpu_driver(device),
        "image": image_reference(),
        "python_version": platform.python_version(),
        "device_name": device_name(device),
        "threads": torch.get_num_threads(),
        "world_size": world_size,
        "study_id": study_id_of(run_id, variant),
        "variant": variant,
    }
