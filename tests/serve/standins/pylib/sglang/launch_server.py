"""Stand-in for ``python -m sglang.launch_server`` across nodes.

Node 0 listens on ``--dist-init-addr``'s port until the other ``--nnodes - 1`` ranks have
connected (each says its ``--node-rank``), then serves HTTP; the others connect, retrying while
node 0 starts, and stay until node 0 goes away, like SGLang's non-zero ranks which serve no HTTP.
Test-only flags: ``--standin-fail-health``, ``--standin-delay S``.

Prefill/decode disaggregation takes SGLang's documented flags and values
(sgl-project/sglang: docs/advanced_features/server_arguments.md, "PD disaggregation":
``--disaggregation-mode`` ``null|prefill|decode``, ``--disaggregation-transfer-backend``
``mooncake|nixl|ascend|fake`` (default mooncake), ``--disaggregation-bootstrap-port`` (default
8998, "Bootstrap server port on the prefill server")). A prefill server's node 0 listens on its
bootstrap port as SGLang's bootstrap server does (the router's stand-in connects to it); a
bootstrap port given to a decode server, or a transfer backend without a mode, is refused.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import standin_http


def main() -> int:
    p = argparse.ArgumentParser(prog="sglang.launch_server")
    p.add_argument("--model-path", required=True)
    p.add_argument("--tp", "--tp-size", type=int, default=1)
    p.add_argument("--pp-size", type=int, default=1)
    p.add_argument("--ep-size", type=int, default=1)
    p.add_argument("--dp-size", "--dp", type=int, default=1)
    p.add_argument("--enable-dp-attention", action="store_true")
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
    p.add_argument("--dist-init-addr")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--served-model-name")
    p.add_argument("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null")
    p.add_argument(
        "--disaggregation-transfer-backend",
        choices=["mooncake", "nixl", "ascend", "fake"],
        default=None,
    )
    p.add_argument("--disaggregation-bootstrap-port", type=int, default=None)
    p.add_argument("--standin-fail-health", action="store_true")
    p.add_argument("--standin-delay", type=float, default=1.0)
    a = p.parse_args()
    if a.tp % a.nnodes:
        print(f"sglang stand-in: --tp {a.tp} does not split over {a.nnodes} nodes", file=sys.stderr)
        return 1
    if a.dp_size > 1 and (not a.enable_dp_attention or a.tp % a.dp_size):
        # the rule slurmfm's recipe checks follow (server_args.py: dp_size with DP attention)
        print(f"sglang stand-in: --dp-size {a.dp_size} needs DP attention in --tp", file=sys.stderr)
        return 2
    mode = a.disaggregation_mode
    if mode == "null" and (a.disaggregation_transfer_backend or a.disaggregation_bootstrap_port):
        print(
            "sglang stand-in: disaggregation flags without --disaggregation-mode", file=sys.stderr
        )
        return 2
    if mode == "decode" and a.disaggregation_bootstrap_port is not None:
        print("sglang stand-in: a decode server has no bootstrap port", file=sys.stderr)
        return 2
    bootstrap = None
    if mode == "prefill" and a.node_rank == 0:  # the bootstrap server, on the prefill's node 0
        bootstrap = socket.socket()
        bootstrap.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        bootstrap.bind(("0.0.0.0", a.disaggregation_bootstrap_port or 8998))  # noqa: S104
        bootstrap.listen(16)
    ranks = [0]
    if a.nnodes > 1:
        host, _, port = a.dist_init_addr.rpartition(":")
        if a.node_rank == 0:
            srv = socket.socket()
            srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            srv.bind(("0.0.0.0", int(port)))  # noqa: S104 - a server, as SGLang's node 0
            srv.listen(a.nnodes)
            srv.settimeout(120)
            peers = []
            while len(peers) < a.nnodes - 1:
                conn, _ = srv.accept()
                ranks.append(int(conn.makefile("r").readline().split()[1]))
                peers.append(conn)
        else:
            deadline = time.monotonic() + 120
            while True:
                try:
                    conn = socket.create_connection((host, int(port)), timeout=5)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        print(f"sglang stand-in: cannot reach {a.dist_init_addr}", file=sys.stderr)
                        return 1
                    time.sleep(0.5)
            conn.sendall(f"RANK {a.node_rank}\n".encode())
            conn.settimeout(None)
            conn.recv(1)
            return 0
    info = {
        "kind": "sglang",
        "model": a.model_path,
        "tp": a.tp,
        "pp": a.pp_size,
        "ep": a.ep_size,
        "dp": a.dp_size,
        "nnodes": a.nnodes,
        "ranks": sorted(ranks),
        "node": os.environ.get("SLURMD_NODENAME"),
        "port": a.port,
        "disaggregation_mode": mode,
        "transfer_backend": a.disaggregation_transfer_backend or "mooncake",
        "bootstrap_port": (a.disaggregation_bootstrap_port or 8998) if mode == "prefill" else None,
        "dist_init_addr": a.dist_init_addr,
    }
    standin_http.serve(
        a.host,
        a.port,
        a.served_model_name or a.model_path,
        fail_health=a.standin_fail_health,
        delay=a.standin_delay,
        info=info,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
