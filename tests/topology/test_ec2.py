"""EC2 DescribeInstanceTopology import: live calls (botocore Stubber), parsing, naming, tree.

The Stubber checks every request we send and every canned response against botocore's real EC2
service model, so a wrong parameter name, a MaxResults combined with InstanceIds that the model
forbids by range, or a response field that does not exist fails here, not on a cluster.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber
from ec2gen import generate_response, private_ips, split_pages
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurmfm.topology.ec2 import (
    ImportReport,
    InstanceRecord,
    describe_instance_topology,
    load_mapping_file,
    map_by_private_ip,
    names_from_ips,
    parse_scontrol_nodes,
    parse_topology_json,
    to_topology,
)
from slurmfm.topology.model import ROOT, Topology, TopologyError
from slurmfm.topology.store import dumps_topology, loads_topology


@pytest.fixture
def ec2() -> Any:
    """A real boto3 client with fake credentials: the Stubber intercepts every call."""
    return boto3.client(
        "ec2",
        region_name="us-east-1",
        aws_access_key_id="x",
        aws_secret_access_key="x",  # noqa: S106 - fake, never sent anywhere
    )


def assert_paths_preserved(topo: Topology, resp: dict[str, Any], names: dict[str, str]) -> None:
    """Every placed instance's path is its NetworkNodes, under the synthetic root if any."""
    for inst in resp["Instances"]:
        nn = tuple(inst["NetworkNodes"])
        name = names.get(inst["InstanceId"], inst["InstanceId"])
        if not nn:
            assert name not in topo.nodes
            continue
        path = topo.path(name)
        assert path[-len(nn) :] == nn
        assert path[: -len(nn)] in ((), (ROOT,))


# --------------------------------------------------------------------------- live calls
def test_pages_follow_next_token(ec2: Any) -> None:
    resp = generate_response(250, seed=3)
    pages = split_pages(resp, 100)
    assert len(pages) == 3
    seen: list[int] = []
    with Stubber(ec2) as stub:
        for i, page in enumerate(pages):
            expected: dict[str, Any] = {"MaxResults": 100}
            if i:
                expected["NextToken"] = pages[i - 1]["NextToken"]
            stub.add_response("describe_instance_topology", page, expected)
        got = describe_instance_topology(ec2, progress=seen.append)
        stub.assert_no_pending_responses()
    assert got == resp["Instances"]
    assert seen == [100, 200, 250]


def test_instance_ids_are_chunked_by_100_without_max_results(ec2: Any) -> None:
    resp = generate_response(250, seed=4)
    ids = [i["InstanceId"] for i in resp["Instances"]]
    with Stubber(ec2) as stub:
        for lo in range(0, 250, 100):
            chunk = ids[lo : lo + 100]
            stub.add_response(
                "describe_instance_topology",
                {"Instances": resp["Instances"][lo : lo + 100]},
                {"InstanceIds": chunk},
            )
        # duplicates in the input are sent once
        got = describe_instance_topology(ec2, instance_ids=ids + ids[:5])
        stub.assert_no_pending_responses()
    assert [i["InstanceId"] for i in got] == ids


def test_instance_ids_chunk_may_still_page(ec2: Any) -> None:
    resp = generate_response(30, seed=5)
    ids = [i["InstanceId"] for i in resp["Instances"]]
    pages = split_pages(resp, 20)
    with Stubber(ec2) as stub:
        stub.add_response("describe_instance_topology", pages[0], {"InstanceIds": ids})
        stub.add_response(
            "describe_instance_topology",
            pages[1],
            {"InstanceIds": ids, "NextToken": pages[0]["NextToken"]},
        )
        got = describe_instance_topology(ec2, instance_ids=ids)
        stub.assert_no_pending_responses()
    assert len(got) == 30


def test_instance_type_filter(ec2: Any) -> None:
    resp = generate_response(10, seed=6)
    filters = [{"Name": "instance-type", "Values": ["p5.48xlarge", "p5e*"]}]
    with Stubber(ec2) as stub:
        stub.add_response(
            "describe_instance_topology", resp, {"MaxResults": 100, "Filters": filters}
        )
        got = describe_instance_topology(ec2, instance_types=["p5.48xlarge", "p5e*"])
        stub.assert_no_pending_responses()
    assert len(got) == 10


