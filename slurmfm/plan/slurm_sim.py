"""Slurm's own node selection for ``topology/tree``, reproduced as pure functions.

Why: the planner's claims ("never more leaves than Slurm", "fewer ring edges crossing a leaf")
need a baseline that is exactly what Slurm would have done with the same free nodes, not a
plausible approximation. This module is that baseline. It follows
Slurm's ``_eval_nodes_topo`` (SchedMD/slurm, select/cons_tres: the greedy best-fit over
leaf switches guided by hop distance), with the tree-selection fix of SchedMD/slurm commits
2ec1d02624 and 64263118c3: two rule sets, checked against a real Slurm 22.05.8.

* ``rules="21.08"``: Slurm 21.08 through 24.05.2. A closer leaf replaces the current best
  whenever ``compare(i, best) >= 0`` (ties allowed), fit or not; once a leaf is used, only its
  own free count drops to 0 and its ancestors keep their original (stale) free counts.
* ``rules="24.05.3"``: Slurm 24.05.3 and later (SchedMD commits 2ec1d02624 and 64263118c3). A
  closer leaf replaces the best only if it "fits", judged at the level where ``compare`` stopped
  climbing; a used leaf's free nodes are subtracted from every ancestor.

Everything else is shared (checked on real 22.05.8: tests/plan/test_slurm_sim.py): the top
switch is the highest-level switch with enough free nodes (ties go to the last one in config
order); leaves are scanned in ``topology.conf`` order; hop distances between switches are
unit-edge shortest paths (sibling leaves 2, cousins 4, ...) summed over the leaves already
chosen; inside a leaf, nodes are taken in node-table order (natural name order:
SchedMD/slurm:src/slurmctld/read_config.c, ``_sort_node_record_table_ptr``).

Scope: whole-node exclusive jobs of a fixed size, uniform node weights,
no ``-w`` required nodes, no ``--contiguous``/arbitrary distribution (which would bypass the
tree routine: ``_eval_nodes_topo`` in SchedMD/slurm:src/plugins/topology/tree/eval_nodes_tree.c).
CPU and GRES demand are implied by the node count for such
jobs and are not modelled.

``topology/block`` (https://slurm.schedmd.com/topology.html#block) is :func:`select_block`
(:mod:`slurmfm.plan.slurm_block`, re-exported here), transcribed from SchedMD/slurm
``src/plugins/topology/block/eval_nodes_block.c`` (the ``<=`` tie on block size, the cap on
llblocks and the "same llblock" preference come from the code, not from the outline in the
documentation), with two rule sets (``rules="24.11"``/``"26.05"``: they differ on one-node
jobs and on segments larger than a base block), checked against real Slurm 24.11.5 and 26.05.5
in the project's chroot labs
(``tests/plan/test_slurm_sim.py::test_block_agrees_with_real_slurm``; the host's 22.05 lab
cannot run ``topology/block``, which needs 23.11+).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from slurmfm.plan.slurm_block import (
    BLOCK_RULE_SETS,
    BlockRules,
    level_blocks,
    nodelist_accepted,
    select_block,
)
from slurmfm.topology.model import Topology, natural_key

Rules = Literal["21.08", "24.05.3"]
RankPolicy = Literal["name", "leaf"]

__all__ = [
    "BLOCK_RULE_SETS",
    "BlockRules",
    "RankPolicy",
    "Rules",
    "block_choices",
    "block_geometry",
    "config_switch_order",
    "level_blocks",
    "natural_key",
    "nodelist_accepted",
    "rank_order",
    "segment_for",
    "select_block",
    "select_tree",
]


def config_switch_order(topology: Topology) -> list[str]:
    """The switch-line order assumed when the caller does not give one.

    Slurm indexes switches in ``topology.conf`` line order, and the leaf scan and the
    top-switch tie-break (``_eval_nodes_topo``,
    SchedMD/slurm:src/plugins/topology/tree/eval_nodes_tree.c) depend on it. Without the actual
    file we
    assume the order ``topology_conf.export_tree`` writes: leaves first, then level by level,
    natural name order within a level. Pass ``switch_order`` explicitly to simulate a
    specific file.
    """
    return sorted(topology.parent_of, key=lambda s: (topology.level(s), natural_key(s)))


@dataclass
class _Table:
    """Slurm's switch table for one topology.conf order (indices = config line order)."""

    names: list[str]
    level: list[int]
    parent: list[int]  # the top switch's parent is itself, as the compare loop expects
    depth: list[int]  # edges from the table's top switch
    topdown: list[int]  # indices in parent-before-child order
    leaves: list[int]  # leaf indices in config order
    leaf_nodes: dict[int, list[str]]  # leaf -> its nodes in node-table order


