"""A pinned job whose host order ends in nodes that do not train: a split train-and-serve
job's serving group (``serve.placement: split``) or the spare nodes (``resources.spare_nodes``)
after the trainer's pin plan.

Why a step of its own: the trainer's rings decide the job's cost, so the trainer is planned
alone (:func:`slurmfm.plan.planner.plan_for_recipe`) and keeps the planned compact prefix and
its ranks; the job script takes the server, or the spares, from the last hosts of the order
(``slurmfm/job/cli.py``), so they are listed in the pin plan's ``--nodelist`` (which Slurm
then allocates as listed) rather than left to Slurm beside a shorter list. Two rules hold for
that tail:

* where NVLink spans nodes (a GB200 UltraServer), each of the server's model replicas stays
  inside one NVLink domain: the group is cut from the order in whole replica units, none
  across two domains (a replica over two UltraServers would run its tensor-parallel
  all-reduces over EFA); spares are single nodes, nearest the trainer first (the same
  UltraServer as the nodes they may replace where it has room);
* under Slurm's ``topology/block`` the whole ``--nodelist`` must be one Slurm takes
  (:func:`slurmfm.plan.slurm_block.nodelist_accepted`, measured on 24.11.5 and 26.05.5), so
  the tail is chosen again inside the trainer's block, or trainer and tail are planned again
  inside one block, or the job is refused, when the nearest nodes would make Slurm refuse it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from slurmfm.plan.planner import Plan, PlanError, _fmt_switch, _names, _Static, _static
from slurmfm.topology.model import natural_key

if TYPE_CHECKING:
    from slurmfm.catalog.slurm_features import SlurmVersion
    from slurmfm.recipe.schema import Recipe
    from slurmfm.topology.model import Topology


@dataclass(frozen=True)
class Tail:
    """What follows the trainer in the order: its name in messages, its unit in nodes (a
    server's replica span; 1 for spares) and the way out when it cannot be placed."""

    name: str
    unit: int
    way_out: str

    @classmethod
    def serving(cls, unit: int) -> Tail:
        return cls("serving group", unit, "use constrain mode, serve.placement: hetjob, or wait")

    @classmethod
    def spares(cls) -> Tail:
        return cls("spare nodes", 1, "use fewer resources.spare_nodes, constrain mode, or wait")


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
    tail: Tail,
    trainer_unit: int,
    unavailable: Iterable[str],
    slurm_version: SlurmVersion | None,
    topology_plugin: str | None = None,
) -> Plan:
    """The trainer's plan (``plan_trainer(more_unavailable)``) with ``k`` nodes of ``tail``
    after it (:func:`with_tail`). Under ``topology/block``, where Slurm would refuse the
    joint ``--nodelist``, both are planned again inside each block of the job's level and the
    cheapest trainer kept; :class:`PlanError` (the first plan's reason) when none holds both.
    """
    from slurmfm.plan.guard import _better
    from slurmfm.plan.slurm_block import level_blocks
    from slurmfm.plan.slurm_sim import block_geometry

    plugin = topology_plugin or topology.kind
    geometry = block_geometry(topology) if plugin == "block" else None

    def joined(trainer: Plan, more: Iterable[str] = ()) -> Plan:
        return with_tail(
            topology,
            trainer,
            k,
            tail=tail,
            trainer_unit=trainer_unit,
            unavailable=[*unavailable, *more],
            slurm_version=slurm_version,
            geometry=geometry,
        )

    first = plan_trainer(frozenset())
    try:
        return joined(first)
    except PlanError as exc:
        refused = exc
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
        f"topology/block: {refused}; trainer and {tail.name} planned again inside one block of "
        f"the job's level: {_names(sorted(best.leaves, key=natural_key))}"
    )
    return dataclasses.replace(best, explanation=(*best.explanation, line))