def test_ids_and_type_filter_together(ec2: Any) -> None:
    resp = generate_response(3, seed=7)
    ids = [i["InstanceId"] for i in resp["Instances"]]
    filters = [{"Name": "instance-type", "Values": ["p5*"]}]
    with Stubber(ec2) as stub:
        stub.add_response(
            "describe_instance_topology", resp, {"InstanceIds": ids, "Filters": filters}
        )
        describe_instance_topology(ec2, instance_ids=ids, instance_types=["p5*"])
        stub.assert_no_pending_responses()


def test_empty_id_list_makes_no_call(ec2: Any) -> None:
    with Stubber(ec2) as stub:
        assert describe_instance_topology(ec2, instance_ids=[]) == []
        stub.assert_no_pending_responses()


def test_empty_type_list_is_an_error(ec2: Any) -> None:
    with pytest.raises(TopologyError, match="instance_types is empty"):
        describe_instance_topology(ec2, instance_types=[])


def test_repeated_next_token_stops(ec2: Any) -> None:
    with Stubber(ec2) as stub:
        for _ in range(3):
            stub.add_response("describe_instance_topology", {"Instances": [], "NextToken": "same"})
        with pytest.raises(TopologyError, match="same NextToken"):
            describe_instance_topology(ec2)


def test_map_by_private_ip_uses_instance_id_filter(ec2: Any) -> None:
    resp = generate_response(150, seed=8)
    ips = private_ips(resp)
    ids = [i["InstanceId"] for i in resp["Instances"]]

    def reservations(chunk: list[str]) -> dict[str, Any]:
        return {
            "Reservations": [
                {"Instances": [{"InstanceId": i, "PrivateIpAddress": ips[i]} for i in chunk]}
            ]
        }

    with Stubber(ec2) as stub:
        stub.add_response(
            "describe_instances",
            {**reservations(ids[:60]), "NextToken": "t1"},
            {"Filters": [{"Name": "instance-id", "Values": ids[:100]}], "MaxResults": 1000},
        )
        stub.add_response(
            "describe_instances",
            reservations(ids[60:100]),
            {
                "Filters": [{"Name": "instance-id", "Values": ids[:100]}],
                "MaxResults": 1000,
                "NextToken": "t1",
            },
        )
        # the last chunk: one instance is gone (terminated) -> simply absent
        stub.add_response(
            "describe_instances",
            reservations(ids[100:149]),
            {"Filters": [{"Name": "instance-id", "Values": ids[100:]}], "MaxResults": 1000},
        )
        got = map_by_private_ip(ec2, ids)
        stub.assert_no_pending_responses()
    assert got == {i: ips[i] for i in ids[:149]}

    # join with scontrol: ip -> node, then build the tree with Slurm names
    nodes = {ip: f"gpu-st-p5-{n}" for n, ip in enumerate(sorted(got.values()), 1)}
    text = "\n".join(
        f"NodeName={name} Arch=x86_64 NodeAddr={ip} State=IDLE" for ip, name in nodes.items()
    )
    names = names_from_ips(got, parse_scontrol_nodes(text))
    report = parse_topology_json(resp)
    topo = to_topology(report, names, private_ips=got)
    assert report.unmapped == [ids[149]]
    assert len(topo.nodes) == 149
    node = topo.nodes[names[ids[0]]]
    assert node.instance_id == ids[0]
    assert node.private_ip == ips[ids[0]]
    assert_paths_preserved(
        topo, {"Instances": [i for i in resp["Instances"] if i["InstanceId"] in names]}, names
    )


