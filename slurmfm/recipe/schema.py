"""The recipe schema: what a user may write in ``recipe.yaml``, validated by pydantic v2.

Why strict: a typo such as ``tensor_paralel: 8`` silently ignored would launch a wrong job on
hundreds of GPUs. Every model forbids unknown keys, numbers are checked against each other
(``tp*pp*cp`` must divide the world size, ``ep`` must divide ``dp*cp``, as in Megatron-LM's
``initialize_model_parallel``), and names that end up on ``#SBATCH`` lines are restricted to
characters sbatch parses safely.
"""

from __future__ import annotations

import math
import re
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import (
    Field,
    StringConstraints,
    field_validator,
    model_validator,
)

from slurmfm.job.options import BatchOptions

# The launcher sections live with their launchers (slurmfm/launchers/), which is the only
# list of kinds (``SPECS``): the schema names none of them (issue 43).
from slurmfm.launchers import (
    SAVE_ON_SIGNAL_LAUNCHERS,
    SERVE_KINDS,
    SPECS,
    Launcher,
    ServeLauncher,
    server_spec,
    spec,
)
from slurmfm.recipe.sweep import Sweep
from slurmfm.strict import _Strict

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType


def _words(names: tuple[str, ...]) -> str:
    """``a, b and c``: a list of the registry's kinds in a field's description."""
    return " and ".join(filter(None, (", ".join(names[:-1]), names[-1] if names else "")))


Flavor = Literal["parallelcluster", "pcs", "hyperpod", "generic"]

# Slurm job names, partitions, accounts, QOS, reservations: conservative identifiers.
SlurmName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}$")]
EnvName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")]

# What an `#SBATCH --output=` path may hold: slurmfm.quote's #SBATCH characters less `%`.
_LOG_DIR_CHARS = re.compile(r"^[A-Za-z0-9_@+=:,./\-\[\]&|!*()]$")

_TIME_RE = re.compile(r"^(?:(?P<d>\d+)-)?(?:(?P<h>\d+):)?(?P<m>\d+)(?::(?P<s>\d+))?$")


def parse_time_limit(text: str) -> int:
    """Parse a Slurm time limit into minutes (rounded up), accepting Slurm's own formats.

    Slurm accepts "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
    "days-hours:minutes" and "days-hours:minutes:seconds" (sbatch(1), ``--time``).
    """
    text = text.strip()
    if text.upper() in {"UNLIMITED", "INFINITE"}:
        return -1
    m = re.fullmatch(r"(\d+)-(\d+)(?::(\d+))?(?::(\d+))?", text)
    if m:
        d, h, mi, s = (int(x) if x else 0 for x in m.groups())
        return d * 1440 + h * 60 + mi + (1 if s else 0)
    parts = text.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3:
        raise ValueError(
            f"{text!r} is not a Slurm time limit (minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM:SS)"
        )
    nums = [int(p) for p in parts]
    if len(nums) == 1:
        return nums[0]
    if len(nums) == 2:
        return nums[0] + (1 if nums[1] else 0)
    return nums[0] * 60 + nums[1] + (1 if nums[2] else 0)


# Numbers a YAML boolean must not silently become (pydantic's lax mode reads true as 1).
class Cluster(_Strict):
    """Where the job runs. ``slurm_version: auto`` asks the cluster (``sbatch --version``)."""

    flavor: Flavor = "generic"
    slurm_version: str = "auto"
    partition: SlurmName | None = None
    account: SlurmName | None = None
    qos: SlurmName | None = None
    reservation: SlurmName | None = None
    constraints: str | None = Field(
        default=None, description="Slurm feature expression for --constraint, e.g. 'efa&p5'"
    )
    instance_type: str = "p5.48xlarge"

    @field_validator("slurm_version", mode="before")
    @classmethod
    def _version_number(cls, v: object) -> object:
        # YAML reads 24.11 as a float; 22.10 would silently become 22.1. Slurm minors are
        # always two digits, so a float is accepted only when it reads back unambiguously.
        if isinstance(v, float) and not isinstance(v, bool):
            text = repr(v)
            if re.fullmatch(r"\d{2}\.\d{2}", text):
                return text
            raise ValueError(f"{v!r} is ambiguous as a number; quote the version, e.g. '24.11'")
        return v

    @field_validator("slurm_version")
    @classmethod
    def _version(cls, v: str) -> str:
        if v == "auto":
            return v
        from slurmfm.catalog.slurm_features import SlurmVersion

        SlurmVersion.parse(v)
        return v

    @field_validator("instance_type")
    @classmethod
    def _itype(cls, v: str) -> str:
        from slurmfm.catalog.instances import get_instance

        return get_instance(v).name

    @field_validator("constraints")
    @classmethod
    def _constraints(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9_.\-&|!*()\[\]:,]+", v):
            raise ValueError("only feature names and the operators & | ! * ( ) [ ] are allowed")
        return v


