"""`launcher: kubeflow`: the convergence component submits a Kubeflow Trainer TrainJob through the
real `kubeflow` SDK and the real `kubernetes` client, against `StandInKubernetesApi`
(trainer_standin.py), a stand-in for the API server, the Trainer's CRD schema and webhook, and
its controllers, which cannot run here. The stand-in refuses on CREATE whatever the real ones
would, so every test that gets past submission proves the body is admitted; it then runs the
job's nodes as local processes. Everything else is real: torchrun, the training script, the
SeaweedFS object store, a real SIGTERM to a real launcher process.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer

from batchscale.config import parse_config
from batchscale.convergence import runner, trainjob
from batchscale.convergence.trainjob_wait import RUNNING, WaitLimits, poll_status
from batchscale.convergence.usererror import UserCodeError
from batchscale.data.prep import prepare
from batchscale.errors import BadInput, BatchscaleError
from trainer_rules import schema_problems, webhook_problems, world_size
from trainer_standin import NAMESPACE, TRAINER_API, UNSCHEDULABLE, StandInKubernetesApi

# Measures time: run alone, not beside other tests (the Makefile's serial phase).
pytestmark = pytest.mark.serial

SECRET = "mlpipeline-minio-artifact"
IMAGE = "registry.example/batchscale-cuda:test"  # what the compiled pipeline would set
POD = {"BATCHSCALE_POD_NAME": "convergence-pod-0", "BATCHSCALE_POD_UID": "pod-uid-0",
       "BATCHSCALE_POD_NAMESPACE": NAMESPACE}
SETTINGS = {"batch_sizes": [64], "lr_rules": ["sqrt"], "seeds": [0], "max_steps": 300,
            "target_val_accuracy": 0.9, "eval_every_steps": 5, "launcher": "kubeflow",
            "max_restarts": 0, "timeout_s": 300}
PLACEMENT = {"node_selector": {"pool": "train"},
             "gpu_node_selector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
             "gpu_tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                  "effect": "NoSchedule"}],
             "service_account": "batchscale-trainer", "image_pull_secrets": ["regcred"],
             "measure_cpus": 1, "measure_memory_gib": 2}
FAST = WaitLimits(poll_interval_s=0.2, api_timeout_s=5, trainer_grace_s=1, log_drain_s=2,
                  pod_reserve_s=2)


@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits")
    prepare(parse_config({}).dataset, out)
    return out


@pytest.fixture
def threaded_server() -> Iterator[HTTPServer]:
    """pytest-httpserver answering requests concurrently, as an API server does: a followed log
    stays open while the launcher keeps polling the job's status."""
    server = HTTPServer(host="127.0.0.1", port=0, threaded=True)
    server.start()
    yield server
    server.clear()
    server.stop()


@pytest.fixture
def cluster(threaded_server, object_store, tmp_path,
            monkeypatch) -> Iterator[StandInKubernetesApi]:
    """The stand-in API with a KUBECONFIG pointing at it, and the convergence pod's env as the
    compiled pipeline sets it: the S3 settings and Secret, the TrainJob's image, the pod's
    identity (the pod itself served by the stand-in) and its deadline."""
    httpserver, s = threaded_server, object_store.settings
    api = StandInKubernetesApi(httpserver, {SECRET: {"accesskey": s.access_key,
                                                     "secretkey": s.secret_key}}, tmp_path)
    api.launcher_pods[POD["BATCHSCALE_POD_NAME"]] = started_ago(0)
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
    for name, value in {"BATCHSCALE_S3_ENDPOINT": s.endpoint_url, "BATCHSCALE_S3_BUCKET":
                        s.bucket, "BATCHSCALE_S3_PREFIX": s.prefix, "AWS_ACCESS_KEY_ID":
                        s.access_key, "AWS_SECRET_ACCESS_KEY": s.secret_key,
                        "BATCHSCALE_TRAINJOB_IMAGE": IMAGE, "BATCHSCALE_POD_DEADLINE_S": "3600",
                        **POD}.items():
        monkeypatch.setenv(name, value)
    yield api
    api.close()
    httpserver.check()  # no request the stand-in did not expect, no error in its handlers


def started_ago(seconds: float) -> str:
    start = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=seconds)
    return start.strftime("%Y-%m-%dT%H:%M:%SZ")


def created_job(api: StandInKubernetesApi) -> dict:
    [body] = [b for method, path, b in api.requests if method == "POST"]
    return body


