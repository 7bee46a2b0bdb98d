"""Run flow-level network scenarios on SimGrid; JSON in on stdin, JSON out on stdout.

This file runs under the interpreter that has SimGrid's Python bindings (Debian's
``python3-simgrid`` is built for ``/usr/bin/python3``), not necessarily slurmfm's, so it uses
only the standard library and ``simgrid``; :mod:`slurmfm.plan.simulate` builds the scenarios
and starts it. SimGrid's ``Engine`` is one per process and cannot be reset, so every scenario
runs in a forked child (fork after ``import simgrid``, before any Engine exists).

Input: ``{"scenarios": [S, ...]}`` where ``S`` is::

    {"links":  [[name, bytes_per_s, latency_s], ...],   # split-duplex (UP/DOWN independent)
     "hosts":  [name, ...],
     "routes": [[src, dst, [[link, "UP" | "DOWN"], ...]], ...],   # one-way routes
     "groups": [{"rounds": R, "edges": [[src, dst, bytes_per_round], ...]}, ...]}

A group is one collective: R rounds, each sending every edge's bytes at once and waiting for
all of them (a ring moves in lock step, so its slowest edge paces it). All groups start at
time 0, so they contend for links through SimGrid's bandwidth sharing. Output:
``{"results": [{"groups": [finish_s, ...], "makespan": s}, ...]}``.

Network model: ``CM02`` (max-min fair sharing without the TCP corrections of the default
``LV08``; https://simgrid.org/doc/latest/Configuring_SimGrid.html, ``network/model``),
cross-traffic off (no TCP acknowledgements) and the TCP window bound off: EFA and NVLink
are RDMA fabrics, not TCP.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _run_one(sc: dict[str, Any]) -> dict[str, Any]:
    from simgrid import (  # type: ignore[import-not-found]
        Actor,
        Comm,
        Engine,
        LinkInRoute,
        NetZone,
    )

    e = Engine(
        [
            "sim",
            "--log=root.thres:critical",
            "--cfg=network/model:CM02",
            "--cfg=network/crosstraffic:0",
            "--cfg=network/TCP-gamma:0",
        ]
    )
    zone = NetZone.create_full_zone("fabric")
    hosts = {h: zone.create_host(h, 1e9) for h in sc["hosts"]}
    links = {}
    for name, bw, lat in sc["links"]:
        link = zone.create_split_duplex_link(name, float(bw))
        link.set_latency(float(lat))
        links[name] = link
    up, down = LinkInRoute.Direction.UP, LinkInRoute.Direction.DOWN
    for src, dst, path in sc["routes"]:
        route = [LinkInRoute(links[n], up if d == "UP" else down) for n, d in path]
        zone.add_route(hosts[src].netpoint, hosts[dst].netpoint, None, None, route, False)
    zone.seal()
    groups = sc["groups"]
    finish = [0.0] * len(groups)

    def run_group(i: int) -> None:
        g = groups[i]
        for _ in range(int(g["rounds"])):
            comms = [
                Comm.sendto_async(hosts[s], hosts[d], max(1, int(b))) for s, d, b in g["edges"]
            ]
            Comm.wait_all(comms)
        finish[i] = Engine.clock

    anchor = next(iter(hosts.values()))
    for i, g in enumerate(groups):
        if g["edges"]:
            Actor.create(f"g{i}", anchor, run_group, i)
    e.run()
    return {"groups": finish, "makespan": max(finish, default=0.0)}


def main() -> int:
    # Imported before forking, so each child only builds an Engine.
    import simgrid  # noqa: F401

    data = json.load(sys.stdin)
    results = []
    for sc in data["scenarios"]:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: one Engine, one scenario
            os.close(r)
            try:
                out = json.dumps(_run_one(sc)).encode()
                code = 0
            except BaseException as exc:  # report any failure to the parent
                out = json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode()
                code = 1
            with os.fdopen(w, "wb") as f:
                f.write(out)
            os._exit(code)
        os.close(w)
        with os.fdopen(r, "rb") as f:
            raw = f.read()
        os.waitpid(pid, 0)
        results.append(json.loads(raw or b'{"error": "simulator died"}'))
    json.dump({"results": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
