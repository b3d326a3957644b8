"""batchscale.localstore: a real `weed mini` started, queried, stopped and restarted; every one
of its ports tried without credentials; its state files corrupted."""

from __future__ import annotations

import dataclasses
import http.client
import json
import os
import re
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batchscale import cli, localstore
from batchscale.errors import ObjectExists, StoreError
from batchscale.localstore import gate, server, weedconfig
from batchscale.localstore import ports as store_ports
from batchscale.localstore import state as state_files
from batchscale.storage import ObjectStore, S3Settings, sha256_b64
from helpers import run_cli


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


def _weed_pid(pid: int) -> int:
    """weed's pid: `pid` itself, or the gate's one child."""
    if b"batchscale.localstore.gate" not in Path(f"/proc/{pid}/cmdline").read_bytes():
        return pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1, f"the gate should have weed as its one child, not {children}"
    return int(children[0])


def _listening_addresses(pid: int, netns_of: int | None = None) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket `pid` listens on in the network namespace of
    `netns_of` (default: `pid`'s own), read from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        net = Path(f"/proc/{pid if netns_of is None else netns_of}/net")
        for line in (net / table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: LISTEN
                address, port = local.split(":")
                raw = bytes.fromhex(address)
                words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
                found.add((socket.inet_ntop(family, words), int(port, 16)))
    return found


def _non_loopback_address() -> str | None:
    """This machine's address on its default route, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = sock.getsockname()[0]
    return None if address.startswith("127.") else address


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
    listening = _listening_addresses(info.pid, netns_of=os.getpid())
    s3_port = int(info.endpoint_url.rsplit(":", 1)[1])
    assert ("127.0.0.1", s3_port) in listening
    assert {address for address, _ in listening} == {"127.0.0.1"}
    outside = _non_loopback_address()
    if outside is not None:
        with pytest.raises(ConnectionRefusedError), socket.socket() as sock:
            sock.connect((outside, s3_port))


def _all_listening(pid: int, ports: set[int], wait_s: float = 30.0) -> bool:
    """Whether `pid` listens on exactly `ports`, waiting for the last (the admin server comes
    up seconds after S3 answers)."""
    deadline = time.monotonic() + wait_s
    while {port for _, port in _listening_addresses(pid)} != ports:
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
    ports = _ports_by_role(workdir)
    weed = _weed_pid(info.pid)
    assert weed != info.pid
    assert _all_listening(weed, set(ports.values())), "weed is not up: the refusals prove nothing"
    assert _listening_addresses(info.pid, netns_of=os.getpid()) == {("127.0.0.1", ports["s3"])}
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
    weed = _weed_pid(info.pid)
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
    sockets = _unix_sockets(_weed_pid(info.pid))
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


def _unix_sockets(pid: int) -> list[str]:
    """Paths of the unix sockets `pid` listens on."""
    inodes = {os.readlink(fd)[len("socket:[") : -1] for fd in Path(f"/proc/{pid}/fd").iterdir()
              if os.readlink(fd).startswith("socket:[")}
    rows = (line.split() for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:])
    return sorted({row[7] for row in rows if len(row) > 7 and row[6] in inodes and row[5] == "01"})


def _ports_by_role(workdir: Path) -> dict[str, int]:
    """Every port weed should listen on, by role: the http port of each service, and its gRPC."""
    http_ports = json.loads((localstore.state_dir(workdir) / "ports.json").read_text())["ports"]
    offset = localstore.GRPC_OFFSET
    return {**http_ports, **{f"{role}-grpc": port + offset for role, port in http_ports.items()}}


def _fids_on_disk(data_dir: Path) -> list[str]:
    """The file id of every needle stored, from the volumes' index and data files: what someone
    who read the filer's metadata would send to the volume server to read or delete an object."""
    fids = []
    for index in data_dir.glob("*.idx"):
        volume = int(index.stem.rsplit("_", 1)[-1])
        entries, data = index.read_bytes(), index.with_suffix(".dat").read_bytes()
        for size in (17, 16):  # needle id, offset/8 (5 bytes in weed's large-disk build), size
            needles = [
                (int.from_bytes(entries[at : at + 8], "big"),
                 int.from_bytes(entries[at + 8 : at + 12], "big") * 8)
                for at in range(0, len(entries) - size + 1, size)
            ]  # a needle's header in the .dat file: cookie (4 bytes), needle id (8 bytes)
            if len(entries) % size == 0 and all(
                data[offset + 4 : offset + 12] == needle.to_bytes(8, "big")
                for needle, offset in needles
            ):
                fids += [f"{volume},{needle:x}{data[offset : offset + 4].hex()}"
                         for needle, offset in needles]
                break
    return fids


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
    fids = _fids_on_disk(info.data_dir)
    assert len(fids) >= 1
    ports = _ports_by_role(workdir)
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
    ports = _ports_by_role(workdir)
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
    master = _ports_by_role(workdir)["master"]
    on_disk = list(info.data_dir.glob("*.dat"))
    assert on_disk
    assert gate.unregistered_volumes(info.data_dir, master) == 0
    for number in range(len(on_disk) + 1):
        (tmp_path / f"c_{number}.dat").touch()
    assert gate.unregistered_volumes(tmp_path, master) == 1


# --- corrupt state files: a clear refusal that says how to recover, nothing written --------


def _state_template(root: Path) -> Path:
    """A workdir whose store was set up once (keys, ports, lock) and is not running."""
    work = root / "work"
    state = localstore.state_dir(work)
    state.mkdir(parents=True, mode=0o700)
    state_files.credentials(state)
    state_files.record(state, "batchscale", dict(localstore.DEFAULT_PORTS))
    (state / "lock").touch()
    return work


def _snapshot(state: Path) -> dict:
    return {p: (p.stat().st_mode, p.read_bytes() if p.is_file() else None)
            for p in sorted(state.rglob("*"))}


def _weed_serves(state: Path) -> bool:
    """Whether any process is a weed for this state's data dir."""
    flag = os.fsencode(f"-dir={state / 'data'}")
    for proc in Path("/proc").iterdir():
        try:
            if flag in (proc / "cmdline").read_bytes().split(b"\0"):
                return True
        except OSError:
            continue
    return False


VALID_PORTS = dict(localstore.DEFAULT_PORTS)
CORRUPTIONS = {
    "credentials.json": [
        b"{not json", b"", b'{"access_key": "bs0123', b"[]", b"\xff\xfe\x00",
        json.dumps({"access_key": "PLANTED-SECRET", "secret_key": 5}).encode(),
        json.dumps({"access_key": "a key with spaces", "secret_key": "x"}).encode(),
        json.dumps({"secret_key": "PLANTED-SECRET"}).encode(), b"[" * 100_000,
        b" " * 70_000 + b"{}", "directory", "fifo",
    ],
    "ports.json": [
        b"{not json", b'{"bucket": "batchscale", "po', b"null",
        json.dumps({"bucket": "batchscale", "ports": [8333]}).encode(),
        json.dumps({"bucket": "batchscale", "ports": {**VALID_PORTS, "s3": "8333"}}).encode(),
        json.dumps({"bucket": "batchscale", "ports": {**VALID_PORTS, "s3": True}}).encode(),
        json.dumps({"bucket": "batchscale", "ports": {**VALID_PORTS, "s3": 65000}}).encode(),
        json.dumps({"bucket": "batchscale", "ports": {"s3": 8333}}).encode(),
        json.dumps({"bucket": "Bad_Bucket!", "ports": VALID_PORTS}).encode(),
        json.dumps({"ports": VALID_PORTS}).encode(), "directory", "fifo",
    ],
    "weed.pid": ["directory", "fifo"],
    "weed.log": ["directory"],
    "data": ["file"],
    "weed-config": ["file"],
}
CASES = [(name, bad) for name, bads in CORRUPTIONS.items() for bad in bads]


def _corrupt(path: Path, bad: bytes | str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    path.unlink(missing_ok=True)
    if bad == "directory":
        path.mkdir()
    elif bad == "fifo":
        os.mkfifo(path)
    elif bad == "file":
        path.write_bytes(b"")
    else:
        path.write_bytes(bad)


@pytest.mark.parametrize(("name", "bad"), CASES, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CASES)])
def test_a_corrupt_state_file_is_refused_with_the_way_to_recover(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, name: str,
    bad: bytes | str,
) -> None:
    """Every corruption through the CLI's own entry point (in this process, for speed; the test
    below runs the real command for a few of them)."""
    work = _state_template(tmp_path)
    state = localstore.state_dir(work)
    _corrupt(state / name, bad)
    before = _snapshot(state)
    monkeypatch.chdir(work)
    for action in ("up", "status", "env"):
        assert cli.main(["store", action]) == 2, action
        out, err = capsys.readouterr()
        assert out == "" and str(state / name) in err and "batchscale store up" in err
        assert "PLANTED-SECRET" not in err
    assert _snapshot(state) == before
    assert not _weed_serves(state)


@pytest.mark.parametrize(("name", "bad"), [
    ("credentials.json", b"{not json"), ("ports.json", CORRUPTIONS["ports.json"][4]),
    ("weed.pid", "fifo"),
])
def test_the_command_refuses_a_corrupt_state_file_without_a_traceback(
    tmp_path: Path, name: str, bad: bytes | str
) -> None:
    work = _state_template(tmp_path)
    state = localstore.state_dir(work)
    _corrupt(state / name, bad)
    before = _snapshot(state)
    for action in ("up", "status", "env"):
        result = run_cli(["store", action], cwd=work, timeout_s=60)
        assert result.returncode == 2, (action, result.stdout, result.stderr)
        assert str(state / name) in result.stderr and "batchscale store up" in result.stderr
        assert "Traceback" not in result.stderr and result.stdout == ""
    assert _snapshot(state) == before
    assert not _weed_serves(state)


def test_a_state_dir_that_is_a_file_is_refused(tmp_path: Path) -> None:
    state = localstore.state_dir(tmp_path)
    state.parent.mkdir(parents=True)
    state.write_text("not a directory")
    for action in ("up", "status", "env"):
        result = run_cli(["store", action], cwd=tmp_path, timeout_s=60)
        assert result.returncode == 2 and str(state) in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    assert state.read_text() == "not a directory"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=3),
    max_leaves=8,
)
STATE_CONTENTS = st.one_of(
    st.binary(max_size=64),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"access_key": JSON_VALUES, "secret_key": JSON_VALUES}).map(
        lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({
        "bucket": st.sampled_from(["batchscale", "x", ""]) | JSON_VALUES,
        "ports": st.dictionaries(st.sampled_from([*VALID_PORTS, "x"]),
                                 st.integers(-1, 70_000) | JSON_VALUES),
    }).map(lambda v: json.dumps(v).encode()),
)


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.sampled_from(["credentials.json", "ports.json"]), content=STATE_CONTENTS)
def test_any_state_file_content_is_used_or_refused_clearly(
    tmp_path: Path, name: str, content: bytes
) -> None:
    state = localstore.state_dir(tmp_path)
    state.mkdir(parents=True, exist_ok=True)
    for stale in state.iterdir():
        stale.unlink()
    (state / name).write_bytes(content)
    try:
        assert localstore.status(tmp_path) is None  # valid, and nothing runs
    except StoreError as exc:
        assert str(state / name) in str(exc) and "batchscale store up" in str(exc)


