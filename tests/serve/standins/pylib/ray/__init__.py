"""Stand-in for the ``ray`` Python module: ``init(address=...)`` and ``nodes()`` only.

slurmfm's vLLM launch counts live nodes as vLLM's multi-node-serving.sh does:
``sum(node["Alive"] for node in ray.nodes())``; this asks the stand-in head's registry.
Each node carries Ray's ``NodeManagerAddress``/``NodeManagerHostname`` keys plus a stand-in
only ``standin_vllm_host_ip`` (the ``VLLM_HOST_IP`` that node's ``ray start`` saw).
"""

from __future__ import annotations

import json
import os
import socket

_state: dict[str, str] = {}


def init(address: str | None = None, **_: object) -> None:
    """As Ray's: an explicit address, else ``RAY_ADDRESS``, else the last head started in
    ``/tmp/ray`` (ray/_private/services.py get_ray_address_from_environment)."""
    if address in (None, "auto"):
        address = os.environ.get("RAY_ADDRESS") or None
    if address in (None, "auto"):
        with open("/tmp/ray/ray_current_cluster") as f:
            address = f.read().strip()
    assert address is not None
    _state["address"] = address


def nodes() -> list[dict[str, object]]:
    host, _, port = _state["address"].rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"NODES\n")
        seen = json.loads(conn.makefile("r").readline())
    return [
        {
            "Alive": True,
            "NodeID": f"standin-{i}",
            "NodeManagerHostname": n["name"],
            "NodeManagerAddress": n["node_ip_address"],
            "standin_vllm_host_ip": n["vllm_host_ip"],
        }
        for i, n in enumerate(seen)
    ]
