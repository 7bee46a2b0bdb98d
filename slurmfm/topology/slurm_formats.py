"""Slurm's own topology formats <-> :class:`~slurmfm.topology.model.Topology`.

Why this module exists: slurmfm plans placement on the model, but Slurm only knows what its
``topology.conf`` / ``topology.yaml`` say, and a live cluster only tells us what ``scontrol show
topology`` prints. Every conversion lives here so that the same rules (names, hostlists, block
order) hold in both directions and round trips can be tested against real slurmctld builds.

Formats and their sources:

* ``topology.conf`` tree (``SwitchName= Switches= Nodes= LinkSpeed=``) and block (``BlockName=
  Nodes=`` + ``BlockSizes=``): topology.conf(5).
* ``topology.yaml`` (Slurm >= 25.05): topology.yaml(5); the exact shape emitted here is the one
  real Slurm 26.05.5 loaded on this repository's lab (scripts/slurm-lab).
* ``scontrol show topology``: lines as printed by real 22.05.8 (tree), 24.11.5 and 26.05.5
  (block), checked on this repo's slurm-lab.

Design choices (stated because the model cannot hold everything Slurm files can):

* **Blocks.** A block topology is a ``Topology`` of ``kind="block"``: every block is a leaf switch,
  all blocks sit under the common :data:`~slurmfm.topology.model.ROOT`. Node ``nvlink_domain`` is
  left unset when parsing: a Slurm block is a scheduling unit chosen by the admin (the lab uses
  blocks of H100-like nodes), not proof of a shared NVLink fabric.
* **Block order** matters (the base-block index is the config line order and aggregated blocks are
  aligned runs of consecutive blocks; section 1.4). It is kept in ``Topology.source_ids`` as
  ``"slurm-block:<index>"`` for every block, because ``source_ids`` is persisted with the topology
  and has no other meaning for Slurm-only blocks; :func:`block_order` reads it back (falling back
  to natural name order when absent).
* **Switch order** of a tree matters too: Slurm indexes switches in ``topology.conf`` line order
  (``scontrol show topology`` prints them in that order), and its leaf scan and tie-breaks follow
  it (section 1.3 steps 3 and 6). :func:`parse_topology_conf` and
  :func:`parse_scontrol_topology` record it the same way, ``"slurm-switch:<index>"`` in
  ``source_ids``, for every switch that has no traceability comment (a ``# <switch> = <id>``
  comment keeps its id instead, and then the order is incomplete); :func:`switch_order` reads it
  back (None when absent or incomplete). Exporters never write these marks as comments.
* **Hostlists.** Parsing uses python-hostlist's ``expand_hostlist``. Compression is done here, only
  over the *trailing* number of a name: python-hostlist's ``collect_hostlist`` also makes ranges in
  the middle of a name (``nn-1a[2-3]b``), which real Slurm 22.05.8 rejects ("Invalid hostlist",
  ``scontrol show hostnames`` on the lab) while 26.05.5 accepts it.
* **Switch names** must be at most 64 characters of ``[A-Za-z0-9_.-]`` (section 1.2 gives the
  length; the character set keeps hostlist syntax and ``SLURM_TOPOLOGY_ADDR`` unambiguous). Valid
  names (e.g. EC2 ``nn-...`` ids) are kept; others are sanitised and a ``# <name> = <source id>``
  comment keeps them traceable. :func:`parse_topology_conf` reads those comments back into
  ``source_ids``.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from slurmfm.catalog.slurm_features import SlurmVersion, require, supports
from slurmfm.topology.model import ROOT, Node, Topology, TopologyError, natural_key

__all__ = [
    "BLOCK_ORDER_PREFIX",
    "SWITCH_ORDER_PREFIX",
    "Ring",
    "TopologyYaml",
    "Torus",
    "block_order",
    "block_sizes_for",
    "block_topology",
    "collect_hostlist",
    "compress_hostlist",
    "expand_hostlist",
    "export_block",
    "export_tree",
    "export_yaml",
    "export_yaml_doc",
    "normalize_state",
    "parse_scontrol_topology",
    "parse_topology_conf",
    "parse_topology_yaml",
    "read_topology_yaml",
    "slurm_node_states",
    "switch_order",
]

BLOCK_ORDER_PREFIX = "slurm-block:"
"""``source_ids`` value prefix that records a block's index (its line order in Slurm's file)."""
SWITCH_ORDER_PREFIX = "slurm-switch:"
"""``source_ids`` value prefix that records a tree switch's line index in Slurm's file."""

MAX_NAME = 64  # topology.conf(5): SwitchName is at most 64 characters (section 1.2)
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
_BAD_NODE_CHARS = re.compile(r"[\s,\[\]=#]")
_TRAILING_NUM = re.compile(r"^(.*?)(\d+)$")
_SOURCE_COMMENT = re.compile(r"^#\s*([A-Za-z0-9_.\-]{1,64})\s*=\s*(\S+)\s*$")

Version = SlurmVersion | str


# ---------------------------------------------------------------------------- small helpers
def _version(v: Version) -> SlurmVersion:
    return v if isinstance(v, SlurmVersion) else SlurmVersion.parse(v)


# A comma outside brackets: the next bracket after it is an opening one (or there is none).
_TOP_COMMA = re.compile(r",(?![^\[]*\])")
_SIMPLE_RANGE = re.compile(r"([^\[\],]*)\[([0-9,-]+)\]([^\[\],]*)")


def _expand_simple(part: str) -> list[str] | None:
    """``prefix[a-b,c]suffix`` (one bracket, ascending ranges) -> names; None for anything else."""
    m = _SIMPLE_RANGE.fullmatch(part)
    if m is None:
        return None
    prefix, body, suffix = m.groups()
    out: list[str] = []
    for r in body.split(","):
        lo, sep, hi = r.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            return None
        a, b = int(lo), int(hi) if sep else int(lo)
        if b < a:
            return None
        width = len(lo)  # Slurm pads every number of a range to the width of its first
        out.extend(f"{prefix}{i:0{width}d}{suffix}" for i in range(a, b + 1))
    return out


def expand_hostlist(expr: str) -> list[str]:
    """Slurm hostlist expression -> names; ``ValueError`` when malformed.

    Plain names and one-bracket ranges (``node[001-128,200]``, the forms Slurm and slurmfm
    write) are expanded here: a 64k-node topology.conf spends most of its parse time in
    python-hostlist otherwise. Anything else (several brackets) goes to python-hostlist.
    Duplicates are dropped, first occurrence kept, as python-hostlist does.
    """
    text = expr.strip()
    if "[" not in text and "]" not in text:
        if len(text.split(maxsplit=1)) < 2:  # no blank inside: no all-blank part (fast path)
            plain = dict.fromkeys(text.split(","))
            plain.pop("", None)
            return list(plain)
        return list(dict.fromkeys(p for p in text.split(",") if p and not p.isspace()))
    if text.count("[") != text.count("]"):
        raise ValueError(f"bad hostlist {expr!r}: unbalanced brackets")
    parts = _TOP_COMMA.split(text)
    names: list[str] = []
    for part in parts:
        if "[" not in part and "]" not in part:
            if part and not part.isspace():
                names.append(part)
            continue
        simple = _expand_simple(part)
        if simple is not None:
            names.extend(simple)
            continue
        import hostlist

        try:
            names.extend(hostlist.expand_hostlist(part))
        except hostlist.BadHostlist as exc:
            raise ValueError(f"bad hostlist {expr!r}: {exc}") from exc
    return list(dict.fromkeys(names))


def collect_hostlist(names: Sequence[str]) -> str:
    """python-hostlist's ``collect_hostlist(names)``, the same text, faster for one-width names.

    Why: a 64k-node plan's ``--nodelist`` has 16k names, and python-hostlist makes one regex
    match, sort key and formatted probe per name per pass (one pass per digit run of the
    name). When every name is one stem and a digit run of one width (``p5-00017``), its passes
    give ``stem[runs]``: consecutive numbers, ascending, duplicates dropped, no brackets for
    a single name (``collect_hostlist_1`` in python-hostlist 2.3.0's ``hostlist.py``,
    http://www.nsc.liu.se/~kent/python-hostlist/). Any other input goes to python-hostlist;
    tests/topology/test_slurm_formats.py compares the two on random name sets.
    """
    if names:
        first = names[0]
        digits = "0123456789"
        stem = first.rstrip(digits)
        cut, width = len(stem), len(first)
        if (
            cut < width
            and not _BAD_NODE_CHARS.search(stem)
            and all(len(n) == width and n.rstrip(digits) == stem for n in names)
        ):
            nums = sorted({int(n[cut:]) for n in names})
            w = width - cut
            if len(nums) == 1:
                return first
            bounds: list[tuple[int, int]] = []
            start = prev = nums[0]
            for x in nums[1:]:
                if x != prev + 1:
                    bounds.append((start, prev))
                    start = x
                prev = x
            bounds.append((start, prev))
            runs = (f"{a:0{w}d}" if a == b else f"{a:0{w}d}-{b:0{w}d}" for a, b in bounds)
            return f"{stem}[{','.join(runs)}]"
    import hostlist

    return str(hostlist.collect_hostlist(list(names)))


def compress_hostlist(names: Iterable[str]) -> str:
    """Names -> a hostlist that every Slurm release parses (ranges only on a trailing number).

    Names are grouped by (prefix, digit count), so ``n9,n10`` stay separate and ``node001`` keeps
    its padding; the result is sorted and deterministic.
    """
    groups: dict[tuple[str, int], list[int]] = {}
    plain: list[str] = []
    for name in set(names):
        m = _TRAILING_NUM.match(name)
        if m is None:
            plain.append(name)
        else:
            groups.setdefault((m.group(1), len(m.group(2))), []).append(int(m.group(2)))
    items: list[tuple[str, str]] = [(natural_key(p), p) for p in plain]
    for (prefix, width), nums in groups.items():
        nums.sort()
        if len(nums) == 1:
            text = f"{prefix}{nums[0]:0{width}d}"
            items.append((natural_key(text), text))
            continue
        ranges: list[str] = []
        start = prev = nums[0]
        for x in [*nums[1:], None]:
            if x is not None and x == prev + 1:
                prev = x
                continue
            ranges.append(
                f"{start:0{width}d}" if start == prev else f"{start:0{width}d}-{prev:0{width}d}"
            )
            if x is not None:
                start = prev = x
        text = f"{prefix}[{','.join(ranges)}]"
        items.append((natural_key(f"{prefix}{nums[0]:0{width}d}"), text))
    return ",".join(t for _, t in sorted(items))


def _check_node_names(t: Topology) -> None:
    for n in t.nodes:
        if not n or _BAD_NODE_CHARS.search(n):
            raise TopologyError(f"node name {n!r} cannot be written in a Slurm hostlist")


def _slurm_names(names: Iterable[str]) -> dict[str, str]:
    """Model switch name -> Slurm-valid, unique switch name (kept when already valid)."""
    out: dict[str, str] = {}
    used: set[str] = set()
    ordered = sorted(names, key=natural_key)
    for n in ordered:  # valid names first claim themselves
        if _NAME_RE.match(n):
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


def _order_mark(src: str | None) -> bool:
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

    Slurm validates that every size after the first is B0·2^k (section 1.4); NVIDIA Topograph and
    this repo's slurm-lab emit ``D,2D,4D...`` while the size fits the cluster (section 2), and a
    level larger than all blocks together could never be satisfied.
    """
    if base < 1 or blocks < 1:
        raise TopologyError("block size and block count must be positive")
    sizes = [base]
    while sizes[-1] * 2 <= base * blocks:
        sizes.append(sizes[-1] * 2)
    return sizes


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


def _hostlist(value: str, where: str, what: str) -> list[str]:
    if not value:
        raise TopologyError(f"{where}: empty {what}")
    try:
        return expand_hostlist(value)
    except ValueError as exc:
        raise TopologyError(f"{where}: {what}: {exc}") from exc


def parse_topology_conf(text: str, *, source: str = "topology.conf") -> Topology:
    """Parse a ``topology.conf`` (tree or block) into a Topology; errors say ``source:line:``.

    Tree: ``SwitchName=`` with ``Nodes=`` (leaf) or ``Switches=`` (inner), optional
    ``LinkSpeed=`` (parsed, unused by Slurm; section 1.2). Several top switches get the model's
    synthetic root. Block: ``BlockName= Nodes=`` in index order plus ``BlockSizes=`` (or the
    23.11 ``BlockLevels=``), kept only as validation here. Keys are case-insensitive and ``#``
    starts a comment, as in topology.conf(5); ``# <switch> = <id>`` comments (written by
    :func:`export_tree`/:func:`export_block`) restore ``source_ids``.
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
            name = fields[0][1]
            if not _NAME_RE.match(name):
                raise TopologyError(f"{where}: invalid switch name {name!r}")
            if name in switches:
                raise TopologyError(
                    f"{where}: switch {name!r} already defined on line {switches[name][0]}"
                )
            unknown = set(rest) - {"nodes", "switches", "linkspeed"}
            if unknown:
                raise TopologyError(f"{where}: unknown key {sorted(unknown)[0]!r} for a switch")
            nodes = _hostlist(rest["nodes"], where, "Nodes=") if "nodes" in rest else []
            kids = _hostlist(rest["switches"], where, "Switches=") if "switches" in rest else []
            if nodes and kids:
                raise TopologyError(
                    f"{where}: switch {name!r} has both Nodes= and Switches= (Slurm's tree "
                    "puts nodes on leaf switches only)"
                )
            if "linkspeed" in rest and not rest["linkspeed"].isdigit():
                raise TopologyError(f"{where}: LinkSpeed must be a number")
            switches[name] = (lineno, nodes, kids)
        elif first == "blockname":
            name = fields[0][1]
            if not _NAME_RE.match(name):
                raise TopologyError(f"{where}: invalid block name {name!r}")
            unknown = set(rest) - {"nodes"}
            if unknown:
                raise TopologyError(f"{where}: unknown key {sorted(unknown)[0]!r} for a block")
            if "nodes" not in rest:
                raise TopologyError(f"{where}: block {name!r} has no Nodes=")
            for other, _, oline in blocks:
                if other == name:
                    raise TopologyError(f"{where}: block {name!r} already defined on line {oline}")
            blocks.append((name, _hostlist(rest["nodes"], where, "Nodes="), lineno))
        elif first in ("blocksizes", "blocklevels"):
            if rest:
                raise TopologyError(f"{where}: {fields[0][0]} takes no other keys on its line")
            if first == "blocksizes":
                try:
                    block_sizes = [int(x) for x in fields[0][1].split(",")]
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
        else:
            raise TopologyError(
                f"{where}: unknown line start {fields[0][0]!r} (expected SwitchName, BlockName, "
                "BlockSizes)"
            )
    if switches and blocks:
        raise TopologyError(f"{source}: mixes SwitchName (tree) and BlockName (block) lines")
    if blocks:
        if block_sizes is not None:
            for name, members, lineno in blocks:
                if len(members) > block_sizes[0]:
                    raise TopologyError(
                        f"{source}:{lineno}: block {name!r} has {len(members)} nodes, more than "
                        f"the base block size {block_sizes[0]}"
                    )
        topo = block_topology([(n, m) for n, m, _ in blocks], source=source)
        return topo
    if not switches:
        raise TopologyError(f"{source}: no SwitchName or BlockName lines")
    return _tree_from_switches(switches, comments, source, record_order=True)


def _tree_from_switches(
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


# ---------------------------------------------------------------------------- exports
def _header(kind: str, t: Topology, v: SlurmVersion, extra: Sequence[str] = ()) -> list[str]:
    return [
        f"# {kind} generated by slurmfm for Slurm {v}: {len(t.nodes)} nodes, "
        f"{len(t.parent_of)} switches.",
        *[f"# {e}" for e in extra],
    ]


def _tree_lines(t: Topology, key: str = "SwitchName") -> tuple[list[tuple[int, str]], list[str]]:
    """(topology.conf switch lines, traceability comments) for a tree.

    Lines go leaves first, then level by level (natural name order within a level), as in
    topology.conf(5)'s examples and the slurm-lab files.
    """
    names = _slurm_names(t.parent_of)
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
        if _order_mark(src):
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


def _with_common_root(t: Topology) -> Topology:
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
    (Slurm will not span switches without a common ancestor; section 1.2). Names are kept when
    Slurm-valid; others are sanitised with a ``# <name> = <source id>`` comment.
    """
    v = _version(version)
    _check_node_names(t)
    t = _with_common_root(t)
    lines, notes = _tree_lines(t)
    extra = [f"Tree depth {t.depth}; use TopologyPlugin=topology/tree in slurm.conf."]
    if supports("topology_yaml", v):
        extra.append("Slurm >= 25.05 ignores this file when a topology.yaml exists.")
    out = _header("topology.conf (tree)", t, v, extra)
    if notes:
        out.append("# Slurm switch name = source network-node id:")
        out.extend(notes)
    out.extend(line for _, line in lines)
    return "\n".join(out) + "\n"


def _blocks_of(
    t: Topology, block_size: int | None
) -> tuple[list[tuple[str, list[str]]], list[str]]:
    """Ordered (Slurm block name, nodes) and traceability comments for :func:`export_block`.

    Sources of blocks, in order of preference: an existing block topology (its own order); NVLink
    domains (UltraServers, ``CapacityBlockId``) ordered by EFA proximity: the root-to-leaf path of
    the leaf holding most of the domain's nodes, so consecutive blocks, which Slurm aggregates into
    higher-level blocks, are physically close (sections 1.4 and 5: sort by NN1, NN2, NN3); and for
    a tree without domains, its leaf switches in path order.
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
                if leaf in t.source_ids and not _order_mark(t.source_ids[leaf]):
                    ids[leaf] = t.source_ids[leaf]
    names = _slurm_names([b for b, _ in raw])
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

    One ``BlockName`` per block (see :func:`_blocks_of` for where blocks come from and their EFA
    order), then ``BlockSizes`` from the base block size ``block_size`` (default: the largest
    block, i.e. the UltraServer size for full GB200 UltraServers) by :func:`block_sizes_for`.
    23.11 has topology/block but not ``BlockSizes`` (24.05 replaced ``BlockLevels``; section 1.1),
    so for 23.11 the line is left out and Slurm's default levels apply.
    """
    v = _version(version)
    require("topology_block", v, "topology/block")
    _check_node_names(t)
    if not t.nodes:
        raise TopologyError("no nodes to put into blocks")
    blocks, notes = _blocks_of(t, block_size)
    base = block_size if block_size is not None else max(len(m) for _, m in blocks)
    sizes = block_sizes_for(base, len(blocks))
    out = _header(
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


def _wants_block(t: Topology) -> bool:
    """Block for GB200-style clusters (block kind, or nodes sharing NVLink domains)."""
    if t.kind == "block":
        return True
    return any(len(m) > 1 for m in t.domains().values())


def _yaml_scalar(text: str) -> str:
    """A YAML scalar: plain when safe (as 26.05.5 loaded it), else double-quoted."""
    if re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.\-\[\],]*", text) and text.lower() not in {
        "true",
        "false",
        "null",
        "yes",
        "no",
        "on",
        "off",
    }:
        return text
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def export_yaml(
    partitions: Mapping[str, Topology],
    version: Version,
    *,
    default: str | None = None,
    block_size: int | None = None,
) -> str:
    """``topology.yaml`` (Slurm >= 25.05): one topology per partition, named like the partition.

    GB200-style topologies (block kind, or nodes sharing NVLink domains) become ``block:`` entries,
    others ``tree:``; the shape (list of ``topology``/``cluster_default``/``tree.switches`` or
    ``block.block_sizes``/``block.blocks``, hostlist strings) is exactly what real 26.05.5 loaded
    (as 26.05.5 loaded it). ``default`` (else the first partition) is the ``cluster_default``. Each
    partition must name its topology in slurm.conf: ``PartitionName=<p> ... Topology=<p>``.
    """
    v = _version(version)
    require("topology_yaml", v, "topology.yaml")
    if not partitions:
        raise TopologyError("topology.yaml needs at least one partition topology")
    default = default if default is not None else next(iter(partitions))
    if default not in partitions:
        raise TopologyError(f"default topology {default!r} is not one of the partitions")
    out = [
        f"# topology.yaml generated by slurmfm for Slurm {v}: {len(partitions)} topologies.",
        "# slurm.conf: drop TopologyPlugin= (ignored when this file exists) and add",
        "# Topology=<name> to each partition:",
        *(f"#   PartitionName={p} ... Topology={p}" for p in partitions),
        "---",
    ]
    for part, t in partitions.items():
        if not _NAME_RE.match(part):
            raise TopologyError(f"partition/topology name {part!r} is not a valid Slurm name")
        _check_node_names(t)
        out.append(f"- topology: {part}")
        out.append(f"  cluster_default: {'true' if part == default else 'false'}")
        if _wants_block(t):
            blocks, notes = _blocks_of(t, block_size)
            base = block_size if block_size is not None else max(len(m) for _, m in blocks)
            out.extend(f"  {n}" for n in notes)
            out.append("  block:")
            out.append("    block_sizes:")
            out.extend(f"      - {s}" for s in block_sizes_for(base, len(blocks)))
            out.append("    blocks:")
            for name, members in blocks:
                out.append(f"      - block: {_yaml_scalar(name)}")
                out.append(f"        nodes: {_yaml_scalar(compress_hostlist(members))}")
        else:
            lines, notes = _tree_lines(_with_common_root(t))
            out.extend(f"  {n}" for n in notes)
            out.append("  tree:")
            out.append("    switches:")
            # top level first (names in order within a level), as 26.05.5 loaded it
            for _, line in sorted(lines, key=lambda e: -e[0]):
                fields = dict(tok.split("=", 1) for tok in line.split())
                out.append(f"      - switch: {_yaml_scalar(fields['SwitchName'])}")
                if "Switches" in fields:
                    out.append(f"        children: {_yaml_scalar(fields['Switches'])}")
                if "Nodes" in fields:
                    out.append(f"        nodes: {_yaml_scalar(fields['Nodes'])}")
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class Ring:
    """A ``ring:`` entry of topology.yaml (26.05 topology/ring): an ordered node list."""

    name: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Torus:
    """A ``torus3d:`` torus (26.05 topology/torus3d), kept as data: dims, nodes or regions,
    placements (each the parsed YAML mapping, plain dicts and lists)."""

    name: str
    dims: tuple[int, int, int]
    nodes: tuple[str, ...]
    extra: Mapping[str, Any]  # regions, placements, anchor_seed, ... as written