def deleted(api: StandInKubernetesApi, name: str) -> bool:
    return ("DELETE", f"{TRAINER_API}/namespaces/{NAMESPACE}/trainjobs/{name}", None) in \
        api.requests


def expected_request(name: str, spec_uri: str, workers: int) -> dict:
    """The exact TrainJob the component must create for SETTINGS with PLACEMENT."""
    from batchscale.envinfo import git_commit

    def secret_ref(env: str, key: str) -> dict:
        return {"name": env, "valueFrom": {"secretKeyRef": {"name": SECRET, "key": key}}}

    node = {"cpu": "1", "memory": "2048Mi", "nvidia.com/gpu": "1"}
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/part-of": "batchscale",
                                              "app.kubernetes.io/component": "convergence"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                          "name": "convergence-pod-0", "uid": "pod-uid-0",
                                          "controller": False, "blockOwnerDeletion": False}]},
        "spec": {
            "runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"},
            "activeDeadlineSeconds": 300,
            "trainer": {
                "command": ["torchrun", "--max-restarts=0", "-m",
                            "batchscale.convergence.train", "--spec", spec_uri],
                "env": [{"name": "BATCHSCALE_S3_ENDPOINT",
                         "value": os.environ["BATCHSCALE_S3_ENDPOINT"]},
                        {"name": "BATCHSCALE_S3_BUCKET",
                         "value": os.environ["BATCHSCALE_S3_BUCKET"]},
                        {"name": "BATCHSCALE_S3_PREFIX",
                         "value": os.environ["BATCHSCALE_S3_PREFIX"]},
                        {"name": "BATCHSCALE_GIT_COMMIT", "value": git_commit()},
                        {"name": "BATCHSCALE_IMAGE_REF", "value": IMAGE},
                        {"name": "OMP_NUM_THREADS", "value": "1"},
                        secret_ref("AWS_ACCESS_KEY_ID", "accesskey"),
                        secret_ref("AWS_SECRET_ACCESS_KEY", "secretkey")],
                "image": IMAGE, "numNodes": workers, "numProcPerNode": 1,
                "resourcesPerNode": {"limits": node, "requests": node},
            },
            "runtimePatches": [{
                "manager": "batchscale/convergence",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                    "name": "node", "template": {"spec": {"template": {"spec": {
                        "nodeSelector": {"pool": "train", "nvidia.com/gpu.product":
                                         "NVIDIA-H100-80GB-HBM3"},
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists",
                                         "effect": "NoSchedule"}],
                        "serviceAccountName": "batchscale-trainer",
                        "imagePullSecrets": [{"name": "regcred"}]}}}}}]}}}}],
        },
    }


# ------------------------------------------------------------------------- the whole run
def test_trainjob_trains_two_nodes_and_returns_their_tables(cluster, digits_dir, capfd):
    cfg = parse_config({"convergence": SETTINGS, "kubernetes": PLACEMENT})
    curves, runs = runner.run_convergence(cfg, [64], data_dir=str(digits_dir),
                                          out_dir="unused", run_id="k8s", workers=2)
    [run] = runs.to_pylist()
    assert (run["status"], run["workers"], run["world_size"]) == ("reached", 2, 2)
    # the pods probed their own group's all-reduce (gloo on the stand-in's CPUs; nccl between
    # a real cluster's GPUs, which these machines do not have)
    assert run["allreduce_backend"] == "gloo" and run["allreduce_gradient_s"] > 0
    assert set(curves.column("world_size").to_pylist()) == {2}
    body = created_job(cluster)
    name = body["metadata"]["name"]
    spec_uri = body["spec"]["trainer"]["command"][-1]
    assert re.fullmatch(r"s3://[^/]+/.+/convergence/k8s/b64-w2/spec-[0-9a-f]{12}\.json",
                        spec_uri)
    assert body == expected_request(name, spec_uri, workers=2)
    # What the stand-in admitted, said out loud: the CRD keeps every field, the webhook
    # accepts it, and the Torch plugin's world size is the configured workers.
    assert schema_problems(body) == []
    assert webhook_problems(body, cluster.runtime) == []
    assert world_size(body, cluster.runtime) == 2
    assert deleted(cluster, name)
    err = capfd.readouterr().err
    assert f"[{name}] [b64-sqrt-s0-w2] reached at step" in err
    assert f"deleted TrainJob {NAMESPACE}/{name}" in err
    assert [line for line in err.splitlines() if line.startswith("warning:")] == []


