"""`launcher: kubeflow`: the convergence component submits a Kubeflow Trainer TrainJob through the
real `kubeflow` SDK (TrainerClient) and the real `kubernetes` client.

No Kubernetes API exists on our machines, so `StandInKubernetesApi` — routes on
pytest-httpserver in this file, clearly a stand-in — plays the API server and the Trainer/JobSet
controllers for the trainer.kubeflow.org/v1alpha1 `trainjobs` resource: the server logs every
request, the stand-in serves the `torch-distributed` ClusterTrainingRuntime and "schedules" a
created TrainJob by running its trainer command as one local process per node, with the
container's env (Secret references resolved from the stand-in's secrets) plus the PET_*
variables Trainer injects. Everything else is real: the SDK's requests, torchrun, the training
script, the SeaweedFS object store the pods exchange the dataset, spec, checkpoints and results
through.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from batchscale.config import parse_config
from batchscale.convergence import runner, trainjob
from batchscale.data.prep import prepare
from batchscale.errors import BadInput, BatchscaleError
from helpers import json_response

TRAINER_API = "/apis/trainer.kubeflow.org/v1alpha1"
NAMESPACE = "team-a"
SECRET = "mlpipeline-minio-artifact"
LOG_POLL_S = 0.2
SETTINGS = {"batch_sizes": [64], "lr_rules": ["sqrt"], "seeds": [0], "max_steps": 300,
            "target_val_accuracy": 0.9, "eval_every_steps": 5, "launcher": "kubeflow",
            "max_restarts": 0, "timeout_s": 300}
RUNTIME = {
    "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "ClusterTrainingRuntime",
    "metadata": {"name": "torch-distributed",
                 "labels": {"trainer.kubeflow.org/framework": "torch"}},
    "spec": {"mlPolicy": {"numNodes": 1, "torch": {"numProcPerNode": "auto"}},
             "template": {"spec": {"replicatedJobs": [{
                 "name": "node",
                 "template": {"metadata": {"labels": {
                     "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                     "spec": {"template": {"spec": {"containers": [
                         {"name": "node", "image": "pytorch/pytorch:2.7.1"}]}}}}}]}}},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class StandInKubernetesApi:
    """A stand-in for the Kubernetes API server plus the Trainer controller (see the module
    docstring), served by pytest-httpserver: enough of /api/v1 and trainer.kubeflow.org/v1alpha1
    for TrainerClient. A request it does not know fails the test."""

    def __init__(self, server: HTTPServer, secrets: dict[str, dict[str, str]], work_dir: Path,
                 nproc_per_node: int = 1):
        self.server, self.url = server, server.url_for("").rstrip("/")
        self.secrets, self.work_dir, self.nproc_per_node = secrets, work_dir, nproc_per_node
        self.jobs: dict[str, dict] = {}
        self.nodes: dict[str, list[subprocess.Popen]] = {}
        jobs = f"{TRAINER_API}/namespaces/{NAMESPACE}/trainjobs"
        pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
        one_job = re.compile(rf"{jobs}/[^/]+$")
        routes = [
            ("GET", f"{TRAINER_API}/clustertrainingruntimes/torch-distributed",
             lambda req: json_response(RUNTIME)),
            ("GET", f"{TRAINER_API}/namespaces/{NAMESPACE}/trainingruntimes/torch-distributed",
             lambda req: not_found("trainingruntimes torch-distributed")),  # SDK looks here first
            ("GET", "/api/v1/namespaces/kubeflow-system/configmaps/kubeflow-trainer-public",
             lambda req: json_response({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {
                 "name": "kubeflow-trainer-public"}, "data": {
                 "kubeflow_trainer_version": "v2.1.0"}})),
            ("POST", jobs, lambda req: json_response(self.create(req.json), 201)),
            ("GET", one_job, lambda req: self.if_known(req, self.job_object)),
            ("DELETE", one_job, lambda req: self.if_known(req, self.delete)),
            ("GET", pods, lambda req: json_response(self.pods(req.args["labelSelector"]))),
            ("GET", re.compile(rf"{pods}/[^/]+/log$"), self.stream_log),
            ("GET", f"/api/v1/namespaces/{NAMESPACE}/events",
             lambda req: json_response({"kind": "EventList", "apiVersion": "v1",
                                        "items": self.events()})),
        ]
        for method, path, respond in routes:
            server.expect_request(path, method=method).respond_with_handler(respond)

    @property
    def requests(self) -> list[tuple[str, str, dict | None]]:
        """(method, path, JSON body or None) of every request received, in order."""
        return [(r.method, r.path, r.get_json(silent=True)) for r, _ in self.server.log]

    # -- plumbing -----------------------------------------------------------------------------
    def close(self) -> None:
        for procs in self.nodes.values():
            for p in procs:
                p.kill()
                p.wait()

    def kubeconfig(self, path: Path) -> Path:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "stand-in",
            "clusters": [{"name": "stand-in", "cluster": {"server": self.url}}],
            "users": [{"name": "u", "user": {"token": "stand-in-token"}}],
            "contexts": [{"name": "stand-in", "context": {
                "cluster": "stand-in", "user": "u", "namespace": NAMESPACE}}]}))
        return path

    def if_known(self, req: Request, answer: Callable[[str], dict]) -> Response:
        """`answer` for the TrainJob the path ends with, or Kubernetes' 404 when there is none."""
        name = req.path.rsplit("/", 1)[1]
        return json_response(answer(name)) if name in self.jobs else \
            not_found(f"trainjobs {name}")

    # -- the API server and controllers -------------------------------------------------------
    def create(self, job: dict) -> dict:
        """Store the TrainJob and start its nodes, as Trainer + JobSet would."""
        name = job["metadata"]["name"]
        job = {**job, "metadata": {**job["metadata"], "namespace": NAMESPACE,
                                   "creationTimestamp": now(), "uid": name}}
        self.jobs[name] = job
        trainer = job["spec"]["trainer"]
        nodes, port = trainer["numNodes"], free_port()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("BATCHSCALE_S3_", "AWS_", "KUBECONFIG"))}
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        env.update(self.container_env(job))
        self.nodes[name] = []
        for rank in range(nodes):
            pet = {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(self.nproc_per_node),
                   "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1",
                   "PET_MASTER_PORT": str(port)}
            log = open(self.work_dir / f"{name}-node-{rank}.log", "wb")  # noqa: SIM115
            self.nodes[name].append(subprocess.Popen(
                trainer["command"], env={**env, **pet}, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.work_dir))
        return job

    def container_env(self, job: dict) -> dict[str, str]:
        """trainer.env plus the runtime patch's env for container `node` (secretKeyRef
        resolved from the stand-in's secrets, as the kubelet would)."""
        env = {e["name"]: e["value"] for e in job["spec"]["trainer"].get("env", [])}
        for patch in job["spec"].get("runtimePatches", []):
            for rjob in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                for c in rjob["template"]["spec"]["template"]["spec"]["containers"]:
                    for e in c.get("env", []):
                        ref = e["valueFrom"]["secretKeyRef"]
                        env[e["name"]] = self.secrets[ref["name"]][ref["key"]]
        return env

    def delete(self, name: str) -> dict:
        for p in self.nodes.pop(name, []):
            p.kill()
            p.wait()
        return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    def exit_codes(self, name: str) -> list[int | None]:
        return [p.poll() for p in self.nodes.get(name, [])]

    def job_object(self, name: str) -> dict:
        codes = self.exit_codes(name)
        job = dict(self.jobs[name])
        if codes and all(c is not None for c in codes):
            failed = [i for i, c in enumerate(codes) if c != 0]
            condition = ({"type": "Failed", "status": "True", "reason": "JobSetFailed",
                          "message": f"node-{failed[0]} exited with status {codes[failed[0]]}"}
                         if failed else {"type": "Complete", "status": "True",
                                         "reason": "JobSetCompleted", "message": "done"})
            job["status"] = {"conditions": [{**condition, "lastTransitionTime": now()}]}
        return job

    def pods(self, selector: str) -> dict:
        name = re.search(r"jobset-name=([^,]+)", selector).group(1)
        items = []
        for rank, code in enumerate(self.exit_codes(name)):
            phase = "Running" if code is None else "Succeeded" if code == 0 else "Failed"
            items.append({
                "metadata": {"name": f"{name}-node-0-{rank}", "namespace": NAMESPACE,
                             "creationTimestamp": self.jobs[name]["metadata"]
                             ["creationTimestamp"],
                             "labels": {"jobset.sigs.k8s.io/jobset-name": name,
                                        "jobset.sigs.k8s.io/replicatedjob-name": "node",
                                        "batch.kubernetes.io/job-completion-index": str(rank)}},
                "spec": {"containers": [{"name": "node", "image": "stand-in"}]},
                "status": {"phase": phase}})
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}

    def events(self) -> list[dict]:
        return [{"metadata": {"name": f"{name}.1", "namespace": NAMESPACE},
                 "involvedObject": {"kind": "TrainJob", "name": name},
                 "reason": "JobSetFailed", "message": "stand-in: a node exited non-zero",
                 "firstTimestamp": now(), "type": "Warning"}
                for name in self.jobs if any(c not in (None, 0) for c in self.exit_codes(name))]

    def stream_log(self, req: Request) -> Response:
        """The node's output as it is written; with follow=true until the process ends."""
        name, rank = re.search(r"/pods/(.+)-node-0-(\d+)/log$", req.path).groups()
        path, proc = self.work_dir / f"{name}-node-{rank}.log", self.nodes[name][int(rank)]
        return Response(follow_file(path, proc), content_type="text/plain")


