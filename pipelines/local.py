"""Run the pipeline on this machine with kfp.local (SubprocessRunner, the installed package)."""

from __future__ import annotations

import os
from pathlib import Path

from batchscale.config import ExperimentConfig


def run_local(cfg: ExperimentConfig, run_id: str, state_dir: Path) -> Path:
    """Run the whole pipeline; returns the local pipeline root holding every task's outputs."""
    from kfp import local

    from batchscale.pipelines.batchscale_pipeline import build_pipeline

    pipeline_root = state_dir / "pipeline_root"
    pipeline_root.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("BATCHSCALE_WORK_DIR", str(state_dir / "work"))
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(pipeline_root),
               raise_on_error=True, enable_caching=False)
    build_pipeline(cfg)(config_json=cfg.to_json(), run_id=run_id)
    return pipeline_root