class Resources(_Strict):
    """How much of the cluster. GPUs per node come from the instance type."""

    nodes: int = Field(default=1, ge=1, le=100_000)
    time_limit: str = "01:00:00"
    exclusive: bool = True
    procs_per_node: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description=(
            "processes per node; defaults to the instance's GPU count. Required for instance "
            "types without GPUs (the local CPU lab)."
        ),
    )
    mem: str | None = Field(default=None, pattern=r"^\d+[KMGT]?$")
    spare_nodes: int = Field(
        default=0,
        ge=0,
        le=1024,
        description=(
            "extra nodes allocated beside `nodes` (--nodes is nodes + spare_nodes) that stand "
            "by: a node that fails the health gate or dies is swapped for one inside the job "
            "and the step relaunched, without a requeue (docs/resilience.md)"
        ),
    )
    exclude: str | None = Field(default=None, description="hostlist of nodes to avoid")
    singleton: bool = Field(
        default=False,
        description=(
            "--dependency=singleton: at most one job of this name and user runs at a time "
            "(chained training segments that must never overlap)"
        ),
    )
    cpu_binding: Literal["auto", "off"] = Field(
        default="auto",
        description=(
            "auto: bind each worker to its GPU's NUMA node (torchrun --numa-binding=node where "
            "the image's torch >= 2.9 has it; srun --cpu-bind=map_ldom for one task per GPU, "
            "NeMo); off: leave placement to the launcher (slurmfm/catalog/binding.py)"
        ),
    )
    segments: Literal["auto", "consolidate", "spread"] = Field(
        default="auto",
        description=(
            "how --segment groups of a multi-UltraServer job are placed (topology/block, Slurm "
            ">= 25.11): auto = --consolidate-segments where Slurm has it (as few blocks as "
            "possible), spread = --spread-segments (each on a block of its own)"
        ),
    )

    @field_validator("time_limit", mode="before")
    @classmethod
    def _time_number(cls, v: object) -> object:
        # `time_limit: 30` in YAML is an int: Slurm reads a bare number as minutes.
        if isinstance(v, int) and not isinstance(v, bool):
            return str(v)
        return v

    @field_validator("time_limit")
    @classmethod
    def _time(cls, v: str) -> str:
        parse_time_limit(v)
        return v

    @field_validator("exclude")
    @classmethod
    def _exclude(cls, v: str | None) -> str | None:
        if v is not None and not re.fullmatch(r"[A-Za-z0-9_.\-\[\],]+", v):
            raise ValueError("must be a Slurm hostlist such as 'node[001-004],node010'")
        return v

    @property
    def time_minutes(self) -> int:
        return parse_time_limit(self.time_limit)


class Parallelism(_Strict):
    """Model-parallel layout; ``dp`` is derived as world / (tp * pp * cp)."""

    tp: int = Field(default=1, ge=1)
    pp: int = Field(default=1, ge=1)
    cp: int = Field(default=1, ge=1)
    ep: int = Field(default=1, ge=1)


class Serve(_Strict):
    """A serving group beside the trainer, as in GRPO/RL post-training: the trainer sends
    prompts to a generation server it starts with.

    ``split`` divides one allocation: the last ``nodes`` hosts of the job's host order serve
    and the rest train, so the trainer keeps the planner's compact prefix (the TRL GRPO
    sample on AWS serves from the last node: aws-samples/awsome-distributed-training:3.test_cases).
    ``hetjob`` asks for a second heterogeneous component (``#SBATCH hetjob``) when the
    server needs another node shape (instance type, partition).
    """

    nodes: int = Field(ge=1, le=100_000)
    placement: Literal["split", "hetjob"] = "split"
    launcher: ServeLauncher
    parallelism: Parallelism = Field(default_factory=Parallelism)
    instance_type: str | None = Field(default=None, description="hetjob only")
    partition: SlurmName | None = Field(default=None, description="hetjob only")
    procs_per_node: int | None = Field(default=None, ge=1, le=1024)

    @field_validator("instance_type")
    @classmethod
    def _itype(cls, v: str | None) -> str | None:
        from slurmfm.catalog.instances import get_instance

        return None if v is None else get_instance(v).name

    @model_validator(mode="after")
    def _hetjob_only(self) -> Serve:
        if self.placement == "split":
            for name in ("instance_type", "partition"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"serve.{name}: only with placement: hetjob (a split shares the "
                        "trainer's nodes)"
                    )
        return self


class Container(_Strict):
    """A Pyxis/enroot container for every launch step."""

    image: str = Field(min_length=1)
    mounts: list[str] = Field(default_factory=list)
    workdir: str | None = None
    mount_home: bool = False
    named: bool = Field(
        default=True,
        description=(
            "one named container per attempt (--container-name), reused by its steps on each "
            "node instead of unpacking the image for each; false where Pyxis runs with "
            "use_squashfuse=1, which mounts the image only for unnamed containers "
            "(NVIDIA/pyxis pyxis_slurmstepd.c, pyxis_can_direct_start_squashfs)"
        ),
    )
    pyxis: str = Field(
        default="auto",
        description=(
            "Pyxis version on the nodes; auto assumes >= 0.15 (AWS stacks install 0.19-0.20), "
            "which has --container-env (slurmfm.catalog.containers)"
        ),
    )
    enroot: str = Field(
        default="auto",
        description=(
            "Enroot version on the nodes; auto assumes < 4.0 (AWS stacks install 3.4-3.5), "
            "which does not mount the IMEX channels GB200 needs"
        ),
    )

    @field_validator("pyxis", "enroot", mode="before")
    @classmethod
    def _version_text(cls, v: object) -> object:
        # YAML reads 0.20 as a float: take it as written.
        if isinstance(v, int | float) and not isinstance(v, bool):
            return str(v)
        return v

    @field_validator("pyxis", "enroot")
    @classmethod
    def _version(cls, v: str) -> str:
        from slurmfm.catalog.containers import parse_version

        parse_version("version", v)
        return v

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, v: list[str]) -> list[str]:
        for m in v:
            if "," in m:
                raise ValueError(
                    f"{m!r}: Pyxis separates mounts with ',', so a path cannot hold one"
                )
            if not m.startswith("/"):
                raise ValueError(f"{m!r}: mounts are SRC[:DST[:FLAGS]] with absolute paths")
        return v


