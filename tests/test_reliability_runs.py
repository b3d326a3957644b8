"""Two whole runs at once on one store, for real: both publish complete, checksummed runs under
their own ids. Its own file (not test_reliability.py) so `make test` can run it beside the
other long run, the one killed in convergence."""

import json
import subprocess
import uuid

import pytest

from batchscale.lake.publish import run_manifest_key
from batchscale.storage import ObjectStore, sha256_b64
from helpers import BATCHSCALE, TINY_CONFIG, cli_env, store_env

pytestmark = pytest.mark.slow

ADAPTIVE = TINY_CONFIG.replace("  lr_rules: [sqrt]\n", "  lr_rules: [sqrt]\n  strategy: adaptive\n")


def test_two_runs_at_once_on_one_store(tmp_path, seaweed):
    """Run "b" is an adaptive search: one convergence step that runs the search's cells, and its
    decisions published beside the other tables (run "a", a grid, publishes none)."""
    store = ObjectStore(seaweed.settings(prefix=f"twice-{uuid.uuid4().hex[:8]}"))
    procs = []
    for name, config in (("a", TINY_CONFIG), ("b", ADAPTIVE)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "tiny.yaml").write_text(config)
        procs.append(subprocess.Popen(BATCHSCALE + ["run", "--config", "tiny.yaml"],
                                      cwd=tmp_path / name, env=cli_env(store_env(store)),
                                      text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [p.communicate(timeout=1200) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    run_ids = [line.split()[2] for out, _ in outs for line in out.splitlines()
               if line.startswith("batchscale run ")]
    assert len(set(run_ids)) == 2
    decisions = []
    for run_id in run_ids:
        manifest = json.loads(store.get_bytes(run_manifest_key(store, run_id)))
        for obj in manifest["objects"]:
            assert sha256_b64(store.get_bytes(obj["key"])) == obj["sha256"]
        decisions.append([o["key"] for o in manifest["objects"] if "/decisions/" in o["key"]])
    assert decisions[0] == [] and len(decisions[1]) == 1
    study = store.get_table(decisions[1][0]).to_pylist()
    assert study[0]["action"] == "probe" and study[-1]["action"] == "stop"
    report = (tmp_path / "b" / ".batchscale" / "runs" / run_ids[1] / "report.html").read_text()
    assert "Adaptive search" in report