@dataclass(frozen=True)
class TopologyYaml:
    """Everything a topology.yaml says, by entry: tree/block as models, the rest as data.

    slurmfm plans on tree and block topologies; ``flat`` entries have no structure, and
    ``ring``/``torus3d`` (Slurm 26.05; topology.yaml(5) of 26.05.5) are read and written back
    as data so that a file holding them is not refused. ``order`` is the file's entry order,
    ``kinds`` each entry's kind, ``default`` the first ``cluster_default: true``.
    """

    topologies: Mapping[str, Topology]
    rings: Mapping[str, tuple[Ring, ...]]
    toruses: Mapping[str, tuple[Torus, ...]]
    kinds: Mapping[str, str]
    order: tuple[str, ...]
    default: str | None = None
    flat_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def summary(self) -> str:
        """One line saying what the file holds (for the CLI and error messages)."""
        if not self.order:
            return "no topology at all (an empty list, [])"
        parts = []
        for name in self.order:
            kind = self.kinds[name]
            if kind in ("tree", "block"):
                t = self.topologies[name]
                parts.append(f"{kind} {name!r} ({len(t.nodes)} nodes)")
            elif kind == "ring":
                rings = self.rings[name]
                n = sum(len(r.nodes) for r in rings)
                parts.append(f"ring {name!r} ({len(rings)} rings, {n} nodes)")
            elif kind == "torus3d":
                tor = self.toruses[name]
                parts.append(f"torus3d {name!r} ({len(tor)} toruses)")
            else:
                parts.append(f"flat {name!r}")
        return ", ".join(parts)