class PythonEnv(_Strict):
    """A host Python environment to activate instead of a container."""

    activate: str | None = Field(default=None, description="path to a venv's bin/activate")
    conda_env: str | None = None
    modules: list[str] = Field(default_factory=list, description="environment modules to load")

    @model_validator(mode="after")
    def _one(self) -> PythonEnv:
        if self.activate and self.conda_env:
            raise ValueError("give either activate or conda_env, not both")
        return self


class Storage(_Strict):
    """Where checkpoints, data and logs live (FSx for Lustre at /fsx by default)."""

    checkpoint_root: str = "/fsx/checkpoints"
    data: dict[EnvName, str] = Field(
        default_factory=dict, description="named data paths, exported as SLURMFM_DATA_<NAME>"
    )
    log_dir: str = "/fsx/logs"
    run_id: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="stable id for resume across submissions; default: the job name",
    )
    stripe: Literal["auto", "off"] = Field(
        default="auto",
        description=(
            "auto: on Lustre (detected at job start), lay out the run's checkpoint directory "
            "for the checkpoint format (file-per-rank formats -- Megatron, NeMo -- get a "
            "progressive layout, lfs setstripe -E 64M -c 1 -E 1G -c 4 -E -1 -c 8; others keep "
            "the file system's default); off: never; the shared log directory is never restriped"
        ),
    )
    min_free_gb: float = Field(
        default=0,
        ge=0,
        description="GiB; fail at start when less is free (on Lustre: on the emptiest OST)",
    )
    write_mb_s: float = Field(
        default=300,
        gt=0,
        description=(
            "MB/s the checkpoint file system sustains for one job's save. Default: an FSx for "
            "Lustre PERSISTENT_2 file system of 1.2 TiB at 250 MB/s/TiB, the smallest AWS "
            "reference size (https://docs.aws.amazon.com/fsx/latest/LustreGuide/performance.html); "
            "throughput scales with capacity, so set your file system's figure"
        ),
    )
    keep_last: int | None = Field(
        default=None, ge=1, description="keep only the newest K checkpoints (exported for scripts)"
    )

    @field_validator("log_dir")
    @classmethod
    def _log_dir(cls, v: str) -> str:
        # It becomes `#SBATCH --output=<log_dir>/%x_%j.out`: sbatch expands every `%` there
        # (sbatch(1), "filename pattern") while the job creates the literal directory, so the
        # output would go nowhere. Same characters as render's #SBATCH check, less `%`.
        if not v:
            raise ValueError("must not be empty")
        bad = sorted({c for c in v if not _LOG_DIR_CHARS.fullmatch(c)})
        if "%" in bad:
            raise ValueError(
                f"{v!r}: '%' is a filename pattern for sbatch --output (sbatch(1)); "
                "the directory would not match"
            )
        if bad:
            shown = ", ".join(repr(c) for c in bad)
            raise ValueError(
                f"{v!r} has characters that #SBATCH lines cannot carry safely ({shown})"
            )
        return v

    @field_validator("checkpoint_root")
    @classmethod
    def _checkpoint_root(cls, v: str) -> str:
        # An empty root or `/` would put checkpoints at /<name>/<run_id> on the node's root.
        if not v.strip("/ "):
            raise ValueError(
                f"{v!r}: give a directory for checkpoints, e.g. /fsx/checkpoints (checkpoints "
                "go to <checkpoint_root>/<name>/<run_id>)"
            )
        return v


# What the job runtime does when the script does not say otherwise: the recipe's defaults.
_RUNTIME = BatchOptions()


