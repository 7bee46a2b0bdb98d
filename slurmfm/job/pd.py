"""SGLang prefill/decode disaggregation: one allocation split by the runtime, a router in front.

SGLang serves a model disaggregated as separate prefill and decode servers, each an ordinary
``sglang.launch_server`` (one node, or several with ``--nnodes/--node-rank/--dist-init-addr``)
with ``--disaggregation-mode prefill|decode`` and ``--disaggregation-transfer-backend
mooncake|nixl``; each prefill server runs a bootstrap server on ``--disaggregation-bootstrap-port``
through which the decode servers fetch the KV cache, and SGLang's router takes the requests:
``python -m sglang_router.launch_router --pd-disaggregation --prefill URL BOOTSTRAP_PORT ...
--decode URL ...`` (sgl-project/sglang: docs/advanced_features/pd_disaggregation.md, "DeepSeek
Multi-Node"; docs/advanced_features/server_arguments.md, "PD disaggregation";
docs/advanced_features/router.md, "Prefill/Decode Disaggregation";
sgl-router/py_src/sglang_router/router_args.py: ``--prefill`` takes ``URL [BOOTSTRAP_PORT]``,
``--decode`` one URL, ``--worker-startup-timeout-secs`` how long the router waits for them).

Why one allocation split here and not a heterogeneous job: prefill and decode servers run
the same model on the same node type and move the KV cache over the same fabric (Mooncake
or NIXL over EFA/RDMA), so they want one instance type and one NCCL/EFA profile, which a
hetjob exists to vary; one step over the whole allocation keeps the server paths a serving
job already has (one readiness wait, one endpoint, a relaunch of the one step, requeue) and
its topology-compact host order, which keeps each server's nodes together. The cut is made
here, where the order is known: the first ``prefill`` nodes of the job's host order serve
prefill, the next ``decode`` nodes decode, in servers of their role's ``tp x pp`` GPUs
(prefill and decode may differ in ``--tp`` and ``--dp-size``: :class:`Role`); the router
runs on node 0 beside the first prefill server.

Ports (all out of the kernel's ephemeral range, checked by ``prepare``): the router listens
on the recipe's port ``R`` (the job's one endpoint); server ``i`` (prefill first, then
decode) on ``R + 1 + i``, every band SGLang takes above an HTTP port (its NCCL port, up to
:data:`.hosts.SGLANG_HTTP_BAND` above) lying above ``R``. One block picked per job, like
SGLang's dist port: server ``i`` takes ``--dist-init-addr`` port ``D + i * (6 + dp)`` (SGLang
takes the next 5 and one per DP-attention rank after it: :func:`.hosts.sglang_port_clash`),
and prefill server ``i`` its bootstrap port after all of them.

``prepare`` decides the layout once (:func:`layout`, exported as ``SLURMFM_PD``, JSON); each
node's entry reads its own part from it (:func:`server_words`, :func:`router_words`), and the
batch step waits for every server's health and the router's readiness (:data:`.serve.ROUTER_READY`:
its ``/health`` answers before it has registered any server) before it writes the endpoint
file.

Standard library only (Python >= 3.8), as all of slurmfm.job.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from .hosts import SGLANG_DIST_EXTRA, SGLANG_HTTP_BAND, ports_clash

ENV = "SLURMFM_PD"
"""The layout ``prepare`` exports (:func:`to_json`) for the node entries and the batch step."""

ROUTER_MODULE = "sglang_router.launch_router"

SOURCES = (
    "sgl-project/sglang:docs/advanced_features/pd_disaggregation.md",
    "sgl-project/sglang:docs/advanced_features/server_arguments.md",
    "sgl-project/sglang:docs/advanced_features/router.md",
    "sgl-project/sglang:sgl-router/py_src/sglang_router/router_args.py",
)
"""Where the flags of this module come from."""


class Server(NamedTuple):
    """One prefill or decode server: its nodes (the first is its head), the head's address,
    its HTTP port, its ``--dist-init-addr`` port and, for prefill, its bootstrap port."""

    role: str
    nodes: tuple[str, ...]
    head: str
    port: int
    dist_port: int
    bootstrap_port: int = 0
    tp: int = 0  # its --tp (its role's; 0: the command has it)
    dp: int = 1  # its --dp-size with DP attention (its role's)

    @property
    def url(self) -> str:
        return "http://%s:%d" % (self.head, self.port)


def dist_block(servers: int, prefill_servers: int, dp: int) -> int:
    """Ports one job takes from its dist base: each server's dist ports, then each prefill
    server's bootstrap port."""
    return servers * (SGLANG_DIST_EXTRA + max(1, dp)) + prefill_servers


