"""Launch lines for model servers (vLLM, SGLang): a pure function from the recipe to shell words.

A server runs either as the whole job (``launcher.kind: vllm|sglang``) or as the serving group
of a train-and-serve job (``serve:``), split from the trainer's allocation or in its own
heterogeneous component. Either way the job script starts one step over the group's nodes in
the planned order, waits until ``GET <health_path>`` on the group's first node answers 200
(failing the job after ``ready_timeout_s``) and writes the endpoint file.

Sources for the launch shapes:

* vLLM multi-node serving: a Ray head on one node (``ray start --head --port=6379``), Ray
  workers joining it (``ray start --address=<head>:6379 --block``, retried while the head
  starts), the leader polling ``sum(node["Alive"] for node in ray.nodes())`` until the cluster
  has every node, then ``vllm serve`` on the head with ``--tensor-parallel-size`` (GPUs per
  node) and ``--pipeline-parallel-size`` (nodes). vLLM docs "Parallelism and Scaling" and
  ``examples/online_serving/multi-node-serving.sh``. One node needs no Ray.
* SGLang multi-node: every node runs ``python -m sglang.launch_server`` with the same
  ``--tp`` (the total), ``--nnodes``, its own ``--node-rank`` and ``--dist-init-addr
  <node 0>:<port>``; node 0 serves HTTP. SGLang docs "Multi-Node Deployment"; ``--ep-size``
  (alias ``--expert-parallel-size``) from SGLang's "Server Arguments" reference. ``--pp-size``
  is SGLang's pipeline-parallel flag in current releases; it is not in the reference sheets
  (unverified here), and it is emitted only when ``pp > 1``.
* Default ports: vLLM's server listens on 8000, SGLang's on 30000 (their CLI defaults).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from slurmfm.job.options import NodeOptions
from slurmfm.render.quote import sh_quote

if TYPE_CHECKING:
    from slurmfm.recipe.schema import Parallelism, SglangLauncher, VllmLauncher

DEFAULT_PORT = {"vllm": 8000, "sglang": 30000}

Group = Literal["all", "split", "hetjob"]


@dataclass(frozen=True)
class ServeLaunch:
    """Everything the job script needs to start one server group and wait for it."""

    kind: str
    group: Group
    nodes: int
    argv: tuple[str, ...]  # lines of already-quoted shell words
    prefix: int  # words after which the node entry inserts --node-rank=R (0: none)
    port: int
    health_path: str
    ready_timeout_s: int
    ready_poll_s: int
    model_json: str  # the model name as a JSON string (the runtime's --serve-model)
    model_cache: str | None  # shell-quoted HF_HOME, if any
    dist_port: int | None  # SGLang's --dist-init-addr port when fixed by the recipe
    # the options of the group's per-node entry (``runtime node``): the prefix, where the
    # group's host order is, and for vLLM across nodes the Ray settings
    node: NodeOptions = field(default_factory=NodeOptions)
    dp: int = 1  # SGLang: data-parallel ranks (each takes one more port after the dist port)

    @property
    def description(self) -> str:
        where = {
            "all": "the whole allocation",
            "split": f"the last {self.nodes} node(s) of the host order",
            "hetjob": "heterogeneous component 1",
        }[self.group]
        return f"{self.kind} server on {where}"


def serve_launch(
    launcher: VllmLauncher | SglangLauncher, par: Parallelism, nodes: int, group: Group
) -> ServeLaunch:
    """Build the per-node command of a server group (pure; every user value quoted)."""
    port = launcher.port or DEFAULT_PORT[launcher.kind]
    model = sh_quote(launcher.model, what="launcher.model")
    extra = [sh_quote(a, what="launcher.extra_args") for a in launcher.extra_args]
    if launcher.served_model_name:
        extra = [
            "--served-model-name",
            sh_quote(launcher.served_model_name, what="launcher.served_model_name"),
            *extra,
        ]
    lines: list[str]
    prefix = 0
    dist_port = None
    node = NodeOptions(prefix=0)
    if launcher.kind == "vllm":
        serve = [sh_quote(launcher.command, what="launcher.command"), "serve", model]
        opts = [
            "--host 0.0.0.0",
            '--port "$SLURMFM_SERVE_PORT"',
            f"--tensor-parallel-size {par.tp}",
            f"--pipeline-parallel-size {par.pp}",
        ]
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
    else:
        lines = [
            f"{sh_quote(launcher.python, what='launcher.python')} -m sglang.launch_server",
            f"--model-path {model} --tp {par.tp}"
            + (f" --pp-size {par.pp}" if par.pp > 1 else "")
            + (f" --ep-size {par.ep}" if par.ep > 1 else ""),
        ]
        if nodes > 1:
            lines.append(
                f'--nnodes {nodes} --dist-init-addr "$SLURMFM_SERVE_HEAD:$SLURMFM_SERVE_DIST_PORT"'
            )
            prefix = 3
            dist_port = launcher.dist_port or 0
        lines.append('--host 0.0.0.0 --port "$SLURMFM_SERVE_PORT"')
    if extra:
        lines.append(" ".join(extra))
    return ServeLaunch(
        kind=launcher.kind,
        group=group,
        nodes=nodes,
        argv=tuple(lines),
        prefix=prefix,
        port=port,
        health_path=launcher.health_path,
        ready_timeout_s=launcher.ready_timeout_s,
        ready_poll_s=launcher.ready_poll_s,
        model_json=json.dumps(launcher.model),
        model_cache=(
            sh_quote(launcher.model_cache, what="launcher.model_cache")
            if launcher.model_cache
            else None
        ),
        dist_port=dist_port,
        node=node._replace(
            prefix=prefix,
            order_var="SLURMFM_HOST_ORDER" if group == "all" else "SLURMFM_SERVE_ORDER",
        ),
        dp=launcher.dp_size() if launcher.kind == "sglang" else 1,
    )