# --------------------------------------------------------------------------- parsing/building
def test_p5_three_levels() -> None:
    resp = generate_response(200, instance_type="p5.48xlarge", seed=1, spines=1)
    report = parse_topology_json(resp)
    assert report.warnings == []
    topo = to_topology(report, None)
    assert topo.depth == 3
    assert len(topo.nodes) == 200
    assert all(len(topo.path(n)) == 3 for n in topo.nodes)
    assert_paths_preserved(topo, resp, {})
    # switch names are the nn- ids, recorded as their own source ids
    assert set(topo.source_ids) == set(topo.parent_of)
    assert all(k == v and k.startswith("nn-") for k, v in topo.source_ids.items())
    leaf_sizes = Counter(topo.leaf_of.values())
    assert len(set(leaf_sizes.values())) > 1  # uneven leaves


def test_p6_b200_four_levels() -> None:
    resp = generate_response(300, instance_type="p6-b200.48xlarge", seed=2, spines=1)
    report = parse_topology_json(resp)
    assert report.warnings == []
    topo = to_topology(report, None)
    assert topo.depth == 4
    assert_paths_preserved(topo, resp, {})


def test_several_top_nodes_get_common_root() -> None:
    resp = generate_response(300, seed=9, spines=3)
    topo = to_topology(parse_topology_json(resp), None)
    assert topo.root == ROOT
    assert topo.depth == 4
    assert_paths_preserved(topo, resp, {})


def test_mixed_depths_share_one_tree() -> None:
    p5 = generate_response(
        200, instance_type="p5.48xlarge", seed=1, spines=2, leaf_size_range=(8, 16)
    )
    tops = sorted({i["NetworkNodes"][0] for i in p5["Instances"]})
    assert len(tops) == 2
    b200 = generate_response(64, instance_type="p6-b200.48xlarge", seed=1, tops=tops)
    resp = {"Instances": p5["Instances"] + b200["Instances"]}
    report = parse_topology_json(resp)
    assert report.warnings == []
    topo = to_topology(report, None)
    assert topo.root == ROOT  # two shared tops -> one synthetic root
    assert_paths_preserved(topo, resp, {})
    levels = {len(topo.path(n)) for n in topo.nodes}
    assert levels == {4, 5}  # leaves at different levels under one root
    a = p5["Instances"][0]["InstanceId"]
    b = next(
        i["InstanceId"]
        for i in b200["Instances"]
        if i["NetworkNodes"][0] == p5["Instances"][0]["NetworkNodes"][0]
    )
    assert topo.lca(a, b) == p5["Instances"][0]["NetworkNodes"][0]


def test_gb200_ultraservers_become_nvlink_domains() -> None:
    resp = generate_response(72, instance_type="p6e-gb200.36xlarge", seed=4)
    report = parse_topology_json(resp)
    assert report.missing_capacity_block == []
    topo = to_topology(report, None)
    assert topo.depth == 3
    domains = topo.domains()
    assert len(domains) == 4
    assert all(len(members) == 18 for members in domains.values())
    for inst in resp["Instances"]:
        assert topo.nodes[inst["InstanceId"]].nvlink_domain == inst["CapacityBlockId"]
    # each UltraServer sits on one leaf
    for members in domains.values():
        assert len({topo.leaf(m) for m in members}) == 1


def test_missing_capacity_block_is_reported() -> None:
    resp = generate_response(
        36, instance_type="p6e-gb200.36xlarge", seed=5, missing_capacity_block=3
    )
    report = parse_topology_json(resp)
    missing = sorted(i["InstanceId"] for i in resp["Instances"] if "CapacityBlockId" not in i)
    assert sorted(report.missing_capacity_block) == missing
    assert any("retry later" in w for w in report.warnings)
    topo = to_topology(report, None)
    assert len(topo.nodes) == 36  # still placed in the tree
    for iid in missing:
        assert topo.nvlink_domain(iid) == iid  # its own domain until EC2 catches up


def test_instances_without_topology_are_reported_not_dropped() -> None:
    resp = generate_response(20, seed=6, without_topology=2)
    resp["Instances"][0]["NetworkNodes"] = None  # the API may return null too
    report = parse_topology_json(resp)
    empty = sorted(i["InstanceId"] for i in resp["Instances"] if not i["NetworkNodes"])
    assert sorted(report.without_topology) == empty
    assert len(report.records) == 22
    assert any("no NetworkNodes" in w for w in report.warnings)
    topo = to_topology(report, None)
    assert len(topo.nodes) == 22 - len(empty)


