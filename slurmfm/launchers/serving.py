"""What the model servers (vLLM, SGLang) share: their recipe fields and their spec's rules.

A server has no training state: no save protocol (the job requeues at the pre-timeout
signal) and no completion check (it serves until cancelled). It sets up NCCL itself, so its
NCCL log is not the node entry's own (``nccl_log`` False); a server across nodes still gets
the transport check, its processes inheriting node 0's ``NCCL_DEBUG_FILE``
(slurmfm/render/script.py). Its launch lines are built by its own spec's
:meth:`ServerSpec.serve_lines`; :func:`slurmfm.render.serve.serve_launch` adds what every
server group shares (port, readiness wait, endpoint file).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, Literal, NamedTuple

from pydantic import Field

from slurmfm.job.options import NodeOptions
from slurmfm.launchers.base import LauncherSpec
from slurmfm.strict import _Strict

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType
    from slurmfm.recipe.schema import Parallelism, Recipe


class Disaggregation(_Strict):
    """Prefill/decode disaggregation (SGLang): the job's first ``prefill_nodes`` nodes serve
    prefill, the next ``decode_nodes`` decode, each in servers of ``tp x pp`` GPUs, and
    SGLang's router on node 0 is the one endpoint (slurmfm/job/pd.py has the sources)."""

    prefill_nodes: int = Field(ge=1, le=4096, description="the first N nodes serve prefill")
    decode_nodes: int = Field(ge=1, le=4096, description="the next N nodes serve decode")
    transfer_backend: Literal["mooncake", "nixl"] = Field(
        default="mooncake", description="--disaggregation-transfer-backend (SGLang's default)"
    )
    router_args: list[str] = Field(
        default_factory=list, description="more sglang_router.launch_router arguments"
    )
    prefill_tp: int | None = Field(
        default=None, ge=1, le=4096, description="a prefill server's --tp (parallelism.tp)"
    )
    decode_tp: int | None = Field(
        default=None, ge=1, le=4096, description="a decode server's --tp (parallelism.tp)"
    )
    prefill_replicas: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="a prefill server's --dp-size with DP attention (launcher.replicas)",
    )
    decode_replicas: int | None = Field(
        default=None,
        ge=1,
        le=4096,
        description="a decode server's --dp-size with DP attention (launcher.replicas)",
    )

    def roles(self, tp: int, replicas: int) -> dict[str, tuple[int, int]]:
        """Each role's ``(--tp, --dp-size)``: its own where the recipe gives one, else the
        job's ``parallelism.tp`` and ``launcher.replicas``."""
        return {
            "prefill": (self.prefill_tp or tp, self.prefill_replicas or replicas),
            "decode": (self.decode_tp or tp, self.decode_replicas or replicas),
        }


class _ServeLauncher(_Strict):
    """What vLLM and SGLang servers share: the model, the HTTP port and the readiness wait.

    The readiness wait polls ``health_path`` on the first node of the serving group (both
    servers answer ``GET /health`` with 200 once the model is loaded: vLLM's OpenAI server
    and SGLang's ``launch_server``), fails the job when ``ready_timeout_s`` passes, and then
    writes the endpoint file ``<log_dir>/endpoints/<run_id>.json`` (and ``.env``).
    """

    model: str = Field(min_length=1, description="Hugging Face id or a path (e.g. on /fsx)")
    served_model_name: str | None = None
    port: int = Field(default=0, ge=0, le=65535, description="HTTP port; 0: the server's default")
    model_cache: str | None = Field(
        default=None, description="HF_HOME for downloads, e.g. /fsx/models (shared by nodes)"
    )
    extra_args: list[str] = Field(default_factory=list, description="more server arguments")
    health_path: str = Field(default="/health", pattern=r"^/[A-Za-z0-9_./-]*$")
    ready_timeout_s: int = Field(default=1800, ge=1, description="model load can take long")
    ready_poll_s: int = Field(default=5, ge=1)
    unhealthy_timeout_s: int = Field(
        default=300,
        ge=0,
        description=(
            "a server alone in its job whose health endpoint stops answering for this long is "
            "stopped and relaunched in the allocation, its stderr tail in the job log (the job "
            "fails with it once max_restarts is used up); 0: not watched"
        ),
    )

    replicas: int = Field(
        default=1,
        ge=1,
        le=4096,
        description=(
            "data-parallel replicas of the model behind one endpoint (vLLM "
            "--data-parallel-size: each replica has tp x pp GPUs; SGLang --dp-size with "
            "--enable-dp-attention: the replicas divide --tp)"
        ),
    )

    disaggregation: Disaggregation | None = Field(
        default=None,
        description=(
            "prefill/decode disaggregation: prefill and decode node counts, the router in front "
            "(SGLang)"
        ),
    )

    def dp_size(self) -> int:
        """The server's data-parallel ranks beside its own port (1 unless it has them)."""
        return self.replicas


