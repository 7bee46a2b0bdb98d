"""NCCL / libfabric / EFA environment profiles, as cited rules gated on stack versions.

Why rules instead of a fixed block of ``export`` lines: the AWS samples carry years of
accumulated flags (``FI_EFA_USE_DEVICE_RDMA=1 # use for p4d``, ``NCCL_PROTO=simple``,
``NCCL_BUFFSIZE``, an explicit ``NCCL_TUNER_PLUGIN``...). Most were needed only by old
aws-ofi-nccl / EFA installer releases, and some now cost performance (the explicit tuner path
cost 10.8 % alltoall bus bandwidth on p6-b300 with NCCL 2.30). The AWS guidance is "minimal by
default, legacy flags only for the versions that need them". So each flag is a :class:`Rule`
with the condition under which it is needed and the source that says so, and everything the
guidance says not to set is in :data:`FORBIDDEN` for a validator to warn about.

Conventions:

* A stack version of ``None`` ("auto") means "unknown, assume the current stack" (EFA >= 1.43,
  aws-ofi-nccl >= 1.14, NCCL >= 2.27). Legacy rules therefore fire only on *known* old versions,
  and :func:`check_minimums` only warns about *known* versions.
* A workaround for an NCCL bug fires only where the bug's trigger is present in the job
  (:class:`JobTraits`, e.g. a permuted ``CUDA_VISIBLE_DEVICES``), never for a whole instance
  family: ``Rule.trigger`` holds that condition as data, with its source.
* :func:`nccl_env` applies :data:`RULES` in order. When two rules set the same variable the later
  rule wins: its value and reason replace the earlier ones, in the position of the first
  occurrence (so the output order stays stable when a legacy rule re-states a default).
* ``raw_shell`` values are the only place shell syntax appears (the
  ``${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}`` prepend idiom of the legacy source-built plugin).
  They are constants of this module, never user input; :class:`EnvSetting` refuses ``$`` in
  non-raw values and quote/backslash characters in raw ones, so a renderer can emit
  ``export NAME="value"`` safely.
* The bundled plugin is *not* put on ``LD_LIBRARY_PATH``: its directory depends on the package
  version and distribution (``lib/<arch>-linux-gnu`` up to 1.16 on Ubuntu, ``lib`` from 1.17,
  ``lib64`` on RPM systems, ``/opt/amazon/aws-ofi-nccl/lib`` in NGC images), and every package
  registers it with the dynamic loader in ``/etc/ld.so.conf.d/100_ofinccl.conf``
  (aws/aws-ofi-nccl:contrib/fedora/aws-ofi-nccl.spec, contrib/debian-template/rules), which is
  how NCCL's ``dlopen("libnccl-net.so")`` finds it. A guessed path would be wrong on some of
  these layouts and would shadow the loader's right answer.
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
    "BLACKWELL_FAMILIES",
    "FORBIDDEN",
    "LEGACY_ONLY",
    "RULES",
    "EnvSetting",
    "JobTraits",
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
# Citations: primary sources only (repository paths, commits, issues, URLs)
# ---------------------------------------------------------------------------------------------
SRC_CHEATSHEET = "aws-samples/awsome-distributed-training:1.architectures/efa-cheatsheet.md"
SRC_EFA_ENV = "aws/aws-ofi-nccl:doc/efa-env-var.md"
SRC_REVIEW = "awslabs/awsome-distributed-ai commit a59b4db5 (May-2026 NCCL/EFA review)"
SRC_DEEPSPEED = "awslabs/awsome-distributed-ai:3.test_cases/pytorch/deepspeed/README.md"
SRC_BUNDLED = "aws-samples/awsome-distributed-training commit e5732423 (#861)"
SRC_AMI_SBATCH = (
    "awslabs/awsome-distributed-ai:micro-benchmarks/nccl-tests/slurm/nccl-tests-ami.sbatch"
)
SRC_LEGACY_PATH = "aws-samples/awsome-distributed-training:3.test_cases/jax/jax.sbatch"
SRC_VJEPA = (
    "awslabs/awsome-distributed-ai:3.test_cases/pytorch/vjepa2/slurm/benchmark_training_b200.sbatch"
)
SRC_TUNER = "aws/aws-ofi-nccl:doc/tuner.md"
SRC_GDR = "awslabs/awsome-distributed-ai commit 45e8f55d"
SRC_NCCL_ENV = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"
SRC_LDSO = (
    "aws/aws-ofi-nccl:contrib/fedora/aws-ofi-nccl.spec and contrib/debian-template/rules "
    "(/etc/ld.so.conf.d/100_ofinccl.conf)"
)
SRC_NVLS_BUG = "https://github.com/NVIDIA/nccl/issues/1906"
SRC_CUMEM_HANG = "https://github.com/NVIDIA/nccl/issues/1721"

# ---------------------------------------------------------------------------------------------
# Version thresholds (each cited where it is used)
# ---------------------------------------------------------------------------------------------
OFI_LEGACY_PROVIDER_BELOW = Version("1.6.0")  # aws-ofi-nccl <= 1.5.x
OFI_DEVICE_RDMA_BELOW = Version("1.7.0")  # aws-ofi-nccl 1.6.x (and older)
EFA_SYNC_MEMOPS_BELOW = Version("1.29.1")
NCCL_SYNC_MEMOPS_FROM = Version("2.19")
# aws-ofi-nccl is bundled with the EFA installer from about 1.36 (SRC_BUNDLED); approximate.
EFA_BUNDLES_OFI_FROM = Version("1.36.0")
# NVIDIA/nccl#1906: "regression in NCCL 2.26.2; NCCL 2.21.5 OK"; no release with the fix yet.
NCCL_NVLS_ORDER_BUG_FROM = Version("2.22")

_PREPEND = "${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
EFA_LIB = "/opt/amazon/efa/lib"
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
        """Build from recipe strings: ``"auto"`` -> ``None``, invalid -> ``ValueError``.

        An "auto" aws-ofi-nccl or libfabric is taken from what a known EFA installer release
        bundles (slurmfm/catalog/stack.py, from the EFA installer release notes).
        """
        from slurmfm.catalog.stack import bundled

        efa = _parse_version("efa_installer", efa_installer)
        ofi = _parse_version("aws_ofi_nccl", aws_ofi_nccl)
        fabric = _parse_version("libfabric", libfabric)
        bundle = bundled(efa)
        if bundle is not None:
            ofi = ofi or _parse_version("aws_ofi_nccl", bundle.aws_ofi_nccl)
            fabric = fabric or _parse_version("libfabric", bundle.libfabric)
        return cls(
            efa_installer=efa,
            libfabric=fabric,
            aws_ofi_nccl=ofi,
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


@dataclass(frozen=True)
class JobTraits:
    """What a job does that an NCCL bug's trigger depends on (not the hardware or versions).

    Why: a workaround such as ``NCCL_NVLS_ENABLE=0`` costs bandwidth for every job it is set on,
    so it belongs only on the jobs that meet the bug's trigger. ``cuda_visible_devices`` is the
    recipe's own value (``None``: Slurm's ascending GPU order); ``pipeline_parallel`` and
    ``nodes`` tell whether the job sends point-to-point traffic between nodes.
    """

    cuda_visible_devices: str | None = None
    pipeline_parallel: int = 1
    nodes: int = 1

    @property
    def permuted_devices(self) -> bool:
        """True when CUDA_VISIBLE_DEVICES lists GPU indices out of ascending order."""
        if not self.cuda_visible_devices:
            return False
        parts = [p.strip() for p in self.cuda_visible_devices.split(",") if p.strip()]
        if not all(p.isdigit() for p in parts):
            return False  # UUIDs / MIG names: no index order to compare
        nums = [int(p) for p in parts]
        return nums != sorted(nums)

    @property
    def internode_send_recv(self) -> bool:
        """Pipeline stages on different nodes talk through NCCL send/recv."""
        return self.pipeline_parallel > 1 and self.nodes > 1


RuleCheck = Callable[[InstanceType, StackVersions, Runtime], bool]
RuleSettings = Callable[[InstanceType, StackVersions, Runtime], tuple[EnvSetting, ...]]
RuleTrigger = Callable[[JobTraits], bool]


@dataclass(frozen=True)
class Rule:
    """A condition on (instance, stack, runtime) and the variables it requires, with a source.

    ``trigger``, when set, is the further condition on the job itself (:class:`JobTraits`) under
    which a bug workaround is needed; ``trigger_text`` says it in words for the reader.
    ``verified`` is False when the only evidence is indirect (e.g. an EKS test rather than a
    Slurm job, or an approximate version boundary).
    """

    id: str
    description: str
    source: str
    applies: RuleCheck
    settings: RuleSettings
    verified: bool = True
    trigger: RuleTrigger | None = None
    trigger_text: str = ""

    def fires(self, i: InstanceType, s: StackVersions, r: Runtime, traits: JobTraits) -> bool:
        """Both the stack condition and, if any, the job trigger hold."""
        return self.applies(i, s, r) and (self.trigger is None or self.trigger(traits))


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


def _nvls_order_bug(s: StackVersions) -> bool:
    """NCCL releases with the NVLS rank-order regression: unknown counts as affected."""
    return s.nccl is None or _base(s.nccl) >= NCCL_NVLS_ORDER_BUG_FROM


def _const(*settings: EnvSetting) -> RuleSettings:
    def produce(_i: InstanceType, _s: StackVersions, _r: Runtime) -> tuple[EnvSetting, ...]:
        return settings

    return produce


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
            "data path is EFA and unaffected. The exclusion form (a leading ^, NCCL's env var "
            "docs) works on every instance type without knowing interface names; the AWS AMI "
            "nccl-tests job and the B200 V-JEPA2 job set exactly this value."
        ),
        source=f"{SRC_AMI_SBATCH}; {SRC_VJEPA}; {SRC_NCCL_ENV}#nccl-socket-ifname",
        applies=lambda i, s, r: _uses_efa(i),
        settings=_const(
            EnvSetting(
                "NCCL_SOCKET_IFNAME",
                "^docker,lo,veth",
                "NCCL bootstrap sockets: exclude docker/loopback/veth interfaces",
                f"{SRC_AMI_SBATCH}; {SRC_NCCL_ENV}#nccl-socket-ifname",
            )
        ),
    ),
    Rule(
        id="nccl-debug-warn",
        description=(
            "NCCL_DEBUG=WARN: NCCL errors get an explicit message at no cost, without INFO's "
            "per-rank init output in every training log. Set NCCL_DEBUG=INFO in the recipe env "
            "(user wins) to see which network plugin NCCL selected when diagnosing."
        ),
        source=f"{SRC_NCCL_ENV}#nccl-debug",
        applies=lambda i, s, r: _uses_efa(i),
        settings=_const(
            EnvSetting(
                "NCCL_DEBUG",
                "WARN",
                "report NCCL errors; set NCCL_DEBUG=INFO to debug EFA selection",
                f"{SRC_NCCL_ENV}#nccl-debug",
            )
        ),
    ),
    Rule(
        id="plugin-path-legacy",
        description=(
            "EFA installer older than ~1.36 did not bundle aws-ofi-nccl; the samples built it "
            "from source into /opt/aws-ofi-nccl/install/lib (host and container alike), which "
            "no ld.so.conf.d entry names, so it must be on LD_LIBRARY_PATH. The 1.36 boundary "
            "is approximate, hence unverified. Bundled packages need no path: they register "
            "their directory with the loader."
        ),
        source=f"{SRC_BUNDLED}; {SRC_LEGACY_PATH}",
        applies=lambda i, s, r: _uses_efa(i) and _legacy_ofi_install(s),
        settings=_const(
            EnvSetting(
                name="LD_LIBRARY_PATH",
                value=f"{OFI_LEGACY_LIB}:{EFA_LIB}{_PREPEND}",
                reason=(
                    "prepend the source-built aws-ofi-nccl (pre-bundling EFA installer) + libfabric"
                ),
                source=f"{SRC_BUNDLED}; {SRC_LEGACY_PATH}",
                raw_shell=True,
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
        id="nvls-permuted-devices",
        description=(
            "NVLS AllGather/ReduceScatter inside a node returns chunks in the wrong rank order "
            "when CUDA_VISIBLE_DEVICES permutes the GPUs (NVIDIA/nccl#1906, a regression after "
            "2.21.5, no fixed release recorded): silent wrong results. Disable NVLS only for "
            "jobs that permute the devices; it is not specific to p5en."
        ),
        source=SRC_NVLS_BUG,
        applies=lambda i, s, r: _uses_efa(i) and i.gpus > 1 and _nvls_order_bug(s),
        settings=_const(
            EnvSetting(
                "NCCL_NVLS_ENABLE",
                "0",
                "CUDA_VISIBLE_DEVICES is permuted: NVLS rank-order bug NVIDIA/nccl#1906",
                SRC_NVLS_BUG,
            )
        ),
        trigger=lambda t: t.permuted_devices,
        trigger_text="the recipe's CUDA_VISIBLE_DEVICES lists GPU indices out of order",
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
    instance: InstanceType,
    stack: StackVersions,
    runtime: Runtime,
    traits: JobTraits | None = None,
) -> tuple[EnvSetting, ...]:
    """The NCCL/EFA environment for one instance type, stack, runtime and job.

    Deterministic and duplicate-free: rules are applied in :data:`RULES` order; on a repeated
    name the later rule's setting replaces the earlier one at the earlier position. Empty for
    virtual/no-EFA types (the local lab), where any of these variables would only mislead.
    ``traits`` defaults to a job that meets no bug trigger.
    """
    _check_runtime(runtime)
    job = traits or JobTraits()
    merged: dict[str, EnvSetting] = {}
    for rule in RULES:
        if rule.fires(instance, stack, runtime, job):
            for setting in rule.settings(instance, stack, runtime):
                merged[setting.name] = setting
    return tuple(merged.values())


def merge_env(
    profile: Sequence[EnvSetting], user: Mapping[str, str]
) -> tuple[list[EnvSetting], dict[str, str]]:
    """Split into (profile settings the user did not override, the user's env unchanged).

    A user value always wins, including ``LD_LIBRARY_PATH``: a user who sets it replaces the
    legacy plugin prepend and must include the plugin path themselves (a validator may warn).
    """
    kept = [s for s in profile if s.name not in user]
    return kept, dict(user)


CUMEM_OFF_HANG = (
    "NCCL_CUMEM_ENABLE=0 has an open report of NCCL send/recv hanging across nodes "
    f"({SRC_CUMEM_HANG}); pipeline parallelism across nodes uses exactly that path"
)


MNNVL_FORCED = (
    "1 restates NCCL's default (auto: multi-node NVLink is used where it works) and also "
    f"forces the MNNVL check on single-node communicators ({SRC_NCCL_ENV}#nccl-mnnvl-enable; "
    "NVIDIA/nccl:src/mnnvl.cc)"
)


def user_env_warnings(
    instance: InstanceType,
    stack: StackVersions,
    runtime: Runtime,
    user: Mapping[str, str],
    traits: JobTraits | None = None,
) -> list[str]:
    """Human warnings for user variables AWS guidance says not to set on this stack.

    The user still wins (see :func:`merge_env`); this only explains the risk.
    """
    job = traits or JobTraits()
    emitted = {s.name for s in nccl_env(instance, stack, runtime, job)}
    warnings: list[str] = []
    for name in sorted(user):
        if name in FORBIDDEN:
            warnings.append(f"{name}: {FORBIDDEN[name]}")
        elif is_forbidden(name):
            warnings.append(f"{name}: {FORBIDDEN['RDMAV_FORK_SAFE']}")
        elif name in LEGACY_ONLY and name not in emitted:
            warnings.append(f"{name}: not needed on this stack/instance: {LEGACY_ONLY[name]}")
        elif name == "NCCL_CUMEM_ENABLE" and user[name] == "0" and job.internode_send_recv:
            warnings.append(f"{name}: {CUMEM_OFF_HANG}")
        elif name == "NCCL_MNNVL_ENABLE" and user[name] == "1":
            warnings.append(f"{name}: {MNNVL_FORCED}")
    return warnings


@dataclass(frozen=True)
class _Minimum:
    families: tuple[str, ...]
    component: Literal["efa_installer", "aws_ofi_nccl", "nccl"]
    minimum: Version
    note: str
    source: str


SRC_P5_MIN = f"{SRC_CHEATSHEET} (p5.48xlarge minimums)"
SRC_NCCL_BLACKWELL = (
    'https://github.com/NVIDIA/nccl/releases/tag/v2.25.1-1 ("Add Blackwell/SM100 support", '
    "with the IMEX checks MNNVL needs; NVIDIA/nccl commit 80f6bda4); "
    'https://github.com/NVIDIA/nccl/issues/1611 ("GB200 and Blackwell were officially supported '
    'in the NCCL 2.25.1 and later releases")'
)
BLACKWELL_FAMILIES: tuple[str, ...] = ("p6-b200", "p6-b300", "p6e-gb200")
"""Instance families with Blackwell GPUs (B200, B300, GB200): one NCCL floor for all of them.

B300 is SM 10.3: NCCL's sm_100 cubins run on it (CUDA runs a cubin on any later minor revision
of its major one), so the floor that added SM100 is the floor for it too."""
_MINIMUMS: tuple[_Minimum, ...] = (
    _Minimum(("p5", "p5e", "p5en"), "nccl", Version("2.18.0"), "2.18.5 recommended", SRC_P5_MIN),
    _Minimum(
        ("p5", "p5e", "p5en"), "aws_ofi_nccl", Version("1.7.2"), "1.7.3 recommended", SRC_P5_MIN
    ),
    _Minimum(("p5", "p5e", "p5en"), "efa_installer", Version("1.29.0"), "", SRC_P5_MIN),
    _Minimum(
        BLACKWELL_FAMILIES,
        "nccl",
        Version("2.25.1"),
        "the NCCL release that added Blackwell support; AWS's B200 sample runs 2.29 with a "
        f"matching aws-ofi-nccl/EFA stack ({SRC_VJEPA})",
        SRC_NCCL_BLACKWELL,
    ),
)


def check_minimums(instance: InstanceType, stack: StackVersions) -> list[str]:
    """Warnings for known stack versions below the documented minimum for the instance.

    Unknown ("auto") versions are not warned about. The p5.48xlarge minimums are also applied to
    p5e/p5en as a floor (newer hardware of the same generation; the sheet documents p5 only).
    An NCCL newer than the plugin's release series was tested with is warned about too
    (slurmfm/catalog/stack.py).
    """
    from slurmfm.catalog.stack import untested_nccl

    warnings: list[str] = []
    untested = untested_nccl(stack.aws_ofi_nccl, stack.nccl)
    if untested:
        warnings.append(untested)
    for m in _MINIMUMS:
        if instance.family not in m.families:
            continue
        have: Version | None = getattr(stack, m.component)
        if have is not None and _base(have) < m.minimum:
            extra = f"; {m.note}" if m.note else ""
            floor = (
                " (p5 minimum used as a floor)"
                if m.families[0] == "p5" and instance.family != "p5"
                else ""
            )
            warnings.append(
                f"{instance.name}: {m.component} {have} is below the minimum {m.minimum}"
                f"{extra}{floor} [{m.source}]"
            )
    return warnings