# Per topology (by identity, dropped with it): tables and node-table positions already built.
# A background fill places thousands of jobs on one fabric; rebuilding the same table for each
# made selection quadratic in the fabric's size. Topology is frozen, so the cache is exact.
_OrderKey = tuple[str, ...] | None


@dataclass
class _Cache:
    ref: weakref.ref[Topology]
    tables: dict[tuple[tuple[str, ...], _OrderKey], _Table]
    positions: dict[_OrderKey, dict[str, int]]


_CACHE: dict[int, _Cache] = {}


def _cached(topology: Topology) -> _Cache:
    key = id(topology)
    hit = _CACHE.get(key)
    if hit is not None and hit.ref() is topology:
        return hit

    def drop(_ref: weakref.ref[Topology]) -> None:
        _CACHE.pop(key, None)

    hit = _CACHE[key] = _Cache(weakref.ref(topology, drop), {}, {})
    return hit


def _table_for(
    topology: Topology, switch_order: Sequence[str], node_order: Sequence[str] | None
) -> _Table:
    """:func:`_build_table`, built once per topology, switch order and node order."""
    tables = _cached(topology).tables
    key = (tuple(switch_order), None if node_order is None else tuple(node_order))
    t = tables.get(key)
    if t is None:
        t = tables[key] = _build_table(topology, switch_order, node_order)
    return t


def _positions(topology: Topology, node_order: Sequence[str] | None) -> dict[str, int]:
    """Node -> its index in the node table (cached; callers must not change it)."""
    positions = _cached(topology).positions
    key = None if node_order is None else tuple(node_order)
    pos = positions.get(key)
    if pos is None:
        pos = positions[key] = {n: k for k, n in enumerate(_node_table(topology, node_order))}
    return pos


def _build_table(
    topology: Topology, switch_order: Sequence[str], node_order: Sequence[str] | None
) -> _Table:
    names = list(switch_order)
    idx = {s: i for i, s in enumerate(names)}
    if len(idx) != len(names):
        raise ValueError("switch_order names a switch twice")
    unknown = [s for s in names if s not in topology.parent_of]
    if unknown:
        raise ValueError(f"switch_order names unknown switches: {unknown[:5]}")
    missing = sorted(set(topology.leaf_of.values()) - set(idx))
    if missing:
        raise ValueError(f"switch_order misses leaf switches: {missing[:5]}")
    parent: list[int] = []
    for i, s in enumerate(names):
        # Switches missing from the table (e.g. a synthetic root not written to the file)
        # are not Slurm switches: a switch whose parent is absent is a top switch.
        p = topology.parent_of[s]
        parent.append(idx[p] if p is not None and p in idx else i)
    depth = [-1] * len(names)
    for i in range(len(names)):
        chain = []
        j = i
        while depth[j] < 0 and parent[j] != j:
            chain.append(j)
            j = parent[j]
        depth[j] = max(depth[j], 0)
        for k in reversed(chain):
            depth[k] = depth[parent[k]] + 1
    topdown = sorted(range(len(names)), key=lambda i: depth[i])
    level = [topology.level(s) for s in names]
    if node_order is None:
        rank = {n: k for k, n in enumerate(topology.natural_order)}
    else:
        rank = {n: k for k, n in enumerate(node_order)}
        absent = [n for n in topology.nodes if n not in rank]
        if absent:
            raise ValueError(f"node_order misses nodes: {absent[:5]}")
    leaf_nodes: dict[int, list[str]] = {}
    for n, leaf in topology.leaf_of.items():
        leaf_nodes.setdefault(idx[leaf], []).append(n)
    for v in leaf_nodes.values():
        v.sort(key=rank.__getitem__)
    leaves = [i for i, s in enumerate(names) if level[i] == 0 and i in leaf_nodes]
    return _Table(names, level, parent, depth, topdown, leaves, leaf_nodes)


