"""slurmfm's own topology file, and :func:`load_any` for every topology source we read.

Why an own format: EC2 and HyperPod data need AWS access (or a node of the cluster) and a
name mapping to become a Slurm tree, and topology.conf loses instance ids, IPs and NVLink
domains. Saving the finished :class:`Topology` once lets the planner, ``slurmfm`` commands and
tests reuse it offline. The file is versioned JSON::

    {"format": "slurmfm-topology", "version": 1, "kind": "tree",
     "nodes": [{"name": ..., "instance_id": ..., "instance_type": ..., "private_ip": ...,
                "state": ..., "nvlink_domain": ...}],      # absent keys: None / "idle"
     "switches": {switch: parent-or-null},                 # every switch, root's parent null
     "leaf_of": {node: leaf switch},
     "source_ids": {switch: EC2 nn- id}}

Readers refuse a newer ``version`` rather than guess: a planner that silently ignores a new
field could place jobs on the wrong fabric.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, cast

from slurmfm.topology.model import Node, Topology, TopologyError

__all__ = [
    "FORMATS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "detect_format",
    "dumps_topology",
    "load_any",
    "loads_topology",
    "save_topology",
]

FORMAT_NAME = "slurmfm-topology"
FORMAT_VERSION = 1
FORMATS = ("slurmfm", "ec2", "hyperpod", "conf", "yaml", "scontrol", "slurm-lab")
"""Values of ``load_any(fmt=...)``: our JSON, DescribeInstanceTopology JSON, HyperPod
resource_config.json, topology.conf, topology.yaml, ``scontrol show topology`` output, and the
``topology.json`` that ``scripts/slurm-lab`` writes beside its lab (scripts/README-lab.md)."""

_NODE_FIELDS = ("instance_id", "instance_type", "private_ip", "nvlink_domain")
_log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- own format
def _to_obj(t: Topology) -> dict[str, Any]:
    nodes: list[dict[str, str]] = []
    for name in sorted(t.nodes):
        n = t.nodes[name]
        d = {"name": n.name}
        for f in _NODE_FIELDS:
            v = getattr(n, f)
            if v is not None:
                d[f] = v
        if n.state != "idle":
            d["state"] = n.state
        nodes.append(d)
    return {
        "format": FORMAT_NAME,
        "version": FORMAT_VERSION,
        "kind": t.kind,
        "nodes": nodes,
        "switches": {s: t.parent_of[s] for s in sorted(t.parent_of)},
        "leaf_of": {n: t.leaf_of[n] for n in sorted(t.leaf_of)},
        "source_ids": {s: t.source_ids[s] for s in sorted(t.source_ids)},
    }


def dumps_topology(t: Topology) -> str:
    """The topology as slurmfm JSON text (sorted, so equal topologies give equal text)."""
    return json.dumps(_to_obj(t), indent=1, ensure_ascii=False) + "\n"


def _str_map(
    obj: Mapping[str, Any], key: str, src: str, *, nullable: bool = False
) -> dict[str, Any]:
    val = obj.get(key, {})
    if not isinstance(val, dict):
        raise TopologyError(f"{src}: '{key}' must be an object")
    for k, v in val.items():
        if not (isinstance(v, str) or (nullable and v is None)):
            raise TopologyError(f"{src}: {key}[{k!r}] must be a string, got {v!r}")
    return val


def _from_obj(obj: Any, src: str) -> Topology:
    if not isinstance(obj, dict) or obj.get("format") != FORMAT_NAME:
        raise TopologyError(f"{src}: not a slurmfm topology file (no format={FORMAT_NAME!r})")
    version = obj.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise TopologyError(f"{src}: 'version' must be an integer")
    if version > FORMAT_VERSION:
        raise TopologyError(
            f"{src}: written by a newer slurmfm (format version {version}; this one reads "
            f"{FORMAT_VERSION}); upgrade slurmfm"
        )
    if version < 1:
        raise TopologyError(f"{src}: invalid version {version}")
    raw_kind = obj.get("kind", "tree")
    if raw_kind not in ("tree", "block"):
        raise TopologyError(f"{src}: kind must be 'tree' or 'block', got {raw_kind!r}")
    kind: Literal["tree", "block"] = "tree" if raw_kind == "tree" else "block"
    raw_nodes = obj.get("nodes")
    if not isinstance(raw_nodes, list):
        raise TopologyError(f"{src}: 'nodes' must be a list")
    nodes: list[Node] = []
    seen: set[str] = set()
    for i, nd in enumerate(raw_nodes):
        if not isinstance(nd, dict) or not isinstance(nd.get("name"), str) or not nd["name"]:
            raise TopologyError(f"{src}: nodes[{i}] must be an object with a 'name'")
        unknown = set(nd) - {"name", "state", *_NODE_FIELDS}
        if unknown:
            raise TopologyError(f"{src}: nodes[{i}] ({nd['name']}): unknown keys {sorted(unknown)}")
        for f in (*_NODE_FIELDS, "state"):
            if f in nd and not isinstance(nd[f], str):
                raise TopologyError(f"{src}: nodes[{i}].{f} must be a string")
        if nd["name"] in seen:
            raise TopologyError(f"{src}: node {nd['name']!r} listed twice")
        seen.add(nd["name"])
        nodes.append(
            Node(
                name=nd["name"],
                instance_id=nd.get("instance_id"),
                instance_type=nd.get("instance_type"),
                private_ip=nd.get("private_ip"),
                state=nd.get("state", "idle"),
                nvlink_domain=nd.get("nvlink_domain"),
            )
        )
    switches = _str_map(obj, "switches", src, nullable=True)
    leaf_of = _str_map(obj, "leaf_of", src)
    source_ids = _str_map(obj, "source_ids", src)
    unknown_sw = sorted(set(source_ids) - set(switches))
    if unknown_sw:
        raise TopologyError(f"{src}: source_ids names unknown switches: {unknown_sw[:5]}")
    try:
        return Topology.from_parents(
            nodes,
            leaf_of,
            switches,
            source_ids=source_ids,
            kind=kind,
            add_root=False,
        )
    except TopologyError as e:
        raise TopologyError(f"{src}: {e}") from e


def loads_topology(text: str, *, source: str = "<string>") -> Topology:
    """Parse slurmfm JSON text; errors are ``TopologyError("source: what")``."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise TopologyError(f"{source}:{e.lineno}: invalid JSON: {e.msg}") from e
    return _from_obj(obj, source)


