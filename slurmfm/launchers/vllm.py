"""vLLM's OpenAI-compatible server: one node alone, or across nodes over Ray.

Across nodes: a Ray head on node 0, Ray workers on the others, then ``vllm serve`` on the
head once every node joined (vLLM docs "Parallelism and Scaling" and
``examples/online_serving/multi-node-serving.sh``); each node's runtime entry runs its part
(slurmfm/job/node.py ``run_ray_node``). One node needs no Ray. The server listens on 8000 by
default (vLLM's CLI default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from slurmfm.job.options import NodeOptions
from slurmfm.launchers.serving import ServeLines, ServerSpec, _ServeLauncher

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType
    from slurmfm.recipe.schema import Parallelism


# Ports the Ray head takes for its own parts unless told otherwise: ``ray start --head
# --port=P`` with P among them exits 1 ("Ray component dashboard is trying to use a port
# number 8265 that is used by other components"; seen with Ray 2.60: the check is
# ray-project/ray:python/ray/_private/parameter.py, ``update_pre_selected_port``). Defaults:
# https://docs.ray.io/en/latest/cluster/cli.html#ray-start (--dashboard-port 8265,
# --ray-client-server-port 10001, --dashboard-agent-listen-port 52365, worker ports
# 10002-19999 when --min/--max-worker-port are not set).
RAY_OWN_PORTS = {8265: "dashboard", 10001: "client server", 52365: "dashboard agent"}
RAY_WORKER_PORTS = range(10002, 20000)


class VllmLauncher(_ServeLauncher):
    """vLLM OpenAI-compatible server across nodes: a Ray head on node 0, Ray workers on the
    others, then ``vllm serve`` on the head (vLLM's multi-node serving guide and its
    ``examples/online_serving/multi-node-serving.sh``). Tensor parallel inside a node (or an
    NVLink domain), pipeline parallel across nodes: ``parallelism.tp`` x ``parallelism.pp``
    must equal the group's GPU count.
    """

    kind: Literal["vllm"]
    command: str = Field(default="vllm", min_length=1, description="the vllm executable")
    ray: str = Field(default="ray", min_length=1, description="the ray executable")
    python: str = Field(
        default="python3", min_length=1, description="a python with ray, to count Ray nodes"
    )
    ray_port: int = Field(default=6379, ge=1024, le=65535, description="Ray's default GCS port")
    ray_timeout_s: int = Field(default=300, ge=1, description="wait for all Ray nodes to join")

    @field_validator("ray_port")
    @classmethod
    def _not_a_port_ray_takes(cls, port: int) -> int:
        if port in RAY_OWN_PORTS:
            what = RAY_OWN_PORTS[port]
            raise ValueError(f"{port} is the Ray head's own {what} port: ray start would refuse it")
        if port in RAY_WORKER_PORTS:
            raise ValueError(
                f"{port} is in Ray's worker port range 10002-19999: ray start would refuse it"
            )
        return port


class VllmSpec(ServerSpec):
    kind = "vllm"
    default_port = 8000
    why_tasks = "one task per node: a Ray head or worker; vLLM starts the per-GPU workers"

    def serve_lines(
        self, launcher: _ServeLauncher, par: Parallelism, nodes: int, model: str, extra: list[str]
    ) -> ServeLines:
        from slurmfm.render.quote import sh_quote

        if not isinstance(launcher, VllmLauncher):
            raise TypeError(f"internal: the vllm spec asked about {type(launcher).__name__}")
        serve = [sh_quote(launcher.command, what="launcher.command"), "serve", model]
        opts = [
            "--host 0.0.0.0",
            '--port "$SLURMFM_SERVE_PORT"',
            f"--tensor-parallel-size {par.tp}",
            f"--pipeline-parallel-size {par.pp}",
        ]
        node = NodeOptions(prefix=0)
        if nodes > 1:
            # Each node's runtime entry starts the Ray head (node 0, then `vllm serve` once
            # every node joined) or a Ray worker (slurmfm/job/node.py run_ray_node).
            sh_quote(launcher.ray, what="launcher.ray")  # refused here when bash cannot carry it
            sh_quote(launcher.python, what="launcher.python")
            node = node._replace(
                ray=launcher.ray,
                ray_python=launcher.python,
                ray_port=str(launcher.ray_port),
                ray_nodes=str(nodes),
                ray_timeout_s=str(launcher.ray_timeout_s),
            )
            lines = [" ".join(serve), " ".join([*opts, "--distributed-executor-backend ray"])]
        else:
            lines = [" ".join(serve), " ".join(opts)]
        return ServeLines([*lines, *([" ".join(extra)] if extra else [])], 0, None, node)

    def check_group(self, p: Parallelism, per_node: int, inst: InstanceType, where: str) -> None:
        """``tp`` inside a node or NVLink domain, ``pp`` across nodes (vLLM's parallelism and
        scaling guide: "set tensor_parallel_size to the number of GPUs per node and
        pipeline_parallel_size to the number of nodes")."""
        domain = inst.nvlink.max_gpus if inst.gpus else per_node
        if p.tp > max(domain, 1):
            raise ValueError(
                f"{where}.tp: vLLM tensor parallel {p.tp} exceeds the NVLink domain of "
                f"{inst.name} ({domain} GPUs); use pp across nodes"
            )
        if p.ep != 1:
            raise ValueError(
                f"{where}.ep: for vLLM pass --enable-expert-parallel in launcher.extra_args "
                "(its expert parallel size follows tp x dp)"
            )


VLLM = VllmSpec()
