"""`batchscale submit`, `schedule` and `schedules` against a stand-in for the KFP API.

No KFP server can run on our machines, so `StandInKfpApi` stands in for it: pytest-httpserver on
127.0.0.1, answering the few v2beta1 REST calls batchscale makes the way KFP's API server does and
logging every request. The real CLI (a subprocess, with the real kfp.Client) talks to it; the
tests assert method, path, body and the Authorization header of what it sent. A request the
stand-in does not know fails the test (`httpserver.check()` after each test).
"""

from __future__ import annotations

import json
import re
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from pytest_httpserver import HTTPServer
from werkzeug import Request, Response

from batchscale.errors import BadInput
from batchscale.kfp_client import (
    Auth,
    check_host,
    connect,
    resolve_auth,
)
from helpers import TINY_CONFIG, json_response, run_cli, task_config

API = "/apis/v2beta1"
CRON = "0 0 2 * * *"
TOKEN = "stand-in-bearer-token-4242"


class StandInKfpApi:
    """Stand-in for the KFP v2beta1 REST API (no KFP server can run here): keeps experiments and
    recurring runs in memory and answers like the API server; `requests` is what it received."""

    DEFAULT_PAGE_SIZE, MAX_PAGE_SIZE = 20, 200  # KFP backend/src/apiserver/list/list.go

    def __init__(self, server: HTTPServer, required_token: str | None = None) -> None:
        self.server, self.required_token = server, required_token
        self.url = server.url_for("").rstrip("/")
        self.experiments: dict[str, dict] = {}
        self.recurring_runs: dict[str, dict] = {}
        self.ignores_filters = False  # like an old server: lists every recurring run
        self.fail_creates = False  # answer the next recurring-run creations with an error
        routes = [
            ("GET", f"{API}/healthz", lambda req: {"multi_user": False}),
            ("GET", f"{API}/experiments", self._list_experiments),
            ("POST", f"{API}/experiments", self._create_experiment),
            ("POST", f"{API}/runs", lambda req: {**req.json, "run_id": str(uuid.uuid4()),
                                                 "state": "PENDING"}),
            ("POST", f"{API}/recurringruns", self._create_recurring),
            ("GET", f"{API}/recurringruns", self._list_recurring),
            ("POST", re.compile(rf"{API}/recurringruns/[\w-]+:(enable|disable)$"), self._set_mode),
            ("DELETE", re.compile(rf"{API}/recurringruns/[\w-]+$"), self._delete_recurring),
        ]
        for method, path, answer in routes:
            server.expect_request(path, method=method).respond_with_handler(self._checked(answer))

    @property
    def requests(self) -> list[Request]:
        return [request for request, _ in self.server.log]

    def sent(self, method: str, path: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and r.path == path]

    def _checked(self, answer: Callable[[Request], dict]) -> Callable[[Request], Response]:
        """`answer` behind the bearer-token check the API server makes when one is required."""
        def respond(req: Request) -> Response:
            if self.required_token and req.headers.get("Authorization") != \
                    f"Bearer {self.required_token}":
                return json_response({"code": 16, "message":
                                      "Unauthenticated: invalid bearer token"}, 401)
            answered = answer(req)
            return answered if isinstance(answered, Response) else json_response(answered)
        return respond

    def _list_experiments(self, req: Request) -> dict:
        predicate = json.loads(req.args["filter"])["predicates"][0]
        found = [e for e in self.experiments.values()
                 if e["display_name"] == predicate["stringValue"]]
        return {"experiments": found, "total_size": len(found)} if found else {}

    def _create_experiment(self, req: Request) -> dict:
        experiment = {**req.json, "experiment_id": str(uuid.uuid4())}
        self.experiments[experiment["experiment_id"]] = experiment
        return experiment

    def _create_recurring(self, req: Request) -> dict | Response:
        if self.fail_creates:
            return json_response({"code": 13, "message": "Internal error: stand-in failure"},
                                 500)
        job = {**req.json, "recurring_run_id": str(uuid.uuid4()), "status": "ENABLED"}
        self.recurring_runs[job["recurring_run_id"]] = job
        return job

    def _list_recurring(self, req: Request) -> dict:
        """Filtered by experiment and by a display_name EQUALS predicate, paged with an offset
        as the page token, as the API server answers (recurringRuns in camelCase, as KFP's
        proto names it)."""
        found = list(self.recurring_runs.values())
        if req.args.get("experiment_id"):
            found = [r for r in found if r["experiment_id"] == req.args["experiment_id"]]
        if req.args.get("filter") and not self.ignores_filters:
            (predicate,) = json.loads(req.args["filter"])["predicates"]
            assert (predicate["operation"], predicate["key"]) == ("EQUALS", "display_name")
            found = [r for r in found if r["display_name"] == predicate["stringValue"]]
        start = int(req.args.get("page_token") or 0)
        size = min(int(req.args.get("page_size") or self.DEFAULT_PAGE_SIZE), self.MAX_PAGE_SIZE)
        page = {"recurringRuns": found[start:start + size], "total_size": len(found)}
        if start + size < len(found):
            page["next_page_token"] = str(start + size)
        return page

    def _set_mode(self, req: Request) -> dict:
        job_id, action = req.path.rsplit("/", 1)[1].split(":")
        self.recurring_runs[job_id]["mode"] = action.upper()
        return {}

    def _delete_recurring(self, req: Request) -> dict:
        del self.recurring_runs[req.path.rsplit("/", 1)[1]]
        return {}