def _hops_from(t: _Table, a: int) -> list[int]:
    """Unit-edge distances from switch ``a`` to every switch of a's tree (``_eval_nodes_topo``'s
    switch distances).

    The tree path is the only path, so the Floyd-Warshall row Slurm computes equals
    ``depth(a) + depth(s) - 2 * depth(lca)``; switches in another tree get a large value.
    """
    on_path = set()
    i = a
    while True:
        on_path.add(i)
        if t.parent[i] == i:
            break
        i = t.parent[i]
    lca_depth = [-1] * len(t.names)
    for s in t.topdown:
        if s in on_path:
            lca_depth[s] = t.depth[s]
        elif t.parent[s] != s:
            lca_depth[s] = lca_depth[t.parent[s]]
    inf = 1 << 40
    out = [inf] * len(t.names)
    da = t.depth[a]
    for s in range(len(t.names)):
        if lca_depth[s] >= 0:
            out[s] = da + t.depth[s] - 2 * lca_depth[s]
    return out


def _compare(t: _Table, i: int, j: int, rem: int, cnt: list[int]) -> tuple[int, bool]:
    """``_topo_compare_switches``: >0 if leaf i is the better fit; also i's last "fit".

    Both fit: fewer free nodes wins. One fits: it wins. Neither: climb to the parents while
    they differ, then more free nodes wins, then the lower level (``_eval_nodes_topo``'s best-fit
    comparison).
    """
    while True:
        i_fit = cnt[i] >= rem
        j_fit = cnt[j] >= rem
        if i_fit and j_fit:
            if cnt[i] < cnt[j]:
                return 1, i_fit
            if cnt[i] > cnt[j]:
                return -1, i_fit
            break
        if i_fit:
            return 1, i_fit
        if j_fit:
            return -1, i_fit
        pi, pj = t.parent[i], t.parent[j]
        if (pi != i or pj != j) and pi != pj:
            i, j = pi, pj
            continue
        break
    if cnt[i] > cnt[j]:
        return 1, i_fit
    if cnt[i] < cnt[j]:
        return -1, i_fit
    if t.level[i] < t.level[j]:
        return 1, i_fit
    if t.level[i] > t.level[j]:
        return -1, i_fit
    return 0, i_fit


def _free_counts(
    t: _Table, free: set[str] | frozenset[str]
) -> tuple[dict[int, list[str]], list[int]]:
    """Each leaf's free nodes (node-table order), and free nodes under every switch."""
    has = free.__contains__
    leaf_free = {lf: list(filter(has, ns)) for lf, ns in t.leaf_nodes.items()}
    cnt = [0] * len(t.names)
    for lf, ns in leaf_free.items():
        if not ns:
            continue
        i = lf
        while True:
            cnt[i] += len(ns)
            if t.parent[i] == i:
                break
            i = t.parent[i]
    return leaf_free, cnt


def _top_switch(t: _Table, cnt: list[int], nodes: int) -> int:
    """Step 3: the highest-level switch with enough free nodes, ties to the last in config
    order (the comparison is level >= current); -1 when none has enough."""
    top = -1
    for i in range(len(t.names)):
        if cnt[i] >= nodes and (top == -1 or t.level[i] >= t.level[top]):
            top = i
    return top


def _prune_to(t: _Table, cnt: list[int], top: int) -> None:
    """Step 4: forget the free nodes outside the top switch's subtree."""
    under_top = [False] * len(t.names)
    for s in t.topdown:
        under_top[s] = s == top or (t.parent[s] != s and under_top[t.parent[s]])
    for i in range(len(t.names)):
        if not under_top[i]:
            cnt[i] = 0