class Resilience(_Strict):
    """Requeue, pre-timeout save, restart cap, health gate and NCCL transport check.

    The defaults of what the job runtime does are the runtime's own
    (:class:`slurmfm.job.options.BatchOptions`): one set of defaults for both sides.

    The pre-timeout signal is SIGUSR2: NCCL catches SIGUSR1 for itself, which is why submitit
    moved to USR2 (https://github.com/facebookincubator/submitit/pull/1697).
    """

    requeue: bool = _RUNTIME.requeue
    expedited_requeue: bool = Field(
        default=_RUNTIME.expedite,
        description=(
            "sbatch --requeue=expedite (Slurm >= 25.11): a requeued job may start again at "
            "once instead of after the credential lifetime (AuthInfo=cred_expire, 120 s by "
            "default). The cluster must allow it (SlurmctldParameters=enable_expedited_requeue;"
            " otherwise sbatch refuses the job). https://slurm.schedmd.com/news.html (25.11)"
        ),
    )
    max_restarts: int = Field(default=_RUNTIME.max_restarts, ge=0, le=1000)
    hang_timeout: str = Field(
        default=f"{int(_RUNTIME.hang_timeout_s) // 60}m",
        description=(
            "a launch with no progress (report_progress, a new checkpoint, a Megatron or NeMo "
            "iteration line) for this long is a hang: stacks dumped, stopped, retried. "
            "Seconds or NUMBER with s, m or h; 'none' turns it off. Default 30m: above NCCL's "
            "own 10-minute collective timeout and a large model's checkpoint save"
        ),
    )
    startup_timeout: str = Field(
        default=f"{int(_RUNTIME.startup_timeout_s) // 3600}h",
        description=(
            "until a launch's first progress the hang watch waits this long instead of "
            "hang_timeout: an image import on many nodes, a large checkpoint load or a first "
            "data index build can take longer than hang_timeout before the first iteration "
            "line. A launch stopped in start-up says 'no first progress within ...' with the "
            "workers' stacks; the job log prints each launch's time to first progress. Same "
            "form as hang_timeout; 'none': hang_timeout from the start"
        ),
    )
    restart_in_job: bool = Field(
        default=_RUNTIME.restart_in_job,
        description=(
            "a retryable failure on nodes that all answer relaunches the step inside the "
            "allocation (no requeue, no credential wait, no queueing), counted against "
            "max_restarts; a lost node, a failed health gate and the pre-timeout signal "
            "still requeue"
        ),
    )
    save_before_timeout_s: int = Field(
        default=300,
        ge=0,
        le=65535,
        description="seconds before the time limit at which training is told to save; 0: never",
    )
    log_mode: Literal["append", "per_restart"] = "append"
    health_gate: Literal["auto", "on", "off"] = Field(
        default="auto", description="auto: on for GPU instance types, off for the CPU lab"
    )
    dcgm_level: Literal[0, 1] = 0
    drain_unhealthy: bool = _RUNTIME.drain
    nccl_transport_check: Literal["auto", "fail", "warn", "off"] = Field(
        default="auto", description="auto: fail on EFA instance types, off elsewhere"
    )
    nccl_check_timeout_s: int = Field(default=int(_RUNTIME.nccl_timeout_s), ge=10)
    fabric_test: Literal["off", "warn", "fail"] = Field(
        default="off",
        description=(
            "before the first launch of an attempt, run nccl-tests' all_reduce_perf across the "
            "allocation (one rank per GPU, in the launch's container) and compare its peak bus "
            "bandwidth with a floor: warn logs it, fail ends the attempt below it (a node the "
            "test singles out is drained and the job requeued off it). slurmfm/catalog/fabric.py"
        ),
    )
    fabric_test_command: str = Field(
        default="all_reduce_perf",
        min_length=1,
        pattern=r"^[^\s]+$",
        description="nccl-tests' all_reduce_perf: a name on the image's PATH, or a path",
    )
    fabric_min_busbw_gbs: float | None = Field(
        default=None,
        gt=0,
        description=(
            "peak bus bandwidth floor in GB/s; default: 0.8 x AWS's measured figure for the "
            "instance type (slurmfm/catalog/fabric.py)"
        ),
    )
    fabric_timeout_s: int = Field(default=1800, ge=60, le=86400)
    save_on_signal: bool | None = Field(
        default=None,
        description=(
            "true: the training saves and exits when told (USR2 for torchrun scripts, TERM for "
            "Megatron-LM's --exit-signal-handler and NeMo 2.0's PreemptionCallback), then the "
            "job requeues; false: the training has no such handler, so the job requeues at once "
            "at the signal and resumes from its last periodic checkpoint. Default by launcher: "
            f"true for {_words(SAVE_ON_SIGNAL_LAUNCHERS)}, false for "
            f"{_words(tuple(k for k in SPECS if k not in SAVE_ON_SIGNAL_LAUNCHERS))}"
        ),
    )
    retry_exit_codes: list[Annotated[int, Field(ge=1, le=255)]] = Field(
        default_factory=list,
        description=(
            "step exit codes retried whatever the evidence says (an override); otherwise a "
            "failure is judged by evidence: an ImportError or argument error before any "
            "progress fails at once, a failure after progress is retried, the same failure "
            "twice without progress is a crash loop (docs/resilience.md)"
        ),
    )
    model_params_b: float | None = Field(
        default=None,
        gt=0,
        description=(
            "model size in billions of parameters; with it slurmfm checks that "
            "save_before_timeout_s can hold one save at storage.write_mb_s"
        ),
    )
    checkpoint_bytes_per_param: float = Field(
        default=14,
        gt=0,
        description=(
            "bytes a checkpoint holds per parameter: 2 (bf16 weights) + 12 (fp32 master "
            "weights and Adam's two moments), the mixed-precision Adam accounting of ZeRO "
            "(https://arxiv.org/abs/1910.02054, section 3.1) minus the gradients, which are "
            "not saved"
        ),
    )

    expected_failure_interval: str | None = Field(
        default=None,
        description=(
            "the mean time between failures you expect for this job (e.g. 6h: one failure "
            "every 6 hours; Llama 3 405B saw one about every 3 h on 16,384 GPUs). With it, "
            "validate gives the Young/Daly checkpoint interval sqrt(2*C*M) for Megatron's "
            "--save-interval. Seconds or NUMBER with s, m or h"
        ),
    )

    @field_validator("expected_failure_interval", mode="before")
    @classmethod
    def _failure_interval(cls, v: object) -> str | None:
        if v is None:
            return None
        text = str(v).strip().lower()
        m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([smh]?)", text)
        if m is None or float(m.group(1)) <= 0:
            raise ValueError(
                f"{str(v)!r} is not a duration above 0: seconds, or a number with s, m or h"
            )
        return text

    @property
    def expected_failure_interval_s(self) -> float | None:
        """The expected time between failures in seconds, None when not stated."""
        text = self.expected_failure_interval
        if text is None:
            return None
        unit = {"s": 1, "m": 60, "h": 3600}.get(text[-1], 1)
        return float(text.rstrip("smh")) * unit

    @field_validator("hang_timeout", "startup_timeout", mode="before")
    @classmethod
    def _hang_timeout(cls, v: object) -> str:
        text = str(v).strip().lower()
        if text == "none" or re.fullmatch(r"[0-9]+[smh]?", text):
            return text
        raise ValueError(f"{v!r} is not a duration: seconds, or a number with s, m or h; none")

    @property
    def hang_timeout_s(self) -> int:
        """The hang timeout in seconds (0: off)."""
        return _duration_s(self.hang_timeout)

    @property
    def startup_timeout_s(self) -> int:
        """The start-up allowance in seconds (0: none, hang_timeout from the start)."""
        return _duration_s(self.startup_timeout)


