"""batchscale.localstore: a real `weed mini` started, queried, stopped and restarted, behind its
gate and without it; every one of its ports tried without credentials (its state files
corrupted: test_localstore_state.py)."""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import re
import secrets
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from localstore_probe import (
    fids_on_disk,
    listening_addresses,
    non_loopback_address,
    ports_by_role,
    unix_sockets,
    weed_pid,
)

from batchscale import localstore
from batchscale.errors import ObjectExists, StoreError
from batchscale.localstore import gate, server, weedconfig
from batchscale.localstore import ports as store_ports
from batchscale.storage import ObjectStore, S3Settings, sha256_b64


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A store of its own, so stopping and restarting it does not disturb other tests."""
    path = tmp_path_factory.mktemp("localstore")
    localstore.up(path)
    yield path
    localstore.down(path)


@pytest.fixture(scope="module")
def open_workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A store started without the gate, every weed port on this machine's 127.0.0.1: as on a
    machine with no private network namespace. weed's own guards, tried on it below, are the
    same behind the gate."""
    path = tmp_path_factory.mktemp("openstore")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(server, "private_network", lambda: (False, "turned off for the test"))
        localstore.up(path)
        yield path
        localstore.down(path)


def test_up_is_idempotent(workdir: Path) -> None:
    first = localstore.status(workdir)
    assert first is not None
    again = localstore.up(workdir)
    assert (again.pid, again.endpoint_url) == (first.pid, first.endpoint_url)


def test_state_is_private(workdir: Path) -> None:
    state = localstore.state_dir(workdir)
    assert (state / "credentials.json").stat().st_mode & 0o777 == 0o600
    assert state.stat().st_mode & 0o777 == 0o700


def test_every_port_is_bound_to_loopback_only(workdir: Path) -> None:
    info = localstore.status(workdir)
    assert info is not None
    listening = listening_addresses(info.pid, netns_of=os.getpid())
    s3_port = int(info.endpoint_url.rsplit(":", 1)[1])
    assert ("127.0.0.1", s3_port) in listening
    assert {address for address, _ in listening} == {"127.0.0.1"}
    outside = non_loopback_address()
    if outside is not None:
        with pytest.raises(ConnectionRefusedError), socket.socket() as sock:
            sock.connect((outside, s3_port))


