"""Submit and schedule the compiled pipeline on a Kubeflow Pipelines cluster (KFP v2beta1 REST API
through `kfp.Client`).

Credentials never come from the repository, the config or the compiled YAML: a bearer token is
read from an environment variable, or from a service-account token file that the kubelet
rotates (re-read on every request), or there is none (a `kubectl port-forward` to an
unauthenticated KFP).

Every request has a timeout (the generated client has none by default and waits forever on a
host that accepts the connection but never answers): the first one, KFP's healthz, is the
connection check with short ones (PREFLIGHT_TIMEOUT_S); the others get REQUEST_TIMEOUT_S.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from batchscale.config import ExperimentConfig, parse_config
from batchscale.cron import check_cron
from batchscale.deadline import DeadlinePassed, call_within
from batchscale.errors import BadInput, BatchscaleError
from batchscale.names import check_endpoint, quote, redact_url

TOKEN_ENV = "KF_PIPELINES_TOKEN"
"""Default environment variable holding a bearer token for the KFP API."""
IN_CLUSTER_TOKEN_PATHS = (
    Path("/var/run/secrets/kubeflow/pipelines/token"),
    Path("/var/run/secrets/kubernetes.io/serviceaccount/token"),
)
"""Tried in order inside a pod: the projected token with the KFP audience (what multi-user KFP
checks), then the pod's default service-account token."""
MAX_CONCURRENT_RUNS = 1
"""A recurring benchmark never overlaps itself: two runs on one GPU pool distort each other."""
RECURRING_RUNS_PAGE_SIZE = 100
MAX_LIST_PAGES = 100
"""Pages read when looking for a recurring run by name: a server that keeps answering with a
next page token is refused after 10,000 recurring runs instead of read forever."""
KFP_DEFAULT_NAMESPACE = "kubeflow"
ERROR_BODY_CHARS = 500
PREFLIGHT_TIMEOUT_S = (5, 10)
"""(connect, read) seconds of the connection check, KFP's healthz, made once with at most one
retry of the connection and none of the read: a silent host fails it within 10 s, one that does
not accept the connection within 2 × 5 s, one that trickles its answer within 2 × 5 + 10 s
(`request_deadline_s`). Stated in docs/kubeflow.md ("Submit a run")."""
CONNECT_ATTEMPTS = 2
REQUEST_TIMEOUT_S = (10, 120)
"""(connect, read) seconds of every other request: creating a run uploads the whole pipeline
spec, and the API server may be slow while it stores it."""


class KfpError(BatchscaleError):
    """The KFP API refused a request or could not be reached."""


def _server_message(body: str | bytes | None) -> str:
    """KFP's own explanation from an error body ({"code": ..., "message": ...}), else the body."""
    try:
        return str(json.loads(body)["message"])
    except (TypeError, ValueError, KeyError):
        return str(body or "")[:ERROR_BODY_CHARS]


@contextlib.contextmanager
def kfp_errors(host: str) -> Iterator[None]:
    """Turn the generated client's exceptions into one message naming the host and KFP's reason
    (401/403: the token; 404: the namespace or id), instead of a traceback."""
    import kfp_server_api
    import urllib3

    host = redact_url(host)
    try:
        yield
    except kfp_server_api.ApiException as err:
        raise KfpError(redact_url(f"KFP API at {host} answered {err.status} {err.reason}: "
                                  f"{_server_message(err.body)}")) from None
    except urllib3.exceptions.HTTPError as err:
        raise KfpError(redact_url(f"cannot reach the KFP API at {host}: {network_reason(err)}; "
                                  "check --host and that the API answers there")) from None


def network_reason(err: BaseException) -> str:
    """What went wrong underneath urllib3's retry and pool wrapping, in the system's words
    ("Connection refused", "Name or service not known"), else urllib3's own message."""
    cause = getattr(err, "reason", None) or err
    for inner in (cause, cause.__cause__, cause.__context__):
        if isinstance(inner, OSError) and inner.strerror:
            return inner.strerror
    text = str(cause)
    return text.split("Failed to establish a new connection: ")[-1]


