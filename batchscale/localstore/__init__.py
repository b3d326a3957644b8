"""A local SeaweedFS (`weed mini`) on 127.0.0.1 for `make local-run` and the tests, behind
`batchscale store up|down|status|env`: the process (server.py), its state directory
(state.py), its ports (ports.py), weed's own security (weedconfig.py) and the gate that keeps
every port but S3 off the machine's network (gate.py). docs/lake.md, "Object storage"."""

from batchscale.localstore.ports import DEFAULT_PORTS, GRPC_OFFSET
from batchscale.localstore.server import (
    StoreInfo,
    down,
    env_lines,
    private_network,
    reach,
    status,
    up,
    weed_binary,
)
from batchscale.localstore.state import state_dir
from batchscale.localstore.weedconfig import HOST

__all__ = ["DEFAULT_PORTS", "GRPC_OFFSET", "HOST", "StoreInfo", "down", "env_lines",
           "private_network", "reach", "state_dir", "status", "up", "weed_binary"]
