"""slurmfm topology files (save/load, versioning) and load_any's format detection."""

from __future__ import annotations

import json
import logging
import os
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from ec2gen import generate_response

from slurmfm.topology.ec2 import parse_topology_json, to_topology
from slurmfm.topology.model import ROOT, Node, Topology, TopologyError
from slurmfm.topology.store import (
    FORMAT_VERSION,
    detect_format,
    dumps_topology,
    load_any,
    loads_topology,
    save_topology,
)


def small() -> Topology:
    nodes = [
        Node("n1", instance_id="i-01", instance_type="p5.48xlarge", private_ip="10.0.0.1"),
        Node("n2", state="allocated"),
        Node("n3", nvlink_domain="cb-1", state="drain"),
        Node("n4", nvlink_domain="cb-1"),
    ]
    t = Topology.from_paths(
        {"n1": ("s", "l1"), "n2": ("s", "l1"), "n3": ("s", "l2"), "n4": ("t", "l3")}, nodes
    )
    return Topology.from_parents(
        t.nodes.values(),
        t.leaf_of,
        t.parent_of,
        source_ids={"s": "nn-s", "l1": "nn-l1"},
        add_root=False,
    )


# --------------------------------------------------------------------------- own format
def test_round_trip_keeps_everything() -> None:
    t = small()
    assert t.root == ROOT
    text = dumps_topology(t)
    back = loads_topology(text)
    assert back == t
    assert dict(back.nodes) == dict(t.nodes)
    assert dict(back.source_ids) == {"s": "nn-s", "l1": "nn-l1"}
    assert back.kind == "tree"
    assert dumps_topology(back) == text


def test_file_shape() -> None:
    obj = json.loads(dumps_topology(small()))
    assert obj["format"] == "slurmfm-topology"
    assert obj["version"] == FORMAT_VERSION
    assert obj["kind"] == "tree"
    assert obj["switches"][ROOT] is None
    assert obj["switches"]["l1"] == "s"
    assert obj["leaf_of"]["n1"] == "l1"
    # defaults (None fields, state idle) are omitted
    assert obj["nodes"][1] == {"name": "n2", "state": "allocated"}
    assert obj["nodes"][3] == {"name": "n4", "nvlink_domain": "cb-1"}


def test_block_kind_round_trips() -> None:
    t = Topology.from_paths({"a": ("b1",), "b": ("b2",)}, kind="block")
    back = loads_topology(dumps_topology(t))
    assert back.kind == "block"
    assert back == t


def test_save_is_atomic_and_readable(tmp_path: Path) -> None:
    p = tmp_path / "topo.json"
    p.write_text("old")
    save_topology(small(), p)
    assert loads_topology(p.read_text()) == small()
    assert sorted(os.listdir(tmp_path)) == ["topo.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~umask


def test_failed_save_leaves_old_file_and_no_temp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = tmp_path / "topo.json"
    p.write_text("old")

    def boom(*_: Any) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        save_topology(small(), p)
    assert p.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == ["topo.json"]


def _doc(**changes: Any) -> str:
    obj = json.loads(dumps_topology(small()))
    obj.update(changes)
    return json.dumps(obj)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{\n\n  nope", r"t\.json:3: invalid JSON"),
        ("[]", "not a slurmfm topology file"),
        ('{"format": "other"}', "not a slurmfm topology file"),
        (_doc(version=2), "written by a newer slurmfm .*version 2"),
        (_doc(version="1"), "'version' must be an integer"),
        (_doc(version=0), "invalid version 0"),
        (_doc(kind="ring"), "kind must be 'tree' or 'block'"),
        (_doc(nodes={}), "'nodes' must be a list"),
        (_doc(nodes=[{"nam": "x"}]), r"nodes\[0\] must be an object with a 'name'"),
        (_doc(nodes=[{"name": "x", "gpus": 8}]), r"unknown keys \['gpus'\]"),
        (_doc(nodes=[{"name": "x", "state": 1}]), r"nodes\[0\]\.state must be a string"),
        (_doc(leaf_of=[]), "'leaf_of' must be an object"),
        (_doc(switches={"a": 3}), r"switches\['a'\] must be a string"),
        (_doc(source_ids={"zz": "nn-1"}), "source_ids names unknown switches"),
        (_doc(leaf_of={"n1": "l1"}), "nodes without a switch"),
    ],
)
def test_load_errors_name_the_file(text: str, message: str) -> None:
    with pytest.raises(TopologyError, match=message) as exc:
        loads_topology(text, source="t.json")
    assert str(exc.value).startswith("t.json")