def test_failed_trainjob_fails_the_step_with_its_reason(cluster, digits_dir, capfd):
    """The nodes get the credentials only from the Secret the job references: a Secret with a
    wrong key makes them fail, and the step reports the job's own reason and log. The log's
    connection stays open after the pod ended (hang_logs): the step stops reading it after
    log_drain_s instead of hanging."""
    cluster.secrets[SECRET]["secretkey"] = "not-the-key"
    cluster.hang_logs = True
    cfg = parse_config({"convergence": SETTINGS})
    started = time.monotonic()
    with pytest.raises(BatchscaleError) as err:
        trainjob.run_on_kubeflow(cfg, [64], data_dir=str(digits_dir), run_id="k8s-fail",
                                 workers=1, limits=FAST)
    name = created_job(cluster)["metadata"]["name"]
    assert str(err.value).startswith(
        f"TrainJob {name} failed: JobSetFailed: node-0 exited with status 1 (events: "
        f"TrainJob/{name} JobSetFailed: stand-in: a node exited non-zero)")
    log = capfd.readouterr().err
    assert f"[{name}] " in log  # the node's log reached the step's log
    assert f"warning: the log of TrainJob {name} was still open 2 s after the job ended" in log
    assert deleted(cluster, name)
    assert time.monotonic() - started < 60


def test_the_workloads_own_failure_in_a_node_is_bad_input_with_its_message(
        cluster, monkeypatch, capfd):
    """A user's workload whose loss refuses training batches over 16 examples passes the
    checks before the job (two examples) and fails in the node at step 0: the step raises
    UserCodeError (exit 2) with the node's one-line message, read back from node-0's log
    (no error file reaches the launcher from a pod), not "TrainJob failed"."""
    tests_dir = str(Path(__file__).parent)
    monkeypatch.setenv("PYTHONPATH", tests_dir)  # the nodes import the workload, as an image
    monkeypatch.syspath_prepend(tests_dir)
    cfg = parse_config({"workload": "user_code_error_workloads:small_train_batches",
                        "convergence": {**SETTINGS, "target_val_accuracy": None,
                                        "max_steps": 20}})
    with pytest.raises(UserCodeError) as err:
        trainjob.run_on_kubeflow(cfg, [64], data_dir="unused", run_id="k8s-user",
                                 workers=1, limits=FAST)
    name = created_job(cluster)["metadata"]["name"]
    assert err.value.exit_code == 2
    assert str(err.value).startswith(
        f"TrainJob {name} failed on the workload's own code: workload 'small-train-batches': "
        "Workload.loss (the model's forward and the loss) failed in trial b64-sqrt-s0-w1 "
        "(batch size 64, seed 0) at step 0")
    assert deleted(cluster, name)
    assert "Traceback" not in str(err.value)
    capfd.readouterr()


def test_local_checkpoint_path_is_refused_with_kubeflow(cluster, digits_dir):
    cfg = parse_config({"convergence": {**SETTINGS, "checkpoint_uri": "ckpt"}})
    with pytest.raises(BadInput, match="checkpoint_uri: 'ckpt' is a local path"):
        runner.run_convergence(cfg, [64], data_dir=str(digits_dir), out_dir="unused",
                               run_id="k8s-bad", workers=1)
    assert cluster.requests == []


def worst_after_deadline_s(limits: WaitLimits) -> float:
    """The longest the step can take besides its job's deadline, path by path, each wait at its
    bound: the create, then after the deadline Trainer's grace and the status read in flight
    when the wait ends; then either the "did not start" message's read and the events, or the
    next poll's read, the log drain, the Failed condition and the events; then the delete and
    what the pod keeps for the tables and KFP's upload."""
    api = limits.api_timeout_s
    create, wait_end = api, limits.trainer_grace_s + api
    not_started, failed_while_running = api + api, api + limits.log_drain_s + api + api
    delete_and_keep = api + limits.pod_reserve_s
    return create + wait_end + max(not_started, failed_while_running) + delete_and_keep


def test_wait_limits_fit_the_job_inside_the_pods_deadline(capsys):
    limits = WaitLimits()  # 60 + 15 + 6 x 30 + 120 s kept after the job
    assert limits.after_job_s == 375
    for tight in (limits, FAST, WaitLimits(api_timeout_s=120, log_drain_s=0)):
        assert worst_after_deadline_s(tight) <= tight.after_job_s
    assert limits.job_deadline_s(1800.2, None) == 1801  # no pod deadline: timeout_s
    assert limits.job_deadline_s(1800, 1800 + 900) == 1800  # the default margin fits
    assert capsys.readouterr().err == ""
    assert limits.job_deadline_s(1800, 1800 + 100) == 1800 + 100 - 375
    assert "the TrainJob's deadline is 1525 s, not convergence.timeout_s (1800 s)" in \
        capsys.readouterr().err
    with pytest.raises(BatchscaleError, match="has 375 s left before its deadline, less than "
                                              "the 375 s kept"):
        limits.job_deadline_s(1800, 375)


