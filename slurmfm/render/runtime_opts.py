"""The job runtime's options as the script passes them: ``prepare`` (host order, ports,
storage) and ``batch`` (restarts, the health gate, checks, the save protocol, observability,
servers, containers) built as typed values (:mod:`slurmfm.job.options`) and written as shell
words; pure (part of :mod:`slurmfm.render.script`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from slurmfm.errors import RenderError
from slurmfm.job import hetjob
from slurmfm.job.options import BatchOptions, PrepareOptions, flag
from slurmfm.launchers import LauncherSpec, spec
from slurmfm.plan.types import Placement
from slurmfm.quote import sh_quote
from slurmfm.render.parts import Component, HealthGate, Observe, _wrap

if TYPE_CHECKING:
    from slurmfm.catalog.instances import InstanceType
    from slurmfm.catalog.storage import CheckpointLayout
    from slurmfm.recipe.schema import Recipe
    from slurmfm.render.serve import ServeLaunch


def _prepare_opts(
    recipe: Recipe,
    placement: Placement,
    serve: ServeLaunch | None,
    launcher: LauncherSpec | None = None,
) -> tuple[PrepareOptions, str]:
    """Options of ``runtime prepare``: where the host order comes from, ports, storage
    (``launcher``: the recipe's spec, when resolved already)."""
    o: dict[str, object] = {}
    if placement.nodes:
        o["planned"] = " ".join(placement.nodes)
        how = "planned by `slurmfm plan`, pin mode"
    elif placement.rank_key:
        o["rank_map"] = " ".join(f"{h}={k}" for h, k in sorted(placement.rank_key.items()))
        how = "the planner's rank map sorts the allocation"
    elif placement.mode == "constrain":
        o["topo_addr"] = True
        how = "sorted by each node's SLURM_TOPOLOGY_ADDR"
    else:
        how = "the allocation's own order"
    port = getattr(recipe.launcher, "rdzv_port", None)
    if port:
        o["rdzv_port"] = port
    launcher = spec(recipe.launcher.kind) if launcher is None else launcher
    if launcher.task_per_gpu:  # one task per GPU, laid out in host order
        o["tasks_per_node"] = recipe.procs_per_node
    if recipe.resources.spare_nodes:
        o["spare_nodes"] = recipe.resources.spare_nodes
    if serve is not None:
        o.update(serve=serve.group, serve_nodes=serve.nodes, serve_port=serve.port)
        if serve.dist_port is not None:
            o["dist_port"] = serve.dist_port
            o["serve_dp"] = serve.dp
        if serve.pd[0]:  # SGLang prefill/decode: the runtime's layout (slurmfm/job/pd.py)
            o.update(pd_prefill=serve.pd[0], pd_decode=serve.pd[1], pd_span=serve.pd[2])
            (_, ptp, pdp), (dspan, dtp, ddp) = serve.pd_roles
            # each role's --tp and --dp-size; SGLang's ports per server follow the larger
            o.update(pd_decode_span=dspan, pd_tp=f"{ptp},{dtp}", pd_dp=f"{pdp},{ddp}")
            o["serve_dp"] = max(pdp, ddp)
    s = recipe.storage
    if s.stripe == "auto":
        layout = _checkpoint_layout(recipe, launcher)
        if layout.args:
            o["stripe_layout"] = " ".join(layout.args)
    if s.min_free_gb:
        gb = str(int(s.min_free_gb)) if s.min_free_gb == int(s.min_free_gb) else str(s.min_free_gb)
        o.update(min_free_kb=int(s.min_free_gb * 1024 * 1024), min_free_gb=gb)
    return PrepareOptions(**o), how  # type: ignore[arg-type]


def _shell_words(words: list[str]) -> str:
    """Runtime option words as shell text: ``--flag=VALUE`` keeps its flag bare."""
    out = []
    for w in words:
        name, eq, value = w.partition("=")
        bare_flag = eq and name.startswith("--") and name[2:].replace("-", "").isalnum()
        out.append(name + "=" + sh_quote(value) if bare_flag else sh_quote(w))
    return " ".join(out)


# ``runtime batch``'s options, one readable line per group: a line marked True always shows
# (for the reader), the others when one of their values is not the runtime's default.
_BATCH_LINES: tuple[tuple[tuple[str, ...], bool], ...] = (
    (("max_restarts", "restart_in_job", "requeue", "drain", "hyperpod"), True),
    # with the hang watch's, which a server-only job has not (no training to watch)
    (("retry_exit", "hang_timeout_s", "startup_timeout_s"), True),
    (("expedite",), False),
    (("health", "gpus", "efa", "dcgm", "imex", "efa_tries", "efa_delay_s"), False),
    (("nccl_check", "nccl_timeout_s"), False),
    (
        (
            "fabric_test",
            "fabric_cmd",
            "fabric_args",
            "fabric_floor_gbs",
            "fabric_tasks",
            "fabric_mpi",
            "fabric_timeout_s",
        ),
        False,
    ),
    (("save_protocol", "resignal_s", "probe_timeout_s", "done_check"), True),
    (("observe", "observe_job_json"), False),
    (
        (
            "serve_words",
            "serve_kind",
            "serve_model",
            "serve_replicas",
            "serve_front",
            "health_path",
            "ready_timeout_s",
            "ready_poll_s",
            "unhealthy_timeout_s",
        ),
        False,
    ),
    (("component",), False),  # one line per component, with its own env lines (_batch_lines)
    (("secret",), False),
    (("container_forward",), False),
    (("container_forward_tasks",), False),
)


def _serve_node_words(serve: ServeLaunch) -> str:
    """The server's per-node entry options: its prefix always and, with Ray, every setting."""
    ray = ("ray", "ray_python", "ray_port", "ray_nodes", "ray_timeout_s") if serve.node.ray else ()
    pd = ("pd", "pd_router_python", "pd_startup_s") if serve.node.pd else ()
    return _shell_words(serve.node.to_argv(always=("prefix", *ray, *pd)))


def _batch_lines(
    o: BatchOptions, components: tuple[Component, ...], trainer: bool = True
) -> list[str]:
    """``o`` as the script's lines of shell words (:data:`_BATCH_LINES`).

    Two values only the job's bash knows are shell text here, not fields of ``o``: the
    number of words of the server's command (``${#slurmfm_serve[@]}``) and each component's
    environment values (the profile's shell words, as in the ``export`` lines).
    ``trainer``: False for a server-only job, whose script then carries no hang watch option
    (it watches a server by its health endpoint, not by training progress).
    """
    changed = set(o.changed())
    lines: list[str] = []
    placed: set[str] = set()
    for names, always in _BATCH_LINES:
        placed.update(names)
        if names == ("component",):
            # Heterogeneous component N: its own health gate and observability agent on its
            # own nodes, and the profile lines of its instance type that differ from the
            # exports above, applied to its steps (`srun --het-group=N`).
            for comp, spec in zip(components[1:], o.component, strict=False):
                lines.append(_shell_words([flag("component"), spec]))
                env = flag("component_env")
                own = [
                    f"{env} " + hetjob.env_spec(comp.group, e.name, e.shell_value) for e in comp.env
                ]
                own += [
                    _shell_words([flag("component_unset"), hetjob.unset_spec(comp.group, n)])
                    for n in comp.unset
                ]
                lines.extend(_wrap(own))
            placed.update(("component_env", "component_unset"))
            continue
        if not always and not changed & set(names):
            continue
        hang = ("hang_timeout_s", "startup_timeout_s")
        shown = names if trainer else tuple(n for n in names if n not in hang)
        words = []
        for name in shown:
            if name == "serve_words":
                words.append(flag(name) + ' "${#slurmfm_serve[@]}"')
            else:
                words.append(_shell_words(o.words(name)))
        lines.append(" ".join(w for w in words if w))
    if changed - placed:  # pragma: no cover - a field added to BatchOptions but not here
        raise RenderError(f"internal: batch options {sorted(changed - placed)} have no line")
    return lines


def _checkpoint_layout(recipe: Recipe, launcher: LauncherSpec) -> CheckpointLayout:
    """The Lustre layout for this recipe's checkpoint format (slurmfm/catalog/storage.py)."""
    from slurmfm.catalog.storage import checkpoint_layout

    fmt = launcher.checkpoint_format(recipe)
    return checkpoint_layout(recipe.launcher.kind, fmt)


def _batch_opts(
    recipe: Recipe,
    inst: InstanceType,
    health: HealthGate,
    nccl_check: str,
    observe: Observe,
    serve: ServeLaunch | None,
    components: tuple[Component, ...] = (),
    container: Mapping[str, object] = {},
    launcher: LauncherSpec | None = None,
) -> BatchOptions:
    """Options of ``runtime batch`` (the words: :func:`_batch_lines`; ``launcher``: the
    recipe's spec, when resolved already)."""
    res = recipe.resilience
    launcher = spec(recipe.launcher.kind) if launcher is None else launcher
    o: dict[str, object] = {
        "max_restarts": res.max_restarts,
        "restart_in_job": res.restart_in_job,
        "requeue": res.requeue,
        "drain": res.drain_unhealthy,
        "hyperpod": recipe.cluster.flavor == "hyperpod",
        # Exits > 128 (killed by a signal) retry in the runtime whatever this list says.
        "retry_exit": ",".join(str(c) for c in sorted(set(res.retry_exit_codes))) or "none",
        "hang_timeout_s": res.hang_timeout_s,
        "startup_timeout_s": res.startup_timeout_s,
        # an end it chooses must not be requeued held
        "expedite": res.requeue and res.expedited_requeue,
    }
    if health.enabled:
        # A multi-node NVLink domain (GB200) needs the IMEX channel: NCCL's MNNVL fails
        # without /dev/nvidia-caps-imex-channels (NVIDIA/nccl src/mnnvl.cc).
        o.update(
            health=True,
            gpus=health.gpus,
            efa=health.efa,
            dcgm=res.dcgm_level,
            imex=max(inst.nvlink.instances) > 1,
        )
    if nccl_check != "off":
        o.update(nccl_check=nccl_check, nccl_timeout_s=res.nccl_check_timeout_s)
    # resilience.save_on_signal (default by launcher: servers have no state to save, scripts
    # without a USR2 handler have no save protocol): false requeues at once at the
    # signal, resuming from the last periodic checkpoint; true lets the training save first.
    if res.fabric_test != "off":
        from slurmfm.catalog.fabric import TEST_ARGS, floor_for

        floor, _ = floor_for(inst, res.fabric_min_busbw_gbs)
        o.update(
            fabric_test=res.fabric_test,
            fabric_cmd=res.fabric_test_command,
            fabric_args=" ".join(TEST_ARGS),
            fabric_floor_gbs=floor or 0.0,
            fabric_tasks=recipe.procs_per_node,
            # the AWS sample's --mpi=pmix (nccl-tests built with MPI); the CPU lab has none
            fabric_mpi="" if inst.virtual else "pmix",
            fabric_timeout_s=float(res.fabric_timeout_s),
        )
    o["save_protocol"] = bool(recipe.save_on_signal)
    o["done_check"] = launcher.done_check(recipe)
    if observe.enabled:
        o.update(observe=True, observe_job_json=observe.job_json)
    if serve is not None:
        o.update(
            serve_kind=serve.kind,
            serve_model=serve.model_json,
            serve_replicas=serve.dp,
            serve_front=serve.front,
            health_path=serve.health_path,
            ready_timeout_s=serve.ready_timeout_s,
            ready_poll_s=serve.ready_poll_s,
            unhealthy_timeout_s=serve.unhealthy_timeout_s,
        )
    o["component_unset"] = tuple(
        hetjob.unset_spec(c.group, n) for c in components[1:] for n in c.unset
    )
    o["component"] = tuple(
        hetjob.component_spec(
            hetjob.Component(
                c.group, c.nodes, c.health.enabled, c.health.gpus, c.health.efa, c.imex
            )
        )
        for c in components[1:]
    )
    # masked in the launch command the job log prints
    o["secret"] = tuple(recipe.secrets)
    o.update(container)
    return BatchOptions(**o)  # type: ignore[arg-type]