def http_clash(router: int, servers: int, ephemeral: tuple[int, int] = (0, -1)) -> str | None:
    """Why the router's port ``router`` leaves no room for the servers' HTTP ports after it
    (and SGLang's band above each) out of the ephemeral range and under 65536, or None."""
    http = range(router, router + 1 + servers + SGLANG_HTTP_BAND)
    lo, hi = ephemeral
    if http.stop > 65536:
        return "the servers' HTTP ports %d-%d (and SGLang's NCCL ports above them) pass 65535" % (
            router + 1,
            router + servers,
        )
    if http.start <= hi and lo < http.stop:
        return "the HTTP ports %d-%d (router, servers, SGLang's NCCL ports) reach the " % (
            http.start,
            http.stop - 1,
        ) + "ephemeral range %d-%d; set launcher.port below it" % (lo, hi)
    return None


def port_clash(
    router: int,
    base: int,
    servers: int,
    prefill_servers: int,
    dp: int = 1,
    taken: Sequence[int] = (),
    ephemeral: tuple[int, int] = (0, -1),
) -> str | None:
    """Why the dist base ``base`` cannot be used beside router port ``router``, or None.

    The HTTP ports (the router's and the servers' ``router + 1 ..``) with SGLang's band above
    each server's must not meet the block from ``base`` (:func:`dist_block`), a port in
    ``taken`` (the rendezvous port), the ephemeral range, or 65535."""
    why = http_clash(router, servers, ephemeral)
    if why:
        return why
    block = range(base, base + dist_block(servers, prefill_servers, dp))
    if block.stop > 65536:
        return "the dist and bootstrap ports %d-%d pass 65535" % (block.start, block.stop - 1)
    return ports_clash(
        block,
        "the dist and bootstrap ports {}",
        range(router, router + 1 + servers + SGLANG_HTTP_BAND),
        "the HTTP ports {}",
        taken,
        ephemeral,
    )


class Role(NamedTuple):
    """One role's servers: nodes of one server, its ``--tp`` (0: in the command) and its
    ``--dp-size``. Prefill and decode may differ (the recipe's checks cite SGLang)."""

    span: int
    tp: int = 0
    dp: int = 1


def layout(
    order: Sequence[str],
    addrs: Mapping[str, str],
    prefill: int,
    decode: int,
    span: int,
    router: int,
    base: int,
    dp: int = 1,
    roles: tuple[Role, Role] | None = None,
) -> list[Server]:
    """The servers of ``order``: its first ``prefill`` nodes in prefill servers of ``span``
    nodes, its next ``decode`` nodes in decode servers (``roles``: each role's own span,
    ``--tp`` and ``--dp-size``); ports as the module says, each server's dist block sized
    for ``dp`` DP-attention ranks. ValueError when the nodes do not split so (the recipe's
    checks make that a slurmfm bug)."""
    pre, dec = roles or (Role(span, 0, dp), Role(span, 0, dp))
    if (
        min(pre.span, dec.span) < 1
        or prefill % pre.span
        or decode % dec.span
        or prefill + decode != len(order)
    ):
        raise ValueError(
            "%d hosts do not split into %d prefill and %d decode nodes in servers of %d and %d"
            % (len(order), prefill, decode, pre.span, dec.span)
        )
    n_prefill = prefill // pre.span
    n = n_prefill + decode // dec.span
    step = SGLANG_DIST_EXTRA + max(1, dp)
    out = []
    start = 0
    for i in range(n):
        role = "prefill" if i < n_prefill else "decode"
        r = pre if role == "prefill" else dec
        nodes = tuple(order[start : start + r.span])
        start += r.span
        out.append(
            Server(
                role=role,
                nodes=nodes,
                head=addrs.get(nodes[0], nodes[0]),
                port=router + 1 + i,
                dist_port=base + i * step,
                bootstrap_port=base + n * step + i if role == "prefill" else 0,
                tp=r.tp,
                dp=r.dp,
            )
        )
    return out


