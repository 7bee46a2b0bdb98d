"""The ranks' order by node and leaf, and the check that the launch got it (issue 42 item 1).

Why: the planner's gain is the order the ranks really get. Node ``i`` of the job's host order
holds global ranks ``i*G .. i*G+G-1`` (the host order is what NCCL sees: it builds its rings
in rank order, and does not detect the network topology, NVIDIA/nccl#1340), so the order is
in *topology order* when every leaf switch's (or block's) nodes are one contiguous run of it.
Slurm before 26.05, and 26.05 without ``TopologyParam``, ranks by node name, and a torchrun
with ``--rdzv-backend=c10d`` ranks nodes by sorting their names as text
(pytorch/pytorch:torch/distributed/elastic/rendezvous/dynamic_rendezvous.py; pytorch#150660),
so nothing else proves per job that the order held.

* :func:`summary`: what ``prepare`` appends to its ``host order`` line and records in the state
  file (``order`` event, which ``slurmfm report`` shows): the runs of node ranks per leaf, and
  whether that is topology order.
* :func:`leaves_from_scontrol` / :func:`leaves_from_addrs`: each node's leaf (``topology/tree``)
  or block (``topology/block``), from ``scontrol show topology`` or ``SLURM_TOPOLOGY_ADDR``.
* :func:`launch_differs`: what the node entry says when the ranks it can see (Slurm's
  ``SLURM_PROCID`` for one task per GPU, torchrun's ``GROUP_RANK`` in its workers'
  environment) are not the planned ones; :func:`c10d` finds a rendezvous that discards them.

Standard library only (the job runtime).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from .hosts import expand_hostlist


def leaves_from_scontrol(text: str) -> dict[str, str]:
    """Each node's leaf switch or block from ``scontrol show topology`` output.

    Tree lines: ``SwitchName=X Level=N LinkSpeed=S Nodes=... [Switches=...]``; a switch without
    child switches is a leaf and its ``Nodes=`` are its own. Block lines: ``BlockName=X
    BlockIndex=I Nodes=... BlockSize=B``; ``AggregatedBlock=`` lines (24.11, 26.05) are derived
    and skipped (the formats ``slurmfm.topology.scontrol`` parses, checked on the lab's 22.05.8,
    24.11.5 and 26.05.5). Nothing known (no topology plugin): an empty map.
    """
    out: dict[str, str] = {}
    for raw in text.splitlines():
        fields = dict(tok.partition("=")[::2] for tok in raw.split() if "=" in tok)
        name = fields.get("SwitchName") or fields.get("BlockName")
        if not name or fields.get("Switches", "(null)") not in ("", "(null)"):
            continue
        for node in expand_hostlist(fields.get("Nodes", "")):
            if node and node != "(null)":
                out.setdefault(node, name)
    return out


def leaves_from_addrs(addrs: Mapping[str, str]) -> dict[str, str]:
    """Each node's leaf from its ``SLURM_TOPOLOGY_ADDR`` (``spine.leaf.node``, top first): the
    path without the node's own name. A node with a one-part address (no topology) has none."""
    return {h: a.rsplit(".", 1)[0] for h, a in addrs.items() if "." in a}


def runs(order: Sequence[str], leaf_of: Mapping[str, str]) -> list[tuple[str, int, int]]:
    """The order as runs of consecutive node ranks under one leaf: (leaf, first, last)."""
    out: list[tuple[str, int, int]] = []
    for i, host in enumerate(order):
        leaf = leaf_of.get(host, "?")
        if out and out[-1][0] == leaf:
            out[-1] = (leaf, out[-1][1], i)
        else:
            out.append((leaf, i, i))
    return out


def summary(order: Sequence[str], leaf_of: Mapping[str, str], source: str) -> str:
    """``by leaf: l1[0-3] l2[4-5]; topology order: yes (leaves from SOURCE)``.

    Topology order: each leaf's nodes are one contiguous run of node ranks, so a ring in rank
    order crosses each leaf's uplink once each way. ``no`` names the leaf split most;
    ``unknown`` when a node's leaf is not known (no topology plugin).
    """
    if not order:
        return "by leaf: -; topology order: unknown (no hosts)"
    parts = runs(order, leaf_of)
    shown = " ".join(f"{lf}[{a}]" if a == b else f"{lf}[{a}-{b}]" for lf, a, b in parts)
    if any(h not in leaf_of for h in order):
        return f"by leaf: {shown}; topology order: unknown (no leaf known for some nodes: {source})"
    count: dict[str, int] = {}
    for lf, _, _ in parts:
        count[lf] = count.get(lf, 0) + 1
    worst = max(count, key=lambda lf: count[lf])
    if count[worst] == 1:
        n = "1 leaf" if len(parts) == 1 else f"{len(parts)} leaves"
        return f"by leaf: {shown}; topology order: yes ({n}, from {source})"
    split = sum(1 for c in count.values() if c > 1)
    return (
        f"by leaf: {shown}; topology order: NO ({split} of {len(count)} leaves split, "
        f"{worst} into {count[worst]} runs; from {source})"
    )


