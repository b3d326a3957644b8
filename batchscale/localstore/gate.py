"""The local store's gate: weed runs in a private network namespace and only its S3 port is
reachable, through this process.

weed cannot drop its master, volume, filer and admin ports, and their status pages answer
anyone who reaches them. Started by `unshare --net --map-root-user`, this process and weed live
in a network namespace of their own (its own loopback, which no other process of the machine
reaches). The store's S3 port is a listening socket bound on the machine's 127.0.0.1 before the
namespace was made and inherited here; each connection to it is copied to weed's S3 port
inside. SIGTERM stops weed (it flushes), then this process; weed gets SIGKILL if this process
is killed (parent-death signal), so the store never outlives its gate. weed still names its
unix sockets in /tmp after its ports, so those ports are claimed machine-wide while it runs
(ports.py) and two stores never share a socket (docs/lake.md, "Object storage").

Only the standard library and batchscale.stopping: it starts in a fraction of a second.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

from batchscale.stopping import die_with_parent

HOST = "127.0.0.1"
WEED_STOP_S = 15.0
"""How long weed gets to flush and exit after SIGTERM before SIGKILL."""
CHUNK_BYTES = 1 << 16
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1


def loopback_up() -> None:
    """A new network namespace's loopback starts down; bring it up (ioctl, no `ip` needed)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))


def unregistered_volumes(data_dir: Path, master_port: int) -> int:
    """How many volumes on disk the master does not know yet (all if it does not answer).

    After a restart S3 answers before the volume server has reported its volumes, and for a
    few seconds reads of existing objects fail with "volume id N not found". The master's JSON
    API is off (-disableHttp), so the count is read from its status page's topology table.
    """
    on_disk = len(list(data_dir.glob("*.dat")))  # "<id>.dat" or "<collection>_<id>.dat"
    try:
        with urllib.request.urlopen(f"http://{HOST}:{master_port}/", timeout=5) as response:
            page = response.read(1 << 20).decode(errors="replace")
    except OSError:
        return on_disk
    table = page.partition("<h2>Topology</h2>")[2].partition("</table>")[0]
    header = [cell.strip() for cell in re.findall(r"<th>(.*?)</th>", table, re.S)]
    if "#Volumes" not in header:
        return on_disk
    column = header.index("#Volumes")
    known = 0
    for row in re.findall(r"<tr>(.*?)</tr>", table.partition("<tbody>")[2], re.S):
        cells = [cell.strip() for cell in re.findall(r"<td>(.*?)</td>", row, re.S)]
        known += int(cells[column]) if len(cells) > column and cells[column].isdigit() else 0
    return max(0, on_disk - known)


def _weed_dies_with_gate() -> None:
    """SIGKILL, not SIGTERM: without its gate, weed's graceful stop can wait forever on the
    filer it already stopped, and a killed gate has no one left to escalate."""
    die_with_parent(signal.SIGKILL)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy one direction until its end closes, then pass the close on."""
    with contextlib.suppress(OSError):
        while chunk := source.recv(CHUNK_BYTES):
            sink.sendall(chunk)
    with contextlib.suppress(OSError):
        sink.shutdown(socket.SHUT_WR)


def _forward(client: socket.socket, port: int) -> None:
    """One connection: both directions copied to weed's S3 port; a refused one is closed."""
    with client:
        try:
            inner = socket.create_connection((HOST, port), timeout=10)
        except OSError:
            return  # weed's S3 is not up yet: the client sees a closed connection and retries
        with inner:
            inner.settimeout(None)
            back = threading.Thread(target=_pump, args=(inner, client), daemon=True)
            back.start()
            _pump(client, inner)
            back.join()


def _serve(listener: socket.socket, port: int) -> None:
    while True:
        try:
            client, _ = listener.accept()
        except OSError:
            return  # closed: the gate is stopping
        threading.Thread(target=_forward, args=(client, port), daemon=True).start()


def _stop_weed(weed: subprocess.Popen) -> int:
    with contextlib.suppress(ProcessLookupError):
        weed.send_signal(signal.SIGTERM)
    try:
        return weed.wait(timeout=WEED_STOP_S)
    except subprocess.TimeoutExpired:
        weed.kill()
        return weed.wait()


def run(listener: socket.socket, s3_port: int, master_port: int, data_dir: Path, ready: Path,
        weed_args: list[str]) -> int:
    """Serve until weed exits or SIGTERM/SIGINT arrives; weed's exit status."""
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stopping.set())
    loopback_up()
    weed = subprocess.Popen(weed_args, stdin=subprocess.DEVNULL, preexec_fn=_weed_dies_with_gate)
    threading.Thread(target=_serve, args=(listener, s3_port), daemon=True).start()
    while not stopping.is_set() and weed.poll() is None:
        if not ready.exists() and unregistered_volumes(data_dir, master_port) == 0:
            ready.touch(mode=0o600)
        stopping.wait(0.25)
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)  # wakes the accept: no new connection from here
    listener.close()
    return _stop_weed(weed) if weed.poll() is None else weed.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m batchscale.localstore.gate")
    parser.add_argument("--listen-fd", type=int, required=True)
    parser.add_argument("--s3-port", type=int, required=True)
    parser.add_argument("--master-port", type=int, required=True)
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument("--ready", type=Path, required=True)
    parser.add_argument("weed_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    weed_args = args.weed_args[1:] if args.weed_args[:1] == ["--"] else args.weed_args
    listener = socket.socket(fileno=args.listen_fd)
    code = run(listener, args.s3_port, args.master_port, args.data_dir, args.ready,
               weed_args)
    print(f"store gate: weed exited with status {code}", file=sys.stderr, flush=True)
    return 0 if code in (0, -signal.SIGTERM) else 1


if __name__ == "__main__":
    sys.exit(main())
