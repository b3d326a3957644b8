"""Shared pytest fixtures. Add new fixtures below the object-storage section."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from batchscale import localstore
from batchscale.storage import ObjectStore

# --- order: the longest files first ------------------------------------------------------------
# `make test` hands whole files to its xdist workers in collection order (--dist loadfile). A
# 6-minute file collected late keeps one worker busy while the other has nothing left; started
# first, the short files fill in beside it (longest-processing-time-first scheduling). The list
# is by measured duration (the sum of a file's test times in a run's --junitxml); a file not in
# it keeps its place after them.
LONGEST_FILES = ("test_contract.py", "test_pipeline.py", "test_regression_lake.py",
                 "test_history.py", "test_loop.py", "test_corrupt_inputs.py",
                 "test_network_waits.py", "test_kubernetes.py", "test_domains.py",
                 "test_checks.py", "test_reliability_runs.py", "test_fault_tolerance.py",
                 "test_stage_inputs.py", "test_stopping.py", "test_hf_trainer_example.py",
                 "test_user_code_errors.py", "test_convergence.py", "test_adaptive_driver.py",
                 "test_cli.py", "test_adaptive_calibration.py", "test_schema_versions.py",
                 "test_batch_schedule.py", "test_claims_adaptive.py",
                 # from a later run's slowest tests (--durations), their files' sums not known
                 "test_run_interrupt.py", "test_report_browser.py",
                 "test_adaptive_probe_budget.py", "test_regression_report.py", "test_publish.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: order within


# --- object storage: a real SeaweedFS (`weed mini`) on loopback, one per test session ---------


@pytest.fixture(scope="session")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[localstore.StoreInfo]:
    """A running local store on free loopback ports, stopped at the end of the session."""
    workdir = tmp_path_factory.mktemp("seaweed")
    info = localstore.up(workdir)
    yield info
    localstore.down(workdir)


@pytest.fixture
def object_store(seaweed: localstore.StoreInfo) -> ObjectStore:
    """An ObjectStore on the session's SeaweedFS, under a prefix no other test uses."""
    return ObjectStore(seaweed.settings(prefix=f"test-{uuid.uuid4().hex[:12]}"), max_attempts=2)


# --- HTTP stand-ins: pytest-httpserver for the KFP and Kubernetes APIs (none runs here) -------


@pytest.fixture(scope="session")
def httpserver_listen_address() -> tuple[str, int]:
    """pytest-httpserver on IPv4 loopback, any free port: clients never try "localhost" on ::1."""
    return ("127.0.0.1", 0)


# --- a real browser: Debian's chromium, installed where missing -------------------------------

APT_INSTALL_CHROMIUM = [["apt-get", "update"],
                        ["apt-get", "install", "-y", "--no-install-recommends", "chromium"]]


@pytest.fixture(scope="session")
def chromium() -> str:
    """The path of Debian's `chromium`, installed with apt-get first where it is missing (the test
    machines and CI run as root with Debian's package registry reachable)."""
    if found := shutil.which("chromium"):
        return found
    for command in APT_INSTALL_CHROMIUM:
        result = subprocess.run(command, capture_output=True, text=True, timeout=1200,
                                env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
        if result.returncode != 0:
            pytest.fail(f"chromium is missing and `{' '.join(command)}` failed with exit code "
                        f"{result.returncode}; install Debian's `chromium` package (as root: "
                        "apt-get install chromium) and run again.\n"
                        f"{result.stderr[-2000:]}", pytrace=False)
    if found := shutil.which("chromium"):
        return found
    pytest.fail("apt-get installed chromium but no `chromium` is on PATH", pytrace=False)