def flag_value(args: list[str], flags: tuple[str, ...]) -> str | None:
    """The value of the first of ``flags`` in ``args`` (``--flag V`` or ``--flag=V``; ``""``
    for a flag given without one), None when none is there."""
    for i, a in enumerate(args):
        for flag in flags:
            if a.startswith(flag + "="):
                return a[len(flag) + 1 :]
            if a == flag:
                return args[i + 1] if i + 1 < len(args) else ""
    return None


def refuse_own_flags(args: list[str], own: dict[str, str], where: str) -> None:
    """``extra_args`` must not repeat a flag slurmfm gives the server itself (``own``: flag
    to the recipe field that sets it): the server would get it twice, or with a value that
    contradicts the node's own."""
    for flag, field in own.items():
        if flag_value(args, (flag,)) is not None:
            raise ValueError(f"{where}.extra_args: {flag} is set by slurmfm ({field}); remove it")


class ServeLines(NamedTuple):
    """A server group's per-node command: lines of shell words, the words after which the
    node entry inserts ``--node-rank`` (0: none), the fixed dist port (None: none; 0: the
    runtime picks one) and the options of the group's node entry."""

    lines: list[str]
    prefix: int
    dist_port: int | None
    node: NodeOptions


class ServerSpec(LauncherSpec):
    """A model server's spec: no save protocol, no completion check, no NCCL log."""

    server = True
    save_signal = None
    save_how = "none"
    nccl_log = False
    default_port: ClassVar[int]
    # What answers at the endpoint's URL when the server runs several replicas (the endpoint
    # file's ``front``, slurmfm/job/serve.py FRONTS): vLLM's API server on node 0 coordinates
    # its data-parallel engines.
    replica_front: ClassVar[str] = "dp-coordinator"

    def done_check(self, recipe: Recipe) -> str:
        return "none"

    def serve_lines(
        self,
        launcher: _ServeLauncher,
        par: Parallelism,
        nodes: int,
        model: str,
        extra: list[str],
    ) -> ServeLines:
        """The lines of ``launcher`` on ``nodes`` nodes; ``model`` and ``extra`` (the
        server's own further arguments) are already quoted."""
        raise NotImplementedError

    def nvlink_span(self, p: Parallelism) -> int:
        """GPUs of one model replica's model-parallel group, as this server defines it: the
        GPUs that should share one NVLink domain (``--segment`` on a GB200 UltraServer).
        vLLM: ``tp x pp`` (one replica; its tensor- and pipeline-parallel ranks)."""
        return p.tp * p.pp

    def replica_spans(self, launcher: _ServeLauncher, p: Parallelism) -> dict[str, int]:
        """Each kind of model replica the group runs and its :meth:`nvlink_span` in GPUs
        (the recipe text that sets it as the key): the GPUs the placement keeps in one NVLink
        domain (a GB200 UltraServer) and the recipe checks fit one."""
        return {self.span_text(p): self.nvlink_span(p)}

    def span_text(self, p: Parallelism) -> str:
        """How the recipe sets :meth:`nvlink_span`, for messages."""
        return f"tp x pp = {p.tp} x {p.pp}"

    def gpus(self, launcher: _ServeLauncher, p: Parallelism) -> int:
        """GPUs the server's replicas use together (vLLM: ``replicas x tp x pp``)."""
        return launcher.replicas * p.tp * p.pp

    def check_replicas(
        self, launcher: _ServeLauncher, p: Parallelism, nodes: int, per_node: int, where: str
    ) -> None:
        """This server's rules for ``launcher.replicas`` (``where``: the launcher's recipe
        field) and for flags in ``extra_args`` that slurmfm sets itself; ValueError says
        what."""

    def check_disaggregation(
        self, launcher: _ServeLauncher, p: Parallelism, nodes: int, per_node: int, where: str
    ) -> int:
        """This server's rules for ``launcher.disaggregation`` (``where``: the launcher's
        recipe field) on ``nodes`` nodes of ``per_node`` GPUs; the nodes of one server.
        ValueError says what is wrong."""
        raise ValueError(
            f"{where}.disaggregation: launcher {self.kind} has no prefill/decode disaggregation "
            "slurmfm can start; use launcher.kind: sglang"
        )

    def check_group(self, p: Parallelism, per_node: int, inst: InstanceType, where: str) -> None:
        """This server's rules for its group's parallelism (``where``: the recipe field),
        after the shared one (tp x pp uses every GPU, no cp); ValueError says what."""