def _take_leaves(
    t: _Table, leaf_free: dict[int, list[str]], cnt: list[int], nodes: int, rules: Rules
) -> tuple[list[str], int]:
    """Steps 5-7, the leaf choice loop: the best leaf by hop distance to the leaves already
    chosen, then :func:`_compare`'s fit, until ``nodes`` are taken. The chosen nodes and how
    many are missing."""
    nsw = len(t.names)
    dist = [0] * nsw
    rem = nodes
    chosen: list[str] = []
    prev = rem + 1
    inf = 1 << 40
    while rem > 0 and prev != rem:
        prev = rem
        best = -1
        for i in t.leaves:
            if best == -1 or dist[i] >= inf or cnt[i] == 0:
                if cnt[i] and dist[i] < inf:
                    best = i
                continue
            tcs, i_fit = _compare(t, i, best, rem, cnt)
            closer_ok = tcs >= 0 if rules == "21.08" else i_fit
            if (dist[i] < dist[best] and closer_ok) or (dist[i] == dist[best] and tcs > 0):
                best = i
        if best == -1:
            break
        row = _hops_from(t, best)
        for i in range(nsw):
            dist[i] = inf if row[i] >= inf or dist[i] >= inf else dist[i] + row[i]
        take = leaf_free[best][:rem]
        chosen.extend(take)
        rem -= len(take)
        if rules != "21.08":
            used = cnt[best]
            i = best
            while t.parent[i] != i:
                i = t.parent[i]
                cnt[i] -= used
        cnt[best] = 0
    return chosen, rem


def select_tree(
    topology: Topology,
    free: set[str] | frozenset[str],
    nodes: int,
    *,
    rules: Rules,
    switches: int | None = None,
    node_order: Sequence[str] | None = None,
    switch_order: Sequence[str] | None = None,
) -> list[str] | None:
    """The nodes Slurm's ``topology/tree`` would give an exclusive ``-N nodes`` job now.

    ``free``: nodes available to the job (idle, in the partition). ``rules``: ``"21.08"`` for
    Slurm 21.08-24.05.2, ``"24.05.3"`` for 24.05.3 and later (SchedMD commits 2ec1d02624,
    64263118c3). ``switches``: the
    job's ``--switches=K``; an allocation over more than K leaves is not started now (it waits
    up to ``max_switch_wait``: https://slurm.schedmd.com/sbatch.html#OPT_switches), so the result
    is None. ``node_order``:
    Slurm's node table (default: natural name order, as slurmctld sorts it:
    SchedMD/slurm:src/slurmctld/read_config.c).
    ``switch_order``: the switch lines of ``topology.conf`` in file order (default:
    :func:`config_switch_order`); leaf scans and tie-breaks follow it.

    Returns the chosen nodes in node-table order (Slurm's allocation/hostlist order), or None
    when Slurm would not start the job now (not enough free nodes under one switch, or more
    leaves than ``switches``).
    """
    if nodes <= 0:
        raise ValueError("nodes must be positive")
    t = _table_for(topology, switch_order or config_switch_order(topology), node_order)
    leaf_free, cnt = _free_counts(t, free)
    top = _top_switch(t, cnt, nodes)
    if top == -1:
        return None
    _prune_to(t, cnt, top)
    chosen, rem = _take_leaves(t, leaf_free, cnt, nodes, rules)
    if rem > 0:
        return None
    if switches is not None:
        leaves_used = {topology.leaf_of[n] for n in chosen}
        if len(leaves_used) > switches:
            return None
    order = _positions(topology, node_order)
    return sorted(chosen, key=order.__getitem__)


def _node_table(topology: Topology, node_order: Sequence[str] | None) -> list[str]:
    if node_order is not None:
        return list(node_order)
    return list(topology.natural_order)