def parse_topology_yaml(text: str, *, source: str = "topology.yaml") -> dict[str, Topology]:
    """Parse ``topology.yaml`` into ``{topology name: Topology}`` (tree and block entries).

    ``flat`` entries carry no structure and ``ring``/``torus3d`` (26.05) have no equivalent in
    the model: they are skipped here (:func:`read_topology_yaml` keeps them as data). An empty
    file (``[]``, what HyperPod's automatic topology management can leave) gives ``{}``.
    Errors carry ``source:line:`` (ruamel's positions).
    """
    return dict(read_topology_yaml(text, source=source).topologies)


def read_topology_yaml(text: str, *, source: str = "topology.yaml") -> TopologyYaml:
    """Parse every entry of ``topology.yaml`` (see :class:`TopologyYaml`)."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        doc = YAML(typ="rt").load(text)
    except YAMLError as exc:
        raise TopologyError(f"{source}: not valid YAML: {exc}") from exc

    def line_of(obj: Any, key: Any = None) -> int:
        lc = getattr(obj, "lc", None)
        if lc is None:
            return 0
        try:
            if key is not None:
                pos = lc.key(key) if isinstance(obj, dict) else lc.item(key)
                return int(pos[0]) + 1
            return int(lc.line) + 1
        except (KeyError, IndexError, TypeError):
            return int(lc.line) + 1

    def err(obj: Any, msg: str, key: Any = None) -> TopologyError:
        return TopologyError(f"{source}:{line_of(obj, key)}: {msg}")

    def hosts(obj: Any, key: str, what: str) -> list[str]:
        val = obj.get(key)
        if isinstance(val, list):
            val = ",".join(str(x) for x in val)
        if not isinstance(val, str) or not val.strip():
            raise err(obj, f"{what} must be a hostlist string", key)
        try:
            return expand_hostlist(val)
        except ValueError as exc:
            raise err(obj, f"{what}: {exc}", key) from exc

    if doc is None or (isinstance(doc, str) and not doc.strip()):
        doc = []  # an empty file: no topology, like []
    if not isinstance(doc, list):
        raise TopologyError(f"{source}:1: expected a YAML list of topologies")
    out: dict[str, Topology] = {}
    rings: dict[str, tuple[Ring, ...]] = {}
    toruses: dict[str, tuple[Torus, ...]] = {}
    kinds_of: dict[str, str] = {}
    order: list[str] = []
    default: str | None = None
    flats: dict[str, Mapping[str, Any]] = {}
    for entry in doc:
        if not isinstance(entry, dict) or not isinstance(entry.get("topology"), str):
            raise err(
                entry if isinstance(entry, dict) else doc, "each entry needs 'topology: NAME'"
            )
        name = entry["topology"]
        if name in kinds_of:
            raise err(entry, f"topology {name!r} defined twice")
        kinds = [k for k in ("tree", "block", "flat", "ring", "torus3d") if k in entry]
        if len(kinds) != 1:
            raise err(entry, f"topology {name!r} needs exactly one of tree/block/flat/ring/torus3d")
        kind = kinds[0]
        body = entry[kind]
        kinds_of[name] = kind
        order.append(name)
        if default is None and entry.get("cluster_default") is True:
            default = name
        if kind == "flat":
            if isinstance(body, dict):  # 26.05: options such as alpha_step_rank
                flats[name] = _plain(body)
            continue
        if kind == "ring":
            rlist = body.get("rings") if isinstance(body, dict) else None
            if not isinstance(rlist, list) or not rlist:
                raise err(entry, f"topology {name!r}: ring needs a 'rings' list", kind)
            got: list[Ring] = []
            for r in rlist:
                if not isinstance(r, dict) or not isinstance(r.get("ring"), str):
                    raise err(body, "each ring needs 'ring: NAME'", "rings")
                members = hosts(r, "nodes", "nodes")
                if len(members) > 16:  # topology.yaml(5), 26.05.5: at most 16 nodes per ring
                    raise err(r, f"ring {r['ring']!r} has {len(members)} nodes (at most 16)")
                got.append(Ring(r["ring"], tuple(members)))
            rings[name] = tuple(got)
            continue
        if kind == "torus3d":
            tlist = body.get("toruses") if isinstance(body, dict) else None
            if not isinstance(tlist, list) or not tlist:
                raise err(entry, f"topology {name!r}: torus3d needs a 'toruses' list", kind)
            tors: list[Torus] = []
            for t in tlist:
                if not isinstance(t, dict) or not isinstance(t.get("name"), str):
                    raise err(body, "each torus needs 'name: NAME'", "toruses")
                dims = t.get("dims")
                if not isinstance(dims, dict) or not all(
                    isinstance(dims.get(k), int) and dims[k] > 0 for k in "xyz"
                ):
                    raise err(t, f"torus {t['name']!r}: dims needs positive x, y and z", "name")
                members = hosts(t, "nodes", "nodes") if "nodes" in t else []
                extra = {
                    str(k): _plain(v) for k, v in t.items() if k not in ("name", "dims", "nodes")
                }
                tors.append(
                    Torus(t["name"], (dims["x"], dims["y"], dims["z"]), tuple(members), extra)
                )
            toruses[name] = tuple(tors)
            continue
        if kind == "tree":
            sw_list = body.get("switches") if isinstance(body, dict) else None
            if not isinstance(sw_list, list):
                raise err(entry, f"topology {name!r}: tree needs a 'switches' list", kind)
            switches: dict[str, tuple[int, Sequence[str], Sequence[str]]] = {}
            for sw in sw_list:
                if not isinstance(sw, dict) or not isinstance(sw.get("switch"), str):
                    raise err(body, "each switch needs 'switch: NAME'", "switches")
                sname = sw["switch"]
                if not _NAME_RE.match(sname):
                    raise err(sw, f"invalid switch name {sname!r}", "switch")
                if sname in switches:
                    raise err(sw, f"switch {sname!r} defined twice", "switch")
                nodes = hosts(sw, "nodes", "nodes") if "nodes" in sw else []
                kids = hosts(sw, "children", "children") if "children" in sw else []
                if nodes and kids:
                    raise err(sw, f"switch {sname!r} has both nodes and children", "switch")
                switches[sname] = (line_of(sw, "switch"), nodes, kids)
            if not switches:
                raise err(entry, f"topology {name!r} has no switches", kind)
            try:
                out[name] = _tree_from_switches(switches, {}, source)
            except TopologyError as exc:
                raise TopologyError(f"{exc} (topology {name!r})") from exc
        else:
            blist = body.get("blocks") if isinstance(body, dict) else None
            if not isinstance(blist, list) or not blist:
                raise err(entry, f"topology {name!r}: block needs a 'blocks' list", kind)
            blocks: list[tuple[str, Sequence[str]]] = []
            for b in blist:
                if not isinstance(b, dict) or not isinstance(b.get("block"), str):
                    raise err(body, "each block needs 'block: NAME'", "blocks")
                if not _NAME_RE.match(b["block"]):
                    raise err(b, f"invalid block name {b['block']!r}", "block")
                blocks.append((b["block"], hosts(b, "nodes", "nodes")))
            sizes = body.get("block_sizes")
            if sizes is not None and (
                not isinstance(sizes, list) or not all(isinstance(s, int) for s in sizes)
            ):
                raise err(body, "block_sizes must be a list of integers", "block_sizes")
            try:
                out[name] = block_topology(blocks, source=f"{source} ({name})")
            except TopologyError as exc:
                raise err(entry, str(exc)) from exc
    return TopologyYaml(out, rings, toruses, kinds_of, tuple(order), default, flats)


def _plain(v: Any) -> Any:
    """ruamel's round-trip containers as plain dicts and lists (for data kept as written)."""
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _yaml_value(v: Any, indent: int) -> list[str]:
    """Block-style YAML lines for plain data (mappings, lists, scalars) at ``indent``."""
    pad = " " * indent
    if isinstance(v, dict):
        lines = []
        for k, x in v.items():
            if isinstance(x, (dict, list)) and x:
                lines.append(f"{pad}{k}:")
                lines.extend(_yaml_value(x, indent + 2))
            else:
                lines.append(f"{pad}{k}: {_yaml_atom(x)}")
        return lines
    if isinstance(v, list):
        lines = []
        for x in v:
            sub = _yaml_value(x, indent + 2) if isinstance(x, (dict, list)) and x else []
            if sub:
                lines.append(f"{pad}- {sub[0].lstrip()}")
                lines.extend(sub[1:])
            else:
                lines.append(f"{pad}- {_yaml_atom(x)}")
        return lines
    return [f"{pad}{_yaml_atom(v)}"]


