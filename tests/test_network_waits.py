"""Every network wait before work is bounded, and a peer that is not what it should be is named.

The peers are local sockets on 127.0.0.1 only: one that accepts connections and never answers,
one whose accept queue is full (connections are never accepted), and a plain web server
(Python's http.server) given as the S3 endpoint. The bounds asserted are the ones the README
states; the margins are generous (2 × bound + 5 s) because a loaded test machine may start
slowly, while a missing timeout would wait forever (or 6 × 60 s). So the file runs in the
parallel phase beside other tests: its waits are sleeps, and a neighbour's load adds seconds of
start-up, far inside the margins. Marked `waits`: `make test` runs it in a third process beside
the two parallel workers, since it spends most of its two minutes asleep.
"""

from __future__ import annotations

import functools
import http.server
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchscale.convergence.trainjob_wait import job_events, read_job
from batchscale.errors import BatchscaleError, StoreError
from batchscale.kfp_client import (
    CONNECT_ATTEMPTS,
    PREFLIGHT_TIMEOUT_S,
    Auth,
    KfpError,
    connect,
    kfp_errors,
    request_deadline_s,
)
from batchscale.lake.lake import read_lake_table
from batchscale.storage import PREFLIGHT_WAITS, ObjectStore, S3Settings
from helpers import TINY_CONFIG, run_cli

pytestmark = pytest.mark.waits

SECRET = "sekrit-never-printed-77"
KEYS = {"AWS_ACCESS_KEY_ID": "key-id", "AWS_SECRET_ACCESS_KEY": SECRET}
BACKOFF_S = 1.0
"""botocore's standard retry mode sleeps less than 1 s before its second attempt."""
S3_SILENT_BOUND_S = PREFLIGHT_WAITS.attempts * PREFLIGHT_WAITS.read_s + BACKOFF_S
S3_UNACCEPTED_BOUND_S = PREFLIGHT_WAITS.attempts * PREFLIGHT_WAITS.connect_s + BACKOFF_S
KFP_SILENT_BOUND_S = PREFLIGHT_TIMEOUT_S[1]
SERVER_LIFETIME_S = 300.0
"""A stand-in never outlives a test by more than this, even if the test hangs."""


def margin(bound_s: float) -> float:
    return 2 * bound_s + 5


@pytest.fixture
def silent_endpoint() -> Iterator[str]:
    """http://127.0.0.1:PORT of a socket that accepts every connection and never answers."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=16)
    listener.settimeout(0.2)
    stop = threading.Event()
    held: list[socket.socket] = []

    def accept_and_hold() -> None:
        deadline = time.monotonic() + SERVER_LIFETIME_S
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept_and_hold, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in [*held, listener]:
        conn.close()


@pytest.fixture
def unaccepting_endpoint() -> Iterator[str]:
    """http://127.0.0.1:PORT whose accept queue is full: Linux drops further SYNs, so a client's
    connect() waits until its own timeout."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=0)
    address = listener.getsockname()
    fillers = []
    for _ in range(4):  # backlog 0 still queues one or two; the rest fill it for sure
        filler = socket.socket()
        filler.setblocking(False)
        filler.connect_ex(address)
        fillers.append(filler)
    time.sleep(0.2)
    yield f"http://127.0.0.1:{address[1]}"
    for sock in [*fillers, listener]:
        sock.close()


TRICKLE_EVERY_S = 0.2
"""The trickling stand-in sends one byte this often: far inside any read timeout."""