def test_unmapped_instances_are_reported_and_left_out() -> None:
    resp = generate_response(10, seed=7)
    ids = [i["InstanceId"] for i in resp["Instances"]]
    names = {iid: f"node{n:03d}" for n, iid in enumerate(ids[:8], 1)}
    report = parse_topology_json(resp)
    topo = to_topology(report, names)
    assert sorted(report.unmapped) == sorted(ids[8:])
    assert set(topo.nodes) == set(names.values())
    to_topology(report, names)
    assert len(report.unmapped) == 2  # not appended twice


def test_two_instances_one_node_name_is_an_error() -> None:
    resp = generate_response(2, seed=8)
    ids = [i["InstanceId"] for i in resp["Instances"]]
    with pytest.raises(TopologyError, match="two instances"):
        to_topology(parse_topology_json(resp), dict.fromkeys(ids, "node1"))


def test_nothing_placeable_is_an_error() -> None:
    resp = generate_response(0, without_topology=3)
    with pytest.raises(TopologyError, match="no instance can be placed"):
        to_topology(parse_topology_json(resp), None)


def test_depth_mismatch_and_foreign_capacity_block_are_warnings() -> None:
    resp = generate_response(3, seed=9)
    resp["Instances"][0]["NetworkNodes"].append("nn-00000000000000001")
    resp["Instances"][1]["CapacityBlockId"] = "cr-0123456789abcdef0"
    report = parse_topology_json(resp)
    assert any("4 network nodes; the catalog expects 3" in w for w in report.warnings)
    assert any("not an UltraServer type" in w for w in report.warnings)
    assert all(r.capacity_block_id is None for r in report.records)


def test_list_input_and_record_fields() -> None:
    inst = {
        "InstanceId": "i-0123456789abcdef0",
        "InstanceType": "p5.48xlarge",
        "GroupName": "ml-cpg",
        "NetworkNodes": ["nn-1", "nn-2", "nn-3"],
        "AvailabilityZone": "us-west-2a",
        "ZoneId": "usw2-az2",
    }
    report = parse_topology_json([inst])
    assert report.records == [
        InstanceRecord(
            instance_id="i-0123456789abcdef0",
            instance_type="p5.48xlarge",
            network_nodes=("nn-1", "nn-2", "nn-3"),
            capacity_block_id=None,
            availability_zone="us-west-2a",
            zone_id="usw2-az2",
            group_name="ml-cpg",
        )
    ]


def test_duplicates_keep_first_with_warning() -> None:
    inst = {"InstanceId": "i-0123456789abcdef0", "NetworkNodes": ["a", "b", "c"]}
    report = parse_topology_json([inst, inst])
    assert len(report.records) == 1
    assert report.warnings == ["i-0123456789abcdef0 listed twice"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({}, "no 'Instances' list"),
        ("x", "expected an object or a list"),
        ({"Instances": [1]}, r"Instances\[0\]: expected an object"),
        ({"Instances": [{"NetworkNodes": []}]}, "missing InstanceId"),
        ({"Instances": [{"InstanceId": "i-1", "NetworkNodes": "nn-1"}]}, "must be a list"),
        ({"Instances": [{"InstanceId": "i-1", "NetworkNodes": ["", "x"]}]}, "non-empty strings"),
        (
            {"Instances": [{"InstanceId": "i-1", "InstanceType": 5}]},
            "InstanceType must be a string",
        ),
    ],
)
def test_malformed_input(data: Any, message: str) -> None:
    with pytest.raises(TopologyError, match=message):
        parse_topology_json(data)


def test_network_node_at_two_levels_is_not_a_tree() -> None:
    data = {
        "Instances": [
            {"InstanceId": "i-1", "NetworkNodes": ["a", "b", "c"]},
            {"InstanceId": "i-2", "NetworkNodes": ["x", "a", "d"]},
        ]
    }
    with pytest.raises(TopologyError, match="two parents"):
        to_topology(parse_topology_json(data), None)