def with_tail(
    topology: Topology,
    trainer: Plan,
    k: int,
    *,
    tail: Tail,
    trainer_unit: int,
    unavailable: Iterable[str],
    slurm_version: SlurmVersion | None,
    geometry: tuple[list[list[str]], list[int]] | None,
) -> Plan:
    """Append ``k`` nodes of ``tail`` to a pinned trainer plan: the free nodes nearest the
    trainer, in whole ``tail.unit``-node NVLink units, taken by Slurm's ``topology/block``
    (its base blocks and ``BlockSizes``, ``geometry``; None: no block rules) with the
    trainer (module docstring); :class:`PlanError` says why none can be.

    Nearest means sharing the deepest switch with the trainer's last node, then closest in the
    fabric order. They go at the end of the order, which is where the job script takes its
    serving group (or spares) from.
    """
    st = _static(topology)
    taken = set(trainer.nodes) | set(unavailable)
    free = [n for n in st.order if topology.nodes[n].free and n not in taken]
    unit = tail.unit
    if k % unit:
        raise PlanError(
            f"{tail.name}: {k} node(s) is not a whole number of the server's {unit}-node "
            "NVLink units (its model replicas)"
        )
    pick = _nearest(st, free, k, tail, trainer.nodes[-1])
    why: list[str] = []
    segment: int | None = None
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
            tail=tail,
            trainer_unit=trainer_unit,
            version=slurm_version,
            why=why,
        )
    return _joined(st, trainer, pick, tail, segment, why)


def _nearest(st: _Static, free: Sequence[str], k: int, tail: Tail, anchor: str) -> list[str]:
    """``k`` of ``free`` nearest ``anchor``, in whole ``tail.unit``-node units of one NVLink
    domain each (any nodes where the unit is 1), in fabric order."""
    unit = tail.unit
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
                f"{tail.name}: {k} node(s) needed beside the trainer, only {len(free)} free"
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
        f"{tail.name}: {k} node(s) needed beside the trainer in whole {unit}-node NVLink "
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
    tail: Tail,
    trainer_unit: int,
    version: SlurmVersion | None,
    why: list[str],
) -> tuple[list[str], int | None]:
    """The tail and ``--segment`` with which Slurm's ``topology/block`` takes the
    trainer's and the tail's nodes as one ``--nodelist``: the nearest group as it is, or
    cut into segments of whole units (Slurm >= 26.05), or a group chosen inside a block of
    the job's level that holds the trainer; else :class:`PlanError`."""
    from slurmfm.catalog.slurm_features import supports
    from slurmfm.plan.slurm_block import level_blocks, nodelist_accepted

    n = len(trainer.nodes) + k
    if nodelist_accepted(blocks, [*trainer.nodes, *pick], block_sizes=sizes, rules="24.11"):
        return pick, None
    segments = version is not None and supports("nodelist_with_segment", version)
    if segments:
        u = math.lcm(tail.unit, trainer_unit)
        for seg in sorted((s for s in range(u, n, u) if n % s == 0), reverse=True):
            both = [*trainer.nodes, *pick]
            if nodelist_accepted(blocks, both, block_sizes=sizes, rules="26.05", segment=seg):
                why.append(
                    f"topology/block: the trainer and the {tail.name} span blocks that no "
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
            again = _nearest(st, [m for m in free if m in inside], k, tail, trainer.nodes[-1])
        except PlanError:
            continue
        if nodelist_accepted(blocks, [*trainer.nodes, *again], block_sizes=sizes, rules="24.11"):
            why.append(
                f"topology/block: the nearest {tail.name} would put the job's --nodelist "
                f"across blocks, which Slurm refuses; chosen inside the trainer's block of "
                f"{len(members)} nodes instead"
            )
            return again, None
    size = max(len(b) for b in level)
    raise PlanError(
        f"{tail.name}: Slurm's topology/block takes the job's --nodelist ({len(mine)} "
        f"training nodes and {k} of the {tail.name}) only inside one block of {size} nodes "
        f"(aligned blocks of BlockSizes {sizes})"
        + ("" if segments else " or, from Slurm 26.05, one cut into --segment pieces")
        + f", and the block holding the trainer has no room for them: {tail.way_out}"
    )


def _joined(
    st: _Static,
    trainer: Plan,
    pick: list[str],
    tail: Tail,
    segment: int | None,
    why: list[str],
) -> Plan:
    """The trainer's plan with the tail after it, and what to ask Slurm for both."""
    from slurmfm.topology.hostlist import nodelist

    anchor = trainer.nodes[-1]
    order = (*trainer.nodes, *pick)
    lca = st._lca([st.leaf_of[n] for n in (*pick, anchor)])
    unit = tail.unit
    units = f" in whole {unit}-node units, each inside one NVLink domain" if unit > 1 else ""
    lines = [
        f"{tail.name}: {_names(sorted(pick, key=natural_key))}, the free nodes nearest the "
        f"trainer (under {_fmt_switch(st, lca)}){units}; last in the order, where the job "
        "takes them from",
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