@pytest.fixture
def kfp_api(httpserver: HTTPServer) -> Iterator[StandInKfpApi]:
    yield StandInKfpApi(httpserver)
    httpserver.check()  # no request the stand-in did not expect, no error in its handlers


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "tiny.yaml").write_text(TINY_CONFIG)
    (tmp_path / "home").mkdir()
    return tmp_path


def kfp_cli(args: list[str], workdir: Path, env: dict | None = None):
    """The real CLI with HOME in the test directory (kfp.Client reads ~/.config/kfp)."""
    base = {"HOME": str(workdir / "home"), "KF_PIPELINES_TOKEN": ""}
    return run_cli(args, cwd=workdir, env={**base, **(env or {})}, timeout_s=120)


def _gate_config(body: dict):
    """The config the run's regression gate is given (compiled into the spec: the run passes
    no parameters)."""
    assert not body["runtime_config"].get("parameters")
    tasks = body["pipeline_spec"]["pipeline_spec"]["root"]["dag"]["tasks"]
    return task_config(tasks["regression-gate"])


def _tasks(body: dict) -> list[dict]:
    spec = body["pipeline_spec"]["pipeline_spec"]
    dags = [spec["root"], *spec["components"].values()]
    return [t for d in dags for t in d.get("dag", {}).get("tasks", {}).values()]


