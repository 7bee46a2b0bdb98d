"""Import SageMaker HyperPod's ``/opt/ml/config/resource_config.json`` into a Topology.

Why a separate importer: on HyperPod the instances belong to a SageMaker service account, so
``aws ec2 describe-instance-topology`` in the customer account does not describe them; the
network-node layers are written into ``resource_config.json`` on every node instead
(awslabs/awsome-distributed-ai:``1.architectures/5.sagemaker-hyperpod/tools/devops-agent/
docs/hyperpod-mental-model.md``).

What is verified and what is not:

* Verified from two independent public readers of the file: ``InstanceGroups[]`` with ``Name``,
  ``InstanceType`` (``ml.``-prefixed) and ``Instances[]``, each instance with ``InstanceName``,
  ``InstanceId``, ``AgentIpAddress`` (a SageMaker-side 172.16.x address) and
  ``CustomerIpAddress`` (the address in the customer VPC). Sources:
  aws-samples/awsome-distributed-training ``1.architectures/5.sagemaker-hyperpod/
  LifecycleScripts/base-config/lifecycle_script.py`` (``ResourceConfig``: ``Name``,
  ``InstanceName``, ``CustomerIpAddress``) and shimomut/sagemaker-solutions
  ``hyperpod_k8s/tools/replace-instance.py`` (a sample document in its docstring, and Slurm
  node names built as ``"ip-" + CustomerIpAddress.replace(".", "-")``).
* Not verified: how the topology labels are nested. Only the label *names*
  ``network-node-layer-1..3`` under ``InstanceLabel`` are documented (the mental-model doc; the
  same names are EKS node labels ``topology.k8s.aws/
  network-node-layer-N`` where layer 1 is ``NetworkNodes[0]``, the top). No sample file with
  labels was found, so :func:`_layer_labels` accepts the plausible shapes: an ``InstanceLabel``
  (or ``InstanceLabels`` / ``Labels``) object of ``{key: value}``, a list of
  ``{"Key"|"Name": ..., "Value": ...}``, or flat ``"InstanceLabel.network-node-layer-N"`` keys;
  keys may carry a ``topology.k8s.aws/`` style prefix. Any number of contiguous layers is
  accepted (p6-b200/b300 have 4 in EC2). An UltraServer id is read from ``CapacityBlockId`` or a
  label ending in ``ultraserver-id`` -- also unverified for this file.

Instances of groups without labels (controller, login, CPU groups) are reported in
``without_topology``, as the EC2 importer does for unsupported types.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from slurmfm.topology.ec2 import ImportReport, InstanceRecord, report_from_records, to_topology
from slurmfm.topology.model import Topology, TopologyError

__all__ = [
    "hyperpod_node_name",
    "hyperpod_node_names",
    "is_resource_config",
    "parse_resource_config",
    "resource_config_topology",
]

_LAYER = re.compile(r"(?:^|[/.])network-node-layer-(\d+)$")
_ULTRASERVER = re.compile(r"(?:^|[/.])ultraserver-id$")
_IPV4 = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}$")


def is_resource_config(data: Any) -> bool:
    """True when ``data`` looks like a HyperPod resource_config.json document."""
    return isinstance(data, Mapping) and isinstance(data.get("InstanceGroups"), list)


def hyperpod_node_name(ip: str) -> str:
    """HyperPod's Slurm node name for a VPC address: ``10.1.2.3`` -> ``ip-10-1-2-3``
    (shimomut/sagemaker-solutions replace-instance.py)."""
    if not _IPV4.match(ip):
        raise TopologyError(f"not an IPv4 address: {ip!r}")
    return "ip-" + ip.replace(".", "-")


def _labels(inst: Mapping[str, Any]) -> dict[str, str]:
    out: dict[str, str] = {}
    for key in ("InstanceLabel", "InstanceLabels", "Labels"):
        val = inst.get(key)
        if isinstance(val, Mapping):
            out.update({str(k): v for k, v in val.items() if isinstance(v, str)})
        elif isinstance(val, list):
            for item in val:
                if isinstance(item, Mapping):
                    k = item.get("Key", item.get("Name"))
                    v = item.get("Value")
                    if isinstance(k, str) and isinstance(v, str):
                        out[k] = v
    for k, v in inst.items():
        if isinstance(k, str) and k.startswith("InstanceLabel.") and isinstance(v, str):
            out[k] = v
    return out


def _layer_labels(labels: Mapping[str, str], where: str, warnings: list[str]) -> tuple[str, ...]:
    """Top-down network nodes from ``network-node-layer-N`` labels (N = 1 is the top)."""
    layers: dict[int, str] = {}
    for k, v in labels.items():
        m = _LAYER.search(k)
        if m and v:
            layers[int(m.group(1))] = v
    if not layers:
        return ()
    want = list(range(1, max(layers) + 1))
    if sorted(layers) != want:
        warnings.append(
            f"{where}: network-node layers {sorted(layers)} are not contiguous from 1; "
            "treated as without topology"
        )
        return ()
    return tuple(layers[i] for i in want)


def _str(inst: Mapping[str, Any], key: str) -> str | None:
    v = inst.get(key)
    return v if isinstance(v, str) and v else None


def _instances(data: Mapping[str, Any]) -> list[tuple[Mapping[str, Any], Mapping[str, Any]]]:
    if not is_resource_config(data):
        raise TopologyError("not a HyperPod resource_config.json: no 'InstanceGroups' list")
    out: list[tuple[Mapping[str, Any], Mapping[str, Any]]] = []
    for gi, group in enumerate(data["InstanceGroups"]):
        if not isinstance(group, Mapping):
            raise TopologyError(f"InstanceGroups[{gi}]: expected an object")
        insts = group.get("Instances")
        if insts is None:
            insts = []
        if not isinstance(insts, list):
            raise TopologyError(f"InstanceGroups[{gi}].Instances: expected a list")
        for ii, inst in enumerate(insts):
            if not isinstance(inst, Mapping):
                raise TopologyError(f"InstanceGroups[{gi}].Instances[{ii}]: expected an object")
            out.append((group, inst))
    return out


def _instance_key(inst: Mapping[str, Any], where: str) -> str:
    key = _str(inst, "InstanceId") or _str(inst, "InstanceName")
    if key is None:
        raise TopologyError(f"{where}: neither InstanceId nor InstanceName")
    return key


def parse_resource_config(data: Mapping[str, Any]) -> ImportReport:
    """Records (keyed by ``InstanceId``, else ``InstanceName``) from resource_config.json."""
    records: list[InstanceRecord] = []
    warnings: list[str] = []
    for n, (group, inst) in enumerate(_instances(data)):
        where = f"instance {n} of group {group.get('Name')!r}"
        key = _instance_key(inst, where)
        labels = _labels(inst)
        ultra = _str(inst, "CapacityBlockId") or next(
            (v for k, v in labels.items() if _ULTRASERVER.search(k)), None
        )
        records.append(
            InstanceRecord(
                instance_id=key,
                instance_type=_str(inst, "InstanceType") or _str(group, "InstanceType"),
                network_nodes=_layer_labels(labels, f"{where} ({key})", warnings),
                capacity_block_id=ultra,
                availability_zone=_str(inst, "AvailabilityZone"),
                zone_id=_str(inst, "ZoneId") or labels.get("topology.k8s.aws/zone-id"),
                group_name=_str(group, "Name"),
            )
        )
    report = report_from_records(records)
    report.warnings[:0] = warnings
    return report


def hyperpod_node_names(data: Mapping[str, Any]) -> dict[str, str]:
    """Record key (as in :func:`parse_resource_config`) -> Slurm node name ``ip-a-b-c-d``,
    from ``CustomerIpAddress`` (``AgentIpAddress`` is SageMaker's side, not the node's)."""
    out: dict[str, str] = {}
    for n, (group, inst) in enumerate(_instances(data)):
        where = f"instance {n} of group {group.get('Name')!r}"
        ip = _str(inst, "CustomerIpAddress")
        if ip is not None:
            out[_instance_key(inst, where)] = hyperpod_node_name(ip)
    return out


def resource_config_topology(data: Mapping[str, Any]) -> tuple[Topology, ImportReport]:
    """The fabric tree of a HyperPod cluster with Slurm node names, plus the import report."""
    report = parse_resource_config(data)
    ips = {
        _instance_key(inst, ""): ip
        for _, inst in _instances(data)
        if (ip := _str(inst, "CustomerIpAddress")) is not None
    }
    topo = to_topology(report, hyperpod_node_names(data), private_ips=ips)
    return topo, report