def test_a_stalled_status_read_is_given_up_at_the_api_timeout(capsys):
    """The SDK's get_job waits up to 120 s per request, four requests a read: the launcher
    waits for a read only api_timeout_s, so the wait still ends at its bound."""
    answer = threading.Event()

    class StalledClient:
        def get_job(self, name):
            answer.wait(60)
            raise RuntimeError("no answer")

    limits = WaitLimits(poll_interval_s=0.2, api_timeout_s=0.5)
    started = time.monotonic()
    try:
        seen = poll_status(StalledClient(), "job-1", {RUNNING}, started + 1, limits)
    finally:
        answer.set()
    assert seen is None
    assert time.monotonic() - started < 1 + limits.api_timeout_s + 1.5  # not the 60 s stall
    assert ("could not read TrainJob job-1 (the Kubernetes API at (unknown host) did not "
            "complete reading TrainJob job-1 within 0.5 s); retrying") in capsys.readouterr().err


# ----------------------------------------------------------------- what a cluster refuses
def test_trainer_older_than_2_2_is_refused_with_the_version_it_needs(cluster, digits_dir):
    """A cluster with Trainer v2.1.0's CRD (the pinned upstream copy) does not know
    runtimePatches or activeDeadlineSeconds: with fieldValidation=Strict its API server refuses
    the job instead of dropping them, and the step names the version it needs."""
    cluster.crd_version = "v2.1.0"
    cfg = parse_config({"convergence": SETTINGS, "kubernetes": PLACEMENT})
    with pytest.raises(BatchscaleError) as err:
        trainjob.run_on_kubeflow(cfg, [64], data_dir=str(digits_dir), run_id="k8s-old",
                                 workers=1, limits=FAST)
    message = str(err.value)
    assert "does not know spec.activeDeadlineSeconds, spec.runtimePatches" in message
    assert "needs Kubeflow Trainer v2.2 or newer" in message
    assert cluster.jobs == {}


def test_a_non_torch_runtime_is_refused_before_anything_is_staged(cluster, digits_dir):
    cluster.runtime = json.loads(json.dumps(cluster.runtime))
    cluster.runtime["metadata"]["labels"]["trainer.kubeflow.org/framework"] = "jax"
    cfg = parse_config({"convergence": SETTINGS})
    with pytest.raises(BadInput, match="'torch-distributed' is a 'jax' runtime"):
        trainjob.run_on_kubeflow(cfg, [64], data_dir=str(digits_dir), run_id="k8s-jax",
                                 workers=1, limits=FAST)
    assert not any(method == "POST" for method, _, _ in cluster.requests)


# --------------------------------------------------------------- no orphans, bounded waits
def test_pending_pods_end_at_the_jobs_deadline_with_what_to_check(cluster, digits_dir):
    """Pods that cannot be placed: Trainer fails the job at its activeDeadlineSeconds
    (timeout_s), and the step says they never ran and what to look at."""
    cluster.start_nodes = False
    cfg = parse_config({"convergence": {**SETTINGS, "timeout_s": 2}})
    started = time.monotonic()
    with pytest.raises(BatchscaleError) as err:
        trainjob.run_on_kubeflow(cfg, [64], data_dir=str(digits_dir), run_id="k8s-pending",
                                 workers=1, limits=FAST)
    body = created_job(cluster)
    name, message = body["metadata"]["name"], str(err.value)
    assert body["spec"]["activeDeadlineSeconds"] == 2
    assert message.startswith(f"TrainJob {name} failed: DeadlineExceeded: TrainJob exceeded "
                              "its active deadline")
    assert UNSCHEDULABLE in message
    assert "never ran on all its nodes" in message and IMAGE in message
    assert "kubernetes.node_selector" in message
    assert deleted(cluster, name)
    assert time.monotonic() - started < 30


