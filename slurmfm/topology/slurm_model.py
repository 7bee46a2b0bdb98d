"""What slurmfm records of Slurm's topology files on a :class:`Topology`, and builds from them.

Why a module of its own: the topology.conf, topology.yaml and ``scontrol show topology`` readers
and writers (:mod:`slurmfm.topology.topology_conf`, :mod:`slurmfm.topology.topology_yaml`,
:mod:`slurmfm.topology.scontrol`) share these rules, and the planner reads the orders back:

* **Block order** matters (the base-block index is the config line order and aggregated blocks are
  aligned runs of consecutive blocks; https://slurm.schedmd.com/topology.html#block). It is kept in
  ``Topology.source_ids`` as ``"slurm-block:<index>"`` for every block, because ``source_ids`` is
  persisted with the topology and has no other meaning for Slurm-only blocks; :func:`block_order`
  reads it back (falling back to natural name order when absent).
* **Switch order** of a tree matters too: Slurm indexes switches in ``topology.conf`` line order
  (``scontrol show topology`` prints them in that order), and its leaf scan and tie-breaks follow
  it (SchedMD/slurm:src/plugins/topology/tree/eval_nodes_tree.c, ``_eval_nodes_topo``). The
  readers record it the same way, ``"slurm-switch:<index>"`` in ``source_ids``, for every switch
  that has no traceability comment (a ``# <switch> = <id>`` comment keeps its id instead, and then
  the order is incomplete); :func:`switch_order` reads it back (None when absent or incomplete).
  Exporters never write these marks as comments.
* **Switch names** must be at most 64 characters of ``[A-Za-z0-9_.-]`` (topology.conf(5),
  https://slurm.schedmd.com/topology.conf.html, gives the length; the character set keeps
  hostlist syntax and ``SLURM_TOPOLOGY_ADDR`` unambiguous). Valid names (e.g. EC2 ``nn-...`` ids)
  are kept; others are sanitised (:func:`slurm_switch_names`) and a ``# <name> = <source id>``
  comment keeps them traceable.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence

from slurmfm.catalog.slurm_features import SlurmVersion
from slurmfm.topology.hostlist import expand_hostlist
from slurmfm.topology.model import ROOT, Node, Topology, TopologyError, natural_key

BLOCK_ORDER_PREFIX = "slurm-block:"
"""``source_ids`` value prefix that records a block's index (its line order in Slurm's file)."""
SWITCH_ORDER_PREFIX = "slurm-switch:"
"""``source_ids`` value prefix that records a tree switch's line index in Slurm's file."""

MAX_NAME = 64  # topology.conf(5): SwitchName is at most 64 characters (topology.conf(5), https://slurm.schedmd.com/topology.conf.html)
SWITCH_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_BAD_NODE_CHARS = re.compile(r"[\s,\[\]=#]")

Version = SlurmVersion | str


def as_version(v: Version) -> SlurmVersion:
    """A version given as text or :class:`SlurmVersion`, as :class:`SlurmVersion`."""
    return v if isinstance(v, SlurmVersion) else SlurmVersion.parse(v)


def check_node_names(t: Topology) -> None:
    for n in t.nodes:
        if not n or _BAD_NODE_CHARS.search(n):
            raise TopologyError(f"node name {n!r} cannot be written in a Slurm hostlist")


def slurm_switch_names(names: Iterable[str]) -> dict[str, str]:
    """Model switch name -> Slurm-valid, unique switch name (kept when already valid)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    ordered = sorted(names, key=natural_key)
    for n in ordered:  # valid names first claim themselves
        if SWITCH_NAME_RE.match(n):
            out[n] = n
            used.add(n)
    for n in ordered:
        if n in out:
            continue
        base = re.sub(r"[^A-Za-z0-9_.\-]", "_", n) or "switch"
        base = base[:MAX_NAME]
        cand, i = base, 1
        while cand in used:
            suffix = f"_{i}"
            cand = base[: MAX_NAME - len(suffix)] + suffix
            i += 1
        out[n] = cand
        used.add(cand)
    return out


def block_order(t: Topology) -> list[str]:
    """Blocks (leaf switches) of a block topology in Slurm's order (base-block index).

    Reads the ``slurm-block:<i>`` marks in ``source_ids`` (see module docstring); unmarked
    blocks follow, in natural name order.
    """

    def key(b: str) -> tuple[int, int, str]:
        src = t.source_ids.get(b, "")
        if src.startswith(BLOCK_ORDER_PREFIX) and src[len(BLOCK_ORDER_PREFIX) :].isdigit():
            return (0, int(src[len(BLOCK_ORDER_PREFIX) :]), "")
        return (1, 0, natural_key(b))

    return sorted(t.leaves, key=key)


def order_mark(src: str | None) -> bool:
    """A ``slurm-switch:<i>`` order mark (not a traceability id, never exported)."""
    return src is not None and src.startswith(SWITCH_ORDER_PREFIX)


