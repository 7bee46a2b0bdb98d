"""SGLang's own multi-node launch: ``python -m sglang.launch_server`` on every node.

Every node runs it with the same ``--tp`` (the total), ``--nnodes``, its own ``--node-rank``
(inserted by the node entry from the planned order) and ``--dist-init-addr <node 0>:<port>``;
node 0 serves HTTP (SGLang docs "Multi-Node Deployment"; ``--ep-size``, alias
``--expert-parallel-size``, from SGLang's "Server Arguments" reference). ``--pp-size`` is
SGLang's pipeline-parallel flag in current releases; it is unverified here and emitted only
when ``pp > 1``. The server listens on 30000 by default (SGLang's CLI default).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from slurmfm.job.options import NodeOptions
from slurmfm.launchers.base import python_module
from slurmfm.launchers.serving import (
    ServeLines,
    ServerSpec,
    _ServeLauncher,
    flag_value,
    refuse_own_flags,
)

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType
    from slurmfm.recipe.schema import Parallelism

DEFAULT_PORT = 30000  # SGLang's --port default


class SglangLauncher(_ServeLauncher):
    """SGLang's own multi-node launch: ``python -m sglang.launch_server`` on every node with
    ``--nnodes``, ``--node-rank`` (from the planned order) and ``--dist-init-addr`` on node 0
    (SGLang's multi-node deployment guide). ``parallelism.tp`` is SGLang's total ``--tp``,
    which may span nodes; ``pp`` and ``ep`` map to ``--pp-size`` and ``--ep-size``.
    """

    kind: Literal["sglang"]
    python: str = Field(default="python3", min_length=1)
    dist_port: int | None = Field(
        default=None, ge=1024, le=65535, description="--dist-init-addr port; default per job"
    )

    def dp_size(self) -> int:
        """SGLang's data-parallel size: ``replicas``, or ``--dp-size N`` / ``--dp N`` in
        ``extra_args``."""
        if self.replicas > 1:
            return self.replicas
        value = flag_value(self.extra_args, ("--dp-size", "--dp"))
        return max(1, int(value)) if value is not None and value.isdigit() else 1

    @model_validator(mode="after")
    def _ports_apart(self) -> SglangLauncher:
        """A fixed dist port must keep SGLang's derived ports clear of its HTTP port's."""
        if self.dist_port is not None:
            from slurmfm.job.hosts import sglang_port_clash

            why = sglang_port_clash(self.dist_port, self.port or DEFAULT_PORT, self.dp_size())
            if why:
                raise ValueError(f"dist_port {self.dist_port}: {why}")
        return self


class SglangSpec(ServerSpec):
    kind = "sglang"
    default_port = DEFAULT_PORT
    # one server whose attention runs data parallel inside its --tp group
    replica_front = "dp-attention"
    tp_spans_nodes = True
    why_tasks = "one launch_server per node; SGLang starts the per-GPU schedulers"

    def serve_lines(
        self,
        launcher: _ServeLauncher,
        par: Parallelism,
        nodes: int,
        model: str,
        extra: list[str],
    ) -> ServeLines:

        if not isinstance(launcher, SglangLauncher):
            raise TypeError(f"internal: the sglang spec asked about {type(launcher).__name__}")
        server = python_module(launcher.python, "sglang.launch_server")
        d = launcher.disaggregation
        # with prefill/decode each server's --tp and --dp-size are its role's, added by
        # its node's entry (slurmfm/job/pd.py, server_words)
        lines = [
            " ".join(server),
            f"--model-path {model}"
            + (f" --tp {par.tp}" if d is None else "")
            + (f" --pp-size {par.pp}" if par.pp > 1 else "")
            + (f" --ep-size {par.ep}" if par.ep > 1 else "")
            + (
                f" --dp-size {launcher.replicas} --enable-dp-attention"
                if launcher.replicas > 1 and d is None
                else ""
            ),
        ]
        if d is not None:
            # Prefill/decode: each node's entry adds its server's port, role, --tp and
            # --dp-size, transfer backend, bootstrap port and (across nodes)
            # --nnodes/--node-rank/--dist-init-addr from the layout the runtime made
            # (slurmfm/job/pd.py); node 0 runs the router.
            from slurmfm.quote import sh_quote

            for a in d.router_args:
                sh_quote(a, what="launcher.disaggregation.router_args")  # bash must carry it
            lines.append("--host 0.0.0.0")
            if extra:
                lines.append(" ".join(extra))
            node = NodeOptions(
                prefix=0,
                pd=d.transfer_backend,
                pd_router_python=launcher.python,
                pd_router_arg=tuple(d.router_args),
                pd_startup_s=launcher.ready_timeout_s,
            )
            return ServeLines(lines, 0, launcher.dist_port or 0, node)
        prefix, dist_port = 0, None
        if nodes > 1:
            lines.append(
                f'--nnodes {nodes} --dist-init-addr "$SLURMFM_SERVE_HEAD:$SLURMFM_SERVE_DIST_PORT"'
            )
            prefix = len(server)  # --node-rank=R after the server's module
            dist_port = launcher.dist_port or 0
        lines.append('--host 0.0.0.0 --port "$SLURMFM_SERVE_PORT"')
        if extra:
            lines.append(" ".join(extra))
        return ServeLines(lines, prefix, dist_port, NodeOptions(prefix=0))

    def nvlink_span(self, p: Parallelism) -> int:
        """SGLang's model-parallel group is ``--tp``: ``--ep-size`` divides it and reuses the
        same GPUs (SGLang's "Server Arguments": expert parallelism within the TP group), so the
        span is ``tp``, never ``tp x ep``."""
        return p.tp

    def span_text(self, p: Parallelism) -> str:
        return f"--tp {p.tp}"

    def gpus(self, launcher: _ServeLauncher, p: Parallelism) -> int:
        """With DP attention the replicas share ``--tp``'s GPUs: ``tp x pp``."""
        return p.tp * p.pp

    def check_replicas(
        self, launcher: _ServeLauncher, p: Parallelism, nodes: int, per_node: int, where: str
    ) -> None:
        """``replicas`` is SGLang's ``--dp-size`` with ``--enable-dp-attention``: the
        attention runs data parallel inside the ``--tp`` group, so ``--dp-size`` must divide
        ``--tp`` (sgl-project/sglang:python/sglang/srt/server_args.py, ``dp_size`` and
        ``enable_dp_attention``; docs "Server Arguments", "Data parallelism attention")."""
        r = launcher.replicas
        if r > 1:
            refuse_own_flags(
                launcher.extra_args,
                {"--dp-size": f"{where}.replicas", "--dp": f"{where}.replicas"},
                where,
            )
            if p.tp % r:
                raise ValueError(
                    f"{where}.replicas: SGLang's DP attention runs the {r} replicas inside the "
                    f"--tp {p.tp} group: replicas must divide parallelism.tp"
                )

    def check_disaggregation(
        self, launcher: _ServeLauncher, p: Parallelism, nodes: int, per_node: int, where: str
    ) -> int:
        """Prefill/decode: the two node counts make up the job, each server (its role's
        ``--tp`` x ``pp`` GPUs, SGLang's ``--tp`` total over ``--nnodes``) takes whole
        nodes, each group holds whole servers, and each role's ``--dp-size`` and
        ``--ep-size`` divide its ``--tp``; flags each node's entry sets are refused in
        ``extra_args``. Returns the nodes of a prefill server.

        Prefill and decode may differ in ``--tp`` and ``--dp-size``: the KV cache moves
        between any two tensor-parallel sizes, each prefill rank sending the heads a decode
        rank holds (sgl-project/sglang:python/sglang/srt/disaggregation/mooncake/conn.py,
        ``send_kvcache_slice``: "supporting generic M-to-N TP size configurations", taken
        when the attention TP sizes differ and the model is not MLA; the same in
        ``disaggregation/nixl/conn.py``); SGLang refuses it itself for sliding-window and
        NSA hybrid models ("SWA and NSA hybrid models do not support different TP sizes
        yet", ``maybe_send_extra`` there)."""
        d = launcher.disaggregation
        if d is None:
            raise TypeError("internal: no disaggregation to check")
        field = f"{where}.disaggregation"
        total = d.prefill_nodes + d.decode_nodes
        if total != nodes:
            raise ValueError(
                f"{field}: prefill_nodes + decode_nodes = {d.prefill_nodes} + {d.decode_nodes} "
                f"= {total} must equal the job's {nodes} nodes (resources.nodes)"
            )
        spans = {}
        for role, (tp, dp) in d.roles(p.tp, launcher.replicas).items():
            n = d.prefill_nodes if role == "prefill" else d.decode_nodes
            own_tp = getattr(d, f"{role}_tp") is not None
            tp_field = f"{field}.{role}_tp" if own_tp else "parallelism.tp"
            span = tp * p.pp
            if span % per_node:
                raise ValueError(
                    f"{tp_field}: a {role} server of tp x pp = {tp} x {p.pp} = {span} GPUs "
                    f"does not fill whole nodes of {per_node} GPUs: each server takes whole nodes"
                )
            k = span // per_node
            if n % k:
                raise ValueError(
                    f"{field}.{role}_nodes: {n} node(s) do not hold whole {role} servers of "
                    f"{k} nodes (tp x pp = {span} GPUs, {per_node} per node)"
                )
            if dp > 1 and tp % dp:
                dp_field = (
                    f"{field}.{role}_replicas"
                    if getattr(d, f"{role}_replicas") is not None
                    else f"{where}.replicas"
                )
                raise ValueError(
                    f"{dp_field}: SGLang's DP attention runs the {dp} replicas of a {role} "
                    f"server inside its --tp {tp} group: replicas must divide its tp"
                )
            if p.ep > 1 and tp % p.ep:
                raise ValueError(
                    f"parallelism.ep: SGLang's --ep-size {p.ep} must divide the {role} "
                    f"servers' --tp {tp}"
                )
            spans[role] = k
        own = {
            "--disaggregation-mode": f"{field}, per node",
            "--disaggregation-transfer-backend": f"{field}.transfer_backend",
            "--disaggregation-bootstrap-port": "the runtime, per server",
            "--port": "the runtime, per server (launcher.port is the router's)",
            "--nnodes": "the runtime, per server",
            "--node-rank": "the runtime, per server",
            "--dist-init-addr": "the runtime, per server",
            "--tp": f"parallelism.tp or {field}.prefill_tp/decode_tp",
            "--tp-size": f"parallelism.tp or {field}.prefill_tp/decode_tp",
            "--tensor-parallel-size": f"parallelism.tp or {field}.prefill_tp/decode_tp",
            "--dp-size": f"{where}.replicas or {field}.prefill_replicas/decode_replicas",
            "--dp": f"{where}.replicas or {field}.prefill_replicas/decode_replicas",
            "--data-parallel-size": f"{where}.replicas or {field}.prefill_replicas/decode_replicas",
        }
        refuse_own_flags(launcher.extra_args, own, where)
        if isinstance(launcher, SglangLauncher) and launcher.dist_port is not None:
            raise ValueError(
                f"{where}.dist_port: with disaggregation the runtime picks each server's dist "
                "and bootstrap ports per job; remove it"
            )
        from slurmfm.job.hosts import SGLANG_HTTP_BAND

        servers = d.prefill_nodes // spans["prefill"] + d.decode_nodes // spans["decode"]
        port = launcher.port or DEFAULT_PORT
        if port + servers + SGLANG_HTTP_BAND > 65535:
            raise ValueError(
                f"{where}.port: the router's port {port} leaves no room for the {servers} "
                f"servers' ports {port + 1}-{port + servers} and SGLang's ports up to "
                f"{SGLANG_HTTP_BAND} above them"
            )
        return spans["prefill"]

    def replica_spans(self, launcher: _ServeLauncher, p: Parallelism) -> dict[str, int]:
        """With prefill/decode each role's servers: their ``--tp`` (:meth:`nvlink_span`)."""
        d = launcher.disaggregation
        if d is None:
            return super().replica_spans(launcher, p)
        return {
            f"a {role} server's --tp {tp}": tp
            for role, (tp, _) in d.roles(p.tp, launcher.replicas).items()
        }

    def check_group(self, p: Parallelism, per_node: int, inst: InstanceType, where: str) -> None:
        """``--tp`` is the total and may span nodes (SGLang's multi-node guide runs --tp 16
        on 2 x 8 GPUs); ``--ep-size`` divides it."""
        if p.ep > 1 and p.tp % p.ep:
            raise ValueError(f"{where}.ep: SGLang's --ep-size {p.ep} must divide --tp {p.tp}")


SGLANG = SglangSpec()
