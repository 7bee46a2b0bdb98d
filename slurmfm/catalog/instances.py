"""EC2 GPU instance types that slurmfm plans for, as frozen, cited data.

Why this exists: every later stage needs the same handful of hardware facts (GPUs per node for
``--nproc_per_node`` and ``--gpus-per-node``, EFA device count for the health gate, NVLink domain
size for block topology, CPU architecture for container images and plugin paths, and the length
of ``DescribeInstanceTopology`` ``NetworkNodes`` for the topology converter). Hard-coding them at
call sites is how generators end up assuming "8 GPUs" on p6e-gb200 (4) or "3 network layers" on
p6-b200 (4). Each entry lists its primary sources; figures that only third-party summaries
give, or that are approximate or inconsistent across sources, are written into ``notes`` and
clear ``verified``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from slurmfm.errors import SlurmfmError

__all__ = [
    "INSTANCES",
    "InstanceType",
    "NVLinkDomain",
    "UnknownInstanceType",
    "get_instance",
    "known_instance_names",
]

# Short citation strings: owner/repo:path for repository files, URLs for documentation.
SRC_KARPENTER = "aws/karpenter-provider-aws:website/content/en/preview/reference/instance-types.md"
SRC_CHEATSHEET = "aws-samples/awsome-distributed-training:1.architectures/efa-cheatsheet.md"
SRC_TORCHX = "meta-pytorch/torchx:torchx/specs/named_resources_aws.py"
SRC_HEALTHCHECK = (
    "aws-samples/awsome-distributed-training:4.validation_and_observability/"
    "2.gpu-cluster-healthcheck (instance-profiles.conf)"
)
SRC_EC2_TOPOLOGY = (
    "https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/how-ec2-instance-topology-works.html"
)
SRC_ULTRASERVER = (
    "https://docs.amazonaws.cn/zh_cn/eks/latest/userguide/ml-eks-nvidia-ultraserver.md"
)
SRC_HYPERPOD_TOPOLOGY = (
    "https://docs.aws.amazon.com/ja_jp/sagemaker/latest/dg/sagemaker-hyperpod-topology.html"
)
SRC_NIC_LAYOUT = "awslabs/awsome-distributed-ai:architectures/aws-pcs/docs/OPERATIONS.md#5"
SRC_LAB = "scripts/slurm-lab (the lab's slurm.conf: Sockets=2 CoresPerSocket=8 RealMemory=64000)"
SRC_IMEX = (
    "https://docs.aws.amazon.com/pcs/latest/userguide/capacity-blocks-nvidia-imex.html; "
    "NVIDIA/nccl:src/mnnvl.cc"
)


@dataclass(frozen=True)
class NVLinkDomain:
    """The set of GPUs that talk over NVLink instead of EFA.

    Why ``instances`` is a tuple: an HGX instance is one 8-GPU domain (``(1,)``), but a GB200
    UltraServer spans 9 or 18 instances depending on what was bought (``u-p6e-gb200x36`` /
    ``u-p6e-gb200x72``), and the block-topology planner needs both sizes to pick ``BlockSizes``
    and a ``--segment`` that divides the block.
    """

    instances: tuple[int, ...]
    gpus_per_instance: int

    def __post_init__(self) -> None:
        if not self.instances or any(n < 1 for n in self.instances):
            raise ValueError(f"NVLinkDomain.instances must be positive counts: {self.instances!r}")
        if self.gpus_per_instance < 0:
            raise ValueError("NVLinkDomain.gpus_per_instance must be >= 0")

    @property
    def max_gpus(self) -> int:
        """GPUs in the largest domain offered (72 for a u-p6e-gb200x72, 8 for an HGX node)."""
        return max(self.instances) * self.gpus_per_instance

    @property
    def is_multi_node(self) -> bool:
        """True when NVLink spans instances, i.e. MNNVL/IMEX and block topology matter."""
        return max(self.instances) > 1


@dataclass(frozen=True)
class InstanceType:
    """Hardware facts for one EC2 instance type (or the virtual local lab node).

    ``verified`` covers the fields slurmfm acts on (GPU count, EFA count, topology depth, CPU
    architecture, NVLink domain, GPU memory); purely informational labels such as
    ``efa_generation`` may still come from third-party summaries, which ``notes`` says.
    """

    name: str
    family: str
    gpu_model: str
    gpus: int
    gpu_memory_mib: int
    efa_interfaces: int
    efa_generation: str | None
    nvlink: NVLinkDomain
    cpu_arch: Literal["x86_64", "aarch64"]
    vcpus: int
    memory_gib: int
    topology_depth: int
    sources: tuple[str, ...]
    notes: tuple[str, ...] = ()
    verified: bool = True
    virtual: bool = False

    def __post_init__(self) -> None:
        if self.topology_depth not in (3, 4):
            raise ValueError(f"{self.name}: topology_depth must be 3 or 4 (EC2 docs)")
        if self.nvlink.gpus_per_instance != self.gpus:
            raise ValueError(f"{self.name}: nvlink.gpus_per_instance must equal gpus")
        if not self.sources:
            raise ValueError(f"{self.name}: every instance type must cite a source")

    @property
    def needs_imex(self) -> bool:
        """NVLink across instances goes through NVIDIA IMEX channels.

        Why it matters: NCCL's multi-node NVLink (MNNVL) needs the channel device
        ``/dev/nvidia-caps-imex-channels/channel0`` in the process's namespace and fails with
        "MNNVL ... available but not working" without it (NVIDIA/nccl:src/mnnvl.cc); the IMEX
        service must know the job's nodes (AWS PCS capacity-blocks-nvidia-imex guide). Today
        that is exactly the types whose NVLink domain spans instances (GB200 UltraServers).
        """
        return self.nvlink.is_multi_node


def _hgx(
    name: str,
    *,
    gpu_model: str,
    gpu_memory_mib: int,
    efa_interfaces: int,
    efa_generation: str | None,
    vcpus: int,
    memory_gib: int,
    topology_depth: int,
    sources: tuple[str, ...],
    notes: tuple[str, ...] = (),
    verified: bool = True,
) -> InstanceType:
    """An 8-GPU HGX x86_64 instance: one NVLink domain per instance (cheatsheet)."""
    return InstanceType(
        name=name,
        family=name.split(".", 1)[0],
        gpu_model=gpu_model,
        gpus=8,
        gpu_memory_mib=gpu_memory_mib,
        efa_interfaces=efa_interfaces,
        efa_generation=efa_generation,
        nvlink=NVLinkDomain(instances=(1,), gpus_per_instance=8),
        cpu_arch="x86_64",
        vcpus=vcpus,
        memory_gib=memory_gib,
        topology_depth=topology_depth,
        sources=sources,
        notes=notes,
        verified=verified,
    )


_CATALOG: tuple[InstanceType, ...] = (
    _hgx(
        "p4d.24xlarge",
        gpu_model="A100",
        gpu_memory_mib=40960,
        efa_interfaces=4,
        efa_generation="EFA",
        vcpus=96,
        memory_gib=1152,
        topology_depth=3,
        sources=(SRC_KARPENTER, SRC_HEALTHCHECK, SRC_EC2_TOPOLOGY, SRC_CHEATSHEET),
        notes=("EFA link split 4x100G is a third-party summary (not an AWS page).",),
    ),
    _hgx(
        "p4de.24xlarge",
        gpu_model="A100",
        gpu_memory_mib=81920,
        efa_interfaces=4,
        efa_generation="EFA",
        vcpus=96,
        memory_gib=1152,
        topology_depth=3,
        sources=(SRC_KARPENTER, SRC_HEALTHCHECK, SRC_EC2_TOPOLOGY, SRC_CHEATSHEET),
        notes=("NVLink3, 12 links per GPU (cheatsheet).",),
    ),
    _hgx(
        "p5.48xlarge",
        gpu_model="H100",
        gpu_memory_mib=81920,
        efa_interfaces=32,
        efa_generation="EFAv2",
        vcpus=192,
        memory_gib=2048,
        topology_depth=3,
        sources=(SRC_KARPENTER, SRC_HEALTHCHECK, SRC_EC2_TOPOLOGY, SRC_CHEATSHEET),
        notes=(
            "EFAv2 / 32x100G label is a third-party summary (not an AWS page).",
            "Two PCIe/NUMA domains with 4 GPUs each (" + SRC_HYPERPOD_TOPOLOGY + ").",
        ),
    ),
    _hgx(
        "p5e.48xlarge",
        gpu_model="H200",
        gpu_memory_mib=144384,
        efa_interfaces=32,
        efa_generation="EFAv2",
        vcpus=192,
        memory_gib=2048,
        topology_depth=3,
        sources=(SRC_KARPENTER, SRC_HEALTHCHECK, SRC_EC2_TOPOLOGY),
        notes=("EFAv2 label is a third-party summary (not an AWS page).",),
    ),
    _hgx(
        "p5en.48xlarge",
        gpu_model="H200",
        gpu_memory_mib=144384,
        efa_interfaces=16,
        efa_generation="EFAv3",
        vcpus=192,
        memory_gib=2048,
        topology_depth=3,
        sources=(SRC_KARPENTER, SRC_HEALTHCHECK, SRC_EC2_TOPOLOGY),
        notes=(
            "EFAv3 / 16x200G label is a third-party summary (not an AWS page).",
            "Known late EFA initialisation; the AWS health check retries 3x5 s.",
        ),
    ),
    _hgx(
        "p6-b200.48xlarge",
        gpu_model="B200",
        gpu_memory_mib=183359,
        efa_interfaces=8,
        efa_generation="EFAv4",
        vcpus=192,
        memory_gib=2048,
        topology_depth=4,
        sources=(SRC_KARPENTER, SRC_HEALTHCHECK, SRC_EC2_TOPOLOGY, SRC_TORCHX),
        notes=("NetworkNodes has 4 entries, not 3 (EC2 topology docs).",),
    ),
    _hgx(
        "p6-b300.48xlarge",
        gpu_model="B300",
        gpu_memory_mib=275040,
        efa_interfaces=16,
        efa_generation="EFAv4",
        vcpus=192,
        memory_gib=4096,
        topology_depth=4,
        sources=(SRC_KARPENTER, SRC_NIC_LAYOUT, SRC_EC2_TOPOLOGY, SRC_TORCHX),
        notes=(
            "17 NICs: card 0 is ENA-only, EFA on cards 1-16 (" + SRC_NIC_LAYOUT + ").",
            "Not in the AWS health-check instance-profiles.conf; 16 EFA is from the NIC layout.",
            "NetworkNodes has 4 entries, not 3 (EC2 topology docs).",
            "Unverified: GPU memory, EFA count and vCPUs come from secondary summaries (the "
            "Karpenter instance list, an operations guide), not from an AWS instance-type page "
            "or a health-check profile; kept unverified until a primary source says otherwise.",
        ),
        verified=False,
    ),
    InstanceType(
        name="p6e-gb200.36xlarge",
        family="p6e-gb200",
        gpu_model="GB200",
        gpus=4,
        # Sheet: "~185 GB (740 GB/instance)", no MiB figure. 185e9 bytes = 176428 MiB; the
        # decimal reading is the smaller one, so memory planning cannot over-commit.
        gpu_memory_mib=176428,
        efa_interfaces=16,
        efa_generation="EFAv4",
        nvlink=NVLinkDomain(instances=(9, 18), gpus_per_instance=4),
        cpu_arch="aarch64",
        vcpus=144,
        memory_gib=960,
        topology_depth=3,
        sources=(
            SRC_KARPENTER,
            SRC_ULTRASERVER,
            SRC_HYPERPOD_TOPOLOGY,
            SRC_EC2_TOPOLOGY,
            SRC_IMEX,
        ),
        notes=(
            "Sold only inside UltraServers: u-p6e-gb200x36 = 9 instances, x72 = 18 instances.",
            "GPU memory is approximate (sheet: ~185 GB per GPU); stored as decimal GB -> MiB.",
            "16 EFA-capable network cards (17 NICs, NIC0 ENA-only); not in the AWS health-check "
            "profiles, so unverified as a health-gate count.",
            "Per-instance network figure is inconsistent across sources (karpenter 3200 Gbps vs "
            "28.8 Tbps/18 = 1.6 Tbps) -- verify before relying on it.",
            "Cross-instance NVLink needs NVIDIA IMEX configured with the job's node IPs.",
            "The UltraServer domain is CapacityBlockId, not an extra NetworkNodes layer.",
        ),
        verified=False,
    ),
    InstanceType(
        name="lab-cpu",
        family="lab-cpu",
        gpu_model="none",
        gpus=0,
        gpu_memory_mib=0,
        efa_interfaces=0,
        efa_generation=None,
        nvlink=NVLinkDomain(instances=(1,), gpus_per_instance=0),
        cpu_arch="x86_64",
        vcpus=16,
        memory_gib=62,
        topology_depth=3,
        sources=(SRC_LAB,),
        notes=(
            "Virtual type for the local CPU Slurm lab: no GPUs, no EFA, so no NCCL/EFA env.",
            "topology_depth 3 mirrors the lab's leaf/spine/core tree.",
        ),
        virtual=True,
    ),
)

INSTANCES: Mapping[str, InstanceType] = MappingProxyType({i.name: i for i in _CATALOG})
"""All known instance types, keyed by canonical name (read-only)."""

_FAMILY_INDEX: Mapping[str, str] = MappingProxyType({i.family: i.name for i in _CATALOG})

_HYPERPOD_PREFIX = "ml."


class UnknownInstanceType(SlurmfmError, ValueError):
    """An instance type name slurmfm has no facts for.

    Also a ``SlurmfmError`` so the CLI reports it as one user-fixable line; the message lists
    every known name so the fix is obvious.
    """


def known_instance_names() -> list[str]:
    """Canonical names, sorted, for error messages and CLI completion."""
    return sorted(INSTANCES)


def get_instance(name: str) -> InstanceType:
    """Look up an instance type by canonical name, family or HyperPod name.

    Accepted spellings (case-insensitive, surrounding whitespace ignored): ``p5.48xlarge``,
    ``p5`` (the family; each family here has exactly one size) and ``ml.p5.48xlarge`` (HyperPod
    prefixes instance-group types with ``ml.``). Raises :class:`UnknownInstanceType` otherwise.
    """
    key = name.strip().lower()
    if key.startswith(_HYPERPOD_PREFIX):
        key = key[len(_HYPERPOD_PREFIX) :]
    if key in INSTANCES:
        return INSTANCES[key]
    if key in _FAMILY_INDEX:
        return INSTANCES[_FAMILY_INDEX[key]]
    raise UnknownInstanceType(
        f"unknown instance type {name!r}; known: {', '.join(known_instance_names())}"
    )
