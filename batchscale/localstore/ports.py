"""The local store's loopback ports: one http port per `weed mini` service whose gRPC twin
(port + GRPC_OFFSET) is free too, and a machine-wide lock so two stores starting at once do not
both take the same free ports (docs/architecture.md, "Packages")."""

from __future__ import annotations

import contextlib
import fcntl
import json
import random
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

from batchscale.errors import StoreError
from batchscale.localstore.weedconfig import HOST
from batchscale.storage import write_bytes_atomic

GRPC_OFFSET = 10000
"""weed serves gRPC on http port + 10000; parts of `weed mini` assume it whatever the flags say
(its maintenance worker dials admin port + 10000), so we keep the convention for every service."""
DEFAULT_PORTS = {"s3": 8333, "master": 9333, "volume": 9340, "filer": 8888, "admin": 23646}
"""First choice of http port per service (weed's own defaults); gRPC is the port + GRPC_OFFSET."""
RANDOM_PORTS = (10000, 22767)
"""Fallback range: the port and its gRPC twin both stay below the kernel's ephemeral range."""
CLAIMS_NAME = "batchscale-store-ports.json"
"""In the system's temporary directory: {pid: [ports]} of stores whose ports are not bound on
this machine's network (weed behind its gate, gate.py). weed names its unix
sockets in /tmp after its ports, so two stores on the same numbers would share sockets."""
PORTS_LOCK_NAME = "batchscale-store-ports.lock"
"""In the system's temporary directory: serializes choosing ports and starting weed."""


@contextlib.contextmanager
def ports_lock() -> Iterator[None]:
    """Held from choosing ports until weed has bound them (two runs in two directories, test
    processes: each would otherwise find the same ports free and one weed would fail)."""
    with locked_file(Path(tempfile.gettempdir()) / PORTS_LOCK_NAME):
        yield


@contextlib.contextmanager
def locked_file(path: Path) -> Iterator[None]:
    """An exclusive flock on `path` (created if missing) for the block, across processes."""
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


def choose_ports(recorded: dict[str, int]) -> dict[str, int]:
    """An http port per service whose gRPC twin is also free: recorded, else default, else random.

    Reusing the recorded ports keeps the endpoint (and weed's per-master-port metadata dir)
    stable across restarts.
    """
    taken: set[int] = claimed_ports()
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


def _claims_path() -> Path:
    return Path(tempfile.gettempdir()) / CLAIMS_NAME


def _live_claims() -> dict[int, list[int]]:
    """The recorded claims whose process still runs (an unreadable file counts as none)."""
    try:
        raw = json.loads(_claims_path().read_text())
        claims = {int(pid): [int(port) for port in ports] for pid, ports in raw.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}
    return {pid: ports for pid, ports in claims.items() if Path(f"/proc/{pid}").exists()}


def claimed_ports() -> set[int]:
    """http and gRPC ports of every running store behind a gate. Call under `ports_lock`."""
    return {port for ports in _live_claims().values() for port in ports}


def claim_ports(pid: int, ports: dict[str, int]) -> None:
    """Record `ports` (and their gRPC twins) as used by `pid` until it exits. Call under
    `ports_lock`."""
    claims = _live_claims()
    claims[pid] = sorted({n for port in ports.values() for n in (port, port + GRPC_OFFSET)})
    text = json.dumps({str(k): v for k, v in claims.items()})
    write_bytes_atomic(_claims_path(), text.encode(), mode=0o600)