def test_saved_cli_output_matches_aws_docs_example(tmp_path: Path) -> None:
    # Shape of the `aws ec2 describe-instance-topology` example in the AWS CLI reference.
    text = json.dumps(
        {
            "Instances": [
                {
                    "InstanceId": "i-1111111111example",
                    "InstanceType": "p4d.24xlarge",
                    "GroupName": "my-ml-cpg",
                    "NetworkNodes": [
                        "nn-1111111111example",
                        "nn-2222222222example",
                        "nn-3333333333example",
                    ],
                    "ZoneId": "usw2-az2",
                    "AvailabilityZone": "us-west-2a",
                }
            ],
            "NextToken": "SomeEncryptedToken",
        }
    )
    report = parse_topology_json(json.loads(text))
    topo = to_topology(report, None)
    assert topo.path("i-1111111111example") == (
        "nn-1111111111example",
        "nn-2222222222example",
        "nn-3333333333example",
    )


# --------------------------------------------------------------------------- Slurm node names
# A real `scontrol show nodes -o` line from Slurm 22.05.8 (the repo's slurm-lab), address edited.
SCONTROL_O = (
    "NodeName=node001 Arch=x86_64 CoresPerSocket=8  CPUAlloc=0 CPUEfctv=16 CPUTot=16 "
    "CPULoad=1.68 AvailableFeatures=leaf3,spine2,lab ActiveFeatures=leaf3,spine2,lab Gres=gpu:8 "
    "NodeAddr=10.1.2.3 NodeHostName=vm Port=17001 Version=22.05.8 OS=Linux 6.18.44-fc-v657 #1 SMP "
    "PREEMPT_DYNAMIC @0  RealMemory=64000 AllocMem=0 State=IDLE Reason=not responding [slurm@x]\n"
    "NodeName=node002 Arch=x86_64 NodeAddr=10.1.2.4 NodeHostName=vm State=IDLE\n"
)


def test_scontrol_one_line_per_node() -> None:
    assert parse_scontrol_nodes(SCONTROL_O) == {"10.1.2.3": "node001", "10.1.2.4": "node002"}


def test_scontrol_multi_line_records() -> None:
    text = (
        "NodeName=ip-10-1-2-3 Arch=x86_64 CoresPerSocket=48\n"
        "   CPUAlloc=0 CPUTot=192\n"
        "   NodeAddr=10.1.2.3 NodeHostName=ip-10-1-2-3 Version=24.11.6\n"
        "   OS=Linux 6.8.0-1021-aws #23-Ubuntu SMP\n\n"
        "NodeName=ip-10-1-2-4 Arch=x86_64\n"
        "   NodeAddr=10.1.2.4 NodeHostName=ip-10-1-2-4\n"
    )
    assert parse_scontrol_nodes(text) == {"10.1.2.3": "ip-10-1-2-3", "10.1.2.4": "ip-10-1-2-4"}


def test_scontrol_json() -> None:
    # fields as printed by `scontrol show nodes --json` on Slurm 24.11 (slurm-lab trixie)
    text = json.dumps(
        {
            "nodes": [
                {"name": "node001", "address": "10.0.0.1", "hostname": "vm", "cores": 8},
                {"name": "node002", "address": "10.0.0.2", "hostname": "vm"},
            ],
            "meta": {},
            "errors": [],
            "warnings": [],
        },
        indent=2,
    )
    assert parse_scontrol_nodes(text) == {"10.0.0.1": "node001", "10.0.0.2": "node002"}


def test_scontrol_shared_address_is_ambiguous() -> None:
    text = "NodeName=a NodeAddr=127.0.0.1\nNodeName=b NodeAddr=127.0.0.1\nNodeName=c NodeAddr=10.0.0.9\n"
    assert parse_scontrol_nodes(text) == {"10.0.0.9": "c"}


def test_scontrol_errors() -> None:
    assert parse_scontrol_nodes("  \n") == {}
    with pytest.raises(TopologyError, match="no 'NodeName='"):
        parse_scontrol_nodes("No nodes in the system\n")
    with pytest.raises(TopologyError, match="line 1"):
        parse_scontrol_nodes("{oops")
    with pytest.raises(TopologyError, match="no 'nodes' list"):
        parse_scontrol_nodes('{"jobs": []}')


