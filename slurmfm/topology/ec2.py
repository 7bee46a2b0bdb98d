"""Import EC2 ``DescribeInstanceTopology`` into the :class:`~slurmfm.topology.model.Topology`.

Why this module exists: the fabric tree Slurm needs (``topology.conf`` / ``topology.yaml``) is
only known to EC2, as a top-down list of hashed network-node ids per instance. Turning that into
a Slurm tree takes four steps, each kept separate so it can be tested without AWS:

1. fetch: :func:`describe_instance_topology` (live, through a boto3 EC2 client passed in) or a
   saved ``aws ec2 describe-instance-topology`` JSON file;
2. parse: :func:`parse_topology_json` -> :class:`ImportReport` (records plus everything that could
   not be used, reported rather than silently dropped);
3. name: instance id -> Slurm node name, by private IP (:func:`map_by_private_ip` +
   :func:`parse_scontrol_nodes`, the approach of aws-samples/ec2-topology-aware-for-slurm,
   which registers nodes by private IP) or by a mapping file (:func:`load_mapping_file`);
4. build: :func:`to_topology`.

API facts used here (checked against botocore's EC2 service model, botocore 1.43, and
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceTopology.html):

* Response ``Instances[]`` members: ``InstanceId``, ``InstanceType``, ``GroupName``,
  ``NetworkNodes`` (top-down: index 0 is the farthest layer, the last is the node the instance
  attaches to), ``AvailabilityZone``, ``ZoneId``, ``CapacityBlockId``; plus ``NextToken``.
* ``NetworkNodes`` is null or empty when the type is unsupported or the instance is not running.
* 3 network nodes for p4d/p4de/p5/p5e/p5en/p6e-gb200, 4 for p6-b200/p6-b300
  (how-ec2-instance-topology-works.html); the catalog's ``topology_depth`` holds this.
* ``CapacityBlockId`` is returned only for UltraServer instances and "might return a null value
  ... immediately after launching instances" (the operation's documentation in the model).
* Request: ``InstanceIds`` at most 100; ``MaxResults`` 1..100 and, per the API reference,
  not combinable with ``InstanceIds``; filters ``availability-zone``, ``instance-type``
  (wildcards allowed), ``zone-id``. Only running instances are described.

Switch names are the EC2 ``nn-`` ids themselves: Slurm's ``SwitchName`` is arbitrary text of at
most 64 characters (topology.conf(5)) and an ``nn-`` id is
20, so keeping them makes every switch traceable back to EC2. ``source_ids`` records the mapping
explicitly so exporters may rename switches without losing it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from slurmfm.catalog.instances import UnknownInstanceType, get_instance
from slurmfm.errors import SlurmfmError
from slurmfm.topology.model import Node, Topology, TopologyError

__all__ = [
    "DESCRIBE_INSTANCES_CHUNK",
    "MAX_IDS_PER_CALL",
    "EC2Client",
    "ImportReport",
    "InstanceRecord",
    "client_from_env",
    "describe_instance_topology",
    "load_mapping_file",
    "map_by_private_ip",
    "names_from_ips",
    "parse_scontrol_nodes",
    "parse_topology_json",
    "report_from_records",
    "to_topology",
]

MAX_IDS_PER_CALL = 100
"""``DescribeInstanceTopology`` takes at most 100 explicit instance ids (EC2 API model)."""

PAGE_SIZE = 100
"""Largest ``MaxResults`` the EC2 model allows for ``DescribeInstanceTopology`` (1..100)."""

DESCRIBE_INSTANCES_CHUNK = 100
"""Instance ids per ``instance-id`` filter in ``DescribeInstances``: well under EC2's limit on
filter values, and a filter (unlike ``InstanceIds``) does not fail the whole call when one id
no longer exists, so a terminated instance only ends up unmapped."""

_INSTANCE_ID = re.compile(r"^i-[0-9a-f]{8,17}$")
_MISSING_CB_HINT = (
    "CapacityBlockId may be missing right after launch (EC2 eventual consistency); retry later"
)


class EC2Client(Protocol):
    """The two boto3 EC2 client methods this module calls (keyword arguments, dict results)."""

    def describe_instance_topology(self, **kwargs: Any) -> Mapping[str, Any]: ...

    def describe_instances(self, **kwargs: Any) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class InstanceRecord:
    """One ``InstanceTopology`` entry, typed. ``network_nodes`` is top-down, as EC2 gives it."""

    instance_id: str
    instance_type: str | None = None
    network_nodes: tuple[str, ...] = ()
    capacity_block_id: str | None = None
    availability_zone: str | None = None
    zone_id: str | None = None
    group_name: str | None = None


@dataclass
class ImportReport:
    """What an import found, including everything it could not place.

    Why a report and not an exception: a cluster where one instance is still booting (no
    ``NetworkNodes`` yet) or one UltraServer's ``CapacityBlockId`` has not propagated is normal,
    and the operator should get the rest of the tree plus a list of what to look at.
    """

    records: list[InstanceRecord] = field(default_factory=list)
    without_topology: list[str] = field(default_factory=list)
    missing_capacity_block: list[str] = field(default_factory=list)
    unmapped: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    @property
    def with_topology(self) -> list[InstanceRecord]:
        """Records that have a network path (the ones :func:`to_topology` can place)."""
        return [r for r in self.records if r.network_nodes]

    def summary(self) -> str:
        """One line for logs and CLI output."""
        return (
            f"{len(self.records)} instances, {len(self.without_topology)} without topology, "
            f"{len(self.missing_capacity_block)} UltraServer instances without CapacityBlockId, "
            f"{len(self.unmapped)} without a Slurm node"
        )


# --------------------------------------------------------------------------- live calls
def client_from_env(region: str | None = None) -> Any:
    """A boto3 EC2 client from the usual environment (profile, role, region).

    boto3 is imported here, not at module level, because it is an optional dependency
    (``slurmfm[aws]``) and slow to import; everything else in this module takes a client.
    """
    try:
        import boto3
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise SlurmfmError("boto3 is needed to call EC2: pip install 'slurmfm[aws]'") from e
    return boto3.client("ec2", region_name=region)


def _chunks(items: Sequence[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(items), size):
        yield list(items[i : i + size])


def _unique(items: Iterable[str], what: str) -> list[str]:
    out: list[str] = []
    seen: set[str] = set()
    for it in items:
        if not isinstance(it, str) or not it:
            raise TopologyError(f"{what} must be non-empty strings, got {it!r}")
        if it not in seen:
            seen.add(it)
            out.append(it)
    return out


def _paged(
    call: Callable[..., Mapping[str, Any]], kwargs: dict[str, Any]
) -> Iterator[Mapping[str, Any]]:
    """Yield every page of an EC2 call, following ``NextToken``; a repeated token is an error
    (it would otherwise loop forever on a misbehaving endpoint or stub)."""
    seen: set[str] = set()
    token: str | None = None
    while True:
        args = dict(kwargs)
        if token:
            args["NextToken"] = token
        page = call(**args)
        yield page
        token = page.get("NextToken") or None
        if not token:
            return
        if token in seen:
            raise TopologyError(f"EC2 returned the same NextToken twice ({token[:20]}...)")
        seen.add(token)


def describe_instance_topology(
    client: EC2Client,
    *,
    instance_ids: Sequence[str] | None = None,
    instance_types: Sequence[str] | None = None,
    progress: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """Every ``InstanceTopology`` entry for the given instances and/or types, all pages.

    With ``instance_ids``, ids are de-duplicated and sent in chunks of at most 100 without
    ``MaxResults`` (the two cannot be combined); otherwise pages of ``MaxResults=100``.
    ``instance_types`` becomes the ``instance-type`` filter (wildcards such as ``p5*`` allowed).
    ``progress`` is called after each page with the number of instances received so far.
    ``instance_ids=[]`` means "none", not "all": it returns ``[]`` without calling EC2.
    """
    filters: list[dict[str, Any]] = []
    if instance_types is not None:
        types = _unique(instance_types, "instance_types")
        if not types:
            raise TopologyError("instance_types is empty; pass None for all types")
        filters.append({"Name": "instance-type", "Values": types})

    requests: list[dict[str, Any]] = []
    if instance_ids is not None:
        ids = _unique(instance_ids, "instance_ids")
        for chunk in _chunks(ids, MAX_IDS_PER_CALL):
            req: dict[str, Any] = {"InstanceIds": chunk}
            if filters:
                req["Filters"] = filters
            requests.append(req)
    else:
        req = {"MaxResults": PAGE_SIZE}
        if filters:
            req["Filters"] = filters
        requests.append(req)

    out: list[dict[str, Any]] = []
    for req in requests:
        for page in _paged(client.describe_instance_topology, req):
            out.extend(dict(inst) for inst in page.get("Instances") or [])
            if progress is not None:
                progress(len(out))
    return out


def map_by_private_ip(client: EC2Client, instance_ids: Iterable[str]) -> dict[str, str]:
    """Instance id -> primary private IPv4 address, via ``DescribeInstances``.

    Why private IPs: Slurm knows nodes by name and ``NodeAddr``, EC2 knows instances by id;
    the primary private IP is the one value both sides share (ParallelCluster, PCS and
    HyperPod all register nodes by it). Uses the ``instance-id``
    filter in chunks of :data:`DESCRIBE_INSTANCES_CHUNK`, so ids that no longer exist are
    simply absent from the result instead of failing the call.
    """
    ids = _unique(instance_ids, "instance_ids")
    out: dict[str, str] = {}
    for chunk in _chunks(ids, DESCRIBE_INSTANCES_CHUNK):
        req = {"Filters": [{"Name": "instance-id", "Values": chunk}], "MaxResults": 1000}
        for page in _paged(client.describe_instances, req):
            for reservation in page.get("Reservations") or []:
                for inst in reservation.get("Instances") or []:
                    iid, ip = inst.get("InstanceId"), inst.get("PrivateIpAddress")
                    if isinstance(iid, str) and isinstance(ip, str) and ip:
                        out[iid] = ip
    return out


# --------------------------------------------------------------------------- Slurm side


def parse_scontrol_nodes(text: str) -> dict[str, str]:
    """``NodeAddr`` -> ``NodeName`` from ``scontrol show nodes`` (``-o``, multi-line or ``--json``).

    The text form is read by the one scontrol record parser (:func:`slurmfm.job.slurm.node_records`:
    ``-o`` or the default multi-line records, values with spaces). The JSON form reads
    ``nodes[].name`` and ``nodes[].address`` (checked against ``scontrol show nodes --json``
    of Slurm 24.11 in the local lab). An address shared by several nodes (e.g. every node of a
    one-host lab is 127.0.0.1) cannot identify an instance, so such addresses are left out:
    their instances end up unmapped rather than attached to an arbitrary node.
    """
    pairs: list[tuple[str, str]] = []
    stripped = text.lstrip()
    if not stripped:
        return {}
    if stripped.startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise TopologyError(f"scontrol JSON: line {e.lineno}: {e.msg}") from e
        nodes = data.get("nodes") if isinstance(data, dict) else None
        if not isinstance(nodes, list):
            raise TopologyError("scontrol JSON has no 'nodes' list")
        for n in nodes:
            if not isinstance(n, dict):
                continue
            name, addr = n.get("name"), n.get("address")
            if isinstance(name, str) and isinstance(addr, str) and name and addr:
                pairs.append((addr, name))
    else:
        from slurmfm.job.slurm import node_records

        records = node_records(text)
        if not records:
            raise TopologyError("no 'NodeName=' records in scontrol output")
        pairs.extend((r["NodeAddr"], r["NodeName"]) for r in records if r.get("NodeAddr"))
    counts: dict[str, int] = {}
    for addr, _ in pairs:
        counts[addr] = counts.get(addr, 0) + 1
    return {addr: name for addr, name in pairs if counts[addr] == 1}


def names_from_ips(ips: Mapping[str, str], addr_to_node: Mapping[str, str]) -> dict[str, str]:
    """Join instance id -> IP (:func:`map_by_private_ip`) with IP -> node
    (:func:`parse_scontrol_nodes`) into instance id -> node name."""
    return {iid: addr_to_node[ip] for iid, ip in ips.items() if ip in addr_to_node}


def load_mapping_file(path: str | Path) -> dict[str, str]:
    """Instance id -> Slurm node name from a file an operator wrote or exported.

    Accepted: a JSON object ``{"i-...": "node"}``, or text with two whitespace-separated
    columns ``i-... nodename`` per line (``#`` comments and blank lines ignored). Errors are
    :class:`TopologyError` ``file:line: what`` so a typo in line 3000 is found at once. Two
    instances with one node name are an error: Slurm cannot put one node under two leaves.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise TopologyError(f"{p}: cannot read mapping file: {e}") from e
    entries: list[tuple[int | None, str, str]] = []
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise TopologyError(f"{p}:{e.lineno}: invalid JSON: {e.msg}") from e
        if not isinstance(data, dict):
            raise TopologyError(f"{p}: JSON mapping must be an object")
        for k, v in data.items():
            if not isinstance(v, str):
                raise TopologyError(f"{p}: {k}: node name must be a string, got {v!r}")
            entries.append((None, k, v))
    else:
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            cols = line.split()
            if len(cols) != 2:
                raise TopologyError(
                    f"{p}:{lineno}: expected 'INSTANCE_ID NODENAME', got {len(cols)} columns"
                )
            entries.append((lineno, cols[0], cols[1]))
    out: dict[str, str] = {}
    owner: dict[str, str] = {}
    for where_line, iid, name in entries:
        where = f"{p}:{where_line}" if where_line is not None else f"{p}: {iid}"
        if not _INSTANCE_ID.match(iid):
            raise TopologyError(f"{where}: {iid!r} is not an EC2 instance id (i-...)")
        if not name or any(c.isspace() for c in name):
            raise TopologyError(f"{where}: invalid node name {name!r}")
        if iid in out and out[iid] != name:
            raise TopologyError(f"{where}: {iid} mapped twice ({out[iid]!r} and {name!r})")
        if name in owner and owner[name] != iid:
            raise TopologyError(f"{where}: node {name!r} already mapped to {owner[name]}")
        out[iid] = name
        owner[name] = iid
    return out


# --------------------------------------------------------------------------- parsing
def _opt_str(inst: Mapping[str, Any], key: str, where: str) -> str | None:
    v = inst.get(key)
    if v is None or v == "":
        return None
    if not isinstance(v, str):
        raise TopologyError(f"{where}: {key} must be a string, got {type(v).__name__}")
    return v


def _record(inst: Any, index: int) -> InstanceRecord:
    if not isinstance(inst, Mapping):
        raise TopologyError(f"Instances[{index}]: expected an object, got {type(inst).__name__}")
    iid = inst.get("InstanceId")
    if not isinstance(iid, str) or not iid:
        raise TopologyError(f"Instances[{index}]: missing InstanceId")
    where = f"Instances[{index}] ({iid})"
    nn = inst.get("NetworkNodes")
    if nn is None:
        nodes: tuple[str, ...] = ()
    elif isinstance(nn, list | tuple):
        if not all(isinstance(x, str) and x for x in nn):
            raise TopologyError(f"{where}: NetworkNodes must be non-empty strings")
        nodes = tuple(nn)
    else:
        raise TopologyError(f"{where}: NetworkNodes must be a list, got {type(nn).__name__}")
    return InstanceRecord(
        instance_id=iid,
        instance_type=_opt_str(inst, "InstanceType", where),
        network_nodes=nodes,
        capacity_block_id=_opt_str(inst, "CapacityBlockId", where),
        availability_zone=_opt_str(inst, "AvailabilityZone", where),
        zone_id=_opt_str(inst, "ZoneId", where),
        group_name=_opt_str(inst, "GroupName", where),
    )


def _catalog_facts(instance_type: str | None) -> tuple[int | None, bool | None, int | None]:
    """(expected depth, multi-node NVLink?, max instances per domain) or Nones if unknown."""
    if not instance_type:
        return None, None, None
    try:
        it = get_instance(instance_type)
    except UnknownInstanceType:
        return None, None, None
    return it.topology_depth, it.nvlink.is_multi_node, max(it.nvlink.instances)


def report_from_records(records: Iterable[InstanceRecord]) -> ImportReport:
    """Check records against the instance catalog and collect what needs the operator's eye.

    Shared by the EC2 and HyperPod importers. Duplicate instance ids keep the first record.
    A ``NetworkNodes`` length that differs from the catalog's ``topology_depth`` is a warning,
    not an error, because sources disagree for p6e-gb200 (catalog notes) and the tree works at
    any depth. ``CapacityBlockId`` on a type the catalog knows as single-instance NVLink is
    dropped with a warning: EC2 documents it only for UltraServers, and using it would glue
    8-GPU nodes into a fake NVLink domain.
    """
    report = ImportReport()
    seen: dict[str, InstanceRecord] = {}
    depth_mismatch: dict[tuple[str, int, int], int] = {}
    domain_sizes: dict[str, int] = {}
    domain_limit: dict[str, int] = {}
    for original in records:
        rec = original
        if rec.instance_id in seen:
            same = seen[rec.instance_id] == rec
            report.warnings.append(
                f"{rec.instance_id} listed twice"
                + ("" if same else " with different data; kept the first")
            )
            continue
        depth, multi, max_domain = _catalog_facts(rec.instance_type)
        if rec.capacity_block_id and multi is False:
            report.warnings.append(
                f"{rec.instance_id}: CapacityBlockId {rec.capacity_block_id} ignored: "
                f"{rec.instance_type} is not an UltraServer type"
            )
            rec = replace(rec, capacity_block_id=None)
        seen[rec.instance_id] = rec
        report.records.append(rec)
        if not rec.network_nodes:
            report.without_topology.append(rec.instance_id)
            continue
        if depth is not None and len(rec.network_nodes) != depth and rec.instance_type:
            key = (rec.instance_type, len(rec.network_nodes), depth)
            depth_mismatch[key] = depth_mismatch.get(key, 0) + 1
        if multi and not rec.capacity_block_id:
            report.missing_capacity_block.append(rec.instance_id)
        if rec.capacity_block_id:
            cb = rec.capacity_block_id
            domain_sizes[cb] = domain_sizes.get(cb, 0) + 1
            if max_domain is not None:
                domain_limit[cb] = max_domain
    for (itype, got, want), n in sorted(depth_mismatch.items()):
        report.warnings.append(
            f"{n} {itype} instances have {got} network nodes; the catalog expects {want}"
        )
    if report.without_topology:
        report.warnings.append(
            f"{len(report.without_topology)} instances have no NetworkNodes (type not "
            "supported or not running yet): " + ", ".join(report.without_topology[:5])
        )
    if report.missing_capacity_block:
        report.warnings.append(
            f"{len(report.missing_capacity_block)} UltraServer instances without "
            f"CapacityBlockId: {_MISSING_CB_HINT}"
        )
    for cb, n in sorted(domain_sizes.items()):
        limit = domain_limit.get(cb)
        if limit is not None and n > limit:
            report.warnings.append(
                f"CapacityBlockId {cb} has {n} instances; an UltraServer holds at most {limit}"
            )
    return report


def parse_topology_json(
    data: Mapping[str, Any] | Sequence[Mapping[str, Any]],
) -> ImportReport:
    """Parse saved ``aws ec2 describe-instance-topology`` output (``{"Instances": [...]}``) or
    the list :func:`describe_instance_topology` returns. Malformed entries raise
    :class:`TopologyError` naming the entry; incomplete ones are reported."""
    if isinstance(data, Mapping):
        instances = data.get("Instances")
        if not isinstance(instances, list):
            raise TopologyError("not DescribeInstanceTopology output: no 'Instances' list")
    elif isinstance(data, list | tuple):
        instances = list(data)
    else:
        raise TopologyError(f"expected an object or a list, got {type(data).__name__}")
    return report_from_records(_record(inst, i) for i, inst in enumerate(instances))


# --------------------------------------------------------------------------- building
def to_topology(
    report: ImportReport,
    names: Mapping[str, str] | None,
    *,
    private_ips: Mapping[str, str] | None = None,
) -> Topology:
    """Build the fabric tree from an import.

    ``names`` maps instance id -> Slurm node name; instances it does not cover are appended to
    ``report.unmapped`` and left out (a tree naming nodes Slurm does not know would be rejected
    by slurmctld). ``names=None`` names nodes by instance id, for inspection and benchmarks.
    ``private_ips`` (instance id -> IP) fills :attr:`Node.private_ip` when known.
    ``Node.nvlink_domain`` is the ``CapacityBlockId``; switch names are the ``nn-`` ids and
    ``source_ids`` maps each to itself. Several top-layer nodes get a common ``root``
    (:meth:`Topology.from_parents`), so mixed 3- and 4-level types still form one tree.
    """
    paths: dict[str, tuple[str, ...]] = {}
    nodes: list[Node] = []
    owner: dict[str, str] = {}
    unmapped = set(report.unmapped)
    for rec in report.records:
        if not rec.network_nodes:
            continue
        if names is None:
            name = rec.instance_id
        elif rec.instance_id in names:
            name = names[rec.instance_id]
        else:
            if rec.instance_id not in unmapped:
                report.unmapped.append(rec.instance_id)
                unmapped.add(rec.instance_id)
            continue
        if name in owner:
            raise TopologyError(
                f"node {name!r} is mapped to two instances ({owner[name]}, {rec.instance_id})"
            )
        owner[name] = rec.instance_id
        paths[name] = rec.network_nodes
        nodes.append(
            Node(
                name=name,
                instance_id=rec.instance_id,
                instance_type=rec.instance_type,
                private_ip=(private_ips or {}).get(rec.instance_id),
                nvlink_domain=rec.capacity_block_id,
            )
        )
    if not nodes:
        raise TopologyError(
            "no instance can be placed: "
            f"{len(report.records)} instances, {len(report.without_topology)} without "
            f"NetworkNodes, {len(report.unmapped)} without a Slurm node name"
        )
    topo = Topology.from_paths(paths, nodes)
    switch_ids = {sw: sw for path in paths.values() for sw in path}
    return replace(topo, source_ids=switch_ids)
