"""Helpers shared by the tests: run the real CLI, point it at the test store, answer JSON from
a stand-in API server."""

import json
import os
import subprocess
import sys
from pathlib import Path

from werkzeug import Response

from batchscale.storage import ObjectStore

BATCHSCALE = [sys.executable, "-m", "batchscale.cli"]


def cli_env(extra: dict | None = None) -> dict:
    """This process's environment without S3 settings, plus `extra`."""
    base = {k: v for k, v in os.environ.items()
            if not k.startswith(("BATCHSCALE_S3_", "AWS_"))}
    return {**base, **(extra or {})}


def run_cli(args: list[str], cwd: Path, env: dict | None = None,
            timeout_s: float = 600) -> subprocess.CompletedProcess:
    """Run the real `batchscale` command in `cwd` (no S3 variables unless `env` gives them)."""
    return subprocess.run(BATCHSCALE + args, cwd=cwd, env=cli_env(env),
                          capture_output=True, text=True, timeout=timeout_s)


def store_env(store: ObjectStore) -> dict:
    s = store.settings
    return {"BATCHSCALE_S3_ENDPOINT": s.endpoint_url, "BATCHSCALE_S3_BUCKET": s.bucket,
            "BATCHSCALE_S3_PREFIX": s.prefix, "AWS_ACCESS_KEY_ID": s.access_key,
            "AWS_SECRET_ACCESS_KEY": s.secret_key}


TINY_CONFIG = """
name: tiny
workload: digits-mlp
sweep:
  batch_sizes: [4, 64]
  time_budget_s: 0.2
  min_timed_steps: 5
  # 0.2 s trials on a shared CI runner: the quality flags are tested elsewhere on known
  # conditions; here they must not decide whether the pipeline passes.
  max_cv: 1000000.0
  max_round_spread: 2.0
  overload_cpu_share: null
  max_cpu_wait_share: null
convergence:
  batch_sizes: [16, 64, 256]
  lr_rules: [sqrt]
  seeds: [0]
  target_val_accuracy: 0.9
  max_steps: 400
  scaling_workers: [2]
  scaling_batch_sizes: [64]
analysis:
  bootstrap_samples: 20
"""


def json_response(obj, status: int = 200) -> Response:
    """A JSON answer from a stand-in API server (a pytest-httpserver handler returns it)."""
    return Response(json.dumps(obj), status, content_type="application/json")


def task_config(task: dict):
    """The config a compiled task (IR, as a dict) is given: a StageConfig of its `experiment`
    and `<section>_config` constants, as its component builds it in the pod; None for a task
    given no config (a study's run-id step)."""
    from batchscale.config.stage_inputs import (
        EXPERIMENT_INPUT,
        SECTION_INPUT_SUFFIX,
        StageConfig,
    )

    constants = {name: spec["runtimeValue"]["constant"]
                 for name, spec in task.get("inputs", {}).get("parameters", {}).items()
                 if "runtimeValue" in spec}
    if EXPERIMENT_INPUT not in constants:
        return None
    sections = {name.removesuffix(SECTION_INPUT_SUFFIX): value
                for name, value in constants.items() if name.endswith(SECTION_INPUT_SUFFIX)}
    return StageConfig(constants[EXPERIMENT_INPUT], **sections)


def processes_marked(marker: str) -> list[int]:
    """Live processes whose environment holds `marker` (the server's, inherited by its ranks)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            state = (proc / "status").read_text().split("State:")[1].split()[0]
        except (OSError, IndexError):
            continue
        if marker.encode() in environ and state != "Z":
            found.append(int(proc.name))
    return found