def _duration_s(text: str) -> int:
    """A validated duration (``90``, ``30m``, ``1h``, ``none``) in seconds (none: 0)."""
    if text == "none":
        return 0
    unit = {"s": 1, "m": 60, "h": 3600}.get(text[-1], 1)
    return int(text.rstrip("smh")) * unit


class Network(_Strict):
    """Versions of the EFA/NCCL stack; ``auto`` assumes a current stack."""

    efa_installer: str = "auto"
    libfabric: str = "auto"
    aws_ofi_nccl: str = "auto"
    nccl: str = "auto"
    nccl_debug: Literal["VERSION", "WARN", "INFO", "TRACE"] | None = None
    imex_channel: Literal["job", "segment"] = Field(
        default="job",
        description=(
            "segment: one IMEX channel per --segment group (--network=unique-channel-per-segment"
            ", switch/nvidia_imex, Slurm >= 25.11); job: one channel for the whole job"
        ),
    )

    @model_validator(mode="after")
    def _versions(self) -> Network:
        from slurmfm.catalog.nccl import StackVersions

        StackVersions.parse(self.efa_installer, self.libfabric, self.aws_ofi_nccl, self.nccl)
        return self


class Observability(_Strict):
    """Per-job metrics for the cluster's Prometheus and Grafana (see slurmfm.observe.agent).

    ``textfile_dir`` is read by node_exporter's textfile collector; its default is the
    directory of node_exporter's own systemd example
    (prometheus/node_exporter ``examples/systemd/sysconfig.node_exporter``); Debian and Ubuntu's
    ``prometheus-node-exporter`` package reads ``/var/lib/prometheus/node-exporter`` instead.
    ``dcgm_job_mapping_dir`` is DCGM-Exporter's ``--hpc-job-mapping-dir`` (no default upstream);
    the default is the directory the HyperPod lifecycle scripts' Slurm prolog fills
    (aws-samples/awsome-distributed-training:1.architectures/5.sagemaker-hyperpod/
    LifecycleScripts). A directory that does not exist on a node is skipped with
    one warning: the job never fails because of metrics. ``null`` turns a part off.
    """

    enabled: Literal["auto", "on", "off"] = Field(
        default="auto", description="auto: on for GPU instance types, off for the CPU lab"
    )
    textfile_dir: str | None = "/var/lib/node_exporter/textfile_collector"
    dcgm_job_mapping_dir: str | None = "/run/slurm/dcgm_job_mapping"
    efa_counters: bool = Field(
        default=True, description="snapshot EFA hw_counters at start and end (slurmfm report)"
    )
    interval_s: int = Field(default=15, ge=1, le=3600, description="textfile update period")

    @field_validator("textfile_dir", "dcgm_job_mapping_dir")
    @classmethod
    def _absolute(cls, v: str | None) -> str | None:
        if v is not None and not v.startswith("/"):
            raise ValueError("must be an absolute path (it is read on every node)")
        return v


