"""One picture of the cluster: nodes, the EFA fabric tree, and NVLink domains.

Why one model: the planner, the renderer and the operator tools all ask the same questions
(which leaf is this node under, how far apart are two nodes, which nodes share an UltraServer),
and every importer (EC2 DescribeInstanceTopology, topology.conf, topology.yaml, scontrol,
HyperPod labels) and exporter goes through this one value. networkx holds the tree (edges point
from parent switch to child switch or node); the typed methods below are the API.

Conventions:

* Switch levels count from the leaves: a leaf switch (one that holds nodes) is level 0, its
  parent level 1, and so on, as in Slurm's ``scontrol show topology``.
* EC2 network nodes are listed top-down (``NetworkNodes[0]`` is the top layer, the last is the
  node the instance attaches to; EC2 docs, how-ec2-instance-topology-works.html).
  :meth:`Topology.from_paths` takes paths in that order.
* Every pair of nodes is connected: if the fabric has several top switches, a synthetic common
  root named :data:`ROOT` is added above them (Slurm's tree needs a common ancestor for a job to
  span switches; topology.conf(5)).
* An NVLink domain is the instance itself for 8-GPU HGX types, or a GB200 UltraServer
  identified by EC2's ``CapacityBlockId`` (9 or 18 instances x 4 GPUs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from slurmfm.errors import SlurmfmError
from slurmfm.job.hosts import natural_key as natural_key  # noqa: PLC0414 - one key, the runtime's

if TYPE_CHECKING:
    import networkx as nx

ROOT = "root"


def natural_sorted(names: Iterable[str]) -> list[str]:
    """``sorted(names, key=natural_key)``, without a key per name when plain order is the same.

    Names that are one stem and a digit run of one width (``p5-00001``...``p5-65536``, the
    padded hostlists Slurm sites write) differ only in runs of equal length, and for those
    ``strnatcmp`` order is character order: numbers of one width compare like their digits,
    a run with a leading ``0`` compares digit by digit anyway, and ``0`` sorts below the
    other digits. Plain ``sorted`` is then several times faster on a 64k-node fabric.
    """
    out = list(names)
    if out:
        first = out[0]
        digits = "0123456789"
        stem = first.rstrip(digits)
        width = len(first)
        if (
            len(stem) < width
            and not (stem and stem[-1].isdecimal())
            and all(len(n) == width and n.rstrip(digits) == stem for n in out)
        ):
            out.sort()
            return out
    out.sort(key=natural_key)
    return out


FREE_STATES = frozenset({"idle"})
NodeState = str  # Slurm's base state, lower case: idle, allocated, mixed, down, drain, unknown


@dataclass(frozen=True)
class Node:
    """A Slurm node and the EC2 instance behind it (instance fields may be unknown)."""

    name: str
    instance_id: str | None = None
    instance_type: str | None = None
    private_ip: str | None = None
    state: NodeState = "idle"
    nvlink_domain: str | None = None  # CapacityBlockId for UltraServers; None: the node itself

    @property
    def free(self) -> bool:
        return self.state in FREE_STATES

    @classmethod
    def plain(cls, names: Iterable[str]) -> list[Node]:
        """``[Node(n) for n in names]``, four times faster: only the name is stored.

        Why: a 64k-node topology.conf makes one record per node, and the frozen dataclass
        ``__init__`` sets six fields through ``object.__setattr__``. A dataclass's defaults are
        class attributes (docs.python.org/3/library/dataclasses.html, "default values"), so an
        instance whose ``__dict__`` holds only ``name`` reads, compares, hashes, pickles and
        ``replace()``-s exactly like ``Node(name)``.
        """
        new = object.__new__
        out: list[Node] = []
        append = out.append
        for name in names:
            node = new(cls)
            node.__dict__["name"] = name
            append(node)
        return out


@dataclass(frozen=True)
class Switch:
    """A network node of the fabric (an EC2 ``nn-...`` id, or a Slurm switch name)."""

    name: str
    parent: str | None
    level: int
    children: tuple[str, ...]  # child switches (inner) or node names (leaf)
    is_leaf: bool
    source_id: str | None = None  # the EC2 network-node id this switch came from, if any


class TopologyError(SlurmfmError, ValueError):
    """A topology that is not a tree, names an unknown node, or is otherwise inconsistent."""


@dataclass(frozen=True)
class Topology:
    """Nodes, the fabric tree above them, and their NVLink domains. Immutable.

    Build with :meth:`from_paths` (EC2-style top-down paths) or :meth:`from_parents`
    (switch -> parent, node -> leaf). Equality compares nodes, tree shape and domains.
    """

    nodes: Mapping[str, Node]
    leaf_of: Mapping[str, str]  # node -> leaf switch
    parent_of: Mapping[str, str | None]  # switch -> parent switch (None for the root)
    source_ids: Mapping[str, str] = field(default_factory=dict)  # switch -> EC2 nn- id
    kind: Literal["tree", "block"] = "tree"

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_parents(
        cls,
        nodes: Iterable[Node],
        leaf_of: Mapping[str, str],
        parent_of: Mapping[str, str | None],
        *,
        source_ids: Mapping[str, str] | None = None,
        kind: Literal["tree", "block"] = "tree",
        add_root: bool = True,
    ) -> Topology:
        """Build from explicit maps; adds a common root when there are several tops."""
        node_map = {n.name: n for n in nodes}
        parents = dict(parent_of)
        # Set operations instead of a Python loop per node (64k-node fabrics); the loop runs
        # only to name the first offender in the error.
        if leaf_of.keys() - node_map.keys():
            for n, leaf in leaf_of.items():
                if n not in node_map:
                    raise TopologyError(f"node {n!r} is under {leaf!r} but is not a known node")
        for leaf in dict.fromkeys(leaf_of.values()):  # first-seen order, as before
            parents.setdefault(leaf, None)
        missing = sorted(node_map.keys() - leaf_of.keys())
        if missing:
            raise TopologyError(f"nodes without a switch: {', '.join(missing[:10])}")
        for sw, par in list(parents.items()):
            if par is not None:
                parents.setdefault(par, None)
            if sw in node_map:
                raise TopologyError(f"{sw!r} is both a node and a switch")
        tops = sorted(s for s, p in parents.items() if p is None)
        if add_root and len(tops) > 1:
            if ROOT in parents:
                raise TopologyError(f"several top switches and one is already named {ROOT!r}")
            for t in tops:
                parents[t] = ROOT
            parents[ROOT] = None
        topo = cls(
            nodes=node_map,
            leaf_of=dict(leaf_of),
            parent_of=parents,
            source_ids=dict(source_ids or {}),
            kind=kind,
        )
        topo._check_tree()
        return topo

    @classmethod
    def from_paths(
        cls,
        paths: Mapping[str, Sequence[str]],
        nodes: Iterable[Node] | None = None,
        *,
        kind: Literal["tree", "block"] = "tree",
    ) -> Topology:
        """Build from top-down switch paths per node (EC2 ``NetworkNodes`` order)."""
        node_list = list(nodes) if nodes is not None else [Node(n) for n in paths]
        leaf_of: dict[str, str] = {}
        parent_of: dict[str, str | None] = {}
        for name, path in paths.items():
            if not path:
                raise TopologyError(f"node {name!r} has an empty network path")
            leaf_of[name] = path[-1]
            for i, sw in enumerate(path):
                par = path[i - 1] if i else None
                old = parent_of.get(sw, par)
                if old != par:
                    raise TopologyError(
                        f"switch {sw!r} has two parents ({old!r} and {par!r}): not a tree"
                    )
                parent_of[sw] = par
        return cls.from_parents(node_list, leaf_of, parent_of, kind=kind)

    def _check_tree(self) -> None:
        for sw in self.parent_of:
            seen: set[str] = set()
            cur: str | None = sw
            while cur is not None:
                if cur in seen:
                    raise TopologyError(f"switch {sw!r} is in a cycle")
                seen.add(cur)
                cur = self.parent_of.get(cur)
        leaves = set(self.leaf_of.values())
        inner = {p for p in self.parent_of.values() if p is not None}
        both = leaves & inner
        if both:
            raise TopologyError(
                f"switch {sorted(both)[0]!r} holds both nodes and switches; Slurm's tree "
                "allows one or the other"
            )

    # ---------------------------------------------------------------- derived structure
    @cached_property
    def graph(self) -> nx.DiGraph:  # type: ignore[type-arg]
        """The tree as a networkx DiGraph, parent -> child, nodes tagged kind=switch|node."""
        import networkx as nx

        g: nx.DiGraph = nx.DiGraph()  # type: ignore[type-arg]
        for sw, par in self.parent_of.items():
            g.add_node(sw, kind="switch")
            if par is not None:
                g.add_edge(par, sw)
        for n, leaf in self.leaf_of.items():
            g.add_node(n, kind="node")
            g.add_edge(leaf, n)
        return g

    @cached_property
    def _children(self) -> dict[str, list[str]]:
        ch: dict[str, list[str]] = {s: [] for s in self.parent_of}
        for sw, par in self.parent_of.items():
            if par is not None:
                ch[par].append(sw)
        for n, leaf in self.leaf_of.items():
            ch[leaf].append(n)
        for v in ch.values():
            v.sort()
        return ch

    @cached_property
    def _levels(self) -> dict[str, int]:
        """Switch -> level: 0 without child switches, else 1 + the highest child's.

        Walked up from every switch without child switches (from the parent map alone: the
        sorted per-switch children, nodes included, cost more than this on 64k nodes); a walk
        stops where an earlier one already reached that height.
        """
        parent_of = self.parent_of
        levels = dict.fromkeys(parent_of, 0)
        inner = {p for p in parent_of.values() if p is not None}
        limit = len(parent_of)
        for sw in parent_of:
            if sw in inner:
                continue
            d = 0
            par = parent_of[sw]
            while par is not None and levels[par] <= d:
                d += 1
                if d > limit:
                    raise TopologyError(f"switch {sw!r} is in a cycle")
                levels[par] = d
                par = parent_of[par]
        return levels

    @cached_property
    def _switch_paths(self) -> dict[str, tuple[str, ...]]:
        """Switch -> the switches from the root down to it (one tuple per switch, shared)."""
        cache: dict[str, tuple[str, ...]] = {}

        def up(sw: str) -> tuple[str, ...]:
            if sw not in cache:
                par = self.parent_of[sw]
                cache[sw] = (sw,) if par is None else (*up(par), sw)
            return cache[sw]

        for sw in self.parent_of:
            up(sw)
        return cache

    @cached_property
    def _paths(self) -> dict[str, tuple[str, ...]]:
        sp = self._switch_paths
        return {n: sp[leaf] for n, leaf in self.leaf_of.items()}

    @cached_property
    def _under(self) -> dict[str, tuple[str, ...]]:
        under: dict[str, list[str]] = {s: [] for s in self.parent_of}
        for n, path in self._paths.items():
            for sw in path:
                under[sw].append(n)
        return {s: tuple(sorted(v)) for s, v in under.items()}

    # ---------------------------------------------------------------- queries
    @property
    def root(self) -> str:
        tops = [s for s, p in self.parent_of.items() if p is None]
        if len(tops) != 1:
            raise TopologyError(f"{len(tops)} top switches: {tops[:5]}")
        return tops[0]

    @property
    def depth(self) -> int:
        """Number of switch levels (leaf = level 0, so depth = root level + 1)."""
        return self._levels[self.root] + 1 if self.parent_of else 0

    def switch(self, name: str) -> Switch:
        return Switch(
            name=name,
            parent=self.parent_of[name],
            level=self._levels[name],
            children=tuple(self._children[name]),
            is_leaf=name in self._leaves_set,
            source_id=self.source_ids.get(name),
        )

    @cached_property
    def _leaves_set(self) -> frozenset[str]:
        return frozenset(self.leaf_of.values())

    @property
    def switches(self) -> list[str]:
        return sorted(self.parent_of, key=lambda s: (self._levels[s], s))

    @property
    def leaves(self) -> list[str]:
        return sorted(self._leaves_set)

    def level(self, switch: str) -> int:
        return self._levels[switch]

    def leaf(self, node: str) -> str:
        return self.leaf_of[node]

    def path(self, node: str) -> tuple[str, ...]:
        """Switches from the root down to the node's leaf (per leaf, not per node: a plan
        on 64k nodes asks for a few thousand)."""
        return self._switch_paths[self.leaf_of[node]]

    def lca(self, a: str, b: str) -> str:
        """Lowest common ancestor switch of two nodes."""
        pa, pb = self._paths[a], self._paths[b]
        common = None
        for x, y in zip(pa, pb, strict=False):
            if x != y:
                break
            common = x
        if common is None:
            raise TopologyError(f"{a!r} and {b!r} share no switch")
        return common

    def hops(self, a: str, b: str) -> int:
        """Links on the path between two nodes: 0 same node, 2 same leaf, 4 via a spine..."""
        if a == b:
            return 0
        return 2 * (self._levels[self.lca(a, b)] + 1)

    @cached_property
    def natural_order(self) -> tuple[str, ...]:
        """Node names in Slurm's node-table order (:func:`natural_key`), computed once."""
        return tuple(natural_sorted(self.nodes))

    def nodes_under(self, switch: str) -> tuple[str, ...]:
        return self._under[switch]

    def free_nodes_under(self, switch: str, unavailable: Iterable[str] = ()) -> list[str]:
        bad = set(unavailable)
        return [n for n in self._under[switch] if self.nodes[n].free and n not in bad]

    def free_counts(self, unavailable: Iterable[str] = ()) -> dict[str, tuple[int, int]]:
        """Per switch: (free nodes, all nodes)."""
        bad = set(unavailable)
        free = {n for n, node in self.nodes.items() if node.free and n not in bad}
        return {s: (sum(1 for n in ns if n in free), len(ns)) for s, ns in self._under.items()}

    def nvlink_domain(self, node: str) -> str:
        """The node's NVLink domain id: its UltraServer, or the node itself."""
        return self.nodes[node].nvlink_domain or node

    def domains(self) -> dict[str, tuple[str, ...]]:
        out: dict[str, list[str]] = {}
        for n in self.nodes:
            out.setdefault(self.nvlink_domain(n), []).append(n)
        return {d: tuple(sorted(v)) for d, v in out.items()}

    # ---------------------------------------------------------------- updates
    def with_states(self, states: Mapping[str, NodeState]) -> Topology:
        """A copy with node states replaced (e.g. from ``sinfo``)."""
        nodes = {
            n: replace(node, state=states.get(n, node.state)) for n, node in self.nodes.items()
        }
        return replace(self, nodes=nodes)

    def with_nodes(self, nodes: Iterable[Node]) -> Topology:
        """A copy with node records replaced by name (instance ids, IPs, domains...)."""
        new = dict(self.nodes)
        for n in nodes:
            if n.name not in new:
                raise TopologyError(f"unknown node {n.name!r}")
            new[n.name] = n
        return replace(self, nodes=new)

    def shape(self) -> tuple[frozenset[tuple[str, str | None]], frozenset[tuple[str, str]]]:
        """The tree's shape alone (for comparisons that ignore node attributes)."""
        return frozenset(self.parent_of.items()), frozenset(self.leaf_of.items())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Topology):
            return NotImplemented
        return (
            dict(self.nodes) == dict(other.nodes)
            and self.shape() == other.shape()
            and self.kind == other.kind
        )

    def __hash__(self) -> int:
        return hash((frozenset(self.nodes), self.shape()))