def test_submit_creates_experiment_and_run_with_bearer_token(kfp_api, workdir):
    result = kfp_cli(["submit", "--host", kfp_api.url, "--config", "tiny.yaml",
                      "--experiment", "bench", "--run-name", "nightly-1"], workdir,
                     env={"KF_PIPELINES_TOKEN": TOKEN})
    assert result.returncode == 0, result.stderr
    (exp_req,) = kfp_api.sent("POST", f"{API}/experiments")
    assert exp_req.json["display_name"] == "bench"
    (run_req,) = kfp_api.sent("POST", f"{API}/runs")
    body = run_req.json
    assert body["experiment_id"] == next(iter(kfp_api.experiments))
    assert body["display_name"] == "nightly-1"
    assert _gate_config(body).name == "tiny"
    assert body["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "batchscale"
    assert "kubernetes" in body["pipeline_spec"]["platform_spec"]["platforms"]
    assert not any(t.get("cachingOptions", {}).get("enableCache") for t in _tasks(body))
    assert all(r.headers.get("authorization") == f"Bearer {TOKEN}" for r in kfp_api.requests)
    assert TOKEN not in "".join(r.get_data(as_text=True) for r in kfp_api.requests) \
        + result.stdout
    assert "run_id=" in result.stdout and "s3://mlpipeline/shared/batchscale/" in result.stdout


def test_schedule_creates_one_at_a_time_recurring_run_that_fails_on_regression(
        kfp_api, workdir):
    token_file = workdir / "sa-token"
    token_file.write_text("projected-sa-token-1\n")
    result = kfp_cli(["schedule", "--host", kfp_api.url, "--config", "tiny.yaml",
                      "--cron", CRON, "--token-file", str(token_file)], workdir)
    assert result.returncode == 0, result.stderr
    (req,) = kfp_api.sent("POST", f"{API}/recurringruns")
    body = req.json
    assert body["trigger"] == {"cron_schedule": {"cron": CRON}}
    assert int(body["max_concurrency"]) == 1
    assert body["no_catchup"] is True
    assert body["mode"] == "ENABLE"
    assert body["display_name"] == "batchscale tiny"
    assert body["experiment_id"] in kfp_api.experiments
    assert _gate_config(body).publish.fail_on_regression is True
    # the sweep's trials on one thread, as recurring runs time (its point is to compare)
    tasks = body["pipeline_spec"]["pipeline_spec"]["root"]["dag"]["tasks"]
    assert task_config(tasks["throughput-sweep"]).sweep.threads == 1
    assert "the sweep's trials on 1 thread (sweep.threads)" in result.stdout
    assert not any(t.get("cachingOptions", {}).get("enableCache") for t in _tasks(body))
    assert all(r.headers.get("authorization") == "Bearer projected-sa-token-1"
               for r in kfp_api.requests)


def test_the_runs_pods_use_the_configured_service_account(kfp_api, workdir):
    """kubernetes.service_account reaches both the one-off run and the recurring run: KFP runs
    the pipeline's pods under it (the kubeflow launcher needs its TrainJob rights)."""
    (workdir / "sa.yaml").write_text(TINY_CONFIG + "kubernetes:\n"
                                     "  service_account: batchscale-runner\n")
    submitted = kfp_cli(["submit", "--host", kfp_api.url, "--config", "sa.yaml"], workdir)
    assert submitted.returncode == 0, submitted.stderr
    scheduled = kfp_cli(["schedule", "--host", kfp_api.url, "--config", "sa.yaml",
                         "--cron", CRON], workdir)
    assert scheduled.returncode == 0, scheduled.stderr
    (run_req,) = kfp_api.sent("POST", f"{API}/runs")
    (recurring_req,) = kfp_api.sent("POST", f"{API}/recurringruns")
    assert run_req.json["service_account"] == "batchscale-runner"
    assert recurring_req.json["service_account"] == "batchscale-runner"


def test_schedules_list_pause_resume_delete(kfp_api, workdir):
    created = kfp_cli(["schedule", "--host", kfp_api.url, "--config", "tiny.yaml",
                       "--cron", CRON, "--namespace", "team-a"], workdir)
    assert created.returncode == 0, created.stderr
    (exp_req,) = kfp_api.sent("POST", f"{API}/experiments")
    assert exp_req.json["namespace"] == "team-a"
    (job_id,) = kfp_api.recurring_runs

    listed = kfp_cli(["schedules", "list", "--host", kfp_api.url, "--namespace", "team-a"],
                     workdir)
    assert listed.returncode == 0, listed.stderr
    assert job_id in listed.stdout and CRON in listed.stdout
    # [-1]: `schedule` listed the experiment's recurring runs first, looking for its name
    assert kfp_api.sent("GET", f"{API}/recurringruns")[-1].args.getlist("namespace") == ["team-a"]

    for action, method, suffix, mode in (("pause", "POST", ":disable", "DISABLE"),
                                         ("resume", "POST", ":enable", "ENABLE")):
        # pause as docs/kubeflow.md writes it (the id after --host), resume the other way
        order = ([action, "--host", kfp_api.url, job_id] if action == "pause"
                 else [action, job_id, "--host", kfp_api.url])
        changed = kfp_cli(["schedules", *order], workdir)
        assert changed.returncode == 0, changed.stderr
        assert kfp_api.sent(method, f"{API}/recurringruns/{job_id}{suffix}")
        assert kfp_api.recurring_runs[job_id]["mode"] == mode
    deleted = kfp_cli(["schedules", "delete", job_id, "--host", kfp_api.url], workdir)
    assert deleted.returncode == 0, deleted.stderr
    assert kfp_api.sent("DELETE", f"{API}/recurringruns/{job_id}")
    assert not kfp_api.recurring_runs
    assert not any("authorization" in r.headers for r in kfp_api.requests)


def schedule(kfp_api, workdir: Path, *more: str):
    return kfp_cli(["schedule", "--host", kfp_api.url, "--config", "tiny.yaml", "--cron", CRON,
                    *more], workdir)


def test_a_second_schedule_of_the_same_name_is_refused_naming_it_and_replace(kfp_api, workdir):
    """Two recurring runs of one benchmark would measure at the same moments."""
    assert schedule(kfp_api, workdir).returncode == 0
    (first,) = kfp_api.recurring_runs
    again = schedule(kfp_api, workdir, "--cron", "0 0 3 * * *")
    assert again.returncode == 2, again.stderr
    assert "a recurring run named 'batchscale tiny' already exists in experiment " \
        f"'batchscale' ({first})" in again.stderr
    assert "--replace" in again.stderr and "Traceback" not in again.stderr
    assert list(kfp_api.recurring_runs) == [first]
    assert len(kfp_api.sent("POST", f"{API}/recurringruns")) == 1
    other_name = schedule(kfp_api, workdir, "--name", "nightly-2")
    other_experiment = schedule(kfp_api, workdir, "--experiment", "other")
    assert other_name.returncode == other_experiment.returncode == 0
    assert len(kfp_api.recurring_runs) == 3


def test_replace_pauses_the_old_schedule_creates_the_new_then_deletes_the_old(kfp_api, workdir):
    assert schedule(kfp_api, workdir).returncode == 0
    (old,) = kfp_api.recurring_runs
    replaced = schedule(kfp_api, workdir, "--cron", "0 30 4 * * *", "--replace")
    assert replaced.returncode == 0, replaced.stderr
    (new,) = kfp_api.recurring_runs
    assert new != old and f"replaced {old}" in replaced.stdout
    assert kfp_api.recurring_runs[new]["trigger"] == {"cron_schedule": {"cron": "0 30 4 * * *"}}
    changes = [(r.method, r.path) for r in kfp_api.requests if r.method in ("POST", "DELETE")
               and "recurringruns" in r.path]
    assert changes == [("POST", f"{API}/recurringruns"),
                       ("POST", f"{API}/recurringruns/{old}:disable"),
                       ("POST", f"{API}/recurringruns"),
                       ("DELETE", f"{API}/recurringruns/{old}")]


def test_a_failed_replace_resumes_the_old_schedule(kfp_api, workdir):
    assert schedule(kfp_api, workdir).returncode == 0
    (old,) = kfp_api.recurring_runs
    kfp_api.fail_creates = True
    failed = schedule(kfp_api, workdir, "--replace")
    assert failed.returncode == 1 and "answered 500" in failed.stderr
    assert list(kfp_api.recurring_runs) == [old]
    assert kfp_api.recurring_runs[old]["mode"] == "ENABLE"
    assert kfp_api.sent("POST", f"{API}/recurringruns/{old}:enable")
    assert not kfp_api.sent("DELETE", f"{API}/recurringruns/{old}")


def test_the_name_is_found_on_a_later_page_of_a_server_that_ignores_the_filter(kfp_api,
                                                                              workdir):
    exp_id = str(uuid.uuid4())
    kfp_api.experiments[exp_id] = {"experiment_id": exp_id, "display_name": "batchscale"}
    for i in range(150):
        kfp_api.recurring_runs[f"other-{i}"] = {"recurring_run_id": f"other-{i}",
                                                "display_name": f"other {i}",
                                                "experiment_id": exp_id, "mode": "ENABLE"}
    kfp_api.ignores_filters = True
    assert schedule(kfp_api, workdir, "--name", "other 149").returncode == 2
    pages = kfp_api.sent("GET", f"{API}/recurringruns")
    assert [r.args.get("page_token", "") for r in pages] == ["", "100"]


@pytest.mark.parametrize(("args", "needle"), [
    (["schedule", "--cron", "0 2 * * *"], "--cron: '0 2 * * *' has 5 fields"),
    (["schedule", "--cron", "0 0 0 31 2 *"], "never runs"),
    (["schedule", "--cron", "0 0 25 * * *"], "hour field '25'"),
    (["submit", "--token-env", "NO_SUCH_TOKEN_VAR"], "NO_SUCH_TOKEN_VAR is not set"),
    (["schedules", "pause"], "give the recurring run id"),
])
def test_bad_input_exits_2_before_any_request(kfp_api, workdir, args, needle):
    result = kfp_cli([*args, "--host", kfp_api.url, *(["--config", "tiny.yaml"]
                                                      if args[0] != "schedules" else [])],
                     workdir)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr
    assert not kfp_api.requests


def test_rejected_token_gives_kfps_reason_without_traceback_or_token(httpserver, workdir):
    api = StandInKfpApi(httpserver, required_token=TOKEN)
    result = kfp_cli(["submit", "--host", api.url, "--config", "tiny.yaml"], workdir,
                     env={"KF_PIPELINES_TOKEN": "wrong-token-1313"})
    assert result.returncode == 1
    assert f"KFP API at {api.url} answered 401" in result.stderr
    assert "Unauthenticated: invalid bearer token" in result.stderr
    assert "Traceback" not in result.stderr and "wrong-token-1313" not in result.stderr
    assert not api.sent("POST", f"{API}/runs")
    httpserver.check()


def test_unreachable_host_is_named(workdir):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    result = kfp_cli(["schedules", "list", "--host", closed], workdir)
    assert result.returncode == 1
    # the system's reason, not urllib3's pool and retry wrapping
    assert f"cannot reach the KFP API at {closed}: Connection refused;" in result.stderr
    assert "HTTPConnectionPool" not in result.stderr and "Max retries" not in result.stderr
    assert "Traceback" not in result.stderr


def test_auth_order_explicit_file_then_token_env_then_in_cluster_token(tmp_path):
    sa_token = tmp_path / "serviceaccount-token"
    sa_token.write_text("sa")
    in_cluster = (tmp_path / "missing", sa_token)
    env = {"KF_PIPELINES_TOKEN": "from-env", "MY_TOKEN": "mine"}
    assert resolve_auth(token_file=sa_token, environ=env).token_file == sa_token
    assert resolve_auth(environ=env, in_cluster_paths=in_cluster).token == "from-env"
    assert resolve_auth("MY_TOKEN", environ=env).token == "mine"
    assert resolve_auth(environ={}, in_cluster_paths=in_cluster).token_file == sa_token
    assert resolve_auth(environ={}, in_cluster_paths=()).source == "none"
    assert "from-env" not in resolve_auth(environ=env).describe()
    with pytest.raises(BadInput, match="--token-file"):
        resolve_auth(token_file=tmp_path / "missing")


# ----------------------------------------------------------------------------------- --host
PASSWORD = "PASSWORD-never-echoed-53"


@pytest.mark.parametrize(("host", "needle"), [
    (f"http://admin:{PASSWORD}@127.0.0.1:8080", "carries credentials"),
    ("http://127.0.0.1:99999", "not a valid URL"),
    ("http://[::1", "not a valid URL"),
    ("http://", "must look like"),
    ("ftp://127.0.0.1", "must start with http:// or https://"),
    ("127.0.0.1:8080", "must start with http:// or https://"),
    ("http://127.0.0.1:8080/pipeline?x=1", "query or fragment"),
])
def test_bad_hosts_are_refused_before_any_request(host, needle):
    with pytest.raises(BadInput, match=needle) as err:
        connect(host, Auth())
    assert PASSWORD not in str(err.value)


def test_the_cli_refuses_a_host_with_credentials_without_printing_them(workdir):
    result = kfp_cli(["schedules", "list", "--host", f"http://admin:{PASSWORD}@127.0.0.1:9"],
                     workdir)
    assert result.returncode == 2 and "carries credentials" in result.stderr
    assert PASSWORD not in result.stdout + result.stderr
    assert "Traceback" not in result.stderr


def test_a_host_with_a_proxy_path_is_accepted():
    """A path is allowed: KFP behind `kubectl proxy` or an ingress lives below one."""
    for host in ("http://127.0.0.1:8001/api/v1/namespaces/kubeflow/services/ml-pipeline:http/"
                 "proxy", "https://kubeflow.example.com/pipeline", "http://[::1]:8080"):
        assert check_host(host) == host