def rank_order(
    nodes: Iterable[str],
    topology: Topology,
    *,
    policy: RankPolicy,
    node_order: Sequence[str] | None = None,
    switch_order: Sequence[str] | None = None,
) -> list[str]:
    """The node order in which Slurm lays out ``SLURM_PROCID`` for an allocation.

    ``policy="name"``: node-table order (natural name order), which a batch job's steps get
    on every release, 26.05 included, unless the cluster sets a ``TopologyParam`` below
    (checked on the lab's 22.05.8, and on 26.05.5 under tree and block:
    tests/catalog/test_newer_slurm.py). ``policy="leaf"``: tree with
    ``TopologyParam=SwitchAsNodeRank`` (slurm.conf(5), 26.05), leaves in ``topology.conf``
    order and node-table order inside a leaf (``topology_p_get_rank`` in
    SchedMD/slurm:src/plugins/topology/tree/topology_tree.c; measured on 26.05.5).
    """
    pos = _positions(topology, node_order)
    chosen = list(nodes)
    unknown = [n for n in chosen if n not in pos]
    if unknown:
        raise ValueError(f"unknown nodes: {unknown[:5]}")
    if policy == "name":
        return sorted(chosen, key=pos.__getitem__)
    sw = {s: k for k, s in enumerate(switch_order or config_switch_order(topology))}
    return sorted(chosen, key=lambda n: (sw[topology.leaf_of[n]], pos[n]))


# ---------------------------------------------------------------------------- topology/block
# The selection itself is slurmfm.plan.slurm_block (select_block, re-exported here).
def segment_for(nodes: int, base: int) -> int:
    """The ``--segment`` a job on ``base``-node blocks would ask: the largest divisor of its
    size that fits one base block, so each segment can share one NVLink domain
    (https://slurm.schedmd.com/topology.html, "--segment"; ``sbatch`` refuses a segment that
    does not divide the job)."""
    return max(d for d in range(1, min(nodes, base) + 1) if nodes % d == 0)


def block_geometry(
    topology: Topology,
    *,
    block_order: Sequence[str] | None = None,
    node_order: Sequence[str] | None = None,
) -> tuple[list[list[str]], list[int]] | None:
    """The base blocks and ``BlockSizes`` Slurm's ``topology/block`` would have on a fabric
    whose NVLink domains are the base blocks, or None when no domain spans nodes.

    One ``BlockName`` per multi-node NVLink domain (a GB200 UltraServer; ParallelCluster and
    HyperPod configure ``topology/block`` this way for p6e-gb200), in ``block_order`` (the
    ``BlockName`` line order; default natural order of the domain names, which is fabric
    order when names follow it), each its nodes in node-table order; ``BlockSizes`` doubling
    from the largest domain (``slurm_model.block_sizes_for``).
    """
    from slurmfm.plan.cost import nvlink_domain
    from slurmfm.topology.slurm_model import block_sizes_for

    members: dict[str, list[str]] = {}
    for n in _node_table(topology, node_order):
        members.setdefault(nvlink_domain(topology, n), []).append(n)
    if all(len(v) < 2 for v in members.values()):
        return None
    names = list(block_order) if block_order is not None else sorted(members, key=natural_key)
    blocks = [members[b] for b in names if b in members]
    return blocks, block_sizes_for(max(len(b) for b in blocks), len(blocks))


def block_choices(
    topology: Topology,
    free: set[str] | frozenset[str],
    nodes: int,
    *,
    rules: BlockRules,
    block_order: Sequence[str] | None = None,
    node_order: Sequence[str] | None = None,
) -> list[tuple[str, list[str]]]:
    """Slurm's ``topology/block`` choices on a fabric whose NVLink domains are the base blocks
    (:func:`block_geometry`). Two jobs: ``-N nodes`` alone and with
    ``--segment`` (:func:`segment_for`), under ``rules`` (:func:`select_block`). Each entry
    is (label, nodes in node-table order); a job Slurm would leave pending has none. Empty
    when no domain spans nodes.
    """
    geometry = block_geometry(topology, block_order=block_order, node_order=node_order)
    if geometry is None:
        return []
    blocks, sizes = geometry
    base = sizes[0]
    out: list[tuple[str, list[str]]] = []
    for label, seg in (("block", None), ("block --segment", segment_for(nodes, base))):
        chosen = select_block(
            blocks,
            free,
            nodes,
            block_sizes=sizes,
            rules=rules,
            segment=seg,
            node_order=node_order,
        )
        if chosen is not None:
            out.append((label if seg is None else f"{label}={seg}", chosen))
    return out