@pytest.fixture
def trickling_endpoint() -> Iterator[str]:
    """http://127.0.0.1:PORT of a server that answers every request with a status line and then
    a header line one byte at a time, never ending it: each read gets bytes in time, the answer
    never completes."""
    listener = socket.create_server(("127.0.0.1", 0), backlog=16)
    listener.settimeout(0.2)
    stop = threading.Event()

    def trickle(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\nx-padding: ")
                while not stop.wait(TRICKLE_EVERY_S):
                    conn.sendall(b"a")
            except OSError:
                return

    def serve() -> None:
        deadline = time.monotonic() + SERVER_LIFETIME_S
        while not stop.is_set() and time.monotonic() < deadline:
            try:
                conn = listener.accept()[0]
            except TimeoutError:
                continue
            threading.Thread(target=trickle, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    listener.close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 -- the base class's name
        pass


@pytest.fixture
def web_server(tmp_path: Path) -> Iterator[str]:
    """A plain web server on 127.0.0.1 serving a folder that has a `batchscale` directory (it
    answers 301 for the bucket, which botocore would follow until the stack overflows)."""
    root = tmp_path / "www"
    (root / "batchscale").mkdir(parents=True)
    (root / "index.html").write_text("<html><body>hello</body></html>")
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def s3_env(endpoint: str, bucket: str = "batchscale") -> dict:
    return {"BATCHSCALE_S3_ENDPOINT": endpoint, "BATCHSCALE_S3_BUCKET": bucket, **KEYS}


def timed_cli(args: list[str], cwd: Path, env: dict, timeout_s: float):
    started = time.monotonic()
    result = run_cli(args, cwd=cwd, env=env, timeout_s=timeout_s)
    return result, time.monotonic() - started


def assert_clean_refusal(result, cwd: Path, before: set[Path]) -> None:
    """Exit 2, a message and no traceback, no secret, nothing written."""
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert SECRET not in result.stdout + result.stderr
    assert set(cwd.rglob("*")) == before


# ------------------------------------------------------------------------------------- S3


def test_report_against_a_silent_s3_endpoint_fails_within_the_stated_bound(
        silent_endpoint, tmp_path):
    before = set(tmp_path.rglob("*"))
    result, elapsed = timed_cli(["report", "--run-id", "20260101T000000Z-x", "--out", "r.html"],
                                tmp_path, s3_env(silent_endpoint),
                                timeout_s=margin(S3_SILENT_BOUND_S) + 30)
    assert_clean_refusal(result, tmp_path, before)
    assert (f"S3 endpoint {silent_endpoint} accepted the connection but did not answer within "
            f"{PREFLIGHT_WAITS.read_s:g} s ({PREFLIGHT_WAITS.attempts} attempts)"
            in result.stderr)
    assert elapsed < margin(S3_SILENT_BOUND_S)


def test_an_endpoint_that_never_accepts_fails_the_check_within_the_stated_bound(
        unaccepting_endpoint):
    store = ObjectStore(S3Settings(unaccepting_endpoint, "batchscale", "p", "id", SECRET))
    started = time.monotonic()
    with pytest.raises(StoreError) as err:
        store.check()
    elapsed = time.monotonic() - started
    assert f"S3 endpoint {unaccepting_endpoint} did not accept a connection within " \
           f"{PREFLIGHT_WAITS.connect_s:g} s" in str(err.value)
    assert elapsed < margin(S3_UNACCEPTED_BOUND_S)


def test_a_trickling_s3_endpoint_is_cut_off_at_the_calls_deadline(trickling_endpoint):
    """Bytes arrive every 0.2 s, inside the 2 s read timeout, so only the whole call's deadline
    can end it: the check, a read, a listing, a write and a lake read through pyarrow's S3
    filesystem each stop within it, naming the endpoint and the bound."""
    deadline_s = 3.0
    store = ObjectStore(S3Settings(trickling_endpoint, "batchscale", "p", "id", SECRET),
                        max_attempts=0, read_timeout_s=2.0, deadline_s=deadline_s)
    calls = {"check": store.check, "get": lambda: store.get_bytes("k"), "list": store.list,
             "put": lambda: store.put_bytes("k", b"x")}
    for name, call in calls.items():
        started = time.monotonic()
        with pytest.raises(StoreError) as err:
            call()
        elapsed = time.monotonic() - started
        assert (f"S3 endpoint {trickling_endpoint} did not complete a request within "
                f"{deadline_s:g} s" in str(err.value)), name
        assert elapsed < margin(deadline_s), name
        assert SECRET not in str(err.value)
    # pyarrow's S3 client (the lake's reads) gives up on a stalled transfer by itself; the
    # store's deadline bounds it either way, and its error names the endpoint.
    started = time.monotonic()
    with pytest.raises(StoreError, match=f"from S3 endpoint {trickling_endpoint} failed"):
        read_lake_table(store, "sweep")
    assert time.monotonic() - started < margin(deadline_s)


@pytest.mark.parametrize("bucket", ["batchscale", "not-served-here"])
def test_a_plain_web_server_is_named_as_not_s3(web_server, tmp_path, bucket):
    """301 for a folder named like the bucket, 404 HTML otherwise: neither is "bucket does not
    exist"."""
    before = set(tmp_path.rglob("*"))
    result = run_cli(["history", "--workload", "digits-mlp"], cwd=tmp_path,
                     env=s3_env(web_server, bucket), timeout_s=120)
    assert_clean_refusal(result, tmp_path, before)
    assert f"S3 endpoint {web_server} does not speak S3" in result.stderr
    assert "does not exist" not in result.stderr
    assert "BATCHSCALE_S3_ENDPOINT" in result.stderr


def test_transfers_from_a_web_server_fail_with_a_message_not_a_recursion(web_server):
    store = ObjectStore(S3Settings(web_server, "batchscale", "", "id", SECRET), max_attempts=1)
    for call in (lambda: store.get_bytes("index.html"), lambda: store.exists("x"),
                 lambda: store.put_bytes("x", b"x")):
        with pytest.raises(StoreError, match="does not speak S3"):
            call()


# ------------------------------------------------------------------------------------ KFP


def test_submit_to_a_silent_kfp_host_fails_within_the_stated_bound(silent_endpoint, tmp_path):
    """Every KFP command connects through the same client (`schedules list` too)."""
    (tmp_path / "tiny.yaml").write_text(TINY_CONFIG)
    (tmp_path / "home").mkdir()
    before = set(tmp_path.rglob("*"))
    result, elapsed = timed_cli(["submit", "--config", "tiny.yaml", "--host", silent_endpoint],
                                tmp_path,
                                {"HOME": str(tmp_path / "home"), "KF_PIPELINES_TOKEN": SECRET},
                                timeout_s=margin(KFP_SILENT_BOUND_S) + 60)
    assert result.returncode == 1, result.stderr  # KfpError, like an unreachable host
    assert "Traceback" not in result.stderr and SECRET not in result.stderr
    assert (f"KFP API at {silent_endpoint} accepted the connection but did not answer within "
            f"{PREFLIGHT_TIMEOUT_S[1]} s" in result.stderr)
    assert set(tmp_path.rglob("*")) == before
    assert elapsed < margin(KFP_SILENT_BOUND_S) + 10  # + the kfp import, a few seconds


def test_a_trickling_kfp_host_is_cut_off_at_the_requests_deadline(trickling_endpoint):
    """Bytes arrive inside every read timeout, the answer never completes: the connection
    check still ends at its whole-request deadline, naming the host."""
    bound = request_deadline_s(PREFLIGHT_TIMEOUT_S)
    started = time.monotonic()
    with pytest.raises(KfpError) as err, kfp_errors(trickling_endpoint):
        connect(trickling_endpoint, Auth())
    elapsed = time.monotonic() - started
    assert (f"KFP API at {trickling_endpoint} did not complete a request within {bound:g} s"
            in str(err.value))
    assert elapsed < margin(bound)


def test_a_kfp_host_that_never_accepts_fails_within_the_stated_bound(unaccepting_endpoint):
    started = time.monotonic()
    with pytest.raises(KfpError) as err, kfp_errors(unaccepting_endpoint):
        connect(unaccepting_endpoint, Auth())
    elapsed = time.monotonic() - started
    assert (f"KFP API at {unaccepting_endpoint} did not accept a connection within "
            f"{PREFLIGHT_TIMEOUT_S[0]} s ({CONNECT_ATTEMPTS} attempts)" in str(err.value))
    assert elapsed < margin(CONNECT_ATTEMPTS * PREFLIGHT_TIMEOUT_S[0])


def _kubeconfig(path: Path, server: str) -> Path:
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "ns"}}],
    }))
    return path


