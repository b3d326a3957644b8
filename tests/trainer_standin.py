"""`StandInKubernetesApi`: a stand-in for a Kubernetes API server with Kubeflow Trainer and
JobSet installed (none can run here), on pytest-httpserver, for the `launcher: kubeflow` tests.

It serves enough of /api/v1 and trainer.kubeflow.org/v1alpha1 for the real `kubeflow` SDK and
`kubernetes` client, and logs every request. On CREATE it does what the real ones do, from
upstream's own files and rules (trainer_rules.py): the TrainJob CRD's schema (fieldValidation
Strict refuses what would be pruned, other schema errors are 422 Invalid), then the Trainer's
validating webhook (403, "denied the request"). An admitted job is "scheduled" by running its
trainer command as one local process per node, with `.spec.trainer.env` (Secret references
resolved from the stand-in's secrets, as the kubelet would) plus the PET_* variables the Torch
plugin gives the node container. It fails a job past its activeDeadlineSeconds as the Trainer
controller does (Failed, DeadlineExceeded; pods gone). With `start_nodes=False` a job's pods
stay Pending, as on a cluster where they cannot be placed. Everything else in those tests is
real: the SDK's requests, torchrun, the training script, the SeaweedFS object store.
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

from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from helpers import json_response
from trainer_rules import (
    CURRENT,
    WEBHOOK,
    gpus_per_node,
    node_resources,
    nproc_per_node,
    schema_problems,
    torch_distributed_runtime,
    unknown_fields,
    validator,
    webhook_problems,
)

TRAINER_API = "/apis/trainer.kubeflow.org/v1alpha1"
NAMESPACE = "team-a"
LOG_POLL_S = 0.2
DEADLINE_MESSAGE = "TrainJob exceeded its active deadline"  # pkg/constants, v2.3.0
UNSCHEDULABLE = "0/3 nodes are available: 3 node(s) didn't match Pod's node affinity/selector."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status(code: int, reason: str, message: str) -> Response:
    return json_response({"kind": "Status", "apiVersion": "v1", "metadata": {},
                          "status": "Failure", "reason": reason, "code": code,
                          "message": message}, code)


def not_found(what: str) -> Response:
    return status(404, "NotFound", f"{what} not found")


class StandInKubernetesApi:
    """See the module docstring. A request it does not know fails the test (httpserver.check)."""

    def __init__(self, server: HTTPServer, secrets: dict[str, dict[str, str]], work_dir: Path,
                 crd_version: str = CURRENT):
        self.server, self.url = server, server.url_for("").rstrip("/")
        self.secrets, self.work_dir, self.crd_version = secrets, work_dir, crd_version
        self.runtime = torch_distributed_runtime()
        validator(crd_version)  # read the CRD now, not inside the first request
        self.start_nodes, self.enforce_deadline = True, True
        self.hang_logs, self.closed = False, False  # hang_logs: streams stay open after the end
        self.launcher_pods: dict[str, str] = {}  # name -> status.startTime
        self.jobs: dict[str, dict] = {}
        self.created_at: dict[str, float] = {}
        self.deadline_failed: set[str] = set()
        self.unplaced: set[str] = set()  # jobs whose pods stay Pending
        self.nodes: dict[str, list[subprocess.Popen]] = {}
        for method, path, respond in self.routes():
            server.expect_request(path, method=method).respond_with_handler(respond)

    def routes(self) -> list[tuple[str, str | re.Pattern, Callable[[Request], Response]]]:
        jobs = f"{TRAINER_API}/namespaces/{NAMESPACE}/trainjobs"
        pods = f"/api/v1/namespaces/{NAMESPACE}/pods"
        one_job = re.compile(rf"{jobs}/[^/]+$")
        return [
            ("GET", f"{TRAINER_API}/clustertrainingruntimes/torch-distributed",
             lambda req: json_response(self.runtime)),
            ("GET", f"{TRAINER_API}/namespaces/{NAMESPACE}/trainingruntimes/torch-distributed",
             lambda req: not_found("trainingruntimes torch-distributed")),  # SDK looks here first
            ("GET", "/api/v1/namespaces/kubeflow-system/configmaps/kubeflow-trainer-public",
             self.version_configmap),
            ("POST", jobs, self.create),
            ("GET", one_job, lambda req: self.if_known(req, self.job_object)),
            ("DELETE", one_job, lambda req: self.if_known(req, self.delete)),
            ("GET", pods, lambda req: json_response(self.pods(req.args["labelSelector"]))),
            ("GET", re.compile(rf"{pods}/[^/]+/log$"), self.stream_log),
            ("GET", re.compile(rf"{pods}/[^/]+$"), self.launcher_pod),
            ("GET", f"/api/v1/namespaces/{NAMESPACE}/events",
             lambda req: json_response({"kind": "EventList", "apiVersion": "v1",
                                        "items": self.events()})),
        ]

    @property
    def requests(self) -> list[tuple[str, str, dict | None]]:
        """(method, path, JSON body or None) of every request received, in order."""
        return [(r.method, r.path, r.get_json(silent=True)) for r, _ in self.server.log]

    # -- plumbing -----------------------------------------------------------------------------
    def close(self) -> None:
        self.closed = True
        for name in list(self.nodes):
            self.stop_nodes(name)

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

    def version_configmap(self, req: Request) -> Response:
        """The public version ConfigMap, which Trainer ships from v2.2.0 on."""
        if self.crd_version < "v2.2":
            return not_found("configmaps kubeflow-trainer-public")
        return json_response({"kind": "ConfigMap", "apiVersion": "v1", "metadata": {
            "name": "kubeflow-trainer-public"}, "data": {
            "kubeflow_trainer_version": self.crd_version}})

    def launcher_pod(self, req: Request) -> Response:
        """The step's own pod (the launcher reads its startTime for the pod's deadline)."""
        name = req.path.rsplit("/", 1)[1]
        if name not in self.launcher_pods:
            return not_found(f"pods {name}")
        return json_response({"kind": "Pod", "apiVersion": "v1", "metadata": {
            "name": name, "namespace": NAMESPACE}, "spec": {"containers": [
                {"name": "main", "image": "stand-in"}]},
            "status": {"phase": "Running", "startTime": self.launcher_pods[name]}})

    # -- the API server: schema, then the webhook ---------------------------------------------
    def create(self, req: Request) -> Response:
        job = req.json
        name = job.get("metadata", {}).get("name", "?")
        unknown = unknown_fields(job, self.crd_version)
        if unknown:
            if req.args.get("fieldValidation") != "Strict":
                return status(500, "InternalError", "stand-in: pruning is not emulated; "
                                                    "send fieldValidation=Strict")
            fields = ", ".join(f'unknown field "{f}"' for f in unknown)
            return status(400, "BadRequest", 'TrainJob in version "v1alpha1" cannot be handled '
                                             f"as a TrainJob: strict decoding error: {fields}")
        invalid = schema_problems(job, self.crd_version)
        if invalid:
            return status(422, "Invalid", f'TrainJob.trainer.kubeflow.org "{name}" is invalid: '
                                          f"[{', '.join(invalid)}]")
        denied = webhook_problems(job, self.runtime)
        if denied:
            return status(403, "Forbidden", f'admission webhook "{WEBHOOK}" denied the '
                                            f"request: [{', '.join(denied)}]")
        return json_response(self.admit(job), 201)

    # -- the Trainer and JobSet controllers, the kubelet ------------------------------------
    def admit(self, job: dict) -> dict:
        name = job["metadata"]["name"]
        job = {**job, "metadata": {**job["metadata"], "namespace": NAMESPACE,
                                   "creationTimestamp": now(), "uid": f"uid-{name}"}}
        self.jobs[name], self.created_at[name] = job, time.monotonic()
        self.nodes[name] = self.start(job) if self.start_nodes else []
        if not self.start_nodes:
            self.unplaced.add(name)
        return job

    def start(self, job: dict) -> list[subprocess.Popen]:
        """One local process per node, with the env Trainer and the kubelet would give it."""
        name, trainer = job["metadata"]["name"], job["spec"]["trainer"]
        nodes, port = trainer["numNodes"], free_port()
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("BATCHSCALE_", "AWS_", "KUBECONFIG", "OMP_"))}
        env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
        env.update(self.container_env(job))
        nproc = nproc_per_node(job, self.runtime)
        if nproc == "auto":  # torchrun's auto on a node whose GPUs are exactly those requested
            nproc = str(gpus_per_node(node_resources(job, self.runtime)))
        procs = []
        for rank in range(nodes):
            pet = {"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": nproc,
                   "PET_NODE_RANK": str(rank), "PET_MASTER_ADDR": "127.0.0.1",
                   "PET_MASTER_PORT": str(port)}
            log = open(self.work_dir / f"{name}-node-{rank}.log", "wb")  # noqa: SIM115
            procs.append(subprocess.Popen(trainer["command"], env={**env, **pet}, stdout=log,
                                          stderr=subprocess.STDOUT, cwd=self.work_dir))
        return procs

    def container_env(self, job: dict) -> dict[str, str]:
        """`.spec.trainer.env`, each entry a value or a Secret reference resolved from the
        stand-in's secrets (as the kubelet would; a pod needs exactly one of the two)."""
        env = {}
        for e in job["spec"]["trainer"].get("env", []):
            assert ("value" in e) != ("valueFrom" in e), f"env {e['name']}: value xor valueFrom"
            if "valueFrom" in e:
                ref = e["valueFrom"]["secretKeyRef"]
                env[e["name"]] = self.secrets[ref["name"]][ref["key"]]
            else:
                env[e["name"]] = e["value"]
        return env

    def stop_nodes(self, name: str) -> None:
        for p in self.nodes.pop(name, []):
            p.kill()
            p.wait()

    def delete(self, name: str) -> dict:
        self.stop_nodes(name)
        self.jobs.pop(name)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success"}

    def exit_codes(self, name: str) -> list[int | None]:
        return [p.poll() for p in self.nodes.get(name, [])]

    def past_deadline(self, name: str) -> bool:
        """trainjob_controller.go reconcileDeadline: creation time + activeDeadlineSeconds."""
        deadline = self.jobs[name]["spec"].get("activeDeadlineSeconds")
        return bool(self.enforce_deadline and deadline and
                    time.monotonic() - self.created_at[name] > deadline)

    def job_object(self, name: str) -> dict:
        codes = self.exit_codes(name)
        job = dict(self.jobs[name])
        finished = codes and all(c is not None for c in codes)
        if name in self.deadline_failed or (not finished and self.past_deadline(name)):
            self.deadline_failed.add(name)
            self.stop_nodes(name)  # the controller deletes the JobSet
            condition = {"type": "Failed", "status": "True", "reason": "DeadlineExceeded",
                         "message": DEADLINE_MESSAGE}
        elif finished:
            failed = [i for i, c in enumerate(codes) if c != 0]
            condition = ({"type": "Failed", "status": "True", "reason": "JobSetFailed",
                          "message": f"node-{failed[0]} exited with status {codes[failed[0]]}"}
                         if failed else {"type": "Complete", "status": "True",
                                         "reason": "JobSetCompleted", "message": "done"})
        else:
            return job
        job["status"] = {"conditions": [{**condition, "lastTransitionTime": now()}]}
        return job

    def pods(self, selector: str) -> dict:
        name = re.search(r"jobset-name=([^,]+)", selector).group(1)
        items = []
        if name in self.jobs and name not in self.deadline_failed:
            nodes = self.jobs[name]["spec"]["trainer"]["numNodes"]
            codes = self.exit_codes(name) or [None] * nodes
            for rank, code in enumerate(codes):
                items.append(self.pod(name, rank, self.phase(name, code)))
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}

    def phase(self, name: str, code: int | None) -> str:
        if name in self.unplaced:
            return "Pending"
        return "Running" if code is None else "Succeeded" if code == 0 else "Failed"

    def pod(self, name: str, rank: int, phase: str) -> dict:
        return {
            "metadata": {"name": f"{name}-node-0-{rank}", "namespace": NAMESPACE,
                         "creationTimestamp": self.jobs[name]["metadata"]["creationTimestamp"],
                         "labels": {"jobset.sigs.k8s.io/jobset-name": name,
                                    "jobset.sigs.k8s.io/replicatedjob-name": "node",
                                    "batch.kubernetes.io/job-completion-index": str(rank)}},
            "spec": {"containers": [{"name": "node", "image": "stand-in"}]},
            "status": {"phase": phase}}

    def events(self) -> list[dict]:
        events = []
        for name in self.jobs:
            if any(c not in (None, 0) for c in self.exit_codes(name)):
                events.append(self.event("TrainJob", name, "JobSetFailed",
                                         "stand-in: a node exited non-zero"))
            elif name in self.unplaced:
                events.append(self.event("Pod", f"{name}-node-0-0", "FailedScheduling",
                                         UNSCHEDULABLE))
        return events

    @staticmethod
    def event(kind: str, name: str, reason: str, message: str) -> dict:
        return {"metadata": {"name": f"{name}.1", "namespace": NAMESPACE},
                "involvedObject": {"kind": kind, "name": name}, "reason": reason,
                "message": message, "firstTimestamp": now(), "type": "Warning"}

    def stream_log(self, req: Request) -> Response:
        """The node's output as it is written; with follow=true until the process ends."""
        name, rank = re.search(r"/pods/(.+)-node-0-(\d+)/log$", req.path).groups()
        if int(rank) >= len(self.nodes.get(name, [])):
            return not_found(f"pods {name}-node-0-{rank}")  # deleted meanwhile
        path, proc = self.work_dir / f"{name}-node-{rank}.log", self.nodes[name][int(rank)]
        return Response(self.follow_file(path, proc), content_type="text/plain")

    def follow_file(self, path: Path, proc: subprocess.Popen) -> Iterator[bytes]:
        """The file as it grows, until the process ends (with `hang_logs`: until the stand-in
        closes, like a connection nobody ends)."""
        with open(path, "rb") as fh:
            while not self.closed:
                chunk = fh.read()
                if chunk:
                    yield chunk
                elif proc.poll() is not None and not self.hang_logs:
                    return
                else:
                    time.sleep(LOG_POLL_S)