def _all_listening(pid: int, ports: set[int], wait_s: float = 30.0) -> bool:
    """Whether `pid` listens on exactly `ports`, waiting for the last (the admin server comes
    up seconds after S3 answers)."""
    deadline = time.monotonic() + wait_s
    while {port for _, port in listening_addresses(pid)} != ports:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _refuses(port: int) -> bool:
    try:
        socket.create_connection((localstore.HOST, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


def test_behind_the_gate_only_the_s3_port_is_reachable(workdir: Path) -> None:
    """weed listens on all its ports, but in its own network: from here every one but S3 is
    refused, status pages included; the S3 port is the gate's, and it serves objects."""
    if not localstore.private_network()[0]:
        pytest.skip(f"no gate on this machine: {localstore.private_network()[1]}")
    info = localstore.status(workdir)
    assert info is not None
    ports = ports_by_role(workdir)
    weed = weed_pid(info.pid)
    assert weed != info.pid
    assert _all_listening(weed, set(ports.values())), "weed is not up: the refusals prove nothing"
    assert listening_addresses(info.pid, netns_of=os.getpid()) == {("127.0.0.1", ports["s3"])}
    for role, port in ports.items():
        if role != "s3":
            assert _refuses(port), f"{role} port {port} answers outside weed's network"
            assert _http(port, "GET", "/", None) == (None, b"")
    store = ObjectStore(info.settings(prefix=f"gate-{secrets.token_hex(4)}"), max_attempts=1)
    store.put_bytes(store.key("through"), b"the gate")
    assert store.get_bytes(store.key("through")) == b"the gate"
    assert "only the S3 port" in localstore.reach(info)


def test_a_killed_gate_takes_weed_with_it(tmp_path: Path) -> None:
    if not localstore.private_network()[0]:
        pytest.skip(f"no gate on this machine: {localstore.private_network()[1]}")
    info = localstore.up(tmp_path)
    weed = weed_pid(info.pid)
    os.kill(info.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not (_stopped(info.pid) and _stopped(weed)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _stopped(weed), "weed outlived its gate"
    assert localstore.status(tmp_path) is None
    again = localstore.up(tmp_path)
    try:
        ObjectStore(again.settings(), max_attempts=1).check()
    finally:
        localstore.down(tmp_path)


def test_without_unshare_the_store_says_why_it_has_no_gate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert server.private_network.__wrapped__() == (
        False, "util-linux's `unshare` is not installed")


def test_endpoint_requires_the_generated_keys(workdir: Path) -> None:
    info = localstore.status(workdir)
    assert info is not None
    ObjectStore(info.settings(), max_attempts=1).check()
    wrong = dataclasses.replace(info.settings(), access_key="someone", secret_key="else")
    with pytest.raises(StoreError, match="refused the credentials"):
        ObjectStore(wrong, max_attempts=1).check()


def test_env_lines_are_shell_exports(workdir: Path) -> None:
    lines = localstore.env_lines(workdir)
    assert all(line.startswith("export ") for line in lines)
    script = "\n".join(lines) + "\nenv -0"
    out = subprocess.run(["bash", "-c", script], env={}, capture_output=True, check=True).stdout
    exported = dict(item.split("=", 1) for item in out.decode().split("\0") if "=" in item)
    settings = S3Settings.from_env(exported)
    info = localstore.status(workdir)
    assert info is not None
    assert settings == info.settings()
    ObjectStore(settings, max_attempts=1).check()


def _stopped(pid: int) -> bool:
    """Gone, or exited and waiting to be reaped: a weed started by an earlier CLI process is
    reparented, and where PID 1 does not reap (some CI containers) it stays a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] in ("Z", "X")


def test_down_stops_only_our_process_and_data_persists(workdir: Path) -> None:
    before = localstore.up(workdir)
    security = localstore.state_dir(workdir) / "weed-config" / "security.toml"
    old_security = security.read_text()
    store = ObjectStore(before.settings(prefix="persist"), max_attempts=2)
    store.put_bytes(store.key("kept"), b"still here")

    assert localstore.down(workdir) is True
    assert localstore.status(workdir) is None
    assert _stopped(before.pid)
    with pytest.raises(StoreError, match="no local store is running"):
        localstore.env_lines(workdir)

    decoy = subprocess.Popen(["sleep", "60"])
    try:
        (localstore.state_dir(workdir) / "weed.pid").write_text(f"{decoy.pid}\n")
        assert localstore.down(workdir) is False
        assert decoy.poll() is None, "down() must never signal a process it did not start"
    finally:
        decoy.kill()
        decoy.wait()

    results: list[localstore.StoreInfo] = []
    threads = [
        threading.Thread(target=lambda: results.append(localstore.up(workdir))) for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 2
    assert len({info.pid for info in results}) == 1, "concurrent up() started two servers"
    after = results[0]
    assert after.pid != before.pid
    assert after.endpoint_url == before.endpoint_url
    assert ObjectStore(after.settings(prefix="persist")).get_bytes(store.key("kept")) == (
        b"still here"
    )
    assert security.read_text() != old_security, "weed's signing keys must be new at each start"


def test_a_store_started_with_other_flags_is_restarted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_args = server._weed_args

    def earlier_args(*args: object) -> list[str]:  # as before the filer and master APIs closed
        return [arg for arg in real_args(*args) if arg != "-disableHttp"]  # type: ignore[arg-type]

    monkeypatch.setattr(server, "_weed_args", earlier_args)
    first = localstore.up(tmp_path)
    try:
        monkeypatch.setattr(server, "_weed_args", real_args)
        second = localstore.up(tmp_path)
        assert second.pid != first.pid
        assert b"-disableHttp" in Path(f"/proc/{second.pid}/cmdline").read_bytes().split(b"\0")
        assert localstore.up(tmp_path).pid == second.pid
    finally:
        localstore.down(tmp_path)


def test_failed_start_shows_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'listen tcp: bind: address already in use' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(server, "weed_binary", lambda: str(fake))
    with pytest.raises(StoreError, match="(?s)weed (or its gate )?exited.*address already in use"):
        localstore.up(tmp_path / "work")
    assert localstore.status(tmp_path / "work") is None
    assert not (localstore.state_dir(tmp_path / "work") / "weed.pid").exists()


def test_weed_secrets_are_private_and_weed_reads_only_our_config(workdir: Path) -> None:
    info = localstore.status(workdir)
    assert info is not None
    config = localstore.state_dir(workdir) / "weed-config"
    assert config.stat().st_mode & 0o777 == 0o700
    assert {p.name for p in config.iterdir()} == {"security.toml", "grpc.crt", "grpc.key"}
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in config.iterdir())
    assert os.readlink(f"/proc/{info.pid}/cwd") == str(config)
    signing_keys = re.findall(r'key = "([0-9a-f]{64})"', (config / "security.toml").read_text())
    assert len(signing_keys) == len(weedconfig.JWT_SECTIONS)
    cmdline = Path(f"/proc/{info.pid}/cmdline").read_bytes()  # readable by every local user
    for secret in (info.secret_key, *signing_keys):
        assert secret.encode() not in cmdline
    sockets = unix_sockets(weed_pid(info.pid))
    assert sockets, "weed serves no unix socket: the check below would prove nothing"
    for path in sockets:  # connecting to a unix socket needs write permission on it
        assert os.stat(path).st_mode & 0o077 == 0, f"{path} is open to other users"


# --- no key-less door: every port of weed refuses a request without credentials -------------

STATUS_PAGES = ("/", "/status", "/healthz", "/health", "/metrics", "/cluster/status")
"""Read-only pages some weed ports serve to anyone, whatever the method (health, metrics,
topology): they may answer, but must never name or serve an object, nor change anything."""
S3_HEALTH_PAGES = ("/status", "/healthz", "/health")
H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")
"""A gRPC client's first bytes: the HTTP/2 connection preface and an empty SETTINGS frame."""


def _attacks(bucket: str, key: str, fids: list[str], tampered: bytes) -> list[tuple]:
    """(method, path, body) of requests that would read, overwrite, delete, plant or list
    objects or drop the bucket, through the S3 (path style), filer, volume, master and admin
    HTTP APIs of weed."""
    objects = [f"/{bucket}/{key}", f"/buckets/{bucket}/{key}", *(f"/{fid}" for fid in fids)]
    planted = [f"/{bucket}/{key}.planted", f"/buckets/{bucket}/{key}.planted"]
    listings = [*STATUS_PAGES, f"/{bucket}", f"/{bucket}?list-type=2", "/buckets/",
                f"/buckets/{bucket}/", f"/buckets/{bucket}/{key}?metadata=true",
                "/api/s3/buckets", "/dir/status", "/vol/status", "/dir/lookup?volumeId=1"]
    control = ["/dir/assign", f"/col/delete?collection={bucket}", "/vol/vacuum",
               "/vol/grow?count=1", "/submit"]
    return [
        *(("GET", path, None) for path in objects + listings),
        *((method, path, tampered) for path in objects + planted for method in ("PUT", "POST")),
        *(("DELETE", path, None) for path in [*objects, f"/{bucket}", f"/buckets/{bucket}"]),
        *((method, path, None) for path in control for method in ("GET", "POST")),
        ("POST", "/", b"Action=ListUsers&Version=2010-05-08"),  # the S3 port's IAM API
    ]


def _may_answer(role: str, method: str, path: str) -> bool:
    """Whether a request without credentials may succeed: only a status page, and on the S3
    port only a GET of its health check (anything else there must be signed)."""
    if role == "s3":
        return method == "GET" and path in S3_HEALTH_PAGES
    return path in STATUS_PAGES


def _http(port: int, method: str, path: str, body: bytes | None) -> tuple[int | None, bytes]:
    """(status, body) of a request without credentials; (None, b"") if no HTTP answer came."""
    conn = http.client.HTTPConnection(localstore.HOST, port, timeout=5)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read()
    except (OSError, http.client.HTTPException):
        return None, b""
    finally:
        conn.close()


def _tls(cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
    """A gRPC client's TLS (ALPN h2), presenting `cert` (certificate, key) if given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    if cert is not None:
        context.load_cert_chain(*cert)
    return context


def _speaks_h2(port: int, tls: ssl.SSLContext | None) -> bool:
    """Whether `port` answers a gRPC client's preface with HTTP/2, in plain text or over `tls`."""
    try:
        sock = socket.create_connection((localstore.HOST, port), timeout=5)
        if tls is not None:
            sock = tls.wrap_socket(sock)
        with sock:
            sock.sendall(H2_PREFACE)
            answer = sock.recv(64)
    except OSError:  # ssl.SSLError too: no TLS there, or our certificate was refused
        return False
    return len(answer) >= 9 and answer[3] == 0x4  # the frame type of SETTINGS


def test_no_port_serves_or_changes_an_object_without_credentials(open_workdir: Path) -> None:
    workdir = open_workdir
    info = localstore.status(workdir)
    assert info is not None
    store = ObjectStore(info.settings(prefix=f"door-{secrets.token_hex(4)}"), max_attempts=1)
    key, content = store.key(f"secret-{secrets.token_hex(8)}.bin"), secrets.token_hex(32).encode()
    store.put_bytes(key, content)
    fids = fids_on_disk(info.data_dir)
    assert len(fids) >= 1
    ports = ports_by_role(workdir)
    assert _all_listening(info.pid, set(ports.values())), "a weed port is not up: none tried"

    tampered = b"tampered " + content
    for role, port in ports.items():
        for method, path, body in _attacks(info.bucket, key, fids, tampered):
            status, answer = _http(port, method, path, body)
            where = f"{role} port {port}: {method} {path} -> {status}"
            assert content not in answer, where
            if status is not None and status < 400:
                assert _may_answer(role, method, path), where
                assert key.rsplit("/", 1)[1].encode() not in answer, where

    assert store.get_bytes(key) == content
    assert store.checksum(key) == sha256_b64(content)
    assert store.list() == [key], "an object was planted beside it"
    with pytest.raises(ObjectExists):
        store.put_bytes(key, tampered)  # create-only still holds


def test_grpc_ports_answer_only_our_certificate(open_workdir: Path, tmp_path: Path) -> None:
    workdir = open_workdir
    ports = ports_by_role(workdir)
    config = localstore.state_dir(workdir) / "weed-config"
    strangers = tmp_path / "stranger.crt", tmp_path / "stranger.key"
    for path, pem in zip(strangers, weedconfig.grpc_certificate(), strict=True):
        path.write_bytes(pem)
    for role, port in ports.items():
        assert not _speaks_h2(port, None), f"{role} port {port} speaks plain gRPC"
        assert not _speaks_h2(port, _tls()), f"{role} port {port}: TLS without a certificate"
        assert not _speaks_h2(port, _tls(strangers)), f"{role} port {port}: another certificate"
    ours = _tls((config / "grpc.crt", config / "grpc.key"))
    for role in localstore.DEFAULT_PORTS:  # the probe above does find gRPC where it is allowed
        assert _speaks_h2(ports[f"{role}-grpc"], ours), f"{role}-grpc refuses our certificate"


def test_master_page_gives_the_count_of_registered_volumes(
    open_workdir: Path, tmp_path: Path
) -> None:
    workdir = open_workdir
    info = localstore.status(workdir)
    assert info is not None
    master = ports_by_role(workdir)["master"]
    on_disk = list(info.data_dir.glob("*.dat"))
    assert on_disk
    assert gate.unregistered_volumes(info.data_dir, master) == 0
    for number in range(len(on_disk) + 1):
        (tmp_path / f"c_{number}.dat").touch()
    assert gate.unregistered_volumes(tmp_path, master) == 1


def test_a_gated_stores_ports_are_claimed_so_another_store_does_not_choose_them(
    workdir: Path,
) -> None:
    """Behind the gate weed's ports are free on the machine's network, yet weed names its unix
    sockets in /tmp after them: another store must not pick them."""
    if not localstore.private_network()[0]:
        pytest.skip(f"no gate on this machine: {localstore.private_network()[1]}")
    ports = ports_by_role(workdir)
    assert set(ports.values()) <= store_ports.claimed_ports()
    other = store_ports.choose_ports(json.loads(
        (localstore.state_dir(workdir) / "ports.json").read_text())["ports"])
    chosen = {n for port in other.values() for n in (port, port + localstore.GRPC_OFFSET)}
    assert not chosen & set(ports.values())