def test_the_launcher_stops_waiting_when_trainer_does_not_end_the_job(cluster, digits_dir):
    """A job nobody ends (the stand-in's controller ignores the deadline): the launcher's own
    bound, deadline + trainer_grace_s, ends the wait, deletes the job and says what timed out."""
    cluster.start_nodes, cluster.enforce_deadline = False, False
    cfg = parse_config({"convergence": {**SETTINGS, "timeout_s": 2}})
    started = time.monotonic()
    with pytest.raises(BatchscaleError) as err:
        trainjob.run_on_kubeflow(cfg, [64], data_dir=str(digits_dir), run_id="k8s-stuck",
                                 workers=1, limits=FAST)
    name, message = created_job(cluster)["metadata"]["name"], str(err.value)
    assert re.match(rf"TrainJob {name} did not start running within [34] s \(node-0 Pending\)",
                    message)
    assert "Pods that stay Pending are not placed or cannot pull their image" in message
    assert f"FailedScheduling: {UNSCHEDULABLE}" in message
    assert deleted(cluster, name)
    assert time.monotonic() - started < 30


def test_the_jobs_deadline_fits_inside_the_pods_deadline(cluster, digits_dir, monkeypatch,
                                                          capfd):
    """The step's pod started 2 s ago with a 26 s deadline, and the launcher keeps 17 s for
    after the job: the job gets what is left (about 6 s), not timeout_s, so it ends and the
    step reports inside the pod's deadline."""
    cluster.start_nodes = False
    cluster.launcher_pods[POD["BATCHSCALE_POD_NAME"]] = started_ago(2)
    monkeypatch.setenv("BATCHSCALE_POD_DEADLINE_S", "26")
    limits = WaitLimits(poll_interval_s=0.2, api_timeout_s=2, trainer_grace_s=1,
                        log_drain_s=2, pod_reserve_s=2)
    cfg = parse_config({"convergence": SETTINGS})
    started = time.monotonic()
    with pytest.raises(BatchscaleError, match="DeadlineExceeded"):
        trainjob.run_on_kubeflow(cfg, [64], data_dir=str(digits_dir), run_id="k8s-tight",
                                 workers=1, limits=limits)
    deadline = created_job(cluster)["spec"]["activeDeadlineSeconds"]
    assert 1 <= deadline <= 26 - 2 - limits.after_job_s
    assert time.monotonic() - started < 26 - 2
    assert f"the TrainJob's deadline is {deadline} s, not convergence.timeout_s (300 s)" in \
        capfd.readouterr().err


def test_no_time_left_in_the_pod_is_refused_before_submitting(cluster, digits_dir,
                                                              monkeypatch):
    cluster.launcher_pods[POD["BATCHSCALE_POD_NAME"]] = started_ago(50)
    monkeypatch.setenv("BATCHSCALE_POD_DEADLINE_S", "60")
    cfg = parse_config({"convergence": SETTINGS})
    with pytest.raises(BatchscaleError, match=rf"pod has \d+ s left before its deadline, less "
                                              rf"than the {FAST.after_job_s:.0f} s kept .* "
                                              r"raise kubernetes\.convergence_timeout_margin_s"):
        trainjob.run_on_kubeflow(cfg, [64], data_dir=str(digits_dir), run_id="k8s-late",
                                 workers=1, limits=FAST)
    assert not any(method == "POST" for method, _, _ in cluster.requests)


LAUNCHER = """
import json, sys
from batchscale.config import parse_config
from batchscale.convergence.trainjob import run_on_kubeflow
from batchscale.convergence.trainjob_wait import WaitLimits

cfg = parse_config(json.loads(sys.argv[1]))
run_on_kubeflow(cfg, [64], data_dir=sys.argv[2], run_id="k8s-term", workers=1,
                limits=WaitLimits(poll_interval_s=0.2))
"""


def test_sigterm_deletes_the_job(cluster, digits_dir):
    """A real launcher process, a real SIGTERM (what the kubelet sends before killing the
    pod): the job is deleted before the process ends, and the step says why it stopped."""
    cluster.start_nodes = False
    config = json.dumps({"convergence": SETTINGS})
    proc = subprocess.Popen([sys.executable, "-c", LAUNCHER, config, str(digits_dir)],
                            env=dict(os.environ), stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: cluster.jobs, 60, "the launcher to create its TrainJob")
        [name] = cluster.jobs
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 1
    assert f"stopped by SIGTERM (the step's pod is being deleted or ran past its deadline); " \
           f"TrainJob {name} was deleted" in err
    assert deleted(cluster, name) and cluster.jobs == {}


def wait_for(condition, timeout_s: float, what: str) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.1)