def switch_order(t: Topology) -> list[str] | None:
    """A tree's switches in Slurm's ``topology.conf`` line order, or None when not recorded.

    Reads the ``slurm-switch:<i>`` marks that :func:`parse_topology_conf` and
    :func:`parse_scontrol_topology` put in ``source_ids`` (module docstring). None unless every
    switch except the model's synthetic :data:`ROOT` (several top switches, not a Slurm switch)
    is marked: a partial order would misplace the unmarked switches in Slurm's scan.
    """
    if t.kind != "tree":
        return None
    pos: dict[str, int] = {}
    for s in t.parent_of:
        src = t.source_ids.get(s, "")
        if src.startswith(SWITCH_ORDER_PREFIX) and src[len(SWITCH_ORDER_PREFIX) :].isdigit():
            pos[s] = int(src[len(SWITCH_ORDER_PREFIX) :])
        elif not (s == ROOT and t.parent_of[s] is None):
            return None
    if not pos:
        return None
    return sorted(pos, key=lambda s: (pos[s], natural_key(s)))


def block_topology(
    blocks: Sequence[tuple[str, Sequence[str]]],
    nodes: Iterable[Node] | None = None,
    *,
    source: str = "blocks",
) -> Topology:
    """A ``kind="block"`` Topology from ordered ``(block name, node names)`` pairs.

    Every block hangs under :data:`ROOT` (even a single one, so all block topologies have the same
    shape) and its index is recorded in ``source_ids`` (module docstring).
    """
    node_map = {n.name: n for n in nodes} if nodes is not None else {}
    leaf_of: dict[str, str] = {}
    parent_of: dict[str, str | None] = {ROOT: None}
    source_ids: dict[str, str] = {}
    for i, (name, members) in enumerate(blocks):
        if name == ROOT or name in parent_of:
            raise TopologyError(f"{source}: block {name!r} is defined twice (or named {ROOT!r})")
        parent_of[name] = ROOT
        source_ids[name] = f"{BLOCK_ORDER_PREFIX}{i}"
        for n in members:
            if n in leaf_of:
                raise TopologyError(
                    f"{source}: node {n!r} is in blocks {leaf_of[n]!r} and {name!r}"
                )
            leaf_of[n] = name
            node_map.setdefault(n, Node(n))
    return Topology.from_parents(
        node_map.values(), leaf_of, parent_of, source_ids=source_ids, kind="block"
    )


def block_sizes_for(base: int, blocks: int) -> list[int]:
    """``BlockSizes``: base·2^k up to the total (aligned groups of 2^k consecutive blocks).

    Slurm validates that every size after the first is B0·2^k
    (https://slurm.schedmd.com/topology.conf.html, BlockSizes); NVIDIA Topograph
    (NVIDIA/topograph) and this repo's slurm-lab emit ``D,2D,4D...`` while the size fits the
    cluster, and a
    level larger than all blocks together could never be satisfied.
    """
    if base < 1 or blocks < 1:
        raise TopologyError("block size and block count must be positive")
    sizes = [base]
    while sizes[-1] * 2 <= base * blocks:
        sizes.append(sizes[-1] * 2)
    return sizes


def hostlist_field(value: str, where: str, what: str) -> list[str]:
    if not value:
        raise TopologyError(f"{where}: empty {what}")
    try:
        return expand_hostlist(value)
    except ValueError as exc:
        raise TopologyError(f"{where}: {what}: {exc}") from exc


def tree_from_switches(
    switches: Mapping[str, tuple[int, Sequence[str], Sequence[str]]],
    comments: Mapping[str, str],
    source: str,
    *,
    record_order: bool = False,
) -> Topology:
    """A tree from switch lines; ``record_order`` marks each switch's line index (docstring)."""
    leaf_of: dict[str, str] = {}
    parent_of: dict[str, str | None] = dict.fromkeys(switches)
    for name, (lineno, nodes, kids) in switches.items():
        where = f"{source}:{lineno}"
        # Checked and added with C-level set and dict operations (a 64k-node file has a
        # Python-level loop per node otherwise); the loop runs only to name an offender.
        fresh = dict.fromkeys(nodes, name)
        if not (
            len(fresh) == len(nodes)
            and switches.keys().isdisjoint(fresh)
            and leaf_of.keys().isdisjoint(fresh)
        ):
            for n in nodes:
                if n in switches:
                    raise TopologyError(f"{where}: {n!r} is both a node and a switch")
                if n in leaf_of:
                    raise TopologyError(
                        f"{where}: node {n!r} is already under switch {leaf_of[n]!r}"
                    )
                leaf_of[n] = name
        leaf_of.update(fresh)
        for k in kids:
            if k not in switches:
                raise TopologyError(f"{where}: switch {name!r} names undefined switch {k!r}")
            if k == name:
                raise TopologyError(f"{where}: switch {name!r} lists itself")
            old = parent_of[k]
            if old is not None:
                raise TopologyError(f"{where}: switch {k!r} already has parent {old!r}: not a tree")
            parent_of[k] = name
    sources = {s: v for s, v in comments.items() if s in switches}
    if record_order:
        for i, (s, _) in enumerate(sorted(switches.items(), key=lambda kv: kv[1][0])):
            sources.setdefault(s, f"{SWITCH_ORDER_PREFIX}{i}")
    try:
        return Topology.from_parents(
            Node.plain(leaf_of), leaf_of, parent_of, source_ids=sources, kind="tree"
        )
    except TopologyError as exc:
        raise TopologyError(f"{source}: {exc}") from exc