def save_topology(t: Topology, path: str | Path) -> None:
    """Write atomically: a temporary file in the same directory, fsync, then rename, so a
    reader (slurmctld tooling, another slurmfm) never sees half a file."""
    from slurmfm.fsutil import write_atomic

    write_atomic(path, dumps_topology(t))


# --------------------------------------------------------------------------- any format
_SCONTROL_FIELD = re.compile(r"\s(?:Level|BlockIndex)=")


def _looks_scontrol(text: str) -> bool:
    r"""A SwitchName/BlockName line with Level=/BlockIndex= (linear: one regex per line; a
    multi-line ``\S+.*\s`` pattern backtracks quadratically on long Nodes= lines)."""
    for line in text.splitlines():
        t = line.lstrip()
        if t.startswith(("SwitchName=", "BlockName=")) and _SCONTROL_FIELD.search(t):
            return True
    return False


_CONF = re.compile(r"^\s*(?:SwitchName|BlockName|BlockSizes)\s*=", re.M | re.I)
_YAML = re.compile(r"^\s*-?\s*topology\s*:", re.M)


def detect_format(text: str, path: str | Path | None = None) -> str:
    """Guess which of :data:`FORMATS` a file's text is in, from content, then extension.

    ``scontrol show topology`` lines carry ``Level=`` (tree) or ``BlockIndex=`` (block), which
    topology.conf lines never do; topology.yaml is a list of ``- topology: NAME`` entries
    (topology.yaml.5, Slurm 25.05+).
    """
    s = text.lstrip()
    if re.fullmatch(r"(?:---\s*)?\[\s*\]\s*", s):
        return "yaml"  # an empty topology.yaml (what HyperPod's topology management can leave)
    if s.startswith(("{", "[")):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict):
            if obj.get("format") == FORMAT_NAME:
                return "slurmfm"
            if "Instances" in obj:
                return "ec2"
            if "InstanceGroups" in obj:
                return "hyperpod"
            if obj.get("plugin") in ("tree", "block", "yaml") and "nodes" in obj:
                return "slurm-lab"
        if (
            isinstance(obj, list)
            and obj
            and all(isinstance(i, dict) and "InstanceId" in i for i in obj)
        ):
            return "ec2"
    if _looks_scontrol(text):
        return "scontrol"
    if _CONF.search(text):
        return "conf"
    if _YAML.search(text):
        return "yaml"
    suffix = Path(path).suffix.lower() if path is not None else ""
    if suffix in (".yaml", ".yml"):
        return "yaml"
    if suffix == ".conf":
        return "conf"
    raise TopologyError(
        f"{path or '<text>'}: unknown topology format (expected one of: {', '.join(FORMATS)})"
    )


