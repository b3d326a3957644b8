"""Probes of a running local store for its tests: which sockets a process listens on (read
from /proc, in a chosen network namespace), weed behind its gate, the ports by role, and the
file ids of the objects on disk."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

from batchscale import localstore


def weed_pid(pid: int) -> int:
    """weed's pid: `pid` itself, or the gate's one child."""
    if b"batchscale.localstore.gate" not in Path(f"/proc/{pid}/cmdline").read_bytes():
        return pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    assert len(children) == 1, f"the gate should have weed as its one child, not {children}"
    return int(children[0])


def listening_addresses(pid: int, netns_of: int | None = None) -> set[tuple[str, int]]:
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


def non_loopback_address() -> str | None:
    """This machine's address on its default route, if it has one (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("10.255.255.255", 1))
        except OSError:
            return None
        address = sock.getsockname()[0]
    return None if address.startswith("127.") else address


def unix_sockets(pid: int) -> list[str]:
    """Paths of the unix sockets `pid` listens on."""
    inodes = {os.readlink(fd)[len("socket:[") : -1] for fd in Path(f"/proc/{pid}/fd").iterdir()
              if os.readlink(fd).startswith("socket:[")}
    rows = (line.split() for line in Path(f"/proc/{pid}/net/unix").read_text().splitlines()[1:])
    return sorted({row[7] for row in rows if len(row) > 7 and row[6] in inodes and row[5] == "01"})


def ports_by_role(workdir: Path) -> dict[str, int]:
    """Every port weed should listen on, by role: the http port of each service, and its gRPC."""
    http_ports = json.loads((localstore.state_dir(workdir) / "ports.json").read_text())["ports"]
    offset = localstore.GRPC_OFFSET
    return {**http_ports, **{f"{role}-grpc": port + offset for role, port in http_ports.items()}}


def fids_on_disk(data_dir: Path) -> list[str]:
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