def to_json(router_url: str, servers: Sequence[Server]) -> str:
    return json.dumps(
        {"router": router_url, "servers": [dict(s._asdict(), nodes=list(s.nodes)) for s in servers]}
    )


def from_json(text: str) -> tuple[str, list[Server]]:
    """The router's URL and the servers of :func:`to_json`'s text."""
    data = json.loads(text)
    servers = [
        Server(
            role=str(s["role"]),
            nodes=tuple(str(n) for n in s["nodes"]),
            head=str(s["head"]),
            port=int(s["port"]),
            dist_port=int(s["dist_port"]),
            bootstrap_port=int(s.get("bootstrap_port", 0)),
            tp=int(s.get("tp", 0)),
            dp=int(s.get("dp", 1)),
        )
        for s in data["servers"]
    ]
    return str(data["router"]), servers


def endpoint_info(router_url: str, servers: Sequence[Server]) -> dict[str, Any]:
    """What the endpoint file lists besides the router: the prefill and decode servers."""
    return {
        "router": router_url,
        "prefill": [
            {
                "url": s.url,
                "bootstrap_port": s.bootstrap_port,
                "nodes": list(s.nodes),
                "tp": s.tp,
                "dp": s.dp,
            }
            for s in servers
            if s.role == "prefill"
        ],
        "decode": [
            {"url": s.url, "nodes": list(s.nodes), "tp": s.tp, "dp": s.dp}
            for s in servers
            if s.role == "decode"
        ],
    }


def mine(servers: Sequence[Server], node: str) -> tuple[Server, int] | None:
    """The server ``node`` belongs to and its rank inside it (None: none)."""
    for s in servers:
        if node in s.nodes:
            return s, s.nodes.index(node)
    return None


def server_words(argv: Sequence[str], server: Server, rank: int, backend: str) -> list[str]:
    """``sglang.launch_server ...`` with this node's own flags: its server's port, its
    role's ``--tp`` and ``--dp-size`` (with ``--enable-dp-attention``), its role, the
    transfer backend, a prefill server's bootstrap port, and across nodes the server's node
    count, this node's rank in it and the server head's dist address."""
    words = list(argv)
    if server.tp:
        words += ["--tp", str(server.tp)]
    if server.dp > 1:
        words += ["--dp-size", str(server.dp), "--enable-dp-attention"]
    words += [
        "--port",
        str(server.port),
        "--disaggregation-mode",
        server.role,
        "--disaggregation-transfer-backend",
        backend,
    ]
    if server.role == "prefill":
        words += ["--disaggregation-bootstrap-port", str(server.bootstrap_port)]
    if len(server.nodes) > 1:
        words += [
            "--nnodes",
            str(len(server.nodes)),
            "--node-rank",
            str(rank),
            "--dist-init-addr",
            "%s:%d" % (server.head, server.dist_port),
        ]
    return words


def router_words(
    python: str,
    servers: Sequence[Server],
    port: int,
    startup_s: int,
    extra: Sequence[str] = (),
) -> list[str]:
    """SGLang's router in PD mode in front of ``servers``, on ``port`` of every address; it
    waits ``startup_s`` for the servers (their model load)."""
    from .safepath import module_words

    words = module_words(python, ROUTER_MODULE) + ["--pd-disaggregation"]
    for s in servers:
        if s.role == "prefill":
            words += ["--prefill", s.url, str(s.bootstrap_port)]
    for s in servers:
        if s.role == "decode":
            words += ["--decode", s.url]
    words += ["--host", "0.0.0.0", "--port", str(port)]  # noqa: S104 - the job's endpoint
    words += ["--worker-startup-timeout-secs", str(startup_s)]
    return words + list(extra)


def describe(router_url: str, servers: Sequence[Server]) -> str:
    """One line for the job log."""
    parts = []
    for s in servers:
        extra = "; tp %d" % s.tp if s.tp else ""
        extra += "; dp %d" % s.dp if s.dp > 1 else ""
        extra += "; bootstrap %d" % s.bootstrap_port if s.role == "prefill" else ""
        parts.append("%s %s (%s%s)" % (s.role, s.url, " ".join(s.nodes), extra))
    return "prefill/decode servers: %s; router %s" % (", ".join(parts), router_url)
