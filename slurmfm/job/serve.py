"""Model servers: HTTP readiness, the endpoint files, and Ray readiness for vLLM.

Readiness polls ``GET <health_path>`` with urllib (no curl, no bash ``/dev/tcp``) until it
answers 200, the server step ends, or the timeout passes. The endpoint files tell the user and
dependent jobs where the server answers; written (temp name, rename) once it is healthy and
removed when the job ends, only when they still name this job.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from . import fsafe
from .safepath import program

if TYPE_CHECKING:
    from .pd import Server


def http_ok(url: str, timeout_s: float = 5.0) -> bool:
    """``GET url`` answers 200. urllib is imported here: it pulls in http.client, email
    and ssl, which the per-node entry (it imports this module for Ray) never needs."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - http only
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def http_status(url: str, timeout_s: float = 5.0) -> int:
    """``GET url``'s HTTP status, 0 when nothing answered."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:  # noqa: S310 - http only
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError, ValueError):
        return 0


ROUTER_READY = "/readiness"
"""SGLang's router: 200 once it has healthy workers, 503 before ("insufficient healthy
workers", sglang-router 0.3.2), while its ``/health`` answers 200 from its start
(sgl-project/sglang docs/advanced_features/router.md, API Surface: ``/liveness``,
``/readiness``, ``/health``)."""


def router_ready(url: str) -> bool:
    """``url`` (a router's :data:`ROUTER_READY`) answers 200; a router without that
    endpoint (404) is asked its ``/health`` instead."""
    status = http_status(url)
    if status == 404:
        return http_ok(url[: -len(ROUTER_READY)] + "/health")
    return status == 200


def pd_check(url: str) -> bool:
    """The readiness check of SGLang prefill/decode's URLs: the router's by
    :func:`router_ready`, the servers' by :func:`http_ok`."""
    return router_ready(url) if url.endswith(ROUTER_READY) else http_ok(url)


def wait_ready(
    url: str,
    running: Callable[[], bool],
    timeout_s: float,
    poll_s: float,
    kind: str = "model",
    check: Callable[[str], bool] = http_ok,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """None when ``url`` answered 200, else why not."""
    deadline = clock() + timeout_s
    while True:
        if check(url):
            return None
        if not running():
            return f"the {kind} server step ended before {url} answered (see its output)"
        if clock() >= deadline:
            return (
                f"the {kind} server at {url} did not become healthy within {timeout_s:g} s "
                "(launcher.ready_timeout_s)"
            )
        sleep(poll_s)


def wait_all(
    urls: Sequence[str],
    running: Callable[[], bool],
    timeout_s: float,
    poll_s: float,
    kind: str = "model",
    check: Callable[[str], bool] = http_ok,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str | None:
    """:func:`wait_ready` for each of ``urls`` in turn, within one ``timeout_s`` for all
    (SGLang prefill/decode: every server, then the router)."""
    deadline = clock() + timeout_s
    for url in urls:
        left = max(0.0, deadline - clock())
        why = wait_ready(url, running, left, poll_s, kind, check, clock, sleep)
        if why is not None:
            return why.replace("within %g s" % left, "within %g s" % timeout_s)
    return None


def pd_servers(env: Mapping[str, str]) -> tuple[str, list[Server]] | None:
    """The router's URL and the servers of SGLang prefill/decode (``prepare``'s export,
    :mod:`.pd`), None for any other server."""
    from . import pd

    text = env.get(pd.ENV, "")
    if not text:
        return None
    try:
        return pd.from_json(text)
    except (ValueError, KeyError, TypeError):
        return None


FRONTS = {
    "server": "the server itself (one model replica)",
    "dp-coordinator": "vLLM's API server on node 0, which spreads requests over its "
    "data-parallel engines",
    "dp-attention": "SGLang's server, whose data-parallel attention ranks share its --tp group",
    "router": "SGLang's router on node 0, in front of the prefill and decode servers",
}
"""What a client's requests reach at the endpoint's ``url`` (the endpoint file's ``front``)."""


def replica_info(
    front: str,
    replicas: int,
    order: Sequence[str],
    pd_info: tuple[str, Sequence[Server]] | None = None,
) -> dict[str, object]:
    """What the endpoint file says of the replicas behind its one ``url``: how many, what
    answers there (``front``, :data:`FRONTS`: the launcher's spec names it, the runtime
    knows no launcher kinds) and each replica's nodes.

    Why: a client, or a load balancer in front of several jobs, must know whether the URL
    is one model or a balancer over many, and a dependent job where each replica runs.
    ``replicas`` model replicas over the ``order`` nodes split evenly (the recipe checks
    made them so): vLLM's data-parallel engines (``replicas / nodes`` whole ones on each
    node), SGLang's DP-attention ranks (each a slice of the ``--tp`` group, in node order).
    With prefill/decode each server is a replica, with its role and URL.
    """
    if pd_info is not None:
        servers = pd_info[1]
        return {
            "front": "router",
            "replicas": len(servers),
            "replica_nodes": [
                {"replica": i, "role": s.role, "url": s.url, "nodes": list(s.nodes)}
                for i, s in enumerate(servers)
            ],
        }
    r, n = max(1, replicas), len(order)
    front = "server" if r == 1 else front
    nodes_of: list[list[str]] = []
    for i in range(r):
        if not n:
            nodes_of.append([])
        elif r >= n:
            nodes_of.append([order[i * n // r]])
        else:
            nodes_of.append(list(order[i * n // r : (i + 1) * n // r]))
    return {
        "front": front,
        "replicas": r,
        "replica_nodes": [{"replica": i, "nodes": nodes} for i, nodes in enumerate(nodes_of)],
    }


def _atomic(path: str, text: str) -> None:
    fsafe.replace(path, text)


def write_endpoint(base: str, info: dict[str, object]) -> None:
    """``BASE.json`` (every field) and ``BASE.env`` (URL and job id, for ``source``)."""
    os.makedirs(os.path.dirname(base), exist_ok=True)
    _atomic(base + ".json", json.dumps(info) + "\n")
    _atomic(
        base + ".env",
        "SLURMFM_ENDPOINT_URL={}\nSLURMFM_ENDPOINT_JOB_ID={}\n".format(info["url"], info["job_id"]),
    )


def drop_endpoint(base: str, job_id: str) -> None:
    """Remove the endpoint files if they still name ``job_id`` (a later job may own them)."""
    try:
        owner = json.loads(fsafe.read_text(base + ".json") or "{}").get("job_id")
    except (ValueError, AttributeError):
        return
    if str(owner) == str(job_id):
        for suffix in (".json", ".env"):
            with contextlib.suppress(OSError):
                os.remove(base + suffix)


RAY_ALIVE = (
    "import ray, sys; ray.init(address=sys.argv[1]); "
    "print(sum(bool(n['Alive']) for n in ray.nodes()))"
)


def ray_alive(
    python: str, address: str, run: Callable[..., tuple[int, str]], timeout_s: float = 60.0
) -> int:
    """Alive Ray nodes, counted as vLLM's multi-node-serving.sh does."""
    rc, out = run([python, "-c", program(RAY_ALIVE), address], timeout_s)
    if rc != 0:
        return 0
    last = (out.strip().splitlines() or ["0"])[-1].strip()
    return int(last) if last.isdigit() else 0
