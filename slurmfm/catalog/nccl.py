"""NCCL / libfabric / EFA environment profiles, as cited rules gated on stack versions.

Why rules instead of a fixed block of ``export`` lines: the AWS samples carry years of
accumulated flags (``FI_EFA_USE_DEVICE_RDMA=1 # use for p4d``, ``NCCL_PROTO=simple``,
``NCCL_BUFFSIZE``, an explicit ``NCCL_TUNER_PLUGIN``...). Most were needed only by old
aws-ofi-nccl / EFA installer releases, and some now cost performance (the explicit tuner path
cost 10.8 % alltoall bus bandwidth on p6-b300 with NCCL 2.30). The AWS guidance is "minimal by
default, legacy flags only for the versions that need them". So each flag is a :class:`Rule`
with the condition under which it is needed and the source that says so, and everything the
guidance says not to set is in :data:`FORBIDDEN` for a validator to warn about.

Facts: ``/work/shared/reference/aws-launch-facts.md`` sections 1.3, 1.4 and 6 (item 3 and 4).

Conventions:

* A stack version of ``None`` ("auto") means "unknown, assume the current stack" (EFA >= 1.43,
  aws-ofi-nccl >= 1.14, NCCL >= 2.27). Legacy rules therefore fire only on *known* old versions,
  and :func:`check_minimums` only warns about *known* versions.
* :func:`nccl_env` applies :data:`RULES` in order. When two rules set the same variable the later
  rule wins: its value and reason replace the earlier ones, in the position of the first
  occurrence (so the output order stays stable when a legacy rule re-states a default).
* ``raw_shell`` values are the only place shell syntax appears (``$(uname -m)`` and the
  ``${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}`` prepend idiom). They are constants of this module,
  never user input; :class:`EnvSetting` refuses ``$`` in non-raw values and quote/backslash
  characters in raw ones, so a renderer can emit ``export NAME="value"`` safely. Note that they
  expand where the batch script runs (the host); with Pyxis the host environment is passed into
  the container, so ``$(uname -m)`` is the container's architecture too (same machine).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Literal

from packaging.version import InvalidVersion, Version

from slurmfm.catalog.instances import InstanceType

__all__ = [
    "FORBIDDEN",
    "LEGACY_ONLY",
    "RULES",
    "EnvSetting",
    "Rule",
    "Runtime",
    "StackVersions",
    "check_minimums",
    "is_forbidden",
    "merge_env",
    "nccl_env",
    "user_env_warnings",
]

Runtime = Literal["host", "container"]
_RUNTIMES: tuple[str, ...] = ("host", "container")

# ---------------------------------------------------------------------------------------------
# Citations (short strings; see aws-launch-facts.md section 0)
# ---------------------------------------------------------------------------------------------
SRC_CHEATSHEET = "aws-samples/awsome-distributed-training:1.architectures/efa-cheatsheet.md"
SRC_EFA_ENV = "aws/aws-ofi-nccl:doc/efa-env-var.md"
SRC_REVIEW = "awslabs/awsome-distributed-ai commit a59b4db5 (May-2026 NCCL/EFA review)"
SRC_NCCL_TESTS = (
    "awslabs/awsome-distributed-ai:micro-benchmarks/nccl-tests/slurm/nccl-tests-container.sbatch"
)
SRC_DEEPSPEED = "awslabs/awsome-distributed-ai:3.test_cases/pytorch/deepspeed/README.md"
SRC_NEMO_RL = "awslabs/awsome-distributed-ai:3.test_cases/megatron/nemo-rl/grpo/README.md"
SRC_GB200_EKS = (
    "awslabs/awsome-distributed-ai:micro-benchmarks/nccl-tests/kubernetes/nccl-tests-gb200.yaml"
)
SRC_BUNDLED = "aws-samples/awsome-distributed-training commit e5732423 (#861)"
SRC_DOCKERFILE = "awslabs/awsome-distributed-ai:micro-benchmarks/nccl-tests/nccl-tests.Dockerfile"
SRC_AMI_SBATCH = (
    "awslabs/awsome-distributed-ai:micro-benchmarks/nccl-tests/slurm/nccl-tests-ami.sbatch"
)
SRC_LEGACY_PATH = "aws-samples/awsome-distributed-training:3.test_cases/jax/jax.sbatch"
SRC_VJEPA = (
    "awslabs/awsome-distributed-ai:3.test_cases/pytorch/vjepa2/slurm/benchmark_training_b200.sbatch"
)
SRC_TUNER = "aws/aws-ofi-nccl:doc/tuner.md"
SRC_GDR = "awslabs/awsome-distributed-ai commit 45e8f55d"
SRC_SUMMARY = "aws-launch-facts.md#6 item 3"

# ---------------------------------------------------------------------------------------------
# Version thresholds (each cited where it is used)
# ---------------------------------------------------------------------------------------------
OFI_LEGACY_PROVIDER_BELOW = Version("1.6.0")  # aws-ofi-nccl <= 1.5.x
OFI_DEVICE_RDMA_BELOW = Version("1.7.0")  # aws-ofi-nccl 1.6.x (and older)
EFA_SYNC_MEMOPS_BELOW = Version("1.29.1")
NCCL_SYNC_MEMOPS_FROM = Version("2.19")
# "aws-ofi-nccl is bundled with the EFA installer since ~1.36" -- approximate in the sheet.
EFA_BUNDLES_OFI_FROM = Version("1.36.0")

_PREPEND = "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
EFA_LIB = "/opt/amazon/efa/lib"
OFI_HOST_LIB = "/opt/amazon/ofi-nccl/lib"
OFI_CONTAINER_LIB = "/opt/amazon/ofi-nccl/lib/$(uname -m)-linux-gnu"
OFI_LEGACY_LIB = "/opt/aws-ofi-nccl/install/lib"

_AMZN_SUFFIX = re.compile(r"^(v?\d+(?:\.\d+)*)amzn[\d.]*$", re.IGNORECASE)
_RAW_SHELL_BAD = ('"', "`", "\\", "\n", "\r", "\x00")


# ---------------------------------------------------------------------------------------------
# Data types
# ---------------------------------------------------------------------------------------------
def _parse_version(field: str, text: str) -> Version | None:
    cleaned = text.strip()
    if cleaned.lower() == "auto":
        return None
    # libfabric as shipped by the EFA installer reports e.g. "1.22.0amzn4.0" (fi_info --version);
    # the Amazon build suffix is not a PEP 440 version, and the upstream release is what gates.
    vendor = _AMZN_SUFFIX.match(cleaned)
    if vendor is not None:
        cleaned = vendor.group(1)
    try:
        return Version(cleaned)
    except InvalidVersion:
        msg = f"{field}: {text!r} is not a version (use e.g. '1.16.3' or 'auto')"
        raise ValueError(msg) from None


def _base(v: Version) -> Version:
    """Compare on the release numbers only: NCCL tags like ``2.19.3-1`` parse as post-releases."""
    return Version(v.base_version)


def _known_below(v: Version | None, bound: Version) -> bool:
    return v is not None and _base(v) < bound


@dataclass(frozen=True)
class StackVersions:
    """Versions of the EFA software stack on the nodes (or in the container).

    ``None`` means "auto": not known, assume the current stack, so no legacy flag is emitted for
    it. Why not probe: the catalog is pure data; detection belongs to a backend.
    """

    efa_installer: Version | None = None
    libfabric: Version | None = None
    aws_ofi_nccl: Version | None = None
    nccl: Version | None = None

    @classmethod
    def parse(
        cls,
        efa_installer: str = "auto",
        libfabric: str = "auto",
        aws_ofi_nccl: str = "auto",
        nccl: str = "auto",
    ) -> StackVersions:
        """Build from recipe strings: ``"auto"`` -> ``None``, invalid -> ``ValueError``."""
        return cls(
            efa_installer=_parse_version("efa_installer", efa_installer),
            libfabric=_parse_version("libfabric", libfabric),
            aws_ofi_nccl=_parse_version("aws_ofi_nccl", aws_ofi_nccl),
            nccl=_parse_version("nccl", nccl),
        )


@dataclass(frozen=True)
class EnvSetting:
    """One environment variable for the generated script, with why and where from.

    ``raw_shell`` marks module-owned values that the shell must expand at run time; the renderer
    emits them inside double quotes without escaping. It is never set for user values.
    """

    name: str
    value: str
    reason: str
    source: str
    raw_shell: bool = False

    def __post_init__(self) -> None:
        if not self.name or not self.source or not self.reason:
            raise ValueError(f"EnvSetting {self.name!r}: name, reason and source are required")
        if "\n" in self.reason:
            raise ValueError(f"EnvSetting {self.name!r}: reason must be one line")
        if self.raw_shell:
            if any(ch in self.value for ch in _RAW_SHELL_BAD):
                msg = f"EnvSetting {self.name!r}: raw_shell value has quote/escape characters"
                raise ValueError(msg)
        elif "$" in self.value or "`" in self.value:
            raise ValueError(f"EnvSetting {self.name!r}: shell expansion requires raw_shell=True")


RuleCheck = Callable[[InstanceType, StackVersions, Runtime], bool]
RuleSettings = Callable[[InstanceType, StackVersions, Runtime], tuple[EnvSetting, ...]]


@dataclass(frozen=True)
class Rule:
    """A condition on (instance, stack, runtime) and the variables it requires, with a source.

    ``verified`` is False when the only evidence is indirect (e.g. an EKS test rather than a
    Slurm job, or an approximate version boundary).
    """

    id: str
    description: str
    source: str
    applies: RuleCheck
    settings: RuleSettings
    verified: bool = True


# ---------------------------------------------------------------------------------------------
# Predicates
# ---------------------------------------------------------------------------------------------
def _uses_efa(i: InstanceType) -> bool:
    """NCCL/EFA variables only make sense on real instances with EFA devices (not lab-cpu)."""
    return not i.virtual and i.efa_interfaces > 0


def _p4_or_p5(i: InstanceType) -> bool:
    """The legacy flags are documented "on p4/p5" (cheatsheet), i.e. p4d/p4de/p5/p5e/p5en."""
    return _uses_efa(i) and i.family.startswith(("p4", "p5"))


def _legacy_ofi_install(s: StackVersions) -> bool:
    """EFA installers before aws-ofi-nccl was bundled: plugin was built to /opt/aws-ofi-nccl."""
    return _known_below(s.efa_installer, EFA_BUNDLES_OFI_FROM)


def _const(*settings: EnvSetting) -> RuleSettings:
    def produce(_i: InstanceType, _s: StackVersions, _r: Runtime) -> tuple[EnvSetting, ...]:
        return settings

    return produce


def _ld_path(prefix: str, reason: str, source: str) -> EnvSetting:
    return EnvSetting(
        name="LD_LIBRARY_PATH",
        value=f"{prefix}:{EFA_LIB}{_PREPEND}",
        reason=reason,
        source=source,
        raw_shell=True,
    )


# ---------------------------------------------------------------------------------------------
# Rules (order matters: later rules win on the same variable)
# ---------------------------------------------------------------------------------------------
RULES: tuple[Rule, ...] = (
    Rule(
        id="efa-provider",
        description=(
            "Pin libfabric to the EFA provider. Required only for aws-ofi-nccl <= 1.5.0, but "
            "harmless on current stacks and kept by the AWS NCCL/EFA team's May-2026 review of "
            "nccl-tests; emitting it everywhere keeps one profile shape across stack versions."
        ),
        source=f"{SRC_CHEATSHEET}; {SRC_REVIEW}",
        applies=lambda i, s, r: _uses_efa(i),
        settings=_const(
            EnvSetting(
                "FI_PROVIDER",
                "efa",
                "use the EFA libfabric provider (harmless on current stacks)",
                f"{SRC_CHEATSHEET}; {SRC_REVIEW}",
            )
        ),
    ),
    Rule(
        id="socket-ifname",
        description=(
            "Keep NCCL's bootstrap/socket traffic off docker, loopback and veth interfaces; the "
            "data path is EFA and unaffected. The exclusion form works on every instance type "
            "without knowing interface names."
        ),
        source=f"{SRC_NCCL_TESTS}; {SRC_SUMMARY}",
        applies=lambda i, s, r: _uses_efa(i),
        settings=_const(
            EnvSetting(
                "NCCL_SOCKET_IFNAME",
                "^docker,lo,veth",
                "NCCL bootstrap sockets: exclude docker/loopback/veth interfaces",
                f"{SRC_NCCL_TESTS}; {SRC_SUMMARY}",
            )
        ),
    ),
    Rule(
        id="nccl-debug-warn",
        description=(
            "NCCL_DEBUG=WARN: NCCL errors get an explicit message at no cost, without INFO's "
            "per-rank init output in every training log. Set NCCL_DEBUG=INFO in the recipe env "
            "(user wins) to see 'NET/OFI Selected provider is efa' when diagnosing."
        ),
        source=SRC_SUMMARY,
        applies=lambda i, s, r: _uses_efa(i),
        settings=_const(
            EnvSetting(
                "NCCL_DEBUG",
                "WARN",
                "report NCCL errors; set NCCL_DEBUG=INFO to debug EFA selection",
                SRC_SUMMARY,
            )
        ),
    ),
    Rule(
        id="plugin-path-host",
        description=(
            "Host (DLAMI/AMI) runs: put the bundled aws-ofi-nccl plugin and libfabric on the "
            "library path, prepended so the site's own LD_LIBRARY_PATH is kept. NCCL loads the "
            "plugin automatically when it is on the path."
        ),
        source=f"{SRC_AMI_SBATCH}; {SRC_NEMO_RL}",
        applies=lambda i, s, r: _uses_efa(i) and r == "host" and not _legacy_ofi_install(s),
        settings=_const(
            _ld_path(
                OFI_HOST_LIB,
                "prepend aws-ofi-nccl + libfabric (EFA installer layout) to the library path",
                SRC_AMI_SBATCH,
            )
        ),
    ),
    Rule(
        id="plugin-path-container",
        description=(
            "Container runs: the EFA installer puts the plugin in an arch-specific directory "
            "(x86_64-linux-gnu or aarch64-linux-gnu), so the path is resolved by the shell with "
            "$(uname -m); prepended to the existing LD_LIBRARY_PATH."
        ),
        source=f"{SRC_DOCKERFILE}; {SRC_NCCL_TESTS}",
        applies=lambda i, s, r: _uses_efa(i) and r == "container" and not _legacy_ofi_install(s),
        settings=_const(
            _ld_path(
                OFI_CONTAINER_LIB,
                "prepend the arch-specific aws-ofi-nccl dir + libfabric to the library path",
                SRC_DOCKERFILE,
            )
        ),
    ),
    Rule(
        id="plugin-path-legacy",
        description=(
            "EFA installer older than ~1.36 did not bundle aws-ofi-nccl; the samples built it "
            "from source into /opt/aws-ofi-nccl/install/lib (host and container alike). The "
            "1.36 boundary is approximate in the reference sheet, hence unverified."
        ),
        source=f"{SRC_BUNDLED}; {SRC_LEGACY_PATH}",
        applies=lambda i, s, r: _uses_efa(i) and _legacy_ofi_install(s),
        settings=_const(
            _ld_path(
                OFI_LEGACY_LIB,
                "prepend the source-built aws-ofi-nccl (pre-bundling EFA installer) + libfabric",
                f"{SRC_BUNDLED}; {SRC_LEGACY_PATH}",
            )
        ),
        verified=False,
    ),
    Rule(
        id="ofi-le-1.5-provider",
        description=(
            "aws-ofi-nccl <= 1.5.x on p4/p5 needs FI_PROVIDER=efa and NCCL_PROTO=simple. "
            "NCCL_PROTO is otherwise never emitted (see LEGACY_ONLY)."
        ),
        source=f"{SRC_CHEATSHEET}; {SRC_EFA_ENV}",
        applies=lambda i, s, r: (
            _p4_or_p5(i) and _known_below(s.aws_ofi_nccl, OFI_LEGACY_PROVIDER_BELOW)
        ),
        settings=_const(
            EnvSetting(
                "FI_PROVIDER",
                "efa",
                "required by aws-ofi-nccl <= 1.5",
                f"{SRC_CHEATSHEET}; {SRC_EFA_ENV}",
            ),
            EnvSetting(
                "NCCL_PROTO",
                "simple",
                "required by aws-ofi-nccl <= 1.5 on p4/p5 (never set on newer plugins)",
                f"{SRC_CHEATSHEET}; {SRC_EFA_ENV}",
            ),
        ),
    ),
    Rule(
        id="ofi-lt-1.7-device-rdma",
        description=(
            "aws-ofi-nccl 1.6.x (and older) on p4/p5 needs FI_EFA_USE_DEVICE_RDMA=1; do not set "
            "it for aws-ofi-nccl >= 1.7.0 with libfabric >= 1.18.0."
        ),
        source=f"{SRC_CHEATSHEET}; {SRC_EFA_ENV}",
        applies=lambda i, s, r: (
            _p4_or_p5(i) and _known_below(s.aws_ofi_nccl, OFI_DEVICE_RDMA_BELOW)
        ),
        settings=_const(
            EnvSetting(
                "FI_EFA_USE_DEVICE_RDMA",
                "1",
                "required by aws-ofi-nccl < 1.7 on p4/p5 (not set on newer plugins)",
                f"{SRC_CHEATSHEET}; {SRC_EFA_ENV}",
            )
        ),
    ),
    Rule(
        id="efa-lt-1.29.1-cuda-sync-memops",
        description=(
            "EFA installer < 1.29.1 with NCCL >= 2.19 fails with 'register_rail_mr_buffer ... "
            "Unable to register memory' unless FI_EFA_SET_CUDA_SYNC_MEMOPS=0. An unknown NCCL "
            "version is assumed current (>= 2.19)."
        ),
        source=SRC_CHEATSHEET,
        applies=lambda i, s, r: (
            _uses_efa(i)
            and _known_below(s.efa_installer, EFA_SYNC_MEMOPS_BELOW)
            and (s.nccl is None or _base(s.nccl) >= NCCL_SYNC_MEMOPS_FROM)
        ),
        settings=_const(
            EnvSetting(
                "FI_EFA_SET_CUDA_SYNC_MEMOPS",
                "0",
                "EFA installer < 1.29.1 with NCCL >= 2.19: avoid memory registration failures",
                SRC_CHEATSHEET,
            )
        ),
    ),
    Rule(
        id="p5en-nvls-disable",
        description=(
            "p5en: disable NVLS to work around the NVLS rank-ordering bug NVIDIA/nccl#1906. "
            "Source is the NeMo-RL sample README; no NCCL version with a fix is recorded, so it "
            "applies to every stack."
        ),
        source=f"{SRC_NEMO_RL}; NVIDIA/nccl#1906",
        applies=lambda i, s, r: _uses_efa(i) and i.family == "p5en",
        settings=_const(
            EnvSetting(
                "NCCL_NVLS_ENABLE",
                "0",
                "p5en workaround for NVLS rank-ordering bug NVIDIA/nccl#1906",
                f"{SRC_NEMO_RL}; NVIDIA/nccl#1906",
            )
        ),
    ),
    Rule(
        id="p5en-cumem-disable",
        description=(
            "p5en: disable cuMem to avoid a ~3660 ms cuMem import penalty (NVIDIA/nccl#1749), "
            "per the NeMo-RL sample README; no fixed NCCL version is recorded."
        ),
        source=f"{SRC_NEMO_RL}; NVIDIA/nccl#1749",
        applies=lambda i, s, r: _uses_efa(i) and i.family == "p5en",
        settings=_const(
            EnvSetting(
                "NCCL_CUMEM_ENABLE",
                "0",
                "p5en workaround for cuMem import penalty NVIDIA/nccl#1749",
                f"{SRC_NEMO_RL}; NVIDIA/nccl#1749",
            )
        ),
    ),
    Rule(
        id="gb200-mnnvl",
        description=(
            "GB200 UltraServers: enable multi-node NVLink and NVLS so NCCL uses the NVLink domain "
            "across instances (requires IMEX). UNVERIFIED for Slurm: the only AWS reference is an "
            "EKS nccl-test (72 ranks, 4 per node, 18 nodes); no AWS Slurm GB200 sbatch exists."
        ),
        source=f"{SRC_GB200_EKS} (history, EKS only)",
        applies=lambda i, s, r: _uses_efa(i) and i.nvlink.is_multi_node,
        settings=_const(
            EnvSetting(
                "NCCL_MNNVL_ENABLE",
                "1",
                "GB200 multi-node NVLink (unverified on Slurm: AWS reference is an EKS nccl-test)",
                f"{SRC_GB200_EKS} (history, EKS only)",
            ),
            EnvSetting(
                "NCCL_NVLS_ENABLE",
                "1",
                "GB200 NVLink SHARP (unverified on Slurm: AWS reference is an EKS nccl-test)",
                f"{SRC_GB200_EKS} (history, EKS only)",
            ),
        ),
        verified=False,
    ),
)

# ---------------------------------------------------------------------------------------------
# Variables never emitted, for a validator to warn about
# ---------------------------------------------------------------------------------------------
FORBIDDEN: Mapping[str, str] = MappingProxyType(
    {
        "NCCL_ALGO": f"NCCL_ALGO=Tree hangs on EFA; let NCCL choose algorithms ({SRC_DEEPSPEED})",
        "RDMAV_FORK_SAFE": f"do not use RDMAV_* variables with EFA ({SRC_CHEATSHEET})",
        "NCCL_BUFFSIZE": (
            f"leave it out; neutral at 8/32 nodes on p6-b300 and removed from AWS nccl-tests "
            f"({SRC_CHEATSHEET}; {SRC_REVIEW})"
        ),
        "NCCL_BUFFERSIZE": (
            f"misspelling of NCCL_BUFFSIZE seen in an AWS sample; NCCL ignores it ({SRC_DEEPSPEED})"
        ),
        "NCCL_P2P_NET_CHUNKSIZE": f"unnecessary; removed from AWS nccl-tests ({SRC_REVIEW})",
        "NCCL_TUNER_PLUGIN": (
            "an explicit tuner path cost +10.8% alltoall busbw on p6-b300/NCCL 2.30 (stale "
            f"algorithm/protocol selection); the plugin's tuner loads by default ({SRC_REVIEW}; "
            f"{SRC_TUNER})"
        ),
        "NCCL_NET_GDR_LEVEL": (
            "LOC disables GPUDirect RDMA; aws-ofi-nccl's per-instance NCCL_TOPO_FILE already "
            f"sets the GDR level ({SRC_GDR})"
        ),
        "FI_EFA_FORK_SAFE": (
            "not needed: the plugin sets it itself (only kernels < 5.15 needed it); the "
            f"DeepSpeed README says do not set it, though AWS nccl-tests still do "
            f"({SRC_EFA_ENV}; {SRC_DEEPSPEED})"
        ),
        "FI_EFA_ENABLE_SHM_TRANSFER": f"no-op / not needed ({SRC_CHEATSHEET}; {SRC_EFA_ENV})",
    }
)
"""Name -> reason and source. Never emitted by :func:`nccl_env` for any instance or stack."""

_FORBIDDEN_PREFIXES: tuple[str, ...] = ("RDMAV_",)

LEGACY_ONLY: Mapping[str, str] = MappingProxyType(
    {
        "NCCL_PROTO": (
            f"only for aws-ofi-nccl <= 1.5 on p4/p5; the DeepSpeed README says do not set it "
            f"({SRC_CHEATSHEET}; {SRC_DEEPSPEED})"
        ),
        "FI_EFA_USE_DEVICE_RDMA": (
            f"only for aws-ofi-nccl < 1.7 on p4/p5; not for libfabric >= 1.18 + aws-ofi-nccl "
            f">= 1.7 ({SRC_CHEATSHEET}; {SRC_EFA_ENV})"
        ),
        "FI_EFA_SET_CUDA_SYNC_MEMOPS": (
            f"only for EFA installer < 1.29.1 with NCCL >= 2.19 (the FSDP sample also claims a "
            f"throughput gain) ({SRC_CHEATSHEET})"
        ),
    }
)
"""Name -> reason. Emitted only by legacy rules; set by a user on a newer stack -> warning."""


def is_forbidden(name: str) -> bool:
    """True for names in :data:`FORBIDDEN` and for the whole ``RDMAV_*`` family (cheatsheet)."""
    return name in FORBIDDEN or name.startswith(_FORBIDDEN_PREFIXES)


# ---------------------------------------------------------------------------------------------
# Functions
# ---------------------------------------------------------------------------------------------
def _check_runtime(runtime: str) -> None:
    if runtime not in _RUNTIMES:
        raise ValueError(f"runtime must be one of {_RUNTIMES}, got {runtime!r}")


def nccl_env(
    instance: InstanceType, stack: StackVersions, runtime: Runtime
) -> tuple[EnvSetting, ...]:
    """The NCCL/EFA environment for one instance type, stack and runtime.

    Deterministic and duplicate-free: rules are applied in :data:`RULES` order; on a repeated
    name the later rule's setting replaces the earlier one at the earlier position. Empty for
    virtual/no-EFA types (the local lab), where any of these variables would only mislead.
    """
    _check_runtime(runtime)
    merged: dict[str, EnvSetting] = {}
    for rule in RULES:
        if rule.applies(instance, stack, runtime):
            for setting in rule.settings(instance, stack, runtime):
                merged[setting.name] = setting
    return tuple(merged.values())


def merge_env(
    profile: Sequence[EnvSetting], user: Mapping[str, str]
) -> tuple[list[EnvSetting], dict[str, str]]:
    """Split into (profile settings the user did not override, the user's env unchanged).

    A user value always wins, including ``LD_LIBRARY_PATH``: a user who sets it replaces the
    profile's prepend and must include the plugin path themselves (a validator may warn).
    """
    kept = [s for s in profile if s.name not in user]
    return kept, dict(user)


def user_env_warnings(
    instance: InstanceType,
    stack: StackVersions,
    runtime: Runtime,
    user: Mapping[str, str],
) -> list[str]:
    """Human warnings for user variables AWS guidance says not to set on this stack.

    The user still wins (see :func:`merge_env`); this only explains the risk.
    """
    emitted = {s.name for s in nccl_env(instance, stack, runtime)}
    warnings: list[str] = []
    for name in sorted(user):
        if name in FORBIDDEN:
            warnings.append(f"{name}: {FORBIDDEN[name]}")
        elif is_forbidden(name):
            warnings.append(f"{name}: {FORBIDDEN['RDMAV_FORK_SAFE']}")
        elif name in LEGACY_ONLY and name not in emitted:
            warnings.append(f"{name}: not needed on this stack/instance: {LEGACY_ONLY[name]}")
    return warnings


@dataclass(frozen=True)
class _Minimum:
    families: tuple[str, ...]
    component: Literal["efa_installer", "aws_ofi_nccl", "nccl"]
    minimum: Version
    note: str
    source: str


SRC_P5_MIN = f"{SRC_CHEATSHEET} (p5.48xlarge minimums)"
_MINIMUMS: tuple[_Minimum, ...] = (
    _Minimum(("p5", "p5e", "p5en"), "nccl", Version("2.18.0"), "2.18.5 recommended", SRC_P5_MIN),
    _Minimum(
        ("p5", "p5e", "p5en"), "aws_ofi_nccl", Version("1.7.2"), "1.7.3 recommended", SRC_P5_MIN
    ),
    _Minimum(("p5", "p5e", "p5en"), "efa_installer", Version("1.29.0"), "", SRC_P5_MIN),
    _Minimum(
        ("p6-b200",),
        "nccl",
        Version("2.29"),
        "with a matching aws-ofi-nccl/EFA stack (NeMo 25.11 container)",
        f"{SRC_VJEPA} (comment)",
    ),
)


def check_minimums(instance: InstanceType, stack: StackVersions) -> list[str]:
    """Warnings for known stack versions below the documented minimum for the instance.

    Unknown ("auto") versions are not warned about. The p5.48xlarge minimums are also applied to
    p5e/p5en as a floor (newer hardware of the same generation; the sheet documents p5 only).
    """
    warnings: list[str] = []
    for m in _MINIMUMS:
        if instance.family not in m.families:
            continue
        have: Version | None = getattr(stack, m.component)
        if have is not None and _base(have) < m.minimum:
            extra = f"; {m.note}" if m.note else ""
            floor = "" if instance.family == m.families[0] else " (p5 minimum used as a floor)"
            warnings.append(
                f"{instance.name}: {m.component} {have} is below the minimum {m.minimum}"
                f"{extra}{floor} [{m.source}]"
            )
    return warnings
