"""Submit and schedule the compiled pipeline on a Kubeflow Pipelines cluster (KFP v2beta1 REST API
through `kfp.Client`).

Credentials never come from the repository, the config or the compiled YAML: a bearer token is
read from an environment variable, or from a service-account token file that the kubelet
rotates (re-read on every request), or there is none (a `kubectl port-forward` to an
unauthenticated KFP).
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from batchscale.config import ExperimentConfig, parse_config
from batchscale.errors import BadInput, BatchscaleError

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
CRON_FIELDS = 6
"""KFP cron has a seconds field first: 'second minute hour day-of-month month day-of-week'."""
RECURRING_RUNS_PAGE_SIZE = 100
KFP_DEFAULT_NAMESPACE = "kubeflow"
ERROR_BODY_CHARS = 500


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

    try:
        yield
    except kfp_server_api.ApiException as err:
        raise KfpError(f"KFP API at {host} answered {err.status} {err.reason}: "
                       f"{_server_message(err.body)}") from None
    except urllib3.exceptions.HTTPError as err:
        raise KfpError(f"cannot reach the KFP API at {host}: {err}") from None


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

    if not host.startswith(("http://", "https://")):
        raise BadInput(f"--host must start with http:// or https://, got {host!r}")
    kwargs: dict = {"host": host, "namespace": namespace or KFP_DEFAULT_NAMESPACE}
    if auth.token:
        kwargs["existing_token"] = auth.token
    elif auth.token_file:
        kwargs["credentials"] = ServiceAccountTokenVolumeCredentials(path=str(auth.token_file))
    class Client(kfp.Client):
        def get_kfp_healthz(self, sleep_duration: int = 0):
            """One attempt instead of kfp's five, 5 s apart: a wrong token or namespace should
            fail at once with KFP's reason (kfp_errors), not after 25 s of logged tracebacks."""
            return self._healthz_api.healthz_service_get_healthz()

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "only works with KFP >= 2.0.0-beta.2"
        return Client(**kwargs)


def check_cron(cron: str) -> str:
    """KFP schedules with 6-field cron (seconds first); a 5-field crontab line would silently
    mean something else, so it is refused."""
    fields = cron.split()
    if len(fields) != CRON_FIELDS:
        raise BadInput(f"--cron: {cron!r} has {len(fields)} fields; KFP needs {CRON_FIELDS} "
                       "(second minute hour day-of-month month day-of-week), e.g. '0 0 2 * * *' "
                       "for 02:00 every day")
    return " ".join(fields)


def scheduled_config(cfg: ExperimentConfig) -> ExperimentConfig:
    """The config of a recurring run: a flagged regression fails the run, so the KFP UI and its
    alerts show it, instead of a green run with a warning nobody reads."""
    data = cfg.model_dump(mode="json")
    data["publish"]["fail_on_regression"] = True
    return parse_config(data, "scheduled config")


def _compiled(cfg: ExperimentConfig, directory: str) -> str:
    from batchscale.pipelines.batchscale_pipeline import compile_pipeline

    return compile_pipeline(cfg, os.path.join(directory, "pipeline.yaml"), for_cluster=True)


def _run_parameters(cfg: ExperimentConfig) -> dict[str, str]:
    return {"config_json": cfg.to_json()}


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
            pipeline_package_path=_compiled(cfg, tmp), params=_run_parameters(cfg),
            enable_caching=False, service_account=_service_account(cfg))


def create_schedule(client, cfg: ExperimentConfig, experiment: str, name: str, cron: str,
                    namespace: str | None = None):
    """A recurring run of `cfg`: one run at a time, no catch-up after a pause (a backlog of
    benchmarks measured at the same moment is noise), caching off, regressions fail the run."""
    cfg = scheduled_config(cfg)
    exp = client.create_experiment(name=experiment, namespace=namespace)
    with tempfile.TemporaryDirectory() as tmp:
        return client.create_recurring_run(
            experiment_id=exp.experiment_id, job_name=name, description=cfg.name,
            cron_expression=check_cron(cron), max_concurrency=MAX_CONCURRENT_RUNS,
            no_catchup=True, params=_run_parameters(cfg),
            pipeline_package_path=_compiled(cfg, tmp), enable_caching=False,
            service_account=_service_account(cfg))


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