def _yaml_atom(x: Any) -> str:
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, (int, float)):
        return str(x)
    if isinstance(x, (dict, list)):
        return "{}" if isinstance(x, dict) else "[]"
    return _yaml_scalar(str(x))


def export_yaml_doc(doc: TopologyYaml, version: Version) -> str:
    """``topology.yaml`` for every entry of ``doc``: tree/block as :func:`export_yaml` writes
    them, ``flat``, and ``ring``/``torus3d`` back as data (Slurm >= 26.05 for those two)."""
    v = _version(version)
    require("topology_yaml", v, "topology.yaml")
    for name, kind in doc.kinds.items():
        if kind == "ring":
            require("topology_ring", v, f"topology {name!r} (ring)")
        if kind == "torus3d":
            require("topology_torus3d", v, f"topology {name!r} (torus3d)")
    default = doc.default or (doc.order[0] if doc.order else None)
    out = [f"# topology.yaml written by slurmfm for Slurm {v}: {doc.summary()}.", "---"]
    if not doc.order:
        return "\n".join([*out, "[]"]) + "\n"
    for name in doc.order:
        kind = doc.kinds[name]
        if kind in ("tree", "block"):
            body = export_yaml({name: doc.topologies[name]}, v, default=name)
            entry = body.split("---\n", 1)[1].splitlines()
            entry[1] = f"  cluster_default: {'true' if name == default else 'false'}"
            out.extend(entry)
            continue
        out.append(f"- topology: {_yaml_scalar(name)}")
        out.append(f"  cluster_default: {'true' if name == default else 'false'}")
        if kind == "flat" and doc.flat_options.get(name):
            out.append("  flat:")
            out.extend(_yaml_value(dict(doc.flat_options[name]), 4))
        elif kind == "flat":
            out.append("  flat: true")
        elif kind == "ring":
            out.append("  ring:")
            out.append("    rings:")
            for r in doc.rings[name]:
                out.append(f"      - ring: {_yaml_scalar(r.name)}")
                out.append(f"        nodes: {_yaml_scalar(compress_hostlist(r.nodes))}")
        else:
            out.append("  torus3d:")
            out.append("    toruses:")
            for t in doc.toruses[name]:
                out.append(f"      - name: {_yaml_scalar(t.name)}")
                out.append("        dims:")
                out.extend(f"          {k}: {d}" for k, d in zip("xyz", t.dims, strict=True))
                if t.nodes:
                    out.append(f"        nodes: {_yaml_scalar(compress_hostlist(t.nodes))}")
                out.extend(_yaml_value(dict(t.extra), 8))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------- live cluster
