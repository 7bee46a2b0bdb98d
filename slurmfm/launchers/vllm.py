"""vLLM's OpenAI-compatible server: one node alone, or across nodes with or without Ray.

Across nodes, by default without Ray where the installed vLLM can (>= 0.11.1, the gate and
its sources in slurmfm/job/vllm.py): ``vllm serve`` on every node with its own
``--nnodes/--node-rank/--master-addr/--master-port`` and ``--headless`` off node 0
(vllm-project/vllm ``docs/serving/parallelism_scaling.md``). Over Ray (``multinode: ray``, or
an older vLLM): a Ray head on node 0, Ray workers on the others, then ``vllm serve`` on the
head once every node joined (the same page and ``examples/online_serving/multi-node-serving.sh``).
Each node's runtime entry adds its own part (slurmfm/job/node.py ``vllm_node``). Data parallel
replicas (``replicas``) run one engine each, ``--data-parallel-size-local`` of them per node
(``docs/serving/data_parallel_deployment.md``); the API server on node 0 is the one endpoint.
The server listens on 8000 by default (vLLM's CLI default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, field_validator

from slurmfm.job.options import NodeOptions
from slurmfm.launchers.serving import ServeLines, ServerSpec, _ServeLauncher, refuse_own_flags

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
    multinode: Literal["auto", "native", "ray"] = Field(
        default="auto",
        description=(
            "across nodes: native (--nnodes/--node-rank/--headless, vLLM >= 0.11.1), ray, or "
            "auto (native where the installed vLLM has it, else Ray)"
        ),
    )
    master_port: int | None = Field(
        default=None,
        ge=1024,
        le=65535,
        description="--master-port / --data-parallel-rpc-port; default: one per job",
    )
    expert_parallel: bool = Field(
        default=False, description="--enable-expert-parallel (MoE: experts across tp x replicas)"
    )

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
        self,
        launcher: _ServeLauncher,
        par: Parallelism,
        nodes: int,
        model: str,
        extra: list[str],
    ) -> ServeLines:
        from slurmfm.quote import sh_quote

        if not isinstance(launcher, VllmLauncher):
            raise TypeError(f"internal: the vllm spec asked about {type(launcher).__name__}")
        serve = [sh_quote(launcher.command, what="launcher.command"), "serve", model]
        opts = [
            "--host 0.0.0.0",
            '--port "$SLURMFM_SERVE_PORT"',
            f"--tensor-parallel-size {par.tp}",
            f"--pipeline-parallel-size {par.pp}",
        ]
        if launcher.expert_parallel:
            opts.append("--enable-expert-parallel")
        node = NodeOptions(prefix=0)
        dp, dist_port = launcher.replicas, None
        if nodes > 1:
            # Each node's runtime entry adds its own flags (slurmfm/job/node.py vllm_node):
            # without Ray its rank, --headless and node 0's address and port; over Ray it
            # starts the Ray head (node 0, then `vllm serve` once every node joined) or a
            # Ray worker (run_ray_node). Data parallel needs no Ray.
            mode = "native" if dp > 1 else launcher.multinode
            if mode != "native":
                sh_quote(launcher.ray, what="launcher.ray")  # refused when bash cannot carry it
                sh_quote(launcher.python, what="launcher.python")
                node = node._replace(
                    ray=launcher.ray,
                    ray_python=launcher.python,
                    ray_port=str(launcher.ray_port),
                    ray_nodes=str(nodes),
                    ray_timeout_s=str(launcher.ray_timeout_s),
                )
            node = node._replace(vllm=mode, vllm_dp=dp, vllm_dp_local=max(1, dp // nodes))
            dist_port = launcher.master_port or 0  # 0: the runtime picks one per job
        elif dp > 1:
            opts.append(f"--data-parallel-size {dp}")
        lines = [" ".join(serve), " ".join(opts)]
        return ServeLines([*lines, *([" ".join(extra)] if extra else [])], 0, dist_port, node)

    def check_replicas(
        self, launcher: _ServeLauncher, p: Parallelism, nodes: int, per_node: int, where: str
    ) -> None:
        """Data parallel across nodes runs ``replicas / nodes`` whole replicas on each node
        (``--data-parallel-size-local``, vLLM's data parallel deployment guide): a replica's
        ``tp x pp`` must fit inside one node and the replicas must split evenly over the
        nodes. Flags the node entry sets are refused in ``extra_args``."""
        if not isinstance(launcher, VllmLauncher):
            raise TypeError(f"internal: the vllm spec asked about {type(launcher).__name__}")
        field = f"{where}.replicas"
        own = {
            "--data-parallel-size": field,
            "-dp": field,
            "--enable-expert-parallel": f"{where}.expert_parallel",
            "-ep": f"{where}.expert_parallel",
            "--tensor-parallel-size": "parallelism.tp",
            "-tp": "parallelism.tp",
            "--pipeline-parallel-size": "parallelism.pp",
            "-pp": "parallelism.pp",
        }
        if nodes > 1 or launcher.replicas > 1:
            for flag in ("--nnodes", "-n", "--node-rank", "-r", "--master-addr", "--headless"):
                own[flag] = "the node entry, per node"
            own["--master-port"] = f"{where}.master_port"
            own["--distributed-executor-backend"] = f"{where}.multinode"
            for flag in (
                "--data-parallel-size-local",
                "-dpl",
                "--data-parallel-address",
                "-dpa",
                "--data-parallel-rpc-port",
                "-dpp",
                "--data-parallel-start-rank",
                "-dpr",
            ):
                own[flag] = "the node entry, per node"
        refuse_own_flags(launcher.extra_args, own, where)
        r, span = launcher.replicas, p.tp * p.pp
        if r == 1:
            return
        if launcher.multinode == "ray" and nodes > 1:
            raise ValueError(
                f"{where}.multinode: data parallel replicas across nodes run without Ray "
                "(one engine per replica, --data-parallel-size-local per node); use native"
            )
        if nodes > 1 and (per_node % span or r % nodes):
            raise ValueError(
                f"{field}: {r} replicas of tp x pp = {span} GPUs do not split into whole "
                f"replicas per node over {nodes} nodes of {per_node} GPUs: each replica must "
                "fit inside one node and the replicas must divide evenly among the nodes"
            )

    def check_disaggregation(
        self, launcher: _ServeLauncher, p: Parallelism, nodes: int, per_node: int, where: str
    ) -> int:
        """Refused: vLLM's disaggregated prefill is experimental and ships no router. Its
        page is "Disaggregated Prefilling (experimental)" ("This feature is experimental and
        subject to change"; "vLLM relies on third-party connectors for production-level
        disaggregated prefilling": vllm-project/vllm docs/features/disagg_prefill.md), and
        the proxy in front of a NixlConnector prefill and decode instance is a test script,
        not part of the installed package (``tests/v1/kv_connector/nixl_integration/
        toy_proxy_server.py``: docs/features/nixl_connector_usage.md)."""
        raise ValueError(
            f"{where}.disaggregation: vLLM's disaggregated prefill is experimental and ships no "
            "router (vllm-project/vllm docs/features/disagg_prefill.md); use launcher.kind: "
            "sglang"
        )

    def check_group(self, p: Parallelism, per_node: int, inst: InstanceType, where: str) -> None:
        """``tp`` inside a node or NVLink domain, ``pp`` across nodes (vLLM's parallelism and
        scaling guide: "set tensor_parallel_size to the number of GPUs per node and
        pipeline_parallel_size to the number of nodes"). A type without GPUs has no NVLink
        domain to keep: vLLM's CPU build runs tensor parallel over gloo, across nodes too
        (the lab's real two-node test does)."""
        domain = inst.nvlink.max_gpus
        if inst.gpus and p.tp > max(domain, 1):
            raise ValueError(
                f"{where}.tp: vLLM tensor parallel {p.tp} exceeds the NVLink domain of "
                f"{inst.name} ({domain} GPUs); use pp across nodes"
            )
        if p.ep != 1:
            raise ValueError(
                f"{where}.ep: for vLLM set launcher.expert_parallel: true (its expert "
                "parallel size follows tp x replicas)"
            )


VLLM = VllmSpec()