_PARSERS = {
    "parse_topology_conf": "slurmfm.topology.topology_conf",
    "parse_scontrol_topology": "slurmfm.topology.scontrol",
    "read_topology_yaml": "slurmfm.topology.topology_yaml",
}


def _slurm_parser(name: str, src: str) -> Callable[..., Any]:
    """The parser of one Slurm format (:data:`_PARSERS`), imported only when a file needs it.

    Lazy so that importing the store (every CLI command does) does not import the parsers.
    """
    del src
    return cast(Callable[..., Any], getattr(importlib.import_module(_PARSERS[name]), name))


def _call_parser(fn: Callable[..., Any], text: str, src: str) -> Any:
    """Call a Slurm-format parser, passing ``source=`` (for ``file:line`` errors) if it takes it."""
    try:
        takes_source = "source" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        takes_source = False
    return fn(text, source=src) if takes_source else fn(text)


def _wrap(src: str, fn: Callable[[], Topology]) -> Topology:
    try:
        return fn()
    except TopologyError as e:
        msg = str(e)
        raise TopologyError(msg if msg.startswith(src) else f"{src}: {msg}") from e
    except ValueError as e:
        raise TopologyError(f"{src}: {e}") from e


def load_any(
    path: str | Path,
    *,
    fmt: str | None = None,
    names: Mapping[str, str] | None = None,
    partition: str | None = None,
) -> Topology:
    """Load a topology from any supported file (``fmt`` one of :data:`FORMATS`, else detected).

    ``names`` (instance id -> Slurm node name) applies to EC2 JSON; without it nodes are named
    by instance id. HyperPod files name nodes ``ip-a-b-c-d`` themselves. ``partition`` picks
    one topology from a topology.yaml with several (a key of ``parse_topology_yaml``'s result).
    Import problems that do not stop the import (instances without topology, unmapped ones,
    missing CapacityBlockId) are logged as warnings. Errors: ``TopologyError("file: what")``.
    """
    src = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyError(f"{src}: cannot read: {e}") from e
    if fmt is None:
        fmt = detect_format(text, path)
    elif fmt not in FORMATS:
        raise TopologyError(f"{src}: unknown format {fmt!r} (one of: {', '.join(FORMATS)})")

    if fmt == "slurmfm":
        return loads_topology(text, source=src)
    if fmt == "slurm-lab":
        return _wrap(src, lambda: _from_lab(json.loads(text)))
    if fmt in ("ec2", "hyperpod"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise TopologyError(f"{src}:{e.lineno}: invalid JSON: {e.msg}") from e
        return _wrap(src, lambda: _load_aws(data, fmt, names, src))
    if fmt == "conf":
        parse = _slurm_parser("parse_topology_conf", src)
        return _wrap(src, lambda: _topology(_call_parser(parse, text, src), src))
    if fmt == "scontrol":
        parse = _slurm_parser("parse_scontrol_topology", src)
        return _wrap(src, lambda: _topology(_call_parser(parse, text, src), src))
    parse = _slurm_parser("read_topology_yaml", src)
    return _wrap(src, lambda: _pick_yaml(_call_parser(parse, text, src), partition, src))


def _pick_yaml(doc: Any, partition: str | None, src: str) -> Topology:
    """One tree/block topology of a topology.yaml, or an error saying what the file holds."""
    topos = getattr(doc, "topologies", None)
    if topos is None:
        raise TopologyError(f"{src}: parser returned {type(doc).__name__}, not a TopologyYaml")
    if not topos or (partition is not None and partition not in topos):
        what = (
            f"no topology {partition!r}" if partition is not None else "no tree or block topology"
        )
        raise TopologyError(
            f"{src}: {what}; it holds {doc.summary()}. slurmfm plans on tree and block "
            "fabrics: for a cluster without one (HyperPod's automatic topology management can "
            "leave topology.yaml empty) plan with --topology live, a flat fabric of its nodes"
        )
    return _pick(topos, partition, src)


def _from_lab(obj: Mapping[str, Any]) -> Topology:
    """The local lab's truth file: ``{"plugin", "switches"|"blocks", "nodes"}``."""
    if obj.get("plugin") == "block":
        leaf_of = {n: b for b, spec in obj["blocks"].items() for n in spec["nodes"]}
        nodes = [Node(n) for n in leaf_of]
        return Topology.from_parents(nodes, leaf_of, {}, kind="block")
    if obj.get("plugin") != "tree":
        raise TopologyError(
            "this lab runs topology.yaml, which its topology.json does not describe; "
            "pass the lab's etc/topology.yaml instead"
        )
    switches = obj["switches"]
    leaf_of = {n: sw for sw, spec in switches.items() if spec["level"] == 0 for n in spec["nodes"]}
    parents = {sw: spec["parent"] for sw, spec in switches.items()}
    return Topology.from_parents([Node(n) for n in leaf_of], leaf_of, parents)


def _topology(obj: Any, src: str) -> Topology:
    if not isinstance(obj, Topology):
        raise TopologyError(f"{src}: parser returned {type(obj).__name__}, not a Topology")
    return obj


def _load_aws(data: Any, fmt: str, names: Mapping[str, str] | None, src: str) -> Topology:
    from slurmfm.topology.ec2 import parse_topology_json, to_topology
    from slurmfm.topology.hyperpod import resource_config_topology

    if fmt == "hyperpod":
        if not isinstance(data, Mapping):
            raise TopologyError("not a HyperPod resource_config.json (not an object)")
        topo, report = resource_config_topology(data)
    else:
        report = parse_topology_json(data)
        topo = to_topology(report, names)
    for w in report.warnings:
        _log.warning("%s: %s", src, w)
    if report.unmapped:
        _log.warning(
            "%s: %d instances have no Slurm node name and were left out: %s",
            src,
            len(report.unmapped),
            ", ".join(report.unmapped[:5]),
        )
    return topo


def _pick(topos: Any, partition: str | None, src: str) -> Topology:
    if not isinstance(topos, Mapping):
        raise TopologyError(f"{src}: parser returned {type(topos).__name__}, not a mapping")
    if partition is not None:
        if partition not in topos:
            raise TopologyError(
                f"{src}: no topology {partition!r} (has: {', '.join(sorted(topos))})"
            )
        return _topology(topos[partition], src)
    if not topos:
        raise TopologyError(f"{src}: no topology defined")
    if len(topos) > 1:
        raise TopologyError(
            f"{src}: {len(topos)} topologies ({', '.join(sorted(topos))}); choose one"
        )
    return _topology(next(iter(topos.values())), src)