def check_host(host: str) -> str:
    """--host: http(s)://host[:port], optionally with a path (a proxy in front of KFP), never
    with credentials, a query or a fragment; the authority is checked by batchscale.names."""
    if isinstance(host, str) and "@" in host:  # first: urlsplit would quote parts of it
        raise BadInput(f"--host {quote(host)} carries credentials; give KFP a token with "
                       f"${TOKEN_ENV}, --token-env or --token-file, never in the URL")
    if not isinstance(host, str) or not host.startswith(("http://", "https://")):
        raise BadInput(f"--host must start with http:// or https://, got {quote(host)}")
    try:
        parts = urlsplit(host)
    except ValueError as err:
        raise BadInput(f"--host {quote(host)} is not a valid URL: {err}") from None
    check_endpoint(f"{parts.scheme}://{parts.netloc}", "--host")
    if parts.query or parts.fragment:
        raise BadInput(f"--host {quote(host)} must not have a query or fragment")
    return host


@functools.cache
def _bounded_rest_class():
    """kfp_server_api's REST client with a timeout on every request and few retries; timeouts
    become a KfpError naming the host and the wait."""
    import kfp_server_api.rest
    import urllib3

    class BoundedRest(kfp_server_api.rest.RESTClientObject):
        def request(self, method, url, *args, _request_timeout=None, **kwargs):
            timeout = _request_timeout or REQUEST_TIMEOUT_S
            deadline_s = request_deadline_s(timeout)

            def send():
                return super(BoundedRest, self).request(method, url, *args,
                                                        _request_timeout=timeout, **kwargs)

            try:
                return call_within(send, deadline_s, "kfp-request")
            except urllib3.exceptions.HTTPError as err:
                raise _timeout_error(err, url, timeout) or err from None
            except DeadlinePassed:
                raise KfpError(f"KFP API at {_host_of(url)} did not complete a request within "
                               f"{deadline_s:g} s (it answers, but too slowly); check the host "
                               "and the network to it") from None

    return BoundedRest


def request_deadline_s(timeout: tuple[int, int]) -> float:
    """The whole of one request, attempts and bytes together: every connection attempt's
    timeout and one read's (a server that trickles its answer is cut off here)."""
    connect_s, read_s = timeout
    return CONNECT_ATTEMPTS * connect_s + read_s


def _host_of(url: str) -> str:
    parts = urlsplit(url)
    return redact_url(f"{parts.scheme}://{parts.netloc}")


def _timeout_error(err: Exception, url: str, timeout: tuple[int, int]) -> KfpError | None:
    """A KfpError naming the host and the wait, if `err` is a timeout (maybe after retries)."""
    import urllib3

    cause = getattr(err, "reason", None) or err
    host = _host_of(url)
    if isinstance(cause, urllib3.exceptions.NewConnectionError):  # refused: not a wait
        return None
    if isinstance(cause, urllib3.exceptions.ConnectTimeoutError):
        return KfpError(f"KFP API at {host} did not accept a connection within {timeout[0]} s "
                        f"({CONNECT_ATTEMPTS} attempts)")
    if isinstance(cause, urllib3.exceptions.ReadTimeoutError):
        return KfpError(f"KFP API at {host} accepted the connection but did not answer within "
                        f"{timeout[1]} s")
    return None


def _bound_requests(api_client) -> None:
    """Give every request of `api_client` a timeout (REQUEST_TIMEOUT_S unless the call names
    one) and at most one retry of a connection, none of an unanswered request."""
    import urllib3

    bounded = _bounded_rest_class()
    if isinstance(api_client.rest_client, bounded):
        return
    api_client.configuration.retries = urllib3.Retry(
        total=None, connect=CONNECT_ATTEMPTS - 1, read=0, status=0, other=0, redirect=5)
    api_client.rest_client = bounded(api_client.configuration)


@dataclass(frozen=True)
class Auth:
    """How the client authenticates; `describe()` names the source, never the token."""

    token: str | None = field(default=None, repr=False)  # never in a log or traceback
    token_file: Path | None = None
    source: str = "none"

    def describe(self) -> str:
        return f"auth: {self.source}"


