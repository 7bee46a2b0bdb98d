"""Spare nodes (``resources.spare_nodes``): a failed node swapped for a spare inside the job.

The job is allocated N+K nodes; the prepare step puts the first N of its host order in the
training order (``SLURMFM_HOST_ORDER``) and the last K aside (``SLURMFM_SPARES``), so the
launch ``srun`` runs on N nodes (``--nodes``/``--nodelist`` of the order) and torchrun's
``--nnodes`` stays N. When the health gate, run again after a failure, names a node, or the
liveness probe finds one that does not answer, the batch step drains it, takes a spare in
its place and relaunches the step in the same allocation, instead of requeueing: no
credential wait, no queue.

Why the spare takes the failed node's *place* in the order (its node rank): every healthy node
keeps its ranks, so a data loader or checkpoint keyed by rank resumes unchanged, and only the
rendezvous host moves when node 0 was the one that failed (as :func:`hosts.replayed_order`
does for HyperPod's replacements).

Which spare: the one whose ``SLURM_TOPOLOGY_ADDR`` (the switch path, top to leaf, that the
prepare step collects in topology-sorted mode) shares the longest prefix with the failed
node's, so a replacement stays under the same leaf switch or NVLink block where one is free;
without addresses, the first spare of the order (the order already groups nodes by leaf in
the modes that know the topology). Kept to this: the planner's cost model is not run again.

Pure functions and one small value; the batch step (:mod:`.batch`) drains, records and
relaunches.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from .hosts import with_master

if TYPE_CHECKING:  # annotations only (the runtime runs on Python 3.8)
    from collections.abc import Sequence


class Pool(NamedTuple):
    """The training order, the spares left, and where each original node now is."""

    order: tuple[str, ...]
    spares: tuple[str, ...]
    # original training node -> the node in its place now (only the swapped ones)
    moved: tuple[tuple[str, str], ...] = ()
    # nodes taken out of the job's steps (failed, drained or down)
    gone: tuple[str, ...] = ()
    topo: tuple[tuple[str, str], ...] = ()
    # the prepare step's rendezvous host and NeMo task list, for the original order
    master: str = ""
    tasks: str = ""

    @property
    def live(self) -> tuple[str, ...]:
        return self.order + self.spares


class Swap(NamedTuple):
    """What one replacement did: ``pairs`` (failed, spare); ``dropped``: failed spares."""

    pool: Pool
    pairs: tuple[tuple[str, str], ...]
    dropped: tuple[str, ...]

    def describe(self) -> str:
        words = ["%s replaced by spare %s" % p for p in self.pairs]
        if self.dropped:
            words.append("spare %s failed and was set aside" % " ".join(self.dropped))
        return "; ".join(words) + "; %d spare(s) left" % len(self.pool.spares)


def from_env(env: dict[str, str]) -> Pool | None:
    """The job's pool from the prepare step's exports; None without spares."""
    spares = tuple(env.get("SLURMFM_SPARES", "").split())
    if not spares:
        return None
    topo = tuple(
        (k, v)
        for k, _, v in (w.partition("=") for w in env.get("SLURMFM_TOPO_ADDRS", "").split())
        if k
    )
    return Pool(
        tuple(env.get("SLURMFM_HOST_ORDER", "").split()),
        spares,
        topo=topo,
        master=env.get("SLURMFM_RDZV_HOST", ""),
        tasks=env.get("SLURMFM_TASK_NODELIST", ""),
    )


def common_prefix(a: str, b: str) -> int:
    """Switches two topology addresses share from the top (``s1.s2.node``: 2 with ``s1.s2.x``)."""
    xs, ys = a.split(".")[:-1], b.split(".")[:-1]
    n = 0
    while n < min(len(xs), len(ys)) and xs[n] == ys[n]:
        n += 1
    return n


def pick(failed: str, spares: Sequence[str], topo: dict[str, str]) -> str:
    """The spare nearest ``failed`` in the topology; the first spare when none is nearer."""
    where = topo.get(failed, "")
    best = spares[0]
    score = common_prefix(where, topo.get(best, "")) if where else 0
    for s in spares[1:]:
        n = common_prefix(where, topo.get(s, "")) if where else 0
        if n > score:
            best, score = s, n
    return best


def replace(pool: Pool, failed: Sequence[str]) -> Swap | None:
    """Swap every failed training node for a spare; failed spares are set aside.

    None when the healthy spares cannot cover the failed training nodes (the job requeues
    off them, as without spares) or nothing failed that the pool holds.
    """
    bad = [n for n in dict.fromkeys(failed) if n in pool.live]
    if not bad:
        return None
    dropped = tuple(n for n in bad if n in pool.spares)
    spares = [s for s in pool.spares if s not in dropped]
    victims = [n for n in bad if n in pool.order]
    if len(victims) > len(spares):
        return None
    topo = dict(pool.topo)
    order = list(pool.order)
    pairs = []
    for v in victims:
        s = pick(v, spares, topo)
        spares.remove(s)
        order[order.index(v)] = s
        pairs.append((v, s))
    moved = dict(pool.moved)
    for v, s in pairs:
        origin = next((o for o, now in moved.items() if now == v), v)
        moved[origin] = s
    new = pool._replace(
        order=tuple(order),
        spares=tuple(spares),
        moved=tuple(moved.items()),
        gone=pool.gone + tuple(bad),
    )
    return Swap(new, tuple(pairs), dropped)


def map_hosts(text: str, mapping: dict[str, str], sep: str = ",") -> str:
    """``text``, a ``sep``-separated host list, with each host mapped."""
    return sep.join(mapping.get(h, h) for h in text.split(sep))


NODELIST_OPTS = ("--nodelist", "-w")


def rewrite(argv: Sequence[str], pool: Pool, addrs: dict[str, str]) -> tuple[list[str], str]:
    """The launch command for the pool's nodes, and its rendezvous host.

    ``argv`` is the launch as the batch script wrote it, for the original order: its node
    list words (``--nodelist=``, ``-w``, a NeMo task list naming each host once per task) get
    each swapped node's replacement, and torchrun's master address moves with node 0.
    """
    mapping = dict(pool.moved)
    words = list(argv)
    out: list[str] = []
    take = False
    for w in words:
        key, eq, val = w.partition("=")
        if take:
            out.append(map_hosts(w, mapping))
            take = False
        elif eq and key in NODELIST_OPTS:
            out.append(key + "=" + map_hosts(val, mapping))
        else:
            take = w in NODELIST_OPTS
            out.append(w)
    master = pool.master
    if pool.order and master:
        head = pool.order[0]
        master = addrs.get(head, head)
        if master != pool.master:
            out = with_master(out, pool.master, master)
    return out, master


def env_for(pool: Pool, master: str) -> dict[str, str]:
    """The exports the prepare step made, for the pool's nodes now (what the per-node entry
    ranks itself by, and what a NeMo task list or the rendezvous host read)."""
    mapping = dict(pool.moved)
    out: dict[str, str] = {
        "SLURMFM_HOST_ORDER": " ".join(pool.order),
        "SLURMFM_NODELIST": ",".join(pool.order),
        "SLURMFM_SPARES": " ".join(pool.spares),
    }
    if master:
        out.update(SLURMFM_RDZV_HOST=master, MASTER_ADDR=master)
    if pool.tasks:
        out["SLURMFM_TASK_NODELIST"] = map_hosts(pool.tasks, mapping)
    return out


def parse_addrs(text: str) -> dict[str, str]:
    """``SLURMFM_NODE_ADDRS`` (``host=addr ...``) as a dict."""
    return dict(w.split("=", 1) for w in text.split() if "=" in w)