def not_found(what: str) -> Response:
    return json_response({"kind": "Status", "apiVersion": "v1", "status": "Failure",
                          "reason": "NotFound", "code": 404, "message": f"{what} not found"}, 404)


def follow_file(path: Path, proc: subprocess.Popen) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        while True:
            chunk = fh.read()
            if chunk:
                yield chunk
            elif proc.poll() is not None:
                return
            else:
                time.sleep(LOG_POLL_S)


# ----------------------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def digits_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("digits")
    prepare(parse_config({}).dataset, out)
    return out


@pytest.fixture
def cluster(httpserver, object_store, tmp_path, monkeypatch) -> Iterator[StandInKubernetesApi]:
    """The stand-in API with a KUBECONFIG pointing at it, and the component's S3 env (the
    pipeline sets it from the same Secret)."""
    s = object_store.settings
    api = StandInKubernetesApi(httpserver, {SECRET: {"accesskey": s.access_key,
                                                     "secretkey": s.secret_key}}, tmp_path)
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig")))
    for name, value in {"BATCHSCALE_S3_ENDPOINT": s.endpoint_url, "BATCHSCALE_S3_BUCKET":
                        s.bucket, "BATCHSCALE_S3_PREFIX": s.prefix, "AWS_ACCESS_KEY_ID":
                        s.access_key, "AWS_SECRET_ACCESS_KEY": s.secret_key}.items():
        monkeypatch.setenv(name, value)
    yield api
    api.close()
    httpserver.check()  # no request the stand-in did not expect, no error in its handlers