def test_the_recovery_the_message_gives_works_and_keeps_the_data(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    info = localstore.up(work)
    try:
        key, content = "kept/object.bin", secrets.token_bytes(64)
        ObjectStore(info.settings(prefix="")).put_bytes(key, content)
        state = localstore.state_dir(work)
        for name in ("credentials.json", "ports.json"):
            (state / name).write_bytes(b"{truncated")
            refused = run_cli(["store", "up"], cwd=work, timeout_s=120)
            assert refused.returncode == 2 and "Remove it and run" in refused.stderr
            (state / name).unlink()  # what the message says to do
            assert run_cli(["store", "up"], cwd=work, timeout_s=120).returncode == 0
            info = localstore.status(work)
            assert info is not None
            assert ObjectStore(info.settings(prefix="")).get_bytes(key) == content
    finally:
        localstore.down(work)


def test_a_gated_stores_ports_are_claimed_so_another_store_does_not_choose_them(
    workdir: Path,
) -> None:
    """Behind the gate weed's ports are free on the machine's network, yet weed names its unix
    sockets in /tmp after them: another store must not pick them."""
    if not localstore.private_network()[0]:
        pytest.skip(f"no gate on this machine: {localstore.private_network()[1]}")
    ports = _ports_by_role(workdir)
    assert set(ports.values()) <= store_ports.claimed_ports()
    other = store_ports.choose_ports(json.loads(
        (localstore.state_dir(workdir) / "ports.json").read_text())["ports"])
    chosen = {n for port in other.values() for n in (port, port + localstore.GRPC_OFFSET)}
    assert not chosen & set(ports.values())