_RDZV_FLAGS = ("--rdzv-backend", "--rdzv_backend")


def c10d(words: Sequence[str]) -> str | None:
    """The word that asks torchrun for a c10d rendezvous (``--rdzv-backend=c10d`` or
    ``--rdzv_backend c10d``), or None. Also inside one shell word of several (``bash -c``)."""
    flat: list[str] = []
    for w in words:
        flat.extend(w.split())
    for i, w in enumerate(flat):
        name, eq, value = w.partition("=")
        if name in _RDZV_FLAGS:
            if not eq:
                value = flat[i + 1] if i + 1 < len(flat) else ""
            if value.strip("'\"") == "c10d":
                return w if eq else f"{w} {value}"
    return None


def launch_differs(env: Mapping[str, str], order: Sequence[str], rank: int) -> str | None:
    """A line when Slurm's task rank on this node is not the one the host order gives it.

    For launches with one task per GPU (``SLURMFM_NTASKS`` set: ``srun
    --distribution=arbitrary`` over the task node list), the task's ``SLURM_PROCID`` is its
    global rank (Lightning's ``SLURMEnvironment`` takes it): it must be ``rank*T + SLURM_LOCALID``
    with ``T`` tasks per node. Other launches get the node rank from the entry (checked in the
    workers by :func:`worker_differs`). None when it agrees or cannot be told.
    """
    ntasks, procid, localid = (env.get(k, "") for k in ("SLURMFM_NTASKS", "SLURM_PROCID",
                                                        "SLURM_LOCALID"))  # fmt: skip
    if not (ntasks.isdigit() and procid.isdigit() and order):
        return None
    per = int(ntasks) // len(order)
    want = rank * per + int(localid or 0)
    if per <= 0 or int(procid) == want:
        return None
    return (
        "slurmfm: rank order differs on %s: Slurm gave task %s (SLURM_PROCID), the job's order "
        "puts it at %d (node rank %d)" % (env.get("SLURMD_NODENAME", "?"), procid, want, rank)
    )


def worker_differs(host: str, rank: int, worker_env: Mapping[str, str]) -> str | None:
    """A line when a torchrun worker's ``GROUP_RANK`` (its node's rank in the rendezvous:
    pytorch/pytorch:torch/distributed/elastic/agent/server/api.py) is not this node's rank in
    the job's order; None when it agrees or the worker has none."""
    got = worker_env.get("GROUP_RANK", "")
    if not got.isdigit() or int(got) == rank:
        return None
    return (
        "slurmfm: rank order differs on %s: the launch made it node %s (GROUP_RANK), the job's "
        "order node %d" % (host, got, rank)
    )


def check_workers(
    host: str,
    rank: int,
    kids_of: Callable[[int], list[int]],
    env_of: Callable[[int], dict[str, str]],
    entry: int,
    *,
    tries: int = 300,
    pause_s: float = 2.0,
    say: Callable[[str], None] = print,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Wait for the launcher's first worker with a ``GROUP_RANK`` (the entry's grandchild) and
    check it (:func:`worker_differs`); say the line when it differs. Returns what was found:
    ``"differs"``, ``"agrees"`` or ``"none"`` (no worker with a group rank within ``tries``).

    Run on a daemon thread of the node entry: workers start after the rendezvous, which can
    take minutes, and the launch must not wait for the check.
    """
    for _ in range(tries):
        for launcher in kids_of(entry):
            for worker in kids_of(launcher):
                env = env_of(worker)
                if "GROUP_RANK" in env:
                    line = worker_differs(host, rank, env)
                    if line:
                        say(line)
                        return "differs"
                    return "agrees"
        sleep(pause_s)
    return "none"