def created_job(api: StandInKubernetesApi) -> dict:
    [body] = [b for method, path, b in api.requests if method == "POST"]
    return body


def expected_request(name: str, spec_uri: str, workers: int) -> dict:
    """The exact TrainJob the component must create."""
    from batchscale.envinfo import git_commit
    from batchscale.images import GPU_IMAGE

    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": {"name": name, "labels": trainjob.JOB_LABELS},
        "spec": {
            "runtimeRef": {"name": "torch-distributed", "kind": "ClusterTrainingRuntime"},
            "trainer": {
                "command": ["torchrun", "--max-restarts=0", "-m",
                            "batchscale.convergence.train", "--spec", spec_uri],
                "env": [{"name": "BATCHSCALE_S3_ENDPOINT",
                         "value": os.environ["BATCHSCALE_S3_ENDPOINT"]},
                        {"name": "BATCHSCALE_S3_BUCKET",
                         "value": os.environ["BATCHSCALE_S3_BUCKET"]},
                        {"name": "BATCHSCALE_S3_PREFIX",
                         "value": os.environ["BATCHSCALE_S3_PREFIX"]},
                        {"name": "BATCHSCALE_GIT_COMMIT", "value": git_commit()}],
                "image": GPU_IMAGE, "numNodes": workers,
                "resourcesPerNode": {"limits": {"nvidia.com/gpu": "1"},
                                     "requests": {"nvidia.com/gpu": "1"}},
            },
            "runtimePatches": [{
                "manager": "trainer.kubeflow.org/kubeflow-sdk",
                "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [{
                    "name": "node", "template": {"spec": {"template": {"spec": {
                        "containers": [{"name": "node", "env": [
                            {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {
                                "name": SECRET, "key": "accesskey"}}},
                            {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {
                                "name": SECRET, "key": "secretkey"}}}]}]}}}}}]}}}}],
        },
    }


