"""The referee's physical fabric: every port and uplink at its own capacity, for all jobs.

Why not the planner simulator's rule: :mod:`slurmfm.plan.simulate` gives a job the *fair share*
of each switch's uplinks (its own nodes under the switch times the NIC over the
oversubscription), so a job is never hurt by where other jobs sit. Here a switch's uplink has
its physical capacity, shared by every job whose traffic crosses it: ``all nodes under the
switch * NIC / oversubscription`` (a fat tree's taper, Leiserson 1985; AWS does not publish
EFA's ratios, so the referee takes them as a parameter the planner never sees).

Links are split-duplex (one per direction): ``nic:up:<node>``, ``nic:dn:<node>``,
``sw:up:<switch>``, ``sw:dn:<switch>``; nodes of one multi-node NVLink domain (a GB200
UltraServer, 18 instances of 4 GPUs: docs.aws.amazon.com/sagemaker/latest/dg/
sagemaker-hyperpod-topology.html) talk over ``nvl:up/dn:<node>`` instead of EFA.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from slurmfm.topology.model import Topology

__all__ = ["FabricParams", "PhysicalFabric"]

# p5/p5e/p5en and p6e-gb200: 3,200 Gbit/s of EFA per instance (EC2 DescribeInstanceTypes, as
# generated into aws/karpenter-provider-aws:pkg/providers/instancetype/zz_generated.bandwidth.go).
EFA_BYTES_PER_S = 3200e9 / 8
# NVLink 5 (GB200): 1.8 TB/s bidirectional per GPU (https://www.nvidia.com/en-us/data-center/nvlink/),
# 900 GB/s each way.
NVLINK_BYTES_PER_S_PER_GPU = 900e9


@dataclass(frozen=True)
class FabricParams:
    """What the referee assumes about the fabric (none of it reaches the planner).

    ``oversubscription`` per tier of the switch whose uplink it is: ``leaf`` (level 0),
    ``spine`` (level 1), ``core`` (2 and above). Latencies: placeholders of the usual EFA
    magnitude (the cost model's are the planner's own; these are separate on purpose).
    """

    oversubscription: Mapping[str, float] = field(
        default_factory=lambda: {"leaf": 1.0, "spine": 1.0, "core": 1.0}
    )
    nic_bytes_per_s: float = EFA_BYTES_PER_S
    nvlink_bytes_per_s_per_gpu: float = NVLINK_BYTES_PER_S_PER_GPU
    gpus_per_node: int = 8
    nic_latency_s: float = 6e-6
    hop_latency_s: float = 1.5e-6
    nvlink_latency_s: float = 2e-6

    @classmethod
    def uniform(cls, o: float, **kw: object) -> FabricParams:
        return cls(oversubscription={"leaf": o, "spine": o, "core": o}, **kw)  # type: ignore[arg-type]


def _tier(level: int) -> str:
    return "leaf" if level <= 0 else "spine" if level == 1 else "core"


class PhysicalFabric:
    """Links and routes of ``topology`` under ``params``."""

    def __init__(self, topology: Topology, params: FabricParams | None = None) -> None:
        self.topology = topology
        self.params = params or FabricParams()

    @cached_property
    def _domain(self) -> dict[str, str]:
        """Multi-node NVLink domain per node (absent: the node is its own domain)."""
        dom: dict[str, str] = {}
        for n, node in self.topology.nodes.items():
            if node.nvlink_domain:
                dom[n] = node.nvlink_domain
            elif self.topology.kind == "block":
                dom[n] = "block:" + self.topology.leaf_of[n]
        size = Counter(dom.values())
        return {n: d for n, d in dom.items() if size[d] > 1}

    def same_domain(self, a: str, b: str) -> bool:
        d = self._domain.get(a)
        return d is not None and d == self._domain.get(b)

    @cached_property
    def capacity(self) -> dict[str, float]:
        p = self.params
        topo = self.topology
        cap: dict[str, float] = {}
        for n in topo.nodes:
            cap[f"nic:up:{n}"] = cap[f"nic:dn:{n}"] = p.nic_bytes_per_s
            if n in self._domain:
                nvl = p.gpus_per_node * p.nvlink_bytes_per_s_per_gpu
                cap[f"nvl:up:{n}"] = cap[f"nvl:dn:{n}"] = nvl
        under: Counter[str] = Counter()
        for n in topo.nodes:
            under.update(topo.path(n))
        for sw, par in topo.parent_of.items():
            if par is None:
                continue
            o = p.oversubscription.get(_tier(topo.level(sw)), 1.0)
            cap[f"sw:up:{sw}"] = cap[f"sw:dn:{sw}"] = under[sw] * p.nic_bytes_per_s / o
        return cap

    def route(self, a: str, b: str) -> tuple[list[str], float]:
        """Links from ``a`` to ``b`` and the one-way latency."""
        p = self.params
        if a == b:
            return [], 0.0
        if self.same_domain(a, b):
            return [f"nvl:up:{a}", f"nvl:dn:{b}"], 2 * p.nvlink_latency_s
        pa, pb = self.topology.path(a), self.topology.path(b)
        common = 0
        while common < min(len(pa), len(pb)) and pa[common] == pb[common]:
            common += 1
        ups = [f"sw:up:{s}" for s in reversed(pa[common:])]
        dns = [f"sw:dn:{s}" for s in pb[common:]]
        links = [f"nic:up:{a}", *ups, *dns, f"nic:dn:{b}"]
        return links, 2 * p.nic_latency_s + (len(ups) + len(dns)) * p.hop_latency_s