class Recipe(_Strict):
    """A whole job: the validated value every later stage consumes."""

    name: SlurmName
    cluster: Cluster = Field(default_factory=Cluster)
    resources: Resources = Field(default_factory=Resources)
    parallelism: Parallelism = Field(default_factory=Parallelism)
    launcher: Launcher
    serve: Serve | None = None
    container: Container | None = None
    python_env: PythonEnv | None = None
    env: dict[EnvName, str] = Field(default_factory=dict)
    secrets: list[EnvName] = Field(
        default_factory=list,
        description="names passed from the submitting environment, never written to the script",
    )
    storage: Storage = Field(default_factory=Storage)
    network: Network = Field(default_factory=Network)
    resilience: Resilience = Field(default_factory=Resilience)
    sweep: Sweep | None = Field(
        default=None, description="run as a job array, one task per set of overrides"
    )
    observability: Observability = Field(default_factory=Observability)

    @field_validator("env", mode="before")
    @classmethod
    def _env_strings(cls, v: object) -> object:
        """Environment values are strings: ``1`` and ``True`` from Python become "1".

        A recipe file keeps each ``env`` value as written (slurmfm.recipe.loader), so numbers
        and booleans only come from Python dicts. A float is refused when its text is not the
        number itself (``inf``, ``nan``), as the job would see something else.
        """
        if isinstance(v, dict):
            out: dict[object, object] = {}
            for k, val in v.items():
                if isinstance(val, bool):
                    out[k] = "1" if val else "0"
                elif isinstance(val, float) and not math.isfinite(val):
                    raise ValueError(f"env.{k}: {val!r} is not a number; quote the value")
                elif isinstance(val, int | float):
                    out[k] = str(val)
                else:
                    out[k] = val
            return out
        return v

    @model_validator(mode="after")
    def _constraint_instance(self) -> Recipe:
        """A ``--constraint`` naming another instance type than the recipe's is refused.

        Why: ``--set cluster.instance_type=p6-b200.48xlarge`` on a recipe that says
        ``constraints: p5.48xlarge&efa`` would keep asking Slurm for p5 nodes while every count
        in the script (GPUs, EFA devices, the health gate) is for B200: the gate would drain
        every node it lands on (slurmfm/catalog/flavors.py).
        """
        from slurmfm.catalog.flavors import foreign_instance_types

        c = self.cluster
        other = foreign_instance_types(c.constraints, c.instance_type)
        if other:
            raise ValueError(
                f"cluster.constraints: {c.constraints!r} names instance type "
                f"{', '.join(other)} but cluster.instance_type is {c.instance_type}; name "
                f"{c.instance_type} there, or leave the instance type out of the constraint"
            )
        return self

    @model_validator(mode="after")
    def _fabric_floor(self) -> Recipe:
        """``fabric_test: fail`` needs a floor to fail below; a serving job has no launch to
        test before."""
        from slurmfm.catalog.fabric import floor_for
        from slurmfm.catalog.instances import get_instance

        res = self.resilience
        if res.fabric_test == "off":
            return self
        if self.launcher.kind in SERVE_KINDS:
            raise ValueError(
                f"resilience.fabric_test: it runs before a training launch; a serving job "
                f"(launcher.kind: {self.launcher.kind}) has none"
            )
        floor, why = floor_for(get_instance(self.cluster.instance_type), res.fabric_min_busbw_gbs)
        if floor is None and res.fabric_test == "fail":
            raise ValueError(
                f"resilience.fabric_test: fail needs a bus bandwidth floor and there is {why}; "
                "set resilience.fabric_min_busbw_gbs"
            )
        return self

    @model_validator(mode="after")
    def _layout(self) -> Recipe:
        from slurmfm.catalog.instances import get_instance

        inst = get_instance(self.cluster.instance_type)
        if self.container is not None and self.python_env is not None:
            raise ValueError("python_env: container and python_env are exclusive: pick one")
        if inst.gpus == 0 and self.resources.procs_per_node is None:
            raise ValueError(
                f"resources.procs_per_node: required, because {inst.name} has no GPUs to count"
            )
        if not inst.gpus and (self.resources.procs_per_node or 0) > inst.vcpus:
            raise ValueError(
                f"resources.procs_per_node: {self.resources.procs_per_node} exceeds the "
                f"{inst.vcpus} vCPUs of {inst.name}: the job would wait for a node that "
                "cannot exist"
            )
        if (
            inst.gpus
            and self.resources.procs_per_node
            and self.resources.procs_per_node > inst.gpus
        ):
            raise ValueError(
                f"resources.procs_per_node: {self.resources.procs_per_node} exceeds the "
                f"{inst.gpus} GPUs of {inst.name}"
            )
        _check_spares(self)
        if self.resilience.save_on_signal and self.launcher.kind not in SAVE_ON_SIGNAL_LAUNCHERS:
            raise ValueError(
                f"resilience.save_on_signal: launcher {self.launcher.kind} has no save-on-signal "
                "protocol slurmfm can drive; use false (requeue at the signal)"
            )
        if self.serve is not None and self.launcher.kind in SERVE_KINDS:
            raise ValueError(
                "serve: a serving recipe (launcher.kind: "
                f"{self.launcher.kind}) is the server itself; serve: is for a trainer's server"
            )
        split = self.serve is not None and self.serve.placement == "split"
        if split and self.serve is not None and self.serve.nodes >= self.resources.nodes:
            raise ValueError(
                f"serve.nodes: {self.serve.nodes} serving nodes leave none of the "
                f"{self.resources.nodes} nodes (resources.nodes) for the trainer"
            )
        if self.serve is not None and self.serve.launcher.disaggregation is not None:
            raise ValueError(
                "serve.launcher.disaggregation: prefill/decode disaggregation is for a serving "
                "job (launcher.kind: sglang with resources.nodes its prefill and decode nodes), "
                "not for a trainer's server"
            )
        if self.serve is not None:
            s = self.serve
            sinst = get_instance(s.instance_type or self.cluster.instance_type)
            # Same node type as the trainer: the same processes per node unless told.
            per_node = s.procs_per_node or sinst.gpus
            if not per_node and sinst.name == inst.name:
                per_node = self.resources.procs_per_node or 0
            if not per_node:
                raise ValueError(
                    f"serve.procs_per_node: required, because {sinst.name} has no GPUs to count"
                )
            _check_serving(s.launcher, s.parallelism, s.nodes, per_node, sinst, "serve.parallelism")
        if self.launcher.kind in SERVE_KINDS:
            _check_serving(
                self.launcher,  # type: ignore[arg-type]  # a server: kind in SERVE_KINDS
                self.parallelism,
                self.resources.nodes,
                self.procs_per_node,
                inst,
                "parallelism",
            )
            return self
        clash = set(self.env) & set(self.secrets)
        if clash:
            raise ValueError(f"secrets: {sorted(clash)} are listed both in env and in secrets")
        p = self.parallelism
        world = self.world_size
        mp = p.tp * p.pp * p.cp
        if world % mp:
            raise ValueError(
                f"parallelism.tp: tp*pp*cp = {p.tp}*{p.pp}*{p.cp} = {mp} does not divide the world "
                f"size {world} ({self.resources.nodes} nodes x {self.procs_per_node} per node)"
            )
        dp = world // mp
        if (dp * p.cp) % p.ep:
            raise ValueError(
                f"parallelism.ep: ep={p.ep} must divide dp*cp = {dp}*{p.cp} (Megatron-LM's rule)"
            )
        # An NVLink domain bounds the tensor-parallel group: TP across EFA is never wanted.
        domain = inst.nvlink.max_gpus if inst.gpus else self.procs_per_node
        if p.tp * p.cp > max(domain, 1) and inst.gpus:
            raise ValueError(
                f"parallelism.tp: tp*cp = {p.tp * p.cp} exceeds the NVLink domain of {inst.name} "
                f"({domain} GPUs)"
            )
        spec(self.launcher.kind).check(self, inst)
        return self

    @model_validator(mode="after")
    def _sweep_tasks(self) -> Recipe:
        # Every array task must be a valid recipe on its own (slurmfm.recipe.sweep).
        if self.sweep is not None:
            from slurmfm.recipe.sweep import expand

            expand(self)
        return self

    @property
    def save_on_signal(self) -> bool:
        """The save protocol in effect: the recipe's choice, else the launcher's default."""
        if self.resilience.save_on_signal is not None:
            return self.resilience.save_on_signal
        return spec(self.launcher.kind).save_signal is not None

    @property
    def save_mode(self) -> str:
        """One line for `validate`: which save protocol the job uses at the time limit."""
        s = self.resilience.save_before_timeout_s
        if not s:
            return "save mode: none (resilience.save_before_timeout_s is 0: no pre-timeout signal)"
        how = "explicit" if self.resilience.save_on_signal is not None else "launcher default"
        if self.save_on_signal:
            sig = spec(self.launcher.kind).save_how
            return (
                f"save mode: save-on-signal ({how}): {s} s before the time limit the training "
                f"gets {sig}, saves and exits; the job requeues and resumes"
            )
        return (
            f"save mode: requeue-at-signal ({how}): {s} s before the time limit the job "
            "requeues at once and resumes from its last periodic checkpoint"
        )

    @property
    def save_estimate_s(self) -> float | None:
        """Seconds one checkpoint takes at ``storage.write_mb_s``, from
        ``resilience.model_params_b`` (None without it)."""
        r = self.resilience
        if r.model_params_b is None:
            return None
        return r.model_params_b * r.checkpoint_bytes_per_param * 1000 / self.storage.write_mb_s

    def save_window_warning(self) -> str | None:
        """A warning when the pre-timeout window cannot hold one save at the storage speed.

        Why: 300 s at 300 MB/s writes 90 GB; a 405B checkpoint is about 5.7 TB. A window too
        short for the save ends the job in TIMEOUT, which Slurm does not requeue, with a
        partial checkpoint.
        """
        r = self.resilience
        if r.model_params_b is None or not r.save_before_timeout_s or not self.save_on_signal:
            return None
        gb = r.model_params_b * r.checkpoint_bytes_per_param  # 1e9 params x bytes = GB
        need_s = gb * 1000 / self.storage.write_mb_s
        if need_s <= r.save_before_timeout_s:
            return None
        return (
            f"resilience.save_before_timeout_s: {r.save_before_timeout_s} s cannot hold one "
            f"save of {gb:,.0f} GB ({r.model_params_b:g}B params x "
            f"{r.checkpoint_bytes_per_param:g} bytes) at storage.write_mb_s "
            f"{self.storage.write_mb_s:g} MB/s, which takes about {math.ceil(need_s):,} s; "
            "raise the window, or set write_mb_s to the file system's real throughput"
        )

    @property
    def procs_per_node(self) -> int:
        from slurmfm.catalog.instances import get_instance

        inst = get_instance(self.cluster.instance_type)
        return self.resources.procs_per_node or inst.gpus

    @property
    def train_nodes(self) -> int:
        """Nodes that run the launcher: all, minus a split serving group's."""
        if self.serve is not None and self.serve.placement == "split":
            return self.resources.nodes - self.serve.nodes
        return self.resources.nodes

    @property
    def world_size(self) -> int:
        return self.train_nodes * self.procs_per_node

    @property
    def dp(self) -> int:
        p = self.parallelism
        return self.world_size // (p.tp * p.pp * p.cp)

    @property
    def run_id(self) -> str:
        """``storage.run_id``, else the recipe's name: names the checkpoint directory and the
        endpoint file, so a resubmission of the same recipe resumes and serves where the last
        one did. One definition for the renderer, the API and sweeps."""
        return self.storage.run_id or self.name

    @property
    def checkpoint_dir(self) -> str:
        """``<checkpoint_root>/<name>/<run_id>``, without a doubled ``/`` when the root is
        ``/``."""
        root = self.storage.checkpoint_root.rstrip("/")
        return f"{root}/{self.name}/{self.run_id}"