def parse_scontrol_topology(text: str) -> Topology:
    """Parse ``scontrol show topology [NAME]`` output (tree or block) into a Topology.

    Tree lines are ``SwitchName=X Level=N LinkSpeed=S Nodes=<all nodes below> [Switches=...]``;
    a switch without ``Switches=`` is a leaf and its ``Nodes=`` are its own. Block lines are
    ``BlockName=X BlockIndex=I Nodes=... BlockSize=B``; the ``AggregatedBlock=`` lines (24.11,
    26.05) are derived data and skipped. Levels printed by Slurm are checked against the model's.
    """
    source = "scontrol show topology"
    switches: dict[str, tuple[int, Sequence[str], Sequence[str]]] = {}
    levels: dict[str, int] = {}
    blocks: list[tuple[int, str, list[str]]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        where = f"{source}:{lineno}"
        fields: dict[str, str] = {}
        for tok in line.split():
            key, sep, value = tok.partition("=")
            if sep:
                fields[key] = value
        if "SwitchName" in fields:
            name = fields["SwitchName"]
            kids = (
                _hostlist(fields["Switches"], where, "Switches=") if fields.get("Switches") else []
            )
            nodes = (
                []
                if kids
                else (_hostlist(fields["Nodes"], where, "Nodes=") if fields.get("Nodes") else [])
            )
            switches[name] = (lineno, nodes, kids)
            if fields.get("Level", "").isdigit():
                levels[name] = int(fields["Level"])
        elif "BlockName" in fields:
            try:
                index = int(fields.get("BlockIndex", str(len(blocks))))
            except ValueError as exc:
                raise TopologyError(f"{where}: bad BlockIndex") from exc
            nodes = _hostlist(fields["Nodes"], where, "Nodes=") if fields.get("Nodes") else []
            blocks.append((index, fields["BlockName"], nodes))
        elif "AggregatedBlock" in fields:
            continue
        else:
            raise TopologyError(f"{where}: unrecognised line {line[:60]!r}")
    if switches and blocks:
        raise TopologyError(f"{source}: both switches and blocks in the output")
    if blocks:
        blocks.sort()
        return block_topology([(n, m) for _, n, m in blocks], source=source)
    if not switches:
        raise TopologyError(f"{source}: no topology in the output (is TopologyPlugin set?)")
    topo = _tree_from_switches(switches, {}, source, record_order=True)
    for s, lvl in levels.items():
        if topo.level(s) != lvl:
            raise TopologyError(
                f"{source}: switch {s!r} is Level={lvl} in Slurm but {topo.level(s)} in the model"
            )
    return topo


StateName = Literal["idle", "allocated", "mixed", "down", "drain", "unknown"]

_STATE_MAP: dict[str, StateName] = {
    "idle": "idle",
    "planned": "idle",  # idle, earmarked by backfill for a pending job (23.02+)
    "alloc": "allocated",
    "allocated": "allocated",
    "comp": "allocated",
    "completing": "allocated",
    "resv": "allocated",
    "reserved": "allocated",
    "blocked": "allocated",  # idle but held by --exclusive=topo (26.05, seen on the lab)
    "mix": "mixed",
    "mixed": "mixed",
    "drain": "drain",
    "drained": "drain",
    "draining": "drain",
    "drng": "drain",
    "down": "down",
    "fail": "down",
    "failing": "down",
    "future": "down",
    "futr": "down",
    "inval": "down",
    "maint": "down",
    "boot": "down",
    "reboot": "down",
    "powered_down": "down",
    "power_down": "down",
    "powering_down": "down",
    "unk": "unknown",
    "unknown": "unknown",
}


def normalize_state(raw: str) -> StateName:
    """One Slurm node state (``sinfo %T``/``%t``) -> idle/allocated/mixed/down/drain/unknown.

    A ``*`` suffix means "not responding": Slurm will not start jobs there, so it counts as down.
    Other suffixes (``~`` powered down, ``#`` powering up, ``!``, ``%``, ``$``, ``@``, ``^``, ``-``)
    do not change the base state. Compound states (``idle+drain``, ``mixed+drain``) report drain.
    """
    s = raw.strip().lower()
    not_responding = "*" in s
    s = s.rstrip("*~#!%$@^-")
    parts = [p for p in re.split(r"[+]", s) if p]
    states = [_STATE_MAP.get(p, "unknown") for p in parts] or ["unknown"]
    if not_responding:
        return "down"
    worst: StateName
    for worst in ("down", "drain"):
        if worst in states:
            return worst
    return states[0]


def slurm_node_states(text: str) -> dict[str, str]:
    """``sinfo -N -h -o '%N %T'`` output -> ``{node: normalised state}``.

    A node listed once per partition appears several times; the least usable state wins. The
    first column may also be a hostlist (``sinfo -h -o '%N %T'`` without ``-N``).
    """
    rank = {"down": 5, "drain": 4, "unknown": 3, "allocated": 2, "mixed": 1, "idle": 0}
    out: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) < 2:
            raise TopologyError(f"sinfo:{lineno}: expected 'NODE STATE', got {line!r}")
        state = normalize_state(parts[1])
        try:
            names = expand_hostlist(parts[0])
        except ValueError as exc:
            raise TopologyError(f"sinfo:{lineno}: {exc}") from exc
        for n in names:
            if n not in out or rank[state] > rank[out[n]]:
                out[n] = state
    return out