def test_trainjob_trains_two_nodes_and_returns_their_tables(cluster, digits_dir, capfd):
    cfg = parse_config({"convergence": SETTINGS})
    curves, runs = runner.run_convergence(cfg, [64], data_dir=str(digits_dir),
                                          out_dir="unused", run_id="k8s", workers=2)
    [run] = runs.to_pylist()
    assert (run["status"], run["workers"], run["world_size"]) == ("reached", 2, 2)
    assert set(curves.column("world_size").to_pylist()) == {2}
    body = created_job(cluster)
    name = body["metadata"]["name"]
    spec_uri = body["spec"]["trainer"]["command"][-1]
    assert re.fullmatch(r"s3://[^/]+/.+/convergence/k8s/b64-w2/spec-[0-9a-f]{12}\.json",
                        spec_uri)
    assert body == expected_request(name, spec_uri, workers=2)
    assert ("DELETE", f"{TRAINER_API}/namespaces/{NAMESPACE}/trainjobs/{name}", None) in \
        cluster.requests
    assert f"[{name}] [b64-sqrt-s0-w2] reached at step" in capfd.readouterr().err


def test_failed_trainjob_fails_the_step_with_its_reason(cluster, digits_dir, capfd):
    cluster.nproc_per_node = 2  # a runtime giving 2 processes per node: world size 2, not 1
    cfg = parse_config({"convergence": SETTINGS})
    with pytest.raises(BatchscaleError) as err:
        runner.run_convergence(cfg, [64], data_dir=str(digits_dir), out_dir="unused",
                               run_id="k8s-fail", workers=1)
    name = created_job(cluster)["metadata"]["name"]
    assert str(err.value).startswith(
        f"TrainJob {name} failed: JobSetFailed: node-0 exited with status 1 (events: "
        f"TrainJob/{name} JobSetFailed: stand-in: a node exited non-zero)")
    assert "world size is 2 but the spec asks for 1 workers" in capfd.readouterr().err
    assert any(m == "DELETE" and p.endswith(f"/trainjobs/{name}")
               for m, p, _ in cluster.requests)


def test_local_checkpoint_path_is_refused_with_kubeflow(cluster, digits_dir):
    cfg = parse_config({"convergence": {**SETTINGS, "checkpoint_uri": "ckpt"}})
    with pytest.raises(BadInput, match="checkpoint_uri: 'ckpt' is a local path"):
        runner.run_convergence(cfg, [64], data_dir=str(digits_dir), out_dir="unused",
                               run_id="k8s-bad", workers=1)
    assert cluster.requests == []
