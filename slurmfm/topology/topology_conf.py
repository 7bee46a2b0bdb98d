"""``topology.conf`` (tree and block) <-> :class:`~slurmfm.topology.model.Topology`.

Formats: tree (``SwitchName= Switches= Nodes= LinkSpeed=``) and block (``BlockName= Nodes=`` +
``BlockSizes=``), topology.conf(5) (https://slurm.schedmd.com/topology.conf.html). A block
topology is a ``Topology`` of ``kind="block"``: every block is a leaf switch, all blocks sit under
the common :data:`~slurmfm.topology.model.ROOT`. Node ``nvlink_domain`` is left unset when
parsing: a Slurm block is a scheduling unit chosen by the admin (the lab uses blocks of H100-like
nodes), not proof of a shared NVLink fabric. The orders and names recorded on the model are
:mod:`slurmfm.topology.slurm_model`'s rules.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

from slurmfm.catalog.slurm_features import SlurmVersion, require, supports
from slurmfm.topology.hostlist import compress_hostlist
from slurmfm.topology.model import Topology, TopologyError, natural_key
from slurmfm.topology.slurm_model import (
    BLOCK_ORDER_PREFIX,
    SWITCH_NAME_RE,
    Version,
    as_version,
    block_order,
    block_sizes_for,
    block_topology,
    check_node_names,
    hostlist_field,
    order_mark,
    slurm_switch_names,
    tree_from_switches,
)

_SOURCE_COMMENT = re.compile(r"^#\s*([A-Za-z0-9_.\-]{1,64})\s*=\s*(\S+)\s*$")
"""A ``# <switch> = <source id>`` traceability comment (written by the exporters)."""


# ---------------------------------------------------------------------------- topology.conf
def _logical_lines(text: str) -> list[tuple[int, str, str]]:
    """(line number, content without comment, comment) with backslash continuations joined."""
    out: list[tuple[int, str, str]] = []
    buf, start = "", 0
    for i, raw in enumerate(text.splitlines(), 1):
        body, _, comment = raw.partition("#")
        if not buf:
            start = i
        if body.rstrip().endswith("\\"):
            buf += body.rstrip()[:-1] + " "
            continue
        out.append((start, buf + body, "#" + comment if "#" in raw else ""))
        buf = ""
    if buf:
        out.append((start, buf, ""))
    return out


def _fields(line: str, where: str) -> list[tuple[str, str]]:
    fields: list[tuple[str, str]] = []
    for tok in line.split():
        key, sep, value = tok.partition("=")
        if not sep or not key:
            raise TopologyError(f"{where}: expected KEY=VALUE, got {tok!r}")
        fields.append((key.lower(), value))
    return fields


def _switch_line(
    where: str,
    name: str,
    rest: dict[str, str],
    switches: dict[str, tuple[int, list[str], list[str]]],
) -> tuple[list[str], list[str]]:
    """A ``SwitchName=`` line's (nodes, child switches), after checking its name and keys:
    a leaf holds nodes and an inner switch holds switches, never both (Slurm's tree)."""
    if not SWITCH_NAME_RE.match(name):
        raise TopologyError(f"{where}: invalid switch name {name!r}")
    if name in switches:
        raise TopologyError(f"{where}: switch {name!r} already defined on line {switches[name][0]}")
    unknown = set(rest) - {"nodes", "switches", "linkspeed"}
    if unknown:
        raise TopologyError(f"{where}: unknown key {sorted(unknown)[0]!r} for a switch")
    nodes = hostlist_field(rest["nodes"], where, "Nodes=") if "nodes" in rest else []
    kids = hostlist_field(rest["switches"], where, "Switches=") if "switches" in rest else []
    if nodes and kids:
        raise TopologyError(
            f"{where}: switch {name!r} has both Nodes= and Switches= (Slurm's tree "
            "puts nodes on leaf switches only)"
        )
    if "linkspeed" in rest and not rest["linkspeed"].isdigit():
        raise TopologyError(f"{where}: LinkSpeed must be a number")
    return nodes, kids


