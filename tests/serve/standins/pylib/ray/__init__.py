"""Stand-in for the ``ray`` Python module: ``init(address=...)`` and ``nodes()`` only.

slurmfm's vLLM launch counts live nodes as vLLM's multi-node-serving.sh does:
``sum(node["Alive"] for node in ray.nodes())``; this asks the stand-in head's registry.
"""

from __future__ import annotations

import socket

_state: dict[str, str] = {}


def init(address: str | None = None, **_: object) -> None:
    if address in (None, "auto"):
        with open("/tmp/ray/ray_current_cluster") as f:
            address = f.read().strip()
    assert address is not None
    _state["address"] = address


def nodes() -> list[dict[str, object]]:
    host, _, port = _state["address"].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"COUNT\n")
        n = int(conn.makefile("r").readline())
    return [{"Alive": True, "NodeID": f"standin-{i}"} for i in range(n)]
