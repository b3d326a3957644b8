"""batchscale.localstore: a real `weed mini` started, queried, stopped and restarted."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from batchscale import localstore
from batchscale.errors import StoreError
from batchscale.storage import ObjectStore, S3Settings


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A store of its own, so stopping and restarting it does not disturb other tests."""
    path = tmp_path_factory.mktemp("localstore")
    localstore.up(path)
    yield path
    localstore.down(path)


def _listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket `pid` listens on, read from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
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
    listening = _listening_addresses(info.pid)
    s3_port = int(info.endpoint_url.rsplit(":", 1)[1])
    assert ("127.0.0.1", s3_port) in listening
    assert {address for address, _ in listening} == {"127.0.0.1"}
    outside = _non_loopback_address()
    if outside is not None:
        with pytest.raises(ConnectionRefusedError), socket.socket() as sock:
            sock.connect((outside, s3_port))


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


def test_down_stops_only_our_process_and_data_persists(workdir: Path) -> None:
    before = localstore.up(workdir)
    store = ObjectStore(before.settings(prefix="persist"), max_attempts=2)
    store.put_bytes(store.key("kept"), b"still here")

    assert localstore.down(workdir) is True
    assert localstore.status(workdir) is None
    assert not Path(f"/proc/{before.pid}").exists()
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


def test_failed_start_shows_the_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "weed"
    fake.write_text("#!/bin/sh\necho 'listen tcp: bind: address already in use' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setattr(localstore, "weed_binary", lambda: str(fake))
    with pytest.raises(StoreError, match="(?s)weed exited.*address already in use"):
        localstore.up(tmp_path / "work")
    assert localstore.status(tmp_path / "work") is None
    assert not (localstore.state_dir(tmp_path / "work") / "weed.pid").exists()
