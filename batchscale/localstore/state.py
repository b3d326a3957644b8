"""The local store's state directory, `<workdir>/.batchscale/store/` (mode 0700): `data/`
(objects), `credentials.json` (the S3 keys, generated once, mode 0600), `weed-config/` (weed's
signing keys and gRPC certificate, new at every start, mode 0600), `weed.pid`, `ports.json` (so
the endpoint stays the same across restarts), `weed.log` and `ready` (the gate's sign that
every stored volume is registered). Each file is read with a size bound and refused, naming it
and the way to recover, when it is corrupt or of the wrong kind."""

from __future__ import annotations

import contextlib
import json
import re
import secrets
from collections.abc import Iterator
from pathlib import Path

from batchscale.errors import BadInput, StoreError
from batchscale.localstore.ports import DEFAULT_PORTS, GRPC_OFFSET, locked_file
from batchscale.names import check_bucket
from batchscale.storage import write_bytes_atomic

READY_FILE = "ready"
"""Left by the gate once weed has registered every stored volume."""
STATE_FILES = ("credentials.json", "ports.json", "weed.pid", "weed.log", "lock", READY_FILE)
STATE_DIRS = ("data", "weed-config")
MAX_STATE_FILE_BYTES = 64 * 1024
AFTER_REMOVAL = {
    "credentials.json": "new keys are made (clients take them from `batchscale store env`)",
    "ports.json": "the store restarts, perhaps on other ports",
}
"""What `batchscale store up` does once a corrupt state file is removed (the data is kept)."""



def state_dir(workdir: str | Path | None = None) -> Path:
    """Where the store of `workdir` (default: the current directory) keeps its state."""
    return Path(workdir if workdir is not None else Path.cwd()).resolve() / ".batchscale" / "store"


@contextlib.contextmanager
def locked(state: Path) -> Iterator[None]:
    """Serialize `up` and `down` on one state dir, across processes."""
    with locked_file(state / "lock"):
        yield


def check_layout(state: Path) -> None:
    """Refuse state entries of the wrong kind (a directory for a file, a FIFO that would block)."""
    if state.exists() and not state.is_dir():
        raise StoreError(f"{state} should be the store's state directory but is not a directory: "
                         "remove it and run `batchscale store up` again")
    for name in STATE_FILES:
        path = state / name
        if path.exists() and not path.is_file():
            raise state_error(path, "is not a regular file")
    for name in STATE_DIRS:
        path = state / name
        if path.exists() and not path.is_dir():
            raise StoreError(f"{path} is not a directory: remove it and run `batchscale store up` "
                             "again")


def state_error(path: Path, problem: str) -> StoreError:
    """The refusal of a bad state file: what is wrong, and how to recover without losing data."""
    then = AFTER_REMOVAL.get(path.name, "the store starts again")
    return StoreError(f"{path} {problem}. Remove it and run `batchscale store up` again: {then}; "
                      "the store's data is kept")


def load_state(path: Path, problem: str) -> dict:
    """The JSON object in a state file, read with a size bound; else a StoreError that says
    what was expected (`problem`) and how to recover."""
    try:
        with path.open("rb") as fh:
            raw = fh.read(MAX_STATE_FILE_BYTES + 1)
        if len(raw) > MAX_STATE_FILE_BYTES:
            raise ValueError(f"larger than {MAX_STATE_FILE_BYTES} bytes")
        value = json.loads(raw.decode("utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        raise state_error(path, f"is unreadable or corrupt ({exc})") from None
    if not isinstance(value, dict):
        raise state_error(path, f"is corrupt (expected {problem})")
    return value


def credentials(state: Path) -> tuple[str, str]:
    """The store's keys, generated on first use and never readable by other users."""
    path = state / "credentials.json"
    if not path.exists():
        keys = {"access_key": f"bs{secrets.token_hex(8)}", "secret_key": secrets.token_hex(24)}
        write_text_atomic(path, json.dumps(keys, indent=2) + "\n", mode=0o600)
    return read_credentials(state)


def read_credentials(state: Path) -> tuple[str, str]:
    """The S3 keys; printable ASCII without spaces (they end up in `export` lines and headers)."""
    path = state / "credentials.json"
    expected = 'an object with "access_key" and "secret_key" strings'
    keys = load_state(path, expected)
    values = (keys.get("access_key"), keys.get("secret_key"))
    if not all(isinstance(v, str) and re.fullmatch(r"[!-~]{1,256}", v) for v in values):
        raise state_error(path, f"is corrupt (expected {expected})")
    return values  # type: ignore[return-value]


def write_text_atomic(path: Path, text: str, mode: int = 0o644) -> None:
    """The file is created with its final mode (the credentials are never world-readable)."""
    write_bytes_atomic(path, text.encode(), mode=mode)


def record(state: Path, bucket: str, ports: dict[str, int]) -> None:
    """Remember the bucket and ports, so status/env work and restarts keep the endpoint."""
    record = {"bucket": bucket, "ports": ports}
    write_text_atomic(state / "ports.json", json.dumps(record, indent=2) + "\n")


def read_record(state: Path) -> tuple[str, dict[str, int]]:
    """The bucket and ports of the last start; ("", {}) before the first one."""
    path = state / "ports.json"
    if not path.exists():
        return "", {}
    expected = (f'{{"bucket": NAME, "ports": {{SERVICE: PORT}}}} with the services '
                f"{', '.join(DEFAULT_PORTS)} and ports 1-{65535 - GRPC_OFFSET}")
    record = load_state(path, expected)
    bucket, ports = record.get("bucket"), record.get("ports")
    valid = (
        isinstance(ports, dict)
        and set(ports) == set(DEFAULT_PORTS)
        and all(type(port) is int and 0 < port <= 65535 - GRPC_OFFSET for port in ports.values())
    )
    try:
        check_bucket(bucket)
    except BadInput:
        valid = False
    if not valid:
        raise state_error(path, f"is corrupt (expected {expected})")
    return bucket, dict(ports)  # type: ignore[arg-type,return-value]
