"""HyperPod resource_config.json import.

The group/instance fields follow the sample document in shimomut/sagemaker-solutions
hyperpod_k8s/tools/replace-instance.py (and the fields ADT's lifecycle_script.py reads). The
label nesting is not verified (see slurmfm.topology.hyperpod), so each accepted shape is tested.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from slurmfm.topology.hyperpod import (
    hyperpod_node_name,
    hyperpod_node_names,
    is_resource_config,
    parse_resource_config,
    resource_config_topology,
)
from slurmfm.topology.model import TopologyError

LAYERS = {
    "10.1.38.128": ("nn-a00000000000000001", "nn-b00000000000000001", "nn-c00000000000000001"),
    "10.1.29.16": ("nn-a00000000000000001", "nn-b00000000000000001", "nn-c00000000000000001"),
    "10.1.30.5": ("nn-a00000000000000001", "nn-b00000000000000002", "nn-c00000000000000002"),
}


def _labels_as_object(nn: tuple[str, ...]) -> dict[str, Any]:
    return {"InstanceLabel": {f"network-node-layer-{i}": v for i, v in enumerate(nn, 1)}}


def _labels_as_list(nn: tuple[str, ...]) -> dict[str, Any]:
    return {
        "InstanceLabels": [
            {"Key": f"topology.k8s.aws/network-node-layer-{i}", "Value": v}
            for i, v in enumerate(nn, 1)
        ]
    }


def _labels_flat(nn: tuple[str, ...]) -> dict[str, Any]:
    return {f"InstanceLabel.network-node-layer-{i}": v for i, v in enumerate(nn, 1)}


def resource_config(label_shape: Any = _labels_as_object) -> dict[str, Any]:
    workers = []
    for n, (ip, nn) in enumerate(LAYERS.items(), 1):
        workers.append(
            {
                "AgentIpAddress": f"172.16.98.{n}",
                "CustomerIpAddress": ip,
                "InstanceId": f"i-0cc2532921ec0634{n}",
                "InstanceName": f"WorkerGroup-{n}",
                **label_shape(nn),
            }
        )
    return {
        "ClusterConfig": {
            "ClusterArn": "arn:aws:sagemaker:us-west-2:123456789012:cluster/kb8v11zrrpvr",
            "ClusterName": "ml-cluster",
        },
        "InstanceGroups": [
            {
                "InstanceType": "ml.m5.xlarge",
                "Instances": [
                    {
                        "AgentIpAddress": "172.16.102.203",
                        "CustomerIpAddress": "10.1.113.28",
                        "InstanceId": "i-07259dd159a1c7130",
                        "InstanceName": "ControllerGroup-1",
                    }
                ],
                "Name": "controller-machine",
            },
            {"InstanceType": "ml.p5.48xlarge", "Instances": workers, "Name": "worker-group-1"},
        ],
    }


@pytest.mark.parametrize("shape", [_labels_as_object, _labels_as_list, _labels_flat])
def test_layers_become_tree_with_ip_names(shape: Any) -> None:
    data = resource_config(shape)
    topo, report = resource_config_topology(data)
    assert report.without_topology == ["i-07259dd159a1c7130"]  # controller: no labels
    assert report.unmapped == []
    assert set(topo.nodes) == {"ip-10-1-38-128", "ip-10-1-29-16", "ip-10-1-30-5"}
    for ip, nn in LAYERS.items():
        name = hyperpod_node_name(ip)
        assert topo.path(name) == nn
        assert topo.nodes[name].private_ip == ip
        assert topo.nodes[name].instance_type == "ml.p5.48xlarge"
    assert topo.depth == 3
    assert topo.hops("ip-10-1-38-128", "ip-10-1-29-16") == 2
    assert topo.hops("ip-10-1-38-128", "ip-10-1-30-5") == 6


def test_records_carry_group_and_type() -> None:
    report = parse_resource_config(resource_config())
    rec = next(r for r in report.records if r.instance_id == "i-0cc2532921ec06341")
    assert rec.group_name == "worker-group-1"
    assert rec.instance_type == "ml.p5.48xlarge"
    assert rec.network_nodes == LAYERS["10.1.38.128"]


def test_node_names_use_customer_ip_not_agent_ip() -> None:
    names = hyperpod_node_names(resource_config())
    assert names["i-07259dd159a1c7130"] == "ip-10-1-113-28"
    assert all(not n.startswith("ip-172-16") for n in names.values())


def test_four_layers_and_ultraserver_label() -> None:
    data = resource_config()
    data["InstanceGroups"][1]["InstanceType"] = "ml.p6e-gb200.36xlarge"
    for i, w in enumerate(data["InstanceGroups"][1]["Instances"]):
        w["InstanceLabel"]["ultraserver-id"] = f"us-{i // 2}"
        if i < 2:  # both instances under nn-c...01 get a 4th layer below it
            w["InstanceLabel"]["network-node-layer-4"] = "nn-d00000000000000001"
    topo, report = resource_config_topology(data)
    assert topo.path("ip-10-1-38-128")[-1] == "nn-d00000000000000001"
    assert topo.nodes["ip-10-1-38-128"].nvlink_domain == "us-0"
    assert topo.domains()["us-0"] == ("ip-10-1-29-16", "ip-10-1-38-128")
    assert "2 ml.p6e-gb200.36xlarge instances have 4 network nodes; the catalog expects 3" in (
        report.warnings
    )


def test_gb200_without_ultraserver_id_is_reported() -> None:
    data = resource_config()
    data["InstanceGroups"][1]["InstanceType"] = "ml.p6e-gb200.36xlarge"
    report = parse_resource_config(data)
    assert len(report.missing_capacity_block) == 3


def test_gap_in_layers_is_without_topology() -> None:
    data = resource_config()
    del data["InstanceGroups"][1]["Instances"][0]["InstanceLabel"]["network-node-layer-2"]
    report = parse_resource_config(data)
    assert "i-0cc2532921ec06341" in report.without_topology
    assert any("not contiguous" in w for w in report.warnings)


def test_missing_ip_leaves_instance_unmapped() -> None:
    data = resource_config()
    del data["InstanceGroups"][1]["Instances"][2]["CustomerIpAddress"]
    topo, report = resource_config_topology(data)
    assert report.unmapped == ["i-0cc2532921ec06343"]
    assert len(topo.nodes) == 2


def test_instance_name_is_the_key_without_instance_id() -> None:
    data = copy.deepcopy(resource_config())
    for w in data["InstanceGroups"][1]["Instances"]:
        del w["InstanceId"]
    topo, report = resource_config_topology(data)
    assert {r.instance_id for r in report.with_topology} == {
        "WorkerGroup-1",
        "WorkerGroup-2",
        "WorkerGroup-3",
    }
    assert len(topo.nodes) == 3


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "no 'InstanceGroups' list"),
        ({"InstanceGroups": [3]}, r"InstanceGroups\[0\]: expected an object"),
        ({"InstanceGroups": [{"Instances": {}}]}, "expected a list"),
        (
            {"InstanceGroups": [{"Instances": [{"CustomerIpAddress": "10.0.0.1"}]}]},
            "neither InstanceId",
        ),
    ],
)
def test_malformed(data: Any, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        parse_resource_config(data)


def test_helpers() -> None:
    assert is_resource_config(resource_config())
    assert not is_resource_config({"Instances": []})
    assert hyperpod_node_name("10.1.2.3") == "ip-10-1-2-3"
    with pytest.raises(TopologyError, match="not an IPv4"):
        hyperpod_node_name("ip-10-1-2-3")