# --------------------------------------------------------------------------- mapping files
def test_mapping_file_text_and_json(tmp_path: Path) -> None:
    txt = tmp_path / "map.txt"
    txt.write_text(
        "# instance  node\n"
        "i-0123456789abcdef0 gpu-st-p5-1\n"
        "\n"
        "i-0123456789abcdef1   gpu-st-p5-2   # trailing comment\n"
    )
    assert load_mapping_file(txt) == {
        "i-0123456789abcdef0": "gpu-st-p5-1",
        "i-0123456789abcdef1": "gpu-st-p5-2",
    }
    js = tmp_path / "map.json"
    js.write_text(json.dumps({"i-0123456789abcdef0": "gpu-st-p5-1"}))
    assert load_mapping_file(js) == {"i-0123456789abcdef0": "gpu-st-p5-1"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (
            "i-0123456789abcdef0 a\ni-0123456789abcdef1\n",
            r"map\.txt:2: expected 'INSTANCE_ID NODENAME', got 1 columns",
        ),
        ("i-0123456789abcdef0 a b\n", r"map\.txt:1: expected"),
        ("\n\nnode1 i-0123456789abcdef0\n", r"map\.txt:3: 'node1' is not an EC2 instance id"),
        ("i-0123456789abcdef0 a\ni-0123456789abcdef1 a\n", r"map\.txt:2: node 'a' already mapped"),
        (
            "i-0123456789abcdef0 a\ni-0123456789abcdef0 b\n",
            r"map\.txt:2: i-0123456789abcdef0 mapped twice",
        ),
        ('{\n "i-0123456789abcdef0": "a",\n}\n', r"map\.txt:3: invalid JSON"),
        ('{"i-0123456789abcdef0": 3}', "node name must be a string"),
    ],
)
def test_mapping_file_errors(tmp_path: Path, content: str, message: str) -> None:
    p = tmp_path / "map.txt"
    p.write_text(content)
    with pytest.raises(TopologyError, match=message):
        load_mapping_file(p)


def test_mapping_file_missing(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="cannot read mapping file"):
        load_mapping_file(tmp_path / "nope.txt")


# --------------------------------------------------------------------------- properties
INSTANCE_TYPES = ["p5.48xlarge", "p5en.48xlarge", "p6-b200.48xlarge", "p6e-gb200.36xlarge"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(min_value=1, max_value=400),
    itype=st.sampled_from(INSTANCE_TYPES),
    seed=st.integers(min_value=0, max_value=10_000),
    lo=st.integers(min_value=1, max_value=20),
    span=st.integers(min_value=0, max_value=30),
    spines=st.none() | st.integers(min_value=1, max_value=5),
    pending=st.integers(min_value=0, max_value=3),
)
def test_import_preserves_paths_and_store_round_trips(
    n: int, itype: str, seed: int, lo: int, span: int, spines: int | None, pending: int
) -> None:
    resp = generate_response(
        n,
        instance_type=itype,
        seed=seed,
        leaf_size_range=(lo, lo + span),
        spines=spines,
        without_topology=pending,
    )
    report = parse_topology_json(resp)
    assert isinstance(report, ImportReport)
    assert len(report.without_topology) == pending
    topo = to_topology(report, None)
    assert len(topo.nodes) == n
    assert_paths_preserved(topo, resp, {})
    for inst in resp["Instances"]:
        if inst["NetworkNodes"]:
            assert topo.nodes[inst["InstanceId"]].nvlink_domain == inst.get("CapacityBlockId")
    back = loads_topology(dumps_topology(topo))
    assert back == topo
    assert dict(back.source_ids) == dict(topo.source_ids)
    assert dumps_topology(back) == dumps_topology(topo)


def test_client_from_env_builds_an_ec2_client() -> None:
    from slurmfm.topology.ec2 import client_from_env

    client = client_from_env("eu-west-1")
    assert client.meta.region_name == "eu-west-1"
    assert client.meta.service_model.service_name == "ec2"