def resolve_auth(token_env: str | None = None, token_file: str | Path | None = None,
                 environ: Mapping[str, str] = os.environ,
                 in_cluster_paths: tuple[Path, ...] = IN_CLUSTER_TOKEN_PATHS) -> Auth:
    """Pick the credentials: an explicit token file, then the token variable (`token_env`, or
    KF_PIPELINES_TOKEN when not named), then an in-cluster token file, else none. A source the
    user named explicitly must exist."""
    if token_file is not None:
        path = Path(token_file)
        if not path.is_file():
            raise BadInput(f"--token-file: {path} does not exist or is not a file")
        return Auth(token_file=path, source=f"token file {path}")
    name = token_env or TOKEN_ENV
    if environ.get(name):
        return Auth(token=environ[name], source=f"bearer token from ${name}")
    if token_env:
        raise BadInput(f"--token-env: environment variable {token_env} is not set or empty")
    for path in in_cluster_paths:
        if path.is_file():
            return Auth(token_file=path, source=f"in-cluster token {path}")
    return Auth()


def connect(host: str, auth: Auth, namespace: str | None = None):
    """A kfp.Client for `host` with `auth`. A token file goes through KFP's own credentials class,
    which re-reads the file before each request (projected tokens expire within hours)."""
    import kfp
    from kfp.client.set_volume_credentials import ServiceAccountTokenVolumeCredentials

    kwargs: dict = {"host": check_host(host), "namespace": namespace or KFP_DEFAULT_NAMESPACE}
    if auth.token:
        kwargs["existing_token"] = auth.token
    elif auth.token_file:
        kwargs["credentials"] = ServiceAccountTokenVolumeCredentials(path=str(auth.token_file))

    class Client(kfp.Client):
        healthy = False

        def get_kfp_healthz(self, sleep_duration: int = 0):
            """The connection check, also made by kfp.Client's constructor: one attempt with
            PREFLIGHT_TIMEOUT_S instead of kfp's five, 5 s apart, and no timeout; a wrong token
            or namespace fails at once with KFP's reason (kfp_errors)."""
            _bound_requests(self._healthz_api.api_client)
            answer = self._healthz_api.healthz_service_get_healthz(
                _request_timeout=PREFLIGHT_TIMEOUT_S)
            self.healthy = True
            return answer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "only works with KFP >= 2.0.0-beta.2"
        client = Client(**kwargs)
    if not client.healthy:  # the constructor skips healthz when ~/.config/kfp names a namespace
        client.get_kfp_healthz()
    return client


SCHEDULED_IDLE_WAIT_S = 120.0
"""A recurring run's sweep.idle_wait_s at least."""


