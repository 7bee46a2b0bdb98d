"""A train-and-serve job split from one allocation (``serve.placement: split``): the trainer's
pin plan, then its serving group after it.

Why a step of its own: the trainer's rings decide the job's cost, so the trainer is planned
alone (:func:`slurmfm.plan.planner.plan_for_recipe`) and keeps the planned compact prefix and
its ranks; the job script takes its server from the last ``serve.nodes`` hosts of the order
(``slurmfm/job/cli.py``). Two rules hold for that tail as they do for a serving job:

* where NVLink spans nodes (a GB200 UltraServer), each of the server's model replicas stays
  inside one NVLink domain: the group is cut from the order in whole replica units, none
  across two domains (a replica over two UltraServers would run its tensor-parallel
  all-reduces over EFA);
* under Slurm's ``topology/block`` the whole ``--nodelist`` (trainer and server) must be one
  Slurm takes (:func:`slurmfm.plan.slurm_block.nodelist_accepted`, measured on 24.11.5 and
  26.05.5), so the group is chosen again inside the trainer's block, or the job refused, when
  the nearest nodes would make Slurm refuse it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from slurmfm.plan.planner import Plan, PlanError, _fmt_switch, _names, _Static, _static
from slurmfm.topology.model import natural_key

if TYPE_CHECKING:
    from slurmfm.catalog.slurm_features import SlurmVersion
    from slurmfm.recipe.schema import Recipe
    from slurmfm.topology.model import Topology


def serving_unit(recipe: Recipe) -> int:
    """Nodes that one whole set of the split server's replicas covers inside one NVLink
    domain: ``lcm(span, G) / G`` for a replica span of ``span`` GPUs on ``G`` per node, where
    NVLink spans nodes; 1 elsewhere (on HGX a node is the domain and a replica over nodes is
    the user's choice of EFA)."""
    from slurmfm.catalog.instances import get_instance
    from slurmfm.launchers import server_spec

    serve = recipe.serve
    if serve is None:
        return 1
    inst = get_instance(serve.instance_type or recipe.cluster.instance_type)
    if not (inst.gpus and inst.nvlink.is_multi_node):
        return 1
    spans = server_spec(serve.launcher.kind).replica_spans(serve.launcher, serve.parallelism)
    per_node = serve.procs_per_node or inst.gpus
    span = math.lcm(*spans.values())
    return math.lcm(span, per_node) // per_node


def plan_split(
    topology: Topology,
    plan_trainer: Callable[[frozenset[str]], Plan],
    k: int,
    *,
    unit: int,
    trainer_unit: int,
    unavailable: Iterable[str],
    slurm_version: SlurmVersion | None,
    topology_plugin: str | None = None,
) -> Plan:
    """The trainer's plan (``plan_trainer(more_unavailable)``) with ``k`` serving nodes after
    it (:func:`with_serving_group`). Under ``topology/block``, where Slurm would refuse the
    joint ``--nodelist``, both are planned again inside each block of the job's level and the
    cheapest trainer kept; :class:`PlanError` (the first plan's reason) when none holds both.
    """
    from slurmfm.plan.guard import _better
    from slurmfm.plan.slurm_block import level_blocks
    from slurmfm.plan.slurm_sim import block_geometry

    def joined(trainer: Plan, more: Iterable[str] = ()) -> Plan:
        return with_serving_group(
            topology,
            trainer,
            k,
            unit=unit,
            trainer_unit=trainer_unit,
            unavailable=[*unavailable, *more],
            slurm_version=slurm_version,
            topology_plugin=topology_plugin,
        )

    first = plan_trainer(frozenset())
    try:
        return joined(first)
    except PlanError as exc:
        refused = exc
    plugin = topology_plugin or topology.kind
    geometry = block_geometry(topology) if plugin == "block" else None
    if geometry is None:
        raise refused
    blocks, sizes = geometry
    best: Plan | None = None
    for members in level_blocks(blocks, len(first.nodes) + k, block_sizes=sizes):
        outside = frozenset(topology.nodes) - set(members)
        try:
            candidate = joined(plan_trainer(outside), outside)
        except PlanError:
            continue
        if best is None or _better(candidate.predicted, best.predicted):
            best = candidate
    if best is None:
        raise refused
    line = (
        f"topology/block: {refused}; trainer and server planned again inside one block of "
        f"the job's level: {_names(sorted(best.leaves, key=natural_key))}"
    )
    return dataclasses.replace(best, explanation=(*best.explanation, line))


def with_serving_group(
    topology: Topology,
    trainer: Plan,
    k: int,
    *,
    unit: int,
    trainer_unit: int,
    unavailable: Iterable[str],
    slurm_version: SlurmVersion | None,
    topology_plugin: str | None = None,
) -> Plan:
    """Append ``k`` serving nodes to a pinned trainer plan: the free nodes nearest the
    trainer, in whole ``unit``-node NVLink units, taken by Slurm's ``topology/block`` with
    the trainer (module docstring); :class:`PlanError` says why none can be.

    Nearest means sharing the deepest switch with the trainer's last node, then closest in the
    fabric order. They go at the end of the order, which is where the job script takes its
    serving group from.
    """
    from slurmfm.plan.slurm_sim import block_geometry

    st = _static(topology)
    taken = set(trainer.nodes) | set(unavailable)
    free = [n for n in st.order if topology.nodes[n].free and n not in taken]
    if k % unit:
        raise PlanError(
            f"serving group: {k} node(s) is not a whole number of the server's {unit}-node "
            "NVLink units (its model replicas)"
        )
    pick = _nearest(st, free, k, unit, trainer.nodes[-1])
    why: list[str] = []
    segment: int | None = None
    plugin = topology_plugin or topology.kind
    geometry = block_geometry(topology) if plugin == "block" else None
    if geometry is not None:
        blocks, sizes = geometry
        pick, segment = _block_taken(
            st,
            blocks,
            sizes,
            trainer,
            free,
            pick,
            k,
            unit=unit,
            trainer_unit=trainer_unit,
            version=slurm_version,
            why=why,
        )
    return _joined(st, trainer, pick, unit, segment, why)


def _nearest(st: _Static, free: Sequence[str], k: int, unit: int, anchor: str) -> list[str]:
    """``k`` of ``free`` nearest ``anchor``, in whole ``unit``-node units of one NVLink
    domain each (any nodes where ``unit`` is 1), in fabric order."""
    home = st.ancestors[st.leaf_of[anchor]]

    def shared(n: str) -> int:
        path = st.ancestors[st.leaf_of[n]]
        c = 0
        while c < min(len(path), len(home)) and path[c] == home[c]:
            c += 1
        return c

    def near(n: str) -> tuple[int, int]:
        return (-shared(n), abs(st.pos[n] - st.pos[anchor]))

    if unit == 1:
        pick = sorted(free, key=near)[:k]
        if len(pick) < k:
            raise PlanError(
                f"serving group: {k} node(s) needed beside the trainer, only {len(free)} free"
            )
        return sorted(pick, key=st.pos.__getitem__)
    by_domain: dict[str, list[str]] = {}
    for n in free:  # fabric order, so each domain's members stay in that order
        by_domain.setdefault(st.domain[n], []).append(n)
    pick = []
    for members in sorted(by_domain.values(), key=lambda m: near(m[0])):
        whole = len(members) // unit * unit
        pick.extend(members[: min(whole, k - len(pick))])
        if len(pick) == k:
            return sorted(pick, key=st.pos.__getitem__)
    usable = sum(len(m) // unit * unit for m in by_domain.values())
    raise PlanError(
        f"serving group: {k} node(s) needed beside the trainer in whole {unit}-node NVLink "
        f"units (a model replica must not straddle two NVLink domains), only {usable} usable "
        f"({len(free)} free)"
    )


def _block_taken(
    st: _Static,
    blocks: list[list[str]],
    sizes: list[int],
    trainer: Plan,
    free: Sequence[str],
    pick: list[str],
    k: int,
    *,
    unit: int,
    trainer_unit: int,
    version: SlurmVersion | None,
    why: list[str],
) -> tuple[list[str], int | None]:
    """The serving group and ``--segment`` with which Slurm's ``topology/block`` takes the
    trainer's and the server's nodes as one ``--nodelist``: the nearest group as it is, or
    cut into segments of whole units (Slurm >= 26.05), or a group chosen inside a block of
    the job's level that holds the trainer; else :class:`PlanError`."""
    from slurmfm.catalog.slurm_features import supports
    from slurmfm.plan.slurm_block import level_blocks, nodelist_accepted

    n = len(trainer.nodes) + k
    if nodelist_accepted(blocks, [*trainer.nodes, *pick], block_sizes=sizes, rules="24.11"):
        return pick, None
    segments = version is not None and supports("nodelist_with_segment", version)
    if segments:
        u = math.lcm(unit, trainer_unit)
        for seg in sorted((s for s in range(u, n, u) if n % s == 0), reverse=True):
            both = [*trainer.nodes, *pick]
            if nodelist_accepted(blocks, both, block_sizes=sizes, rules="26.05", segment=seg):
                why.append(
                    f"topology/block: the trainer and the serving group span blocks that no "
                    f"block of the job's level holds; with --segment={seg} Slurm {version} "
                    "lays the segments out inside the list (measured on 26.05.5)"
                )
                return pick, seg
    mine = set(trainer.nodes)
    level = level_blocks(blocks, n, block_sizes=sizes)
    for members in level:
        inside = set(members)
        if not mine <= inside:
            continue
        try:
            again = _nearest(st, [m for m in free if m in inside], k, unit, trainer.nodes[-1])
        except PlanError:
            continue
        if nodelist_accepted(blocks, [*trainer.nodes, *again], block_sizes=sizes, rules="24.11"):
            why.append(
                "topology/block: the nearest serving nodes would put the job's --nodelist "
                f"across blocks, which Slurm refuses; chosen inside the trainer's block of "
                f"{len(members)} nodes instead"
            )
            return again, None
    size = max(len(b) for b in level)
    raise PlanError(
        f"serving group: Slurm's topology/block takes the job's --nodelist ({len(mine)} "
        f"training and {k} serving nodes) only inside one block of {size} nodes (aligned "
        f"blocks of BlockSizes {sizes})"
        + ("" if segments else " or, from Slurm 26.05, one cut into --segment pieces")
        + ", and the block holding the trainer has no room for the server: use constrain "
        "mode, serve.placement: hetjob, or wait"
    )


def _joined(
    st: _Static,
    trainer: Plan,
    pick: list[str],
    unit: int,
    segment: int | None,
    why: list[str],
) -> Plan:
    """The trainer's plan with the serving group after it, and what to ask Slurm for both."""
    from slurmfm.topology.hostlist import nodelist

    anchor = trainer.nodes[-1]
    order = (*trainer.nodes, *pick)
    lca = st._lca([st.leaf_of[n] for n in (*pick, anchor)])
    units = f" in whole {unit}-node units, each inside one NVLink domain" if unit > 1 else ""
    lines = [
        f"serving group: {_names(sorted(pick, key=natural_key))}, the free nodes nearest the "
        f"trainer (under {_fmt_switch(st, lca)}){units}; last in the order, where the job "
        "takes its server from",
        *why,
    ]
    options = [f"--nodelist={nodelist(order)}"]
    if segment is not None:
        options.append(f"--segment={segment}")
    return dataclasses.replace(
        trainer,
        nodes=order,
        leaves=tuple(dict.fromkeys((*trainer.leaves, *(st.leaf_of[n] for n in pick)))),
        segment=segment,
        sbatch_options=tuple(options),
        explanation=(*trainer.explanation, *lines),
    )