def _check_spares(recipe: Recipe) -> None:
    """``resources.spare_nodes``: what the in-job swap (slurmfm/job/spares.py) can serve.

    At most one spare per training node: more would idle more of the allocation than it
    trains on. A server beside the trainer keeps its own node list (its failure is not a
    training node's), and HyperPod replaces a failed node itself (its auto-resume,
    https://docs.aws.amazon.com/sagemaker/latest/dg/sagemaker-hyperpod-resiliency-slurm-auto-resume.html).
    """
    k = recipe.resources.spare_nodes
    if not k:
        return
    n = recipe.resources.nodes
    if k > n:
        raise ValueError(
            f"resources.spare_nodes: {k} spares for {n} training node(s): at most one spare "
            "per training node"
        )
    if recipe.serve is not None or recipe.launcher.kind in SERVE_KINDS:
        raise ValueError(
            "resources.spare_nodes: spares are for training launches; a job with a server "
            "(serve:, or a serving launcher) cannot have them"
        )
    if recipe.cluster.flavor == "hyperpod":
        raise ValueError(
            "resources.spare_nodes: HyperPod replaces a failed node itself (auto-resume); "
            "use 0 there"
        )


def _check_serving(
    launcher: ServeLauncher,
    p: Parallelism,
    nodes: int,
    per_node: int,
    inst: InstanceType,
    where: str,
) -> None:
    """A server group's replicas must use every GPU: ``tp x pp`` for one replica,
    ``replicas x tp x pp`` for vLLM's data parallel (SGLang's DP attention shares ``--tp``'s
    GPUs); the server's own rules on top
    (:meth:`slurmfm.launchers.serving.ServerSpec.check_replicas` and ``check_group``)."""
    gpus = nodes * per_node
    spec_ = server_spec(launcher.kind)
    lwhere = where.replace("parallelism", "launcher")
    if p.cp != 1:
        raise ValueError(f"{where}.cp: context parallelism is not a serving option here")
    if launcher.disaggregation is not None:
        # prefill/decode: servers of their role's tp x pp GPUs in each group, not one over
        # the job; the role checks cover replicas and ep per server
        spec_.check_disaggregation(launcher, p, nodes, per_node, lwhere)
        _check_nvlink_span(launcher, p, per_node, inst, where)
        return
    need = spec_.gpus(launcher, p)
    if need != gpus and p.tp * p.pp == need:
        raise ValueError(
            f"{where}.tp: tp*pp = {p.tp}*{p.pp} = {p.tp * p.pp} must equal the serving group's "
            f"{gpus} GPUs ({nodes} nodes x {per_node}); one server replica per job, or set "
            f"{lwhere}.replicas"
        )
    if need != gpus:
        raise ValueError(
            f"{lwhere}.replicas: replicas x tp x pp = {launcher.replicas} x {p.tp} x {p.pp} = "
            f"{need} GPUs must equal the serving group's {gpus} GPUs ({nodes} nodes x "
            f"{per_node})"
        )
    spec_.check_replicas(launcher, p, nodes, per_node, lwhere)
    spec_.check_group(p, per_node, inst, where)
    _check_nvlink_span(launcher, p, per_node, inst, where)