def _block_line(
    where: str, name: str, rest: dict[str, str], blocks: list[tuple[str, list[str], int]]
) -> list[str]:
    """A ``BlockName=`` line's nodes, after checking its name, keys and that it is new."""
    if not SWITCH_NAME_RE.match(name):
        raise TopologyError(f"{where}: invalid block name {name!r}")
    unknown = set(rest) - {"nodes"}
    if unknown:
        raise TopologyError(f"{where}: unknown key {sorted(unknown)[0]!r} for a block")
    if "nodes" not in rest:
        raise TopologyError(f"{where}: block {name!r} has no Nodes=")
    for other, _, oline in blocks:
        if other == name:
            raise TopologyError(f"{where}: block {name!r} already defined on line {oline}")
    return hostlist_field(rest["nodes"], where, "Nodes=")


def _block_sizes(where: str, value: str) -> list[int]:
    """``BlockSizes=``: numbers, each after the first the first times a power of two (the
    aggregated block levels Slurm accepts)."""
    try:
        block_sizes = [int(x) for x in value.split(",")]
    except ValueError as exc:
        raise TopologyError(f"{where}: BlockSizes must be numbers: {exc}") from exc
    if any(s < 1 for s in block_sizes) or any(
        s % block_sizes[0] or (s // block_sizes[0]) & (s // block_sizes[0] - 1)
        for s in block_sizes[1:]
    ):
        raise TopologyError(
            f"{where}: every BlockSizes entry after the first must be the first "
            "times a power of two"
        )
    return block_sizes


def _conf_blocks(
    source: str, blocks: list[tuple[str, list[str], int]], block_sizes: list[int] | None
) -> Topology:
    """The block topology of the file's ``BlockName=`` lines; no block may hold more nodes
    than the base block size."""
    if block_sizes is not None:
        for name, members, lineno in blocks:
            if len(members) > block_sizes[0]:
                raise TopologyError(
                    f"{source}:{lineno}: block {name!r} has {len(members)} nodes, more than "
                    f"the base block size {block_sizes[0]}"
                )
    return block_topology([(n, m) for n, m, _ in blocks], source=source)


def parse_topology_conf(text: str, *, source: str = "topology.conf") -> Topology:
    """Parse a ``topology.conf`` (tree or block) into a Topology; errors say ``source:line:``.

    Tree: ``SwitchName=`` with ``Nodes=`` (leaf) or ``Switches=`` (inner), optional
    ``LinkSpeed=`` (parsed, unused by Slurm; https://slurm.schedmd.com/topology.conf.html).
    Several top switches get the model's synthetic root. Block: ``BlockName= Nodes=`` in index
    order plus ``BlockSizes=`` (or the 23.11 ``BlockLevels=``), kept only as validation here.
    Keys are case-insensitive and ``#`` starts a comment, as in topology.conf(5);
    ``# <switch> = <id>`` comments (written by :func:`export_tree`/:func:`export_block`) restore
    ``source_ids``.
    """
    switches: dict[str, tuple[int, list[str], list[str]]] = {}  # name -> (line, nodes, switches)
    blocks: list[tuple[str, list[str], int]] = []
    comments: dict[str, str] = {}
    block_sizes: list[int] | None = None
    for lineno, body, comment in _logical_lines(text):
        where = f"{source}:{lineno}"
        m = _SOURCE_COMMENT.match(comment.strip()) if comment else None
        if m:
            comments[m.group(1)] = m.group(2)
        if not body.strip():
            continue
        fields = _fields(body, where)
        first = fields[0][0]
        rest = dict(fields[1:])
        if len(rest) != len(fields) - 1:
            raise TopologyError(f"{where}: a key is repeated")
        if first == "switchname":
            nodes, kids = _switch_line(where, fields[0][1], rest, switches)
            switches[fields[0][1]] = (lineno, nodes, kids)
        elif first == "blockname":
            name = fields[0][1]
            blocks.append((name, _block_line(where, name, rest, blocks), lineno))
        elif first in ("blocksizes", "blocklevels"):
            if rest:
                raise TopologyError(f"{where}: {fields[0][0]} takes no other keys on its line")
            if first == "blocksizes":
                block_sizes = _block_sizes(where, fields[0][1])
        else:
            raise TopologyError(
                f"{where}: unknown line start {fields[0][0]!r} (expected SwitchName, BlockName, "
                "BlockSizes)"
            )
    if switches and blocks:
        raise TopologyError(f"{source}: mixes SwitchName (tree) and BlockName (block) lines")
    if blocks:
        return _conf_blocks(source, blocks, block_sizes)
    if not switches:
        raise TopologyError(f"{source}: no SwitchName or BlockName lines")
    return tree_from_switches(switches, comments, source, record_order=True)


# ---------------------------------------------------------------------------- exports
def header_lines(kind: str, t: Topology, v: SlurmVersion, extra: Sequence[str] = ()) -> list[str]:
    return [
        f"# {kind} generated by slurmfm for Slurm {v}: {len(t.nodes)} nodes, "
        f"{len(t.parent_of)} switches.",
        *[f"# {e}" for e in extra],
    ]


def tree_lines(t: Topology, key: str = "SwitchName") -> tuple[list[tuple[int, str]], list[str]]:
    """(topology.conf switch lines, traceability comments) for a tree.

    Lines go leaves first, then level by level (natural name order within a level), as in
    topology.conf(5)'s examples and the slurm-lab files.
    """
    names = slurm_switch_names(t.parent_of)
    children: dict[str, list[str]] = {s: [] for s in t.parent_of}
    for s, p in t.parent_of.items():
        if p is not None:
            children[p].append(s)
    nodes_of: dict[str, list[str]] = {}
    for n, leaf in t.leaf_of.items():
        nodes_of.setdefault(leaf, []).append(n)
    lines: list[tuple[int, str]] = []
    notes: list[str] = []
    for s in sorted(t.parent_of, key=lambda s: (t.level(s), natural_key(names[s]))):
        src = t.source_ids.get(s)
        if order_mark(src):
            src = None
        if names[s] != s or (src is not None and src != s):
            notes.append(f"# {names[s]} = {src if src is not None else s}")
        if s in nodes_of:
            line = f"{key}={names[s]} Nodes={compress_hostlist(nodes_of[s])}"
        elif children[s]:
            line = f"{key}={names[s]} Switches={compress_hostlist(names[c] for c in children[s])}"
        else:
            line = f"{key}={names[s]}"
        lines.append((t.level(s), line))
    return lines, notes


def with_common_root(t: Topology) -> Topology:
    """Add the synthetic root when a topology was built with several tops (add_root=False)."""
    tops = [s for s, p in t.parent_of.items() if p is None]
    if len(tops) <= 1:
        return t
    return Topology.from_parents(
        t.nodes.values(), t.leaf_of, t.parent_of, source_ids=t.source_ids, kind=t.kind
    )


def export_tree(t: Topology, version: Version) -> str:
    """``topology.conf`` for ``TopologyPlugin=topology/tree``, deterministic.

    One line per switch, leaves (``Nodes=``) first, then each level up to a single common root
    (Slurm will not span switches without a common ancestor;
    https://slurm.schedmd.com/topology.conf.html). Names are kept when Slurm-valid; others are
    sanitised with a ``# <name> = <source id>`` comment.
    """
    v = as_version(version)
    check_node_names(t)
    t = with_common_root(t)
    lines, notes = tree_lines(t)
    extra = [f"Tree depth {t.depth}; use TopologyPlugin=topology/tree in slurm.conf."]
    if supports("topology_yaml", v):
        extra.append("Slurm >= 25.05 ignores this file when a topology.yaml exists.")
    out = header_lines("topology.conf (tree)", t, v, extra)
    if notes:
        out.append("# Slurm switch name = source network-node id:")
        out.extend(notes)
    out.extend(line for _, line in lines)
    return "\n".join(out) + "\n"


def blocks_of(t: Topology, block_size: int | None) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Ordered (Slurm block name, nodes) and traceability comments for :func:`export_block`.

    Sources of blocks, in order of preference: an existing block topology (its own order); NVLink
    domains (UltraServers, ``CapacityBlockId``) ordered by EFA proximity: the root-to-leaf path of
    the leaf holding most of the domain's nodes, so consecutive blocks, which Slurm aggregates into
    higher-level blocks, are physically close (https://slurm.schedmd.com/topology.html#block; EC2's
    ``DescribeInstanceTopology`` lists network nodes NN1-NN3 top down:
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/how-ec2-instance-topology-works.html);
    and for a tree without domains, its leaf switches in path order.
    """
    raw: list[tuple[str, list[str]]] = []
    ids: dict[str, str] = {}
    if t.kind == "block":
        for b in block_order(t):
            raw.append((b, sorted(t.nodes_under(b))))
            src = t.source_ids.get(b)
            if src is not None and not src.startswith(BLOCK_ORDER_PREFIX):
                ids[b] = src
    else:
        with_domain = [n for n, node in t.nodes.items() if node.nvlink_domain]
        if with_domain:
            missing = sorted(set(t.nodes) - set(with_domain), key=natural_key)
            if missing:
                raise TopologyError(
                    f"{len(missing)} node(s) have no NVLink domain (UltraServer CapacityBlockId), "
                    f"e.g. {', '.join(missing[:5])}; EC2 can report it late after launch, so "
                    "re-import the topology before exporting blocks"
                )
            groups: dict[str, list[str]] = {}
            for n in t.nodes:
                groups.setdefault(t.nvlink_domain(n), []).append(n)

            def proximity(dom: str) -> tuple[Any, ...]:
                members = groups[dom]
                counts = Counter(t.leaf(n) for n in members)
                leaf = min(counts, key=lambda lf: (-counts[lf], natural_key(lf)))
                sample = next(n for n in members if t.leaf(n) == leaf)
                return (tuple(natural_key(s) for s in t.path(sample)), natural_key(dom))

            for dom in sorted(groups, key=proximity):
                raw.append((dom, sorted(groups[dom])))
                ids[dom] = dom
        else:
            for leaf in sorted(
                t.leaves,
                key=lambda lf: tuple(natural_key(s) for s in t.path(t.nodes_under(lf)[0])),
            ):
                raw.append((leaf, sorted(t.nodes_under(leaf))))
                if leaf in t.source_ids and not order_mark(t.source_ids[leaf]):
                    ids[leaf] = t.source_ids[leaf]
    names = slurm_switch_names([b for b, _ in raw])
    notes = [
        f"# {names[b]} = {ids.get(b, b)}"
        for b, _ in raw
        if names[b] != b or (b in ids and ids[b] != names[b])
    ]
    blocks = [(names[b], members) for b, members in raw]
    base = block_size if block_size is not None else max(len(m) for _, m in blocks)
    for name, members in blocks:
        if len(members) > base:
            raise TopologyError(
                f"block {name!r} has {len(members)} nodes, more than the base block size {base}"
            )
    return blocks, notes


def export_block(t: Topology, version: Version, *, block_size: int | None = None) -> str:
    """``topology.conf`` for ``TopologyPlugin=topology/block`` (Slurm >= 23.11).

    One ``BlockName`` per block (see :func:`blocks_of` for where blocks come from and their EFA
    order), then ``BlockSizes`` from the base block size ``block_size`` (default: the largest
    block, i.e. the UltraServer size for full GB200 UltraServers) by :func:`block_sizes_for`.
    23.11 has topology/block but not ``BlockSizes`` (24.05 replaced ``BlockLevels``;
    SchedMD/slurm:CHANGELOG/slurm-24.05.md),
    so for 23.11 the line is left out and Slurm's default levels apply.
    """
    v = as_version(version)
    require("topology_block", v, "topology/block")
    check_node_names(t)
    if not t.nodes:
        raise TopologyError("no nodes to put into blocks")
    blocks, notes = blocks_of(t, block_size)
    base = block_size if block_size is not None else max(len(m) for _, m in blocks)
    sizes = block_sizes_for(base, len(blocks))
    out = header_lines(
        "topology.conf (block)",
        t,
        v,
        [
            f"{len(blocks)} block(s), base block {base} nodes; line order = block index (Slurm "
            "aggregates aligned runs of consecutive blocks).",
            "Use TopologyPlugin=topology/block in slurm.conf.",
        ],
    )
    if notes:
        out.append("# Slurm block name = source id:")
        out.extend(notes)
    out.extend(f"BlockName={name} Nodes={compress_hostlist(m)}" for name, m in blocks)
    if v >= SlurmVersion(24, 5):
        out.append(f"BlockSizes={','.join(str(s) for s in sizes)}")
    else:
        out.append(
            f"# BlockSizes={','.join(map(str, sizes))} needs Slurm >= 24.05; omitted for {v}"
        )
    return "\n".join(out) + "\n"


def wants_block(t: Topology) -> bool:
    """Block for GB200-style clusters (block kind, or nodes sharing NVLink domains)."""
    if t.kind == "block":
        return True
    return any(len(m) > 1 for m in t.domains().values())