def scheduled_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config of a recurring run: a confirmed regression fails the run, so the KFP UI and
    its alerts show it, instead of a green run with a warning nobody reads; a sweep disturbed
    by a busy node does not (it publishes, unjudged, with a warning): it is not a regression.
    No one waits for a recurring run, so before re-measuring a disturbed row it waits longer for
    the neighbour to go (SCHEDULED_IDLE_WAIT_S). Its point is to compare with the last run, so
    its trials run on one thread unless the config names a count (sweep.threads: on a shared
    virtual machine two threads swung whole sweeps between two speeds, and the check missed
    its goals where one thread met them; docs/sweep.md)."""
    data = cfg.model_dump(mode="json")
    data["publish"]["fail_on_regression"] = True
    data["sweep"]["unstable_fails"] = False
    data["sweep"]["idle_wait_s"] = max(data["sweep"]["idle_wait_s"], SCHEDULED_IDLE_WAIT_S)
    data["sweep"]["threads"] = data["sweep"]["threads"] or 1
    return parse_config(data, "scheduled config")


def _compiled(cfg: ExperimentConfig, directory: str) -> str:
    from batchscale.pipelines.batchscale_pipeline import compile_pipeline

    return compile_pipeline(cfg, os.path.join(directory, "pipeline.yaml"), for_cluster=True)


def _service_account(cfg: ExperimentConfig) -> str | None:
    return cfg.kubernetes.service_account or None


def submit_run(client, cfg: ExperimentConfig, experiment: str, run_name: str,
               namespace: str | None = None):
    """Compile `cfg` for the cluster, then create one run in `experiment` (created if missing)
    with the spec inline; caching is off for the whole run."""
    exp = client.create_experiment(name=experiment, namespace=namespace)
    with tempfile.TemporaryDirectory() as tmp:
        return client.run_pipeline(
            experiment_id=exp.experiment_id, job_name=run_name,
            pipeline_package_path=_compiled(cfg, tmp), params={},
            enable_caching=False, service_account=_service_account(cfg))


def create_schedule(client, cfg: ExperimentConfig, experiment: str, name: str, cron: str,
                    namespace: str | None = None, replace: bool = False):
    """A recurring run of `cfg`: one run at a time, no catch-up after a pause (a backlog of
    benchmarks measured at the same moment is noise), caching off, regressions fail the run.
    One per name in an experiment: a second would measure alongside the first (max_concurrency
    holds per recurring run), so an existing one is refused, or with `replace` swapped for the
    new one (the v2beta1 API has no update). Returns (the new one, the ids it replaced)."""
    cfg, cron = scheduled_config(cfg), check_cron(cron)
    exp = client.create_experiment(name=experiment, namespace=namespace)
    existing = find_schedules(client, exp.experiment_id, name)
    if existing and not replace:
        ids = ", ".join(r.recurring_run_id for r in existing)
        raise BadInput(f"a recurring run named {quote(name)} already exists in experiment "
                       f"{quote(experiment)} ({ids}); a second one would run its benchmarks "
                       "alongside it. Use --replace to swap it for this config, or --name to "
                       "schedule another one (see `batchscale schedules list`)")
    with tempfile.TemporaryDirectory() as tmp:
        create = functools.partial(
            client.create_recurring_run, experiment_id=exp.experiment_id, job_name=name,
            description=cfg.name, cron_expression=cron, max_concurrency=MAX_CONCURRENT_RUNS,
            no_catchup=True, params={},
            pipeline_package_path=_compiled(cfg, tmp), enable_caching=False,
            service_account=_service_account(cfg))
        return _swap(client, existing, create), [r.recurring_run_id for r in existing]


def find_schedules(client, experiment_id: str, name: str) -> list:
    """The recurring runs named `name` in the experiment, every page (KFP filters by name
    server-side; the name is compared again in case a server ignores the filter)."""
    by_name = json.dumps({"predicates": [{"operation": "EQUALS", "key": "display_name",
                                          "stringValue": name}]})
    found, token = [], ""
    for _ in range(MAX_LIST_PAGES):
        page = client.list_recurring_runs(page_token=token, page_size=RECURRING_RUNS_PAGE_SIZE,
                                          experiment_id=experiment_id, filter=by_name)
        found += [r for r in page.recurring_runs or [] if r.display_name == name]
        token = page.next_page_token
        if not token:
            return found
    raise KfpError(f"the recurring runs of experiment {experiment_id} did not end after "
                   f"{MAX_LIST_PAGES} pages of {RECURRING_RUNS_PAGE_SIZE}")


def _swap(client, old: list, create):
    """Pause the old recurring runs, create the new one, then delete the old ones: never two
    schedules that could both start a run, and a failed create resumes the old ones as they
    were."""
    paused = [r.recurring_run_id for r in old if r.mode != "DISABLE"]
    for recurring_run_id in paused:
        client.disable_recurring_run(recurring_run_id)
    try:
        new = create()
    except BaseException:
        for recurring_run_id in paused:
            client.enable_recurring_run(recurring_run_id)
        raise
    for r in old:
        client.delete_recurring_run(r.recurring_run_id)
    return new


def list_schedules(client, namespace: str | None = None) -> list:
    """All recurring runs visible to the caller (one page of up to 100)."""
    response = client.list_recurring_runs(page_size=RECURRING_RUNS_PAGE_SIZE,
                                          namespace=namespace)
    return list(response.recurring_runs or [])


def schedule_line(recurring_run) -> str:
    """One row of `batchscale schedules list`."""
    trigger = recurring_run.trigger
    cron = trigger.cron_schedule.cron if trigger and trigger.cron_schedule else "-"
    return (f"{recurring_run.recurring_run_id}  {recurring_run.mode or '-':8s}  {cron:16s}  "
            f"{recurring_run.display_name}")


def change_schedule(client, action: str, recurring_run_id: str) -> None:
    """pause, resume or delete one recurring run."""
    calls = {"pause": client.disable_recurring_run, "resume": client.enable_recurring_run,
             "delete": client.delete_recurring_run}
    calls[action](recurring_run_id)
