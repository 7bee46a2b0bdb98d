"""Realistic synthetic EC2 ``DescribeInstanceTopology`` responses, for tests and benchmarks.

Stdlib only (benchmark scripts import it through ``sys.path``). What "realistic" means here,
from the EC2 documentation
(https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/how-ec2-instance-topology-works.html,
https://docs.aws.amazon.com/AWSEC2/latest/APIReference/API_DescribeInstanceTopology.html) and
the EC2 API model:

* ``NetworkNodes`` is top-down; 3 entries for p4d/p4de/p5/p5e/p5en/p6e-gb200, 4 for
  p6-b200/p6-b300 (how-ec2-instance-topology-works.html). Kept here as a small table, not
  imported from the catalog, so this file has no dependency on slurmfm.
* ``nn-`` ids and instance ids are 17 lower-case hex digits (the AWS CLI example and EKS label
  samples such as ``nn-c79422f4e61deb9ca``); ids are hashed per account in reality, so a
  different ``seed`` stands for a different account.
* Leaves hold an uneven number of instances; UltraServer (p6e-gb200) instances come in groups
  of 18 that share a ``CapacityBlockId`` and a leaf. The ``cb-`` prefix of generated
  CapacityBlockIds is an assumption; slurmfm treats the value as opaque.
* Instances are listed in random order, as the API does not group them by topology.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

__all__ = [
    "ULTRASERVER_SIZE",
    "generate_response",
    "network_depth",
    "private_ips",
    "split_pages",
]

ULTRASERVER_SIZE = 18  # instances per u-p6e-gb200x72 UltraServer
# (docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-topology.html)
_FOUR_LEVEL = ("p6-b200.", "p6-b300.")


def network_depth(instance_type: str) -> int:
    """Entries in ``NetworkNodes`` for a supported type: 4 for p6-b200/p6-b300, else 3."""
    return 4 if instance_type.startswith(_FOUR_LEVEL) else 3


def _hex_ids(rng: random.Random, prefix: str, n: int, used: set[str]) -> list[str]:
    out: list[str] = []
    while len(out) < n:
        s = f"{prefix}{rng.getrandbits(68):017x}"
        if s not in used:
            used.add(s)
            out.append(s)
    return out


def _group(rng: random.Random, items: list[str], lo: int, hi: int) -> list[list[str]]:
    groups: list[list[str]] = []
    i = 0
    while i < len(items):
        k = rng.randint(lo, hi)
        groups.append(items[i : i + k])
        i += k
    return groups


def generate_response(
    n_instances: int,
    *,
    instance_type: str = "p5.48xlarge",
    seed: int = 0,
    leaf_size_range: tuple[int, int] = (8, 32),
    spines: int | None = None,
    ultraservers: bool | None = None,
    tops: Sequence[str] | None = None,
    without_topology: int = 0,
    missing_capacity_block: int = 0,
    group_name: str | None = None,
    availability_zone: str = "us-east-1a",
    zone_id: str = "use1-az4",
) -> dict[str, Any]:
    """A ``{"Instances": [...]}`` response for ``n_instances`` running instances.

    ``spines`` is the number of top-layer network nodes (default: one per 2,048 instances);
    ``tops`` reuses given top-layer ids instead (to build mixed-type clusters that share a
    fabric). ``ultraservers`` (default: True for p6e-gb200) emits ``CapacityBlockId`` per 18
    instances and keeps each UltraServer on one leaf; ``missing_capacity_block`` of them lose
    it (as right after launch). ``without_topology`` extra instances have empty
    ``NetworkNodes`` (not running yet / unsupported).
    """
    if n_instances < 0 or without_topology < 0:
        raise ValueError("counts must be >= 0")
    lo, hi = leaf_size_range
    if not 1 <= lo <= hi:
        raise ValueError(f"bad leaf_size_range {leaf_size_range}")
    rng = random.Random(f"{seed}:{instance_type}")
    used: set[str] = set(tops or ())
    depth = network_depth(instance_type)
    ultra = instance_type.startswith("p6e-gb200") if ultraservers is None else ultraservers

    # Leaves, bottom layer: uneven sizes; whole UltraServers per leaf when ultra.
    unit = ULTRASERVER_SIZE if ultra else 1
    sizes: list[int] = []
    placed = 0
    while placed < n_instances:
        k = rng.randint(lo, hi)
        if ultra:
            k = max(1, k // unit) * unit
        sizes.append(min(k, n_instances - placed))
        placed += sizes[-1]
    layer: list[str] = _hex_ids(rng, "nn-", len(sizes), used)
    leaf_ids = list(layer)
    parent: dict[str, str] = {}
    # Middle layers: group 2..6 children per network node.
    for _ in range(depth - 2):
        groups = _group(rng, layer, 2, 6)
        ups = _hex_ids(rng, "nn-", len(groups), used)
        for up, grp in zip(ups, groups, strict=True):
            for child in grp:
                parent[child] = up
        layer = ups
    # Top layer.
    if tops is not None:
        top_ids = list(tops)
        if not top_ids:
            raise ValueError("tops must not be empty")
    else:
        n_tops = spines if spines is not None else max(1, math.ceil(n_instances / 2048))
        top_ids = _hex_ids(rng, "nn-", max(1, min(n_tops, len(layer))), used)
    for i, node in enumerate(layer):
        parent[node] = top_ids[i % len(top_ids)]

    def path(leaf: str) -> list[str]:
        out = [leaf]
        while out[-1] in parent:
            out.append(parent[out[-1]])
        return out[::-1]

    total = n_instances + without_topology
    iids = _hex_ids(rng, "i-", total, used)
    instances: list[dict[str, Any]] = []
    pos = 0
    cb_ids: list[str] = []
    for leaf, size in zip(leaf_ids, sizes, strict=True):
        p = path(leaf)
        for _ in range(size):
            inst: dict[str, Any] = {
                "InstanceId": iids[pos],
                "InstanceType": instance_type,
                "NetworkNodes": list(p),
                "AvailabilityZone": availability_zone,
                "ZoneId": zone_id,
            }
            if group_name is not None:
                inst["GroupName"] = group_name
            if ultra:
                if pos % ULTRASERVER_SIZE == 0:
                    cb_ids.extend(_hex_ids(rng, "cb-", 1, used))
                inst["CapacityBlockId"] = cb_ids[-1]
            instances.append(inst)
            pos += 1
    for i in range(n_instances, total):
        instances.append(
            {
                "InstanceId": iids[i],
                "InstanceType": instance_type,
                "NetworkNodes": [],
                "AvailabilityZone": availability_zone,
                "ZoneId": zone_id,
            }
        )
    if ultra and missing_capacity_block:
        for inst in rng.sample(instances[:n_instances], min(missing_capacity_block, n_instances)):
            inst.pop("CapacityBlockId", None)
    rng.shuffle(instances)
    return {"Instances": instances}


def private_ips(response: dict[str, Any], *, seed: int = 0) -> dict[str, str]:
    """Instance id -> a unique 10.x private IP for every instance of ``response``: what a
    matching ``DescribeInstances`` would report (PrivateIpAddress is not in InstanceTopology)."""
    insts = response["Instances"]
    rng = random.Random(f"ips:{seed}")
    cells = rng.sample(range(2**16 * 247), len(insts))
    ips: dict[str, str] = {}
    for inst, cell in zip(insts, cells, strict=True):
        hi16, low = divmod(cell, 247)  # last octet 4..250: no network/broadcast look-alikes
        ips[inst["InstanceId"]] = f"10.{hi16 >> 8}.{hi16 & 255}.{low + 4}"
    return ips


def split_pages(response: dict[str, Any], page_size: int) -> list[dict[str, Any]]:
    """Cut ``response["Instances"]`` into API pages chained by ``NextToken`` (no extra keys)."""
    insts = response["Instances"]
    pages: list[dict[str, Any]] = []
    for i in range(0, max(len(insts), 1), page_size):
        page: dict[str, Any] = {"Instances": insts[i : i + page_size]}
        if i + page_size < len(insts):
            page["NextToken"] = f"token-{i // page_size + 1}"
        pages.append(page)
    return pages