def test_a_trickling_kubernetes_api_is_cut_off_at_each_calls_deadline(
    trickling_endpoint, tmp_path, monkeypatch
):
    """The TrainJob launcher's requests (the real kubeflow SDK and kubernetes client) against
    an API server that trickles its answers: each ends at its own deadline, naming the server;
    starting the client or creating the job fails the step, deleting it only warns."""
    import kubernetes.client
    from kubeflow_trainer_api import models

    from batchscale.convergence import trainjob

    bound = 2.0
    late = f"the Kubernetes API at {trickling_endpoint} did not"
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "trickle", trickling_endpoint)))
    started = time.monotonic()
    with pytest.raises(BatchscaleError, match=f"{late} answer the Trainer client's first"):
        trainjob.trainer_client(None, bound)
    assert time.monotonic() - started < margin(bound)

    # A client started against a closed port (its first read fails at once, with a warning),
    # then pointed at the trickling server: every later request goes there.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        nobody = f"http://127.0.0.1:{closed.getsockname()[1]}"
    monkeypatch.setenv("KUBECONFIG", str(_kubeconfig(tmp_path / "closed", nobody)))
    client = trainjob.trainer_client(None, bound)
    settings = kubernetes.client.Configuration.get_default_copy()
    settings.host = trickling_endpoint
    settings.refresh_api_key_hook = None  # it reloads the kubeconfig, host included
    api = kubernetes.client.ApiClient(settings)
    client.backend.core_api = kubernetes.client.CoreV1Api(api)
    client.backend.custom_api = kubernetes.client.CustomObjectsApi(api)
    job = models.TrainerV1alpha1TrainJob(
        api_version="trainer.kubeflow.org/v1alpha1", kind="TrainJob",
        metadata=models.IoK8sApimachineryPkgApisMetaV1ObjectMeta(name="bs-trickle"))
    started = time.monotonic()
    with pytest.raises(BatchscaleError) as err:
        trainjob.create_job(client, job, bound)
    assert (f"could not create TrainJob bs-trickle: {late} complete creating TrainJob "
            f"bs-trickle within {bound:g} s") in str(err.value)
    with pytest.raises(BatchscaleError, match="could not read the training runtime"):
        trainjob.torch_runtime(client, "torch-distributed", bound)
    assert trainjob.delete_job(client, "bs-trickle", bound) is False
    with pytest.raises(TimeoutError, match=late):
        read_job(client, "bs-trickle", bound)
    assert late in job_events(client, "bs-trickle", bound)
    assert time.monotonic() - started < margin(bound * 6)