def _check_nvlink_span(
    launcher: ServeLauncher, p: Parallelism, per_node: int, inst: InstanceType, where: str
) -> None:
    """Where NVLink spans nodes (a GB200 UltraServer), each model replica's model-parallel
    span must fit one domain: the placement keeps it inside one (slurmfm/plan/planner.py,
    ``job_for_recipe``), and a replica over two UltraServers would run its tensor-parallel
    all-reduces over EFA, ~36x slower than NVLink. Elsewhere (HGX) a span over nodes is
    the user's choice of EFA (SGLang's multi-node guide runs ``--tp 16`` on 2 x 8 GPUs)."""
    if not (inst.gpus and inst.nvlink.is_multi_node):
        return
    domain = inst.nvlink.max_gpus
    spans = server_spec(launcher.kind).replica_spans(launcher, p)
    for text, span in spans.items():
        if span > domain:
            nodes = -(-span // max(1, per_node))
            raise ValueError(
                f"{where}.tp: a model replica's span ({text}) is {span} GPUs ({nodes} nodes) "
                f"but one NVLink domain of {inst.name} holds {domain} GPUs (an UltraServer of "
                f"{max(inst.nvlink.instances)} instances): a replica must not straddle two "
                "UltraServers; make the replica smaller and serve more of them"
            )
    d = launcher.disaggregation
    g = max(1, per_node)
    unit = math.lcm(*(math.lcm(s, g) // g for s in spans.values()))
    if d is not None and unit > 1 and (d.prefill_nodes % unit or d.decode_nodes % unit):
        # The job's host order holds whole units domain by domain (the planner's NVLink
        # rule); the prefill servers are cut from its start, so a prefill group that ends
        # inside a unit would push a decode server across two domains.
        raise ValueError(
            f"{where.replace('parallelism', 'launcher')}.disaggregation.prefill_nodes: with "
            f"{' and '.join(spans)} on {inst.name}, "
            f"prefill_nodes and decode_nodes ({d.prefill_nodes}, {d.decode_nodes}) must be "
            f"multiples of {unit} nodes (the smallest block that holds whole servers of both) "
            "so that no server straddles two UltraServers"
        )
