"""Launch lines for model servers (vLLM, SGLang): a pure function from the recipe to shell words.

A server runs either as the whole job (``launcher.kind: vllm|sglang``) or as the serving group
of a train-and-serve job (``serve:``), split from the trainer's allocation or in its own
heterogeneous component. Either way the job script starts one step over the group's nodes in
the planned order, waits until ``GET <health_path>`` on the group's first node answers 200
(failing the job after ``ready_timeout_s``) and writes the endpoint file.

Each server's own lines, and their sources, come from its launcher module
(:mod:`slurmfm.launchers.vllm`, :mod:`slurmfm.launchers.sglang`); this module adds what
every server group shares: the port, the readiness wait, the endpoint file and the options
of the group's node entry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from slurmfm.job.options import NodeOptions
from slurmfm.launchers import server_spec
from slurmfm.quote import sh_quote

if TYPE_CHECKING:
    from slurmfm.launchers import ServeLauncher
    from slurmfm.recipe.schema import Parallelism

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
    unhealthy_timeout_s: int
    model_json: str  # the model name as a JSON string (the runtime's --serve-model)
    model_cache: str | None  # shell-quoted HF_HOME, if any
    dist_port: int | None  # SGLang's --dist-init-addr port when fixed by the recipe
    # the options of the group's per-node entry (``runtime node``): the prefix, where the
    # group's host order is, and for vLLM across nodes the Ray settings
    node: NodeOptions = field(default_factory=NodeOptions)
    dp: int = 1  # SGLang: data-parallel ranks (each takes one more port after the dist port)
    front: str = "server"  # what answers at the URL (ServerSpec.replica_front when dp > 1)
    # SGLang prefill/decode (slurmfm/job/pd.py): prefill nodes, decode nodes, nodes of one
    # prefill server; (0, 0, 1) when not disaggregated
    pd: tuple[int, int, int] = (0, 0, 1)
    # and each role's (nodes of one server, --tp, --dp-size): prefill's, decode's
    pd_roles: tuple[tuple[int, int, int], ...] = ()

    @property
    def span(self) -> int:
        """Nodes one server spans (NCCL crosses the network only inside one)."""
        if self.pd[0]:
            return max([self.pd[2], *(r[0] for r in self.pd_roles)])
        return self.nodes

    @property
    def description(self) -> str:
        where = {
            "all": "the whole allocation",
            "split": f"the last {self.nodes} node(s) of the host order",
            "hetjob": "heterogeneous component 1",
        }[self.group]
        if self.pd[0]:
            p, d, k = self.pd
            return (
                f"{self.kind} prefill/decode on {where}: prefill on the first {p} node(s), "
                f"decode on the next {d}, servers of {k} node(s), the router on node 0"
            )
        return f"{self.kind} server on {where}"


def serve_launch(
    launcher: ServeLauncher, par: Parallelism, nodes: int, group: Group, per_node: int = 0
) -> ServeLaunch:
    """Build the per-node command of a server group of ``nodes`` nodes of ``per_node`` GPUs
    (pure; every user value quoted)."""
    port = launcher.port or server_spec(launcher.kind).default_port
    model = sh_quote(launcher.model, what="launcher.model")
    extra = [sh_quote(a, what="launcher.extra_args") for a in launcher.extra_args]
    if launcher.served_model_name:
        extra = [
            "--served-model-name",
            sh_quote(launcher.served_model_name, what="launcher.served_model_name"),
            *extra,
        ]
    lines, prefix, dist_port, node = server_spec(launcher.kind).serve_lines(
        launcher, par, nodes, model, extra
    )
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
        unhealthy_timeout_s=launcher.unhealthy_timeout_s,
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
        dp=launcher.dp_size(),
        front=server_spec(launcher.kind).replica_front if launcher.dp_size() > 1 else "server",
        pd=_pd(launcher, par, per_node),
        pd_roles=_pd_roles(launcher, par, per_node),
    )


def _pd(launcher: ServeLauncher, par: Parallelism, per_node: int) -> tuple[int, int, int]:
    """Prefill nodes, decode nodes and the nodes of one server (the recipe's checks made
    them whole: slurmfm.launchers.sglang ``check_disaggregation``)."""
    d = launcher.disaggregation
    if d is None:
        return (0, 0, 1)
    tp = d.roles(par.tp, launcher.replicas)["prefill"][0]
    span = max(1, tp * par.pp // per_node) if per_node else 1
    return (d.prefill_nodes, d.decode_nodes, span)


def _pd_roles(
    launcher: ServeLauncher, par: Parallelism, per_node: int
) -> tuple[tuple[int, int, int], ...]:
    """Prefill's and decode's (nodes of one server, ``--tp``, ``--dp-size``); () when not
    disaggregated."""
    d = launcher.disaggregation
    if d is None:
        return ()
    out = []
    for tp, dp in d.roles(par.tp, launcher.replicas).values():
        out.append((max(1, tp * par.pp // per_node) if per_node else 1, tp, dp))
    return tuple(out)
