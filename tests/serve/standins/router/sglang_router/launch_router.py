"""Stand-in for ``python -m sglang_router.launch_router`` in prefill/decode mode.

It takes the router's documented flags as its own parser declares them
(sgl-project/sglang: sgl-router/py_src/sglang_router/router_args.py: ``--pd-disaggregation``;
``--prefill URL [BOOTSTRAP_PORT]``, ``nargs="+"``, ``action="append"``, the port a number or
``none``; ``--decode URL``, ``nargs=1``, ``action="append"``; ``--host`` default 127.0.0.1,
``--port`` default 30000; ``--policy``, ``--prefill-policy``, ``--decode-policy`` among
``random|round_robin|cache_aware|power_of_two``; ``--worker-startup-timeout-secs`` default 600;
``--prometheus-port`` default 29000, ``--prometheus-host``)
and its usage in docs/advanced_features/router.md ("Prefill/Decode Disaggregation"). Like the
router it waits up to the startup timeout for its workers' ``/health``; then it checks what
only a stand-in can: each ``--prefill`` is a prefill server whose bootstrap port is the one
given (and accepts a connection), each ``--decode`` a decode server. Then it serves
``/health``, ``/v1/models`` and ``/standin/info`` (the workers it routes to).

Not on ``pylib``'s path: the real router (sglang-router, a Rust build that runs on CPU) is
the same module name, and tests/serve/test_pd_script.py runs the job with each.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import urllib.request
from urllib.parse import urlsplit

import standin_http

POLICIES = ["random", "round_robin", "cache_aware", "power_of_two"]


def get(url: str) -> dict | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - the test's own
            return json.loads(resp.read()) if resp.status == 200 else None
    except (OSError, ValueError):
        return None


def main() -> int:
    p = argparse.ArgumentParser(prog="sglang_router.launch_router")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--pd-disaggregation", action="store_true")
    p.add_argument("--prefill", nargs="+", action="append")
    p.add_argument("--decode", nargs=1, action="append", metavar=("URL",))
    p.add_argument("--policy", choices=POLICIES, default="cache_aware")
    p.add_argument("--prefill-policy", choices=POLICIES)
    p.add_argument("--decode-policy", choices=POLICIES)
    p.add_argument("--worker-startup-timeout-secs", type=int, default=600)
    p.add_argument("--prometheus-port", type=int, default=29000)
    p.add_argument("--prometheus-host", default="127.0.0.1")
    a = p.parse_args()
    if not a.pd_disaggregation or not a.prefill or not a.decode:
        print("router stand-in: PD mode needs --prefill and --decode", file=sys.stderr)
        return 2
    prefill = []
    for item in a.prefill:
        if len(item) > 2 or (len(item) == 2 and not (item[1].isdigit() or item[1] == "none")):
            print(f"router stand-in: --prefill URL [BOOTSTRAP_PORT], not {item}", file=sys.stderr)
            return 2
        prefill.append((item[0], int(item[1]) if len(item) == 2 and item[1] != "none" else None))
    decode = [d[0] for d in a.decode]
    deadline = time.monotonic() + a.worker_startup_timeout_secs
    infos: dict[str, dict] = {}
    for url in [u for u, _ in prefill] + decode:
        while get(url + "/health") is None:
            if time.monotonic() > deadline:
                print(f"router stand-in: {url} not healthy in time", file=sys.stderr)
                return 1
            time.sleep(0.2)
        infos[url] = get(url + "/standin/info") or {}
    for url, port in prefill:
        info = infos[url]
        if info.get("disaggregation_mode") != "prefill" or info.get("bootstrap_port") != port:
            print(f"router stand-in: {url} is not a prefill server on {port}: {info}")
            return 1
        with socket.create_connection((urlsplit(url).hostname, port), timeout=5):
            pass  # the bootstrap server answers
    for url in decode:
        if infos[url].get("disaggregation_mode") != "decode":
            print(f"router stand-in: {url} is not a decode server: {infos[url]}")
            return 1
    model = next(iter(infos.values())).get("model", "?")
    standin_http.serve(
        a.host,
        a.port,
        model,
        fail_health=False,
        delay=0.0,
        info={
            "kind": "sglang_router",
            "prefill": [[u, b] for u, b in prefill],
            "decode": decode,
            "policy": a.policy,
            "node": os.environ.get("SLURMD_NODENAME"),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