def test_duplicate_node_is_an_error() -> None:
    obj = json.loads(dumps_topology(small()))
    obj["nodes"].append({"name": "n1"})
    with pytest.raises(TopologyError, match="listed twice"):
        loads_topology(json.dumps(obj))


# --------------------------------------------------------------------------- load_any
def test_load_any_slurmfm(tmp_path: Path) -> None:
    p = tmp_path / "t.json"
    save_topology(small(), p)
    assert load_any(p) == small()
    assert load_any(str(p), fmt="slurmfm") == small()


def test_load_any_ec2_dict_and_list(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    resp = generate_response(40, seed=2, without_topology=1)
    want = to_topology(parse_topology_json(resp), None)
    p = tmp_path / "ec2.json"
    p.write_text(json.dumps(resp))
    with caplog.at_level(logging.WARNING, logger="slurmfm.topology.store"):
        assert load_any(p) == want
    assert "no NetworkNodes" in caplog.text
    p.write_text(json.dumps(resp["Instances"]))
    assert load_any(p, fmt="ec2") == want


def test_load_any_ec2_with_names(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    resp = generate_response(5, seed=3)
    ids = [i["InstanceId"] for i in resp["Instances"]]
    p = tmp_path / "ec2.json"
    p.write_text(json.dumps(resp))
    with caplog.at_level(logging.WARNING, logger="slurmfm.topology.store"):
        t = load_any(p, names={iid: f"node{n}" for n, iid in enumerate(ids[:4])})
    assert set(t.nodes) == {"node0", "node1", "node2", "node3"}
    assert "1 instances have no Slurm node name" in caplog.text


def test_load_any_hyperpod(tmp_path: Path) -> None:
    doc = {
        "InstanceGroups": [
            {
                "Name": "workers",
                "InstanceType": "ml.p5.48xlarge",
                "Instances": [
                    {
                        "InstanceId": f"i-0000000000000000{n}",
                        "CustomerIpAddress": f"10.1.0.{n}",
                        "InstanceLabel": {
                            "network-node-layer-1": "nn-a",
                            "network-node-layer-2": "nn-b",
                            "network-node-layer-3": f"nn-c{n % 2}",
                        },
                    }
                    for n in range(1, 5)
                ],
            }
        ]
    }
    p = tmp_path / "resource_config.json"
    p.write_text(json.dumps(doc))
    t = load_any(p)
    assert sorted(t.nodes) == ["ip-10-1-0-1", "ip-10-1-0-2", "ip-10-1-0-3", "ip-10-1-0-4"]
    assert t.leaf("ip-10-1-0-1") == "nn-c1"


@pytest.mark.parametrize(
    ("content", "fmt", "message"),
    [
        ("hello\n", None, "unknown topology format"),
        ('{"Foo": 1}', None, "unknown topology format"),
        ("{}", "nope", "unknown format 'nope'"),
        ('{"Instances": [{"InstanceId": "i-1", "NetworkNodes": 3}]}', None, "must be a list"),
        ('{"Instances": [{"InstanceId": "i-1"}]}', None, "no instance can be placed"),
        ("{\n oops", "ec2", r"x\.json:2: invalid JSON"),
        ('["a"]', "hyperpod", "not a HyperPod resource_config.json"),
    ],
)
def test_load_any_errors(tmp_path: Path, content: str, fmt: str | None, message: str) -> None:
    p = tmp_path / "x.json"
    p.write_text(content)
    with pytest.raises(TopologyError, match=message) as exc:
        load_any(p, fmt=fmt)
    assert str(exc.value).startswith(str(p))


def test_load_any_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read"):
        load_any(tmp_path / "nope.json")


# --------------------------------------------------------------------------- Slurm formats
CONF = """\
# comment
SwitchName=leaf1 Nodes=node[001-002]
SwitchName=leaf2 Nodes=node[003-004]
SwitchName=spine Switches=leaf[1-2]
"""
# `scontrol show topology` as printed by Slurm 22.05.8 on the repo's slurm-lab.
SCONTROL = """\
SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=node[001-002]
SwitchName=leaf2 Level=0 LinkSpeed=1 Nodes=node[003-004]
SwitchName=spine Level=1 LinkSpeed=1 Nodes=node[001-004] Switches=leaf[1-2]
"""
YAML = """\
---
- topology: gpu
  cluster_default: true
  tree:
    switches:
      - switch: spine
        children: leaf[1-2]
      - switch: leaf1
        nodes: node[001-002]
      - switch: leaf2
        nodes: node[003-004]
- topology: cpu
  cluster_default: false
  tree:
    switches:
      - switch: s0
        nodes: cpu[1-2]
"""


def test_detect_format() -> None:
    assert detect_format(CONF) == "conf"
    assert detect_format(SCONTROL) == "scontrol"
    assert detect_format(YAML) == "yaml"
    assert detect_format("BlockName=b1 Nodes=n[1-18]\nBlockSizes=18\n") == "conf"
    assert detect_format("BlockName=b1 BlockIndex=0 Nodes=n[1-18] BlockSize=18\n") == "scontrol"
    assert detect_format(dumps_topology(small())) == "slurmfm"
    assert detect_format('{"Instances": []}') == "ec2"
    assert detect_format('[{"InstanceId": "i-1"}]') == "ec2"
    assert detect_format('{"InstanceGroups": []}') == "hyperpod"
    assert detect_format("# empty\n", "x.yaml") == "yaml"
    assert detect_format("# empty\n", "topology.conf") == "conf"


def _shape() -> Topology:
    return Topology.from_paths(
        {
            "node001": ("spine", "leaf1"),
            "node002": ("spine", "leaf1"),
            "node003": ("spine", "leaf2"),
            "node004": ("spine", "leaf2"),
        }
    )


def test_slurm_parsers_are_dispatched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dispatch, ``source=`` passing and yaml selection, with stand-in parsers."""
    calls: list[tuple[str, dict[str, Any]]] = []
    fakes = {
        m: types.ModuleType(m)
        for m in (
            "slurmfm.topology.topology_conf",
            "slurmfm.topology.scontrol",
            "slurmfm.topology.topology_yaml",
        )
    }

    def conf(text: str, *, source: str = "?") -> Topology:
        calls.append(("conf", {"source": source}))
        return _shape()

    def scontrol(text: str) -> Topology:
        calls.append(("scontrol", {}))
        return _shape()

    from slurmfm.topology.topology_yaml import TopologyYaml

    def yaml(text: str, *, source: str = "?") -> TopologyYaml:
        calls.append(("yaml", {"source": source}))
        topos = {"gpu": _shape(), "cpu": Topology.from_paths({"c": ("s",)})}
        return TopologyYaml(topos, {}, {}, dict.fromkeys(topos, "tree"), tuple(topos))

    fakes["slurmfm.topology.topology_conf"].parse_topology_conf = conf  # type: ignore[attr-defined]
    fakes["slurmfm.topology.scontrol"].parse_scontrol_topology = scontrol  # type: ignore[attr-defined]
    fakes["slurmfm.topology.topology_yaml"].read_topology_yaml = yaml  # type: ignore[attr-defined]
    for name, mod in fakes.items():
        monkeypatch.setitem(sys.modules, name, mod)
    for name, text in (("t.conf", CONF), ("s.txt", SCONTROL), ("t.yaml", YAML)):
        (tmp_path / name).write_text(text)
    assert load_any(tmp_path / "t.conf") == _shape()
    assert load_any(tmp_path / "s.txt") == _shape()
    assert load_any(tmp_path / "t.yaml", partition="gpu") == _shape()
    with pytest.raises(TopologyError, match=r"2 topologies \(cpu, gpu\); choose one"):
        load_any(tmp_path / "t.yaml")
    with pytest.raises(TopologyError, match="no topology 'x'"):
        load_any(tmp_path / "t.yaml", partition="x")
    assert calls[0] == ("conf", {"source": str(tmp_path / "t.conf")})
    assert calls[1] == ("scontrol", {})


def test_slurm_formats_real(tmp_path: Path) -> None:
    """Against the real parsers and exporters."""
    from slurmfm.topology import topology_conf as sf

    for name, text in (("t.conf", CONF), ("s.txt", SCONTROL)):
        (tmp_path / name).write_text(text)
        assert load_any(tmp_path / name).shape() == _shape().shape()
    (tmp_path / "t.yaml").write_text(YAML)
    assert load_any(tmp_path / "t.yaml", partition="gpu").shape() == _shape().shape()
    # an EC2 import exported as topology.conf and read back keeps the tree
    resp = generate_response(100, seed=11, spines=2)
    t = to_topology(parse_topology_json(resp), None)
    (tmp_path / "ec2.conf").write_text(sf.export_tree(t, "24.11"))
    assert load_any(tmp_path / "ec2.conf").shape() == t.shape()


def test_slurm_parser_errors_name_the_file(tmp_path: Path) -> None:
    p = tmp_path / "topology.conf"
    p.write_text("SwitchName=a Nodes=n1\nSwitchName=a Nodes=n2\n")
    with pytest.raises(TopologyError) as exc:
        load_any(p)
    assert str(exc.value).startswith(str(p))
