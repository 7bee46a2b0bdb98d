"""What the model servers (vLLM, SGLang) share: their recipe fields and their spec's rules.

A server has no training state: no save protocol (the job requeues at the pre-timeout
signal), no completion check (it serves until cancelled) and no NCCL log under the node
entry (the server sets up NCCL itself). Its launch lines are built by its own spec's
:meth:`ServerSpec.serve_lines`; :func:`slurmfm.render.serve.serve_launch` adds what every
server group shares (port, readiness wait, endpoint file).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, NamedTuple

from pydantic import Field

from slurmfm.job.options import NodeOptions
from slurmfm.launchers.base import LauncherSpec
from slurmfm.recipe.strict import _Strict

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType
    from slurmfm.recipe.schema import Parallelism, Recipe


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

    def dp_size(self) -> int:
        """The server's data-parallel ranks beside its own port (1 unless it has them)."""
        return 1


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

    def done_check(self, recipe: Recipe) -> str:
        return "none"

    def serve_lines(
        self, launcher: _ServeLauncher, par: Parallelism, nodes: int, model: str, extra: list[str]
    ) -> ServeLines:
        """The lines of ``launcher`` on ``nodes`` nodes; ``model`` and ``extra`` (the
        server's own further arguments) are already quoted."""
        raise NotImplementedError

    def check_group(self, p: Parallelism, per_node: int, inst: InstanceType, where: str) -> None:
        """This server's rules for its group's parallelism (``where``: the recipe field),
        after the shared one (tp x pp uses every GPU, no cp); ValueError says what."""
