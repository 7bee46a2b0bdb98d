"""Choose a job's nodes and rank order on the fabric, and what to ask Slurm for.

Why not leave it to Slurm: ``topology/tree`` is a greedy, config-order-dependent best-fit whose
rank order is node-name order, not topology order, before 26.05
(https://slurm.schedmd.com/topology.html; checked on the lab's 22.05.8); ``topology/block`` places
``--segment`` chunks one at a time. The planner does the selection the documentation promises
and then fixes the rank order:

1. **NVLink rule (hard).** TP*CP and EP groups are blocks of consecutive ranks (Megatron order
   ``tp-cp-ep-dp-pp``, NVIDIA/Megatron-LM:megatron/core/parallel_state.py); they must not
   leave their NVLink domain, the node itself or a GB200 UltraServer (1.8 TB/s of NVLink per
   GPU inside NVL72 against 50 GB/s of EFA per GPU outside, a ~36x cliff:
   https://www.nvidia.com/en-us/data-center/gb200-nvl72/). So the job is cut into units of
   :meth:`JobShape.nvlink_unit` consecutive nodes
   and every unit is placed inside one domain's free nodes.
2. **Fewest leaves, then lowest switch.** The fewest bins (leaves) that can hold the job
   anywhere in the fabric, under the lowest-level switch that achieves that minimum, the
   tightest such one on ties (the documented tree rule, https://slurm.schedmd.com/topology.html;
   best-fit against fragmentation, as Kueue's topology-aware scheduling,
   https://kueue.sigs.k8s.io/docs/concepts/topology_aware_scheduling/, and Slurm's block
   plugin's smallest sufficient block,
   SchedMD/slurm:src/plugins/topology/block/eval_nodes_block.c). Slurm's top switch
   is the highest with room, so no Slurm choice can use fewer leaves than this. (The lowest
   switch with room may need more leaves than Slurm's greedy scan across it.)
3. **Few subtrees, tight fit.** Inside it, level by level, keep the fewest child subtrees that
   still hold the job in that many bins (the last one swapped for the smallest that also
   completes it); then take bins largest-first and finish with the closest, tightest bin that
   fits the remainder (the shape of Slurm's and Kueue's best-fit, ``_eval_nodes_topo`` in
   SchedMD/slurm:src/plugins/topology/tree/eval_nodes_tree.c, without its config-order
   quirks). Whole leaves/UltraServers stay free.
3a. **Objective: predicted time (tree).** Fewest leaves is a starting point, not the goal:
   it can cost more (two leaves across a core switch vs three under one spine, or a 512-node
   PP=4 job whose stages each fit under one spine). So Slurm's own choice is simulated
   (``slurm_sim``, with the real ``topology.conf`` switch order: ``switch_order=``, else the
   order recorded when the topology was parsed from topology.conf/scontrol, else slurm_sim's
   default), and candidates compete on the cost model's predicted communication time
   (:func:`slurmfm.plan.guard._better`: time, then DP ring edges crossing a leaf, then leaves): the
   planner's
   own selection, its selections under lower switches, one selection per PP stage (each
   stage placed as its own job, so a stage can take one spine), and Slurm's node sets, each
   in the planner's rank order (in pin mode also in Slurm's name and leaf orders). On fabrics
   whose NVLink domains span nodes (GB200) Slurm's ``topology/block`` choices
   (``slurm_sim.block_choices``: ``-N`` alone and with ``--segment``) are candidates too.
   In constrain mode the best wins, so the plan is never predicted slower than Slurm's
   choices, and on a predicted tie never crosses more leaves on DP rings. In pin mode Slurm's
   own choice in Slurm's topology order is kept unless a candidate wins robustly
   (:func:`slurmfm.plan.guard.keep_slurm_unless_robust`: in every scenario the planner cannot rule
   out, or with
   ``risk="model"`` never slower in any and faster in one), because the referee found the
   model's preferred placements up to 37.8 % slower (docs/placement-plans.md, "Referee"). With
   ``slurm_version`` known, only
   the rule set that version runs is simulated (feature ``tree_selection_rules_2405_3``:
   "24.05.3" rules from 24.05.3, "21.08" rules before); without it, both. Run when the fabric
   has <= 4,096 nodes or the job <= 1,024 nodes (the simulation is linear in leaves per leaf
   used); otherwise fewest leaves, then cost. ``slurmfm.plan.simulate`` checks the model's
   ranking against a flow-level simulation (scripts/bench_placement.py).
4. **Rank order.** Nodes grouped by leaf (by UltraServer when units span nodes), leaves in fabric
   DFS order, so consecutive DP ring members share a leaf and each ring crosses each uplink the
   minimum number of times (NCCL builds its rings and trees in rank order:
   NVIDIA/nccl:src/graph/rings.cc, trees.cc); PP stages are contiguous node blocks. A
   second order that puts fuller subtrees first (stage blocks aligned to leaves) is scored with
   the cost model and kept only if it is cheaper.

Modes: ``pin`` requests the exact nodes (``--nodelist``) in the planned order. ``constrain``
lets Slurm choose with ``--switches=K@T`` (tree, https://slurm.schedmd.com/sbatch.html#OPT_switches)
or ``--segment=S`` (block, 24.05+, https://slurm.schedmd.com/sbatch.html#OPT_segment) and carries a
rank key for every node of the fabric so that the job sorts whatever it got
by the same DFS order.

Everything is deterministic: names are compared in natural order and every tie has a final
position-based tie-break.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import weakref
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from slurmfm.errors import SlurmfmError
from slurmfm.plan.cost import CostParams, CostReport, JobShape, evaluate
from slurmfm.plan.guard import (
    Risk,
    guard_rule_sets,
    simulation_check,
    slurm_guard,
    switch_order_for,
)
from slurmfm.plan.types import Placement
from slurmfm.topology.model import natural_key

if TYPE_CHECKING:
    from slurmfm.catalog.slurm_features import SlurmVersion
    from slurmfm.recipe.schema import Recipe
    from slurmfm.topology.model import Topology

DEFAULT_SWITCH_WAIT = "00:10:00"
Mode = Literal["pin", "constrain"]


class PlanError(SlurmfmError):
    """An impossible placement request; the message says why."""


@dataclass(frozen=True)
class Plan:
    """The planner's answer: nodes in rank order, what to ask Slurm, and the predicted cost."""

    nodes: tuple[str, ...]
    leaves: tuple[str, ...]
    switches: str | None
    segment: int | None
    sbatch_options: tuple[str, ...]
    predicted: CostReport
    mode: str
    explanation: tuple[str, ...]
    rank_key: Mapping[str, str] = field(default_factory=dict, repr=False, compare=False)

    def placement(self) -> Placement:
        """The rendering seam: pin = planned order; constrain = Slurm picks, job sorts by key."""
        if self.mode == "pin":
            return Placement(
                mode="pin", nodes=self.nodes, segment=self.segment, explanation=self.explanation
            )
        return Placement(
            mode="constrain",
            rank_key=dict(self.rank_key),
            switches=self.switches,
            segment=self.segment,
            explanation=self.explanation,
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "nodes": list(self.nodes),
            "leaves": list(self.leaves),
            "switches": self.switches,
            "segment": self.segment,
            "sbatch_options": list(self.sbatch_options),
            "predicted": self.predicted.as_dict(),
            "bound_by": dict(self.predicted.bound_by),
            "explanation": list(self.explanation),
        }


# ---------------------------------------------------------------------------- fabric


class _Static:
    """What does not change between plans on one topology: DFS order, ancestry, domains."""

    def __init__(self, topology: Topology) -> None:
        parent_of = topology.parent_of
        children: dict[str, list[str]] = {s: [] for s in parent_of}
        for sw, par in parent_of.items():
            if par is not None:
                children[par].append(sw)
        # Leaf members in Slurm's node-table order: one natural key per node, cached on the
        # topology (the same order slurm_sim uses).
        leaf_of = topology.leaf_of
        leaf_members: dict[str, list[str]] = {}
        for n in topology.natural_order:
            leaf_members.setdefault(leaf_of[n], []).append(n)
        for v in children.values():
            v.sort(key=natural_key)
        self.children = children
        self.level = {s: topology.level(s) for s in parent_of}
        root = topology.root
        # Iterative pre-order DFS: switch positions and node visiting order.
        self.switch_pos: dict[str, int] = {}
        self.ancestors: dict[str, tuple[str, ...]] = {root: (root,)}
        dfs_nodes: list[str] = []
        stack = [root]
        while stack:
            sw = stack.pop()
            self.switch_pos[sw] = len(self.switch_pos)
            for c in reversed(children[sw]):
                self.ancestors[c] = (*self.ancestors[sw], c)
                stack.append(c)
            dfs_nodes.extend(leaf_members.get(sw, ()))
        nodes = topology.nodes
        block = topology.kind == "block"
        if block or any(node.nvlink_domain for node in nodes.values()):
            self.domain = {
                n: nodes[n].nvlink_domain or ("block:" + leaf_of[n] if block else n)
                for n in dfs_nodes
            }  # nvlink_domain(topology, n), inlined: this loop runs once per node
            self.domain_size = Counter(self.domain.values())
        else:  # every node is its own domain (HGX trees): the same maps, built in C
            self.domain = dict(zip(dfs_nodes, dfs_nodes, strict=True))
            self.domain_size = Counter(dict.fromkeys(dfs_nodes, 1))
        if len(self.domain_size) == len(dfs_nodes):
            self.order = dfs_nodes  # every node is its own domain: DFS order as is
        else:
            first: dict[str, int] = {}
            for i, n in enumerate(dfs_nodes):
                first.setdefault(self.domain[n], i)
            # Fabric order: DFS, with the nodes of one NVLink domain kept together.
            dfs_index = {n: i for i, n in enumerate(dfs_nodes)}
            self.order = sorted(dfs_nodes, key=lambda n: (first[self.domain[n]], dfs_index[n]))
        self.pos = dict(zip(self.order, range(len(self.order)), strict=True))
        self._rank_key: dict[str, str] | None = None
        self.leaf_of = dict(leaf_of)
        if len(self.domain_size) == len(dfs_nodes):
            self.domain_attach = dict(  # domain -> its one node's leaf, in DFS order (in C)
                zip(
                    map(self.domain.__getitem__, dfs_nodes),
                    map(leaf_of.__getitem__, dfs_nodes),
                    strict=True,
                )
            )
        else:
            dom_leaves: dict[str, set[str]] = {}
            for n, d in self.domain.items():
                dom_leaves.setdefault(d, set()).add(leaf_of[n])
            self.domain_attach = {
                d: next(iter(ls)) if len(ls) == 1 else self._lca(ls) for d, ls in dom_leaves.items()
            }
        self._natural_order = topology.natural_order
        self._slurm_table: list[str] | None = None

    @property
    def rank_key(self) -> dict[str, str]:
        """Node -> zero-padded fabric position (constrain mode's rank map), built on first use."""
        if self._rank_key is None:
            width = max(6, len(str(len(self.order))))
            self._rank_key = {n: f"{i:0{width}d}" for i, n in enumerate(self.order)}
        return self._rank_key

    def slurm_node_table(self) -> list[str]:
        """Slurm's node table (natural name order, exactly as ``slurm_sim`` sorts it), cached."""
        if self._slurm_table is None:
            self._slurm_table = list(self._natural_order)
        return self._slurm_table

    def _lca(self, switches: Iterable[str]) -> str:
        paths = [self.ancestors[s] for s in switches]
        common = paths[0]
        for p in paths[1:]:
            c = 0
            while c < min(len(common), len(p)) and common[c] == p[c]:
                c += 1
            common = common[:c]
        return common[-1]


_STATIC: dict[int, tuple[weakref.ref[Any], _Static]] = {}


def _static(topology: Topology) -> _Static:
    hit = _STATIC.get(id(topology))
    if hit is not None and hit[0]() is topology:
        return hit[1]
    st = _Static(topology)
    if len(_STATIC) > 64:
        _STATIC.clear()
    _STATIC[id(topology)] = (weakref.ref(topology), st)
    return st


@dataclass
class _Bin:
    """A leaf (or, when units span nodes, an NVLink domain) and its usable free nodes."""

    name: str
    attach: str  # the switch it hangs under (the leaf, or the domain's lowest common switch)
    members: list[str]  # free nodes in fabric order
    cap: int  # usable: whole units only
    pos: int


def _min_bins(caps: list[int], need: int) -> int:
    """Fewest bins whose capacities sum to ``need`` (largest first is optimal)."""
    total = 0
    for i, c in enumerate(sorted(caps, reverse=True)):
        total += c
        if total >= need:
            return i + 1
    return 1 << 30


# ---------------------------------------------------------------------------- planning


def _fmt_switch(st: _Static, sw: str) -> str:
    return f"{sw} (level {st.level[sw]})"


@dataclass(frozen=True)
class PlanRequest:
    """Everything one plan depends on, typed (:func:`plan` takes the same as keywords).

    ``unavailable``: nodes not to use (busy, drained) besides the topology's non-free ones.
    ``mode``: ``pin`` (``--nodelist`` in the planned order) or ``constrain`` (Slurm picks within
    ``--switches``/``--segment``; the job sorts by the rank key). ``slurm_version``: the
    cluster's, for the rule set of Slurm's own choice and version gates (None: unknown).
    ``params``: the cost model's calibration. ``switch_wait``: the ``@T`` of ``--switches`` in
    constrain mode (Slurm caps it at ``max_switch_wait``, 300 s by default:
    https://slurm.schedmd.com/sbatch.html#OPT_switches). ``switch_order``: the switch lines of
    the cluster's ``topology.conf`` in file order, which drive Slurm's own choice; default: the
    order recorded when ``topology`` was parsed from topology.conf or ``scontrol show topology``
    (:func:`slurmfm.topology.slurm_model.switch_order`), else
    :func:`slurmfm.plan.slurm_sim.config_switch_order`. ``simulate``: in pin mode on tree
    fabrics, also check the plan against Slurm's own choice in simulated time (SimGrid,
    :mod:`slurmfm.plan.simulate`). ``avoid``: node -> reason for nodes that failed recently
    (:func:`slurmfm.plan.failed.recent_failures`); like ``unavailable``, but each is named in
    the explanation. ``risk``: in pin mode on tree fabrics, when the plan may leave Slurm's own
    choice (nodes and topology order): ``none`` only when it is predicted at least
    :data:`slurmfm.plan.guard.MIN_GAIN` faster in every scenario the planner cannot rule out;
    ``model`` when it
    is never predicted slower in any and at least that much faster in one
    (:func:`slurmfm.plan.guard.keep_slurm_unless_robust`; docs/placement-plans.md, "Referee", has
    what each
    costs and gains). ``topology_plugin``: the cluster's ``TopologyPlugin`` where it is not the
    topology's kind (a fabric built from EC2's API is a tree whose UltraServers are NVLink
    domains, while ParallelCluster >= 3.14 and HyperPod run ``topology/block`` on them); under
    ``block`` a pin plan asks only what that plugin takes (:func:`_block_acceptance`). None:
    ``topology.kind``.
    """

    topology: Topology
    job: JobShape
    unavailable: frozenset[str] = frozenset()
    mode: Mode = "pin"
    slurm_version: SlurmVersion | None = None
    params: CostParams | None = None
    switch_wait: str = DEFAULT_SWITCH_WAIT
    switch_order: tuple[str, ...] | None = None
    simulate: bool = False
    avoid: Mapping[str, str] = field(default_factory=dict)
    risk: Risk = "none"
    topology_plugin: Literal["tree", "block"] | None = None


def plan(
    topology: Topology,
    job: JobShape,
    *,
    unavailable: Iterable[str] = (),
    mode: Mode = "pin",
    slurm_version: SlurmVersion | None = None,
    params: CostParams | None = None,
    switch_wait: str = DEFAULT_SWITCH_WAIT,
    switch_order: Sequence[str] | None = None,
    simulate: bool = False,
    avoid: Mapping[str, str] | None = None,
    risk: Risk = "none",
    topology_plugin: Literal["tree", "block"] | None = None,
) -> Plan:
    """Plan ``job`` on the free nodes of ``topology``: :func:`make_plan` of a
    :class:`PlanRequest` with these fields (see it for each).

    Raises :class:`PlanError` when no placement satisfies the NVLink rule and the node count,
    or when ``simulate`` is asked for and SimGrid is missing.
    """
    return make_plan(
        PlanRequest(
            topology,
            job,
            unavailable=frozenset(unavailable),
            mode=mode,
            slurm_version=slurm_version,
            params=params,
            switch_wait=switch_wait,
            switch_order=tuple(switch_order) if switch_order is not None else None,
            simulate=simulate,
            avoid=dict(avoid or {}),
            risk=risk,
            topology_plugin=topology_plugin,
        )
    )


def make_plan(req: PlanRequest) -> Plan:
    """The plan for ``req``: the steps of the module docstring, one function each."""
    st = _static(req.topology)
    why: list[str] = []
    free_nodes = _admit(req, st, why)
    sel = _own_selection(req, st, free_nodes, why)
    order, report = _first_order(req, st, sel.nodes, why)
    fabric_order = order
    order, report = _guard_step(req, st, free_nodes, sel, order, report, why)
    if order is fabric_order:
        why.append(
            "rank order: nodes grouped by "
            + ("leaf" if req.job.nvlink_unit() == 1 else "NVLink domain")
            + " in fabric DFS order; PP stages are contiguous node blocks"
        )
    order, report, pin_segment = _block_acceptance(req, order, report, why)
    _explain_cost(report, why)
    return _finish(req, st, order, report, why, pin_segment)


def _block_acceptance(
    req: PlanRequest, order: list[str], report: CostReport, why: list[str]
) -> tuple[list[str], CostReport, int | None]:
    """Pin mode under ``topology/block`` (the request's ``topology_plugin``, else the
    topology's kind) on a fabric whose NVLink domains span nodes (GB200, one base block per
    UltraServer: :func:`slurmfm.plan.slurm_sim.block_geometry`): a ``--nodelist`` Slurm takes,
    with the ``--segment`` it needs (or None).

    Why: real Slurm refuses such a job at submission ("Requested node configuration is not
    available") unless every listed node lies in one block of the job's level; 26.05 also
    takes a list cut into ``--segment`` pieces, 24.11 does not
    (:func:`slurmfm.plan.slurm_block.nodelist_accepted`, measured on 24.11.5 and 26.05.5).
    So a plan outside those rules is cut to what Slurm takes: first the same nodes with the
    largest ``--segment`` that makes them acceptable (when the version has
    ``nodelist_with_segment``), else the best plan inside one block of the job's level, else
    :class:`PlanError` (no ``--nodelist`` could start the job now).
    """
    from slurmfm.plan.slurm_sim import block_geometry, level_blocks, nodelist_accepted

    topology, job = req.topology, req.job
    plugin = req.topology_plugin or topology.kind
    geometry = block_geometry(topology) if req.mode == "pin" and plugin == "block" else None
    if geometry is None:
        return order, report, None
    blocks, sizes = geometry
    n = job.nodes
    if nodelist_accepted(blocks, order, block_sizes=sizes, rules="24.11"):
        return order, report, None  # the same rule on 24.11 and 26.05 without --segment
    from slurmfm.catalog.slurm_features import supports

    version = req.slurm_version
    if version is not None and supports("nodelist_with_segment", version):
        u = job.nvlink_unit()
        for seg in sorted((s for s in range(u, n, u) if n % s == 0), reverse=True):
            if nodelist_accepted(blocks, order, block_sizes=sizes, rules="26.05", segment=seg):
                why.append(
                    f"topology/block: the nodes span blocks that no block of the job's level "
                    f"holds, so --nodelist alone is refused; with --segment={seg} Slurm "
                    f"{version} lays the segments out inside the list (measured on 26.05.5)"
                )
                return order, report, seg
    from slurmfm.plan.guard import _better

    best: Plan | None = None
    level = level_blocks(blocks, n, block_sizes=sizes)
    for members in level:
        inside = set(members)
        if sum(1 for m in members if m not in req.unavailable and topology.nodes[m].free) < n:
            continue
        outside = frozenset(m for m in topology.nodes if m not in inside)
        try:
            sub = make_plan(dataclasses.replace(req, unavailable=req.unavailable | outside))
        except PlanError:
            continue
        if best is None or _better(sub.predicted, best.predicted):
            best = sub
    size = max(len(b) for b in level)
    if best is None:
        raise PlanError(
            f"Slurm's topology/block takes a --nodelist of {n} nodes only inside one block of "
            f"{size} nodes (aligned blocks of BlockSizes {sizes}), and none has {n} usable "
            "free nodes now"
            + (
                ""
                if version is not None and supports("nodelist_with_segment", version)
                else "; Slurm >= 26.05 also takes one cut into --segment pieces"
            )
            + ": use constrain mode or wait"
        )
    why.append(
        f"topology/block: the planned nodes span blocks that no block of the job's level "
        f"holds ({size} nodes), and Slurm refuses such a --nodelist"
        + (
            ""
            if version is not None and supports("nodelist_with_segment", version)
            else " (with --segment it takes one from Slurm 26.05; the cluster's is "
            + (f"{version})" if version is not None else "not known)")
        )
        + "; planned again inside one such block: "
        + _names(sorted(best.leaves, key=natural_key))
    )
    return list(best.nodes), best.predicted, best.segment


def _admit(req: PlanRequest, st: _Static, why: list[str]) -> list[str]:
    """Check the request and the NVLink rule; the free nodes in fabric order (``why`` told)."""
    topology, job = req.topology, req.job
    problems = job.problems()
    if problems:
        raise PlanError("job shape: " + "; ".join(problems))
    if req.mode not in ("pin", "constrain"):
        raise PlanError(f"mode must be pin or constrain, not {req.mode!r}")
    if req.risk not in ("none", "model"):
        raise PlanError(f"risk must be none or model, not {req.risk!r}")
    bad = set(req.unavailable)
    avoid = req.avoid
    avoided = sorted(set(avoid) & set(topology.nodes), key=natural_key)
    bad.update(avoided)
    unknown = sorted(bad - set(topology.nodes), key=natural_key)
    n_need = job.nodes
    u = job.nvlink_unit()
    why.append(
        f"job: {n_need} nodes x {job.gpus_per_node} GPUs, tp={job.tp} cp={job.cp} ep={job.ep} "
        f"pp={job.pp} dp={job.dp}; rank order tp-cp-ep-dp-pp "
        "(NVIDIA/Megatron-LM:megatron/core/parallel_state.py)"
    )
    max_dom = max(st.domain_size.values(), default=1)
    if u > 1:
        why.append(
            f"NVLink rule: {'server replicas' if job.span > 1 else 'TP*CP/EP blocks'} span {u} "
            "consecutive nodes; each block stays inside "
            "one NVLink domain (docs/placement-plans.md)"
        )
    group = "a TP*CP/EP group or server replica" if job.span > 1 else "a TP*CP/EP group"
    if u > max_dom:
        raise PlanError(
            f"{group} spans {u} nodes ({u * job.gpus_per_node} GPUs) but the largest "
            f"NVLink domain of this fabric has {max_dom} node(s); reduce tp*cp or tp*ep"
            + (" or the replica's span (parallelism.tp)" if job.span > 1 else "")
        )
    if n_need % u:
        raise PlanError(
            f"{n_need} nodes is not a whole number of {u}-node NVLink units (tp*cp and tp*ep "
            "blocks" + (", server replicas" if job.span > 1 else "") + "); choose a multiple"
        )
    if avoided:
        why.append(
            f"avoided {len(avoided)} node(s) that failed recently: "
            + _names([f"{n} ({avoid[n]})" for n in avoided], 5)
        )
    nodes_of = topology.nodes
    free_nodes = [n for n in st.order if n not in bad and nodes_of[n].free]
    why.append(
        f"free: {len(free_nodes)} of {len(st.order)} nodes"
        + (f" ({len(bad) - len(unknown)} marked unavailable)" if bad else "")
        + (f"; ignored unknown hosts {', '.join(unknown[:5])}" if unknown else "")
    )
    return free_nodes


@dataclass
class _Selection:
    """The planner's own selection (steps 1-3) and what the guard needs of it."""

    bins: list[_Bin]
    cap: Counter[str]
    feasible: list[str]
    k_of: dict[str, int]
    k_best: int
    top: str
    nodes: list[str]


def _own_selection(
    req: PlanRequest, st: _Static, free_nodes: Sequence[str], why: list[str]
) -> _Selection:
    """Steps 1-3: bins of whole NVLink units, the fewest bins under the lowest tightest switch."""
    job = req.job
    n_need = job.nodes
    u = job.nvlink_unit()
    # Bins: leaves, or NVLink domains when a unit spans nodes.
    bins_by_key: dict[str, _Bin] = {}
    for n in free_nodes:
        key = st.leaf_of[n] if u == 1 else st.domain[n]
        b = bins_by_key.get(key)
        if b is None:
            attach = key if u == 1 else st.domain_attach[key]
            b = bins_by_key[key] = _Bin(key, attach, [], 0, st.pos[n])
        b.members.append(n)
    bins = [b for b in bins_by_key.values() if len(b.members) >= u]
    for b in bins:
        b.cap = len(b.members) // u * u
    cap: Counter[str] = Counter()
    caps_under: dict[str, list[int]] = {}
    for b in bins:
        for sw in st.ancestors[b.attach]:
            cap[sw] += b.cap
            caps_under.setdefault(sw, []).append(b.cap)
    unit_word = "leaves" if u == 1 else "NVLink domains"
    feasible = [s for s, c in cap.items() if c >= n_need]
    if not feasible:
        total = sum(b.cap for b in bins)
        if u > 1:
            raise PlanError(
                f"not enough free nodes in whole {u}-node NVLink units: need {n_need}, "
                f"{total} usable across {len(bins)} domain(s) ({len(free_nodes)} free nodes)"
            )
        raise PlanError(
            f"not enough free nodes under any common switch: need {n_need}, "
            f"{len(free_nodes)} free in the whole fabric"
        )
    # Fewest bins first (so never more leaves than any greedy choice Slurm could make, whose
    # top switch is the highest one with room), then the lowest and tightest switch that
    # achieves that minimum.
    k_of = {s: _min_bins(caps_under[s], n_need) for s in feasible}
    k_best = min(k_of.values())
    lowest = min(feasible, key=lambda s: (st.level[s], cap[s], st.switch_pos[s]))
    top = min(
        (s for s in feasible if k_of[s] == k_best),
        key=lambda s: (st.level[s], cap[s], st.switch_pos[s]),
    )
    why.append(
        f"switch: {_fmt_switch(st, top)} is the lowest where the job fits in the fewest "
        f"{unit_word} ({k_best}): {cap[top]} usable free nodes for {n_need} "
        f"(leftover {cap[top] - n_need}); tightest at that level"
        + (
            ""
            if top == lowest
            else f" (the lowest with room, {_fmt_switch(st, lowest)}, needs {k_of[lowest]})"
        )
    )
    chosen = _select(st, bins, cap, top, n_need)
    nodes_set: list[str] = []
    partial: list[str] = []
    for b, take in chosen:
        nodes_set.extend(b.members[:take])
        if take < len(b.members):
            partial.append(f"{b.name} ({len(b.members) - take} of {len(b.members)} free left)")
    why.append(
        f"{unit_word}: {len(chosen)} used (minimum in the fabric: {k_best}): "
        + _names([b.name for b, _ in sorted(chosen, key=lambda bt: bt[0].pos)])
        + ("; partly used: " + _names(partial) if partial else "; all used whole")
    )
    return _Selection(bins, cap, feasible, k_of, k_best, top, nodes_set)


def _first_order(
    req: PlanRequest, st: _Static, nodes_set: Sequence[str], why: list[str]
) -> tuple[list[str], CostReport]:
    """Step 4: fabric DFS order, or fuller subtrees first when that is predicted cheaper."""
    topology, job, params = req.topology, req.job, req.params
    order = order_nodes(topology, nodes_set, job)
    report = evaluate(topology, order, job, params)
    if (
        req.mode == "pin"
        and job.nvlink_unit() == 1
        and job.pp > 1
        and job.nodes <= _ALT_ORDER_MAX_NODES
    ):
        alt = _fuller_first(st, nodes_set)
        if alt != order:
            alt_report = evaluate(topology, alt, job, params)
            if alt_report.predicted_s < report.predicted_s:
                order, report = alt, alt_report
                why.append("rank order: fuller subtrees first, so PP stage blocks align to leaves")
    return order, report


def _alternatives(
    st: _Static, sel: _Selection, free_nodes: Sequence[str], job: JobShape
) -> list[list[str]]:
    """Step 3a's other candidates: selections under lower switches, balanced fills, stages."""
    n_need = job.nodes
    bins, cap, feasible, k_of = sel.bins, sel.cap, sel.feasible, sel.k_of
    # Lower switches than ``top`` that need more leaves: each one's own selection.
    alts: list[list[str]] = []
    best_k = sel.k_best
    for s_alt in sorted(feasible, key=lambda s: (-st.level[s], k_of[s], cap[s])):
        if st.level[s_alt] < st.level[sel.top] and k_of[s_alt] > best_k:
            best_k = k_of[s_alt]
            alts.append(
                [n for b, t in _select(st, bins, cap, s_alt, n_need) for n in b.members[:t]]
            )
    # Balanced fills: the fewest largest leaves under each switch with room, every one
    # given at least need/k nodes, so no leaf uplink carries a ring for a sliver of nodes.
    for s_bal in sorted(feasible, key=lambda s: (st.level[s], st.switch_pos[s]))[:_BALANCED_MAX]:
        balanced = _balanced(bins, st, s_bal, n_need)
        if balanced is not None:
            alts.append(balanced)
    if job.pp > 1:
        staged = _stagewise(st, free_nodes, n_need, job.pp)
        if staged is not None:
            alts.append(staged)
    return alts


def _guard_step(
    req: PlanRequest,
    st: _Static,
    free_nodes: Sequence[str],
    sel: _Selection,
    order: list[str],
    report: CostReport,
    why: list[str],
) -> tuple[list[str], CostReport]:
    """Step 3a on tree fabrics: Slurm's own choice simulated, candidates compared, then the
    citizenship and robustness rules (:func:`slurmfm.plan.guard.slurm_guard`); the simulation check
    if asked."""
    topology, job, mode = req.topology, req.job, req.mode
    n_need = job.nodes
    u = job.nvlink_unit()
    if not (
        u == 1
        and topology.kind == "tree"
        and (len(st.order) <= _GUARD_MAX_FABRIC or n_need <= _GUARD_MAX_JOB)
    ):
        if req.simulate:
            why.append(
                "simulation check: skipped (tree fabrics with single-node NVLink units, fabrics "
                f"<= {_GUARD_MAX_FABRIC} nodes or jobs <= {_GUARD_MAX_JOB})"
            )
        return order, report
    sw_order, sw_source = switch_order_for(topology, req.switch_order)
    alts = _alternatives(st, sel, free_nodes, job)
    rule_sets = guard_rule_sets(req.slurm_version)
    slurm_sets: list[tuple[str, list[str]]] = []
    notes: list[str] = []
    better, counts, refused, kept = slurm_guard(
        topology,
        st,
        free_nodes,
        job,
        mode,
        order,
        report,
        req.params,
        alts,
        sw_order,
        rule_sets,
        slurm_sets,
        notes,
        req.risk,
    )
    label = {"21.08": "21.08-24.05.2 rules", "24.05.3": "24.05.3+ rules"}
    why.append(
        f"guard: Slurm's own choice ({sw_source}) would use "
        + " / ".join(f"{c} leaves ({label[r]})" for r, c in zip(rule_sets, counts, strict=True))
        + (
            f"; Slurm {req.slurm_version} runs only these rules"
            if req.slurm_version is not None
            else "; Slurm version unknown: both rule sets"
        )
    )
    limit = min(counts)
    if limit < 1 << 30:
        why.append(
            f"citizenship: at most {limit} leaf switches, as many as Slurm's own choice "
            "(the smaller count when the version is unknown); placements on more leaves "
            "are never used, whatever the cost model predicts, because they fragment the "
            "cluster and their gain depends on other jobs' traffic, which the planner "
            "cannot see"
        )
    why.extend(notes)
    if better is not None:
        before = report
        order, report, origin = better
        why.extend(_guard_reason(req, origin, report, before, refused, kept))
    if req.simulate and mode == "pin":
        order, report = simulation_check(
            topology, st, job, order, report, req.params, slurm_sets, sw_order, why
        )
    elif req.simulate:
        why.append("simulation check: pin mode only (constrain mode ranks whatever Slurm gives)")
    return order, report


def _guard_reason(
    req: PlanRequest,
    origin: str,
    report: CostReport,
    before: CostReport,
    refused: tuple[int, int] | None,
    kept: bool,
) -> list[str]:
    """The explanation line for the guard's choice (none when Slurm's choice was kept: the
    guard's note says so)."""
    if kept:
        return []
    scope = (
        f"Slurm {req.slurm_version}'s own choice"
        if req.slurm_version is not None
        else "Slurm's own choice under either rule set"
    )
    if req.mode == "pin":
        reason = (
            "used: never predicted slower than Slurm's own choice in topology order "
            "and faster in some scenario (the robust gain line)"
        )
    elif refused is not None:
        reason = (
            "used instead: the planner's own choice would leave less free room than "
            "Slurm's (largest free run under one spine / one leaf below "
            f"{refused[0]} / {refused[1]} nodes); predicted "
            f"{report.predicted_s * 1e3:.3f} ms/step (the planner's own choice: "
            f"{before.predicted_s * 1e3:.3f}); using it"
        )
    elif report.predicted_s < before.predicted_s * (1 - 1e-9):
        reason = (
            f"predicted cheaper ({report.predicted_s * 1e3:.3f} ms/step vs "
            f"{before.predicted_s * 1e3:.3f}); using it"
        )
    else:
        reason = (
            f"predicted as fast ({report.predicted_s * 1e3:.3f} ms/step) with "
            f"fewer DP ring edges crossing a leaf ({report.dp_edges_cross_leaf} vs "
            f"{before.dp_edges_cross_leaf}) or leaves; using it"
        )
    return [f"guard: {origin}, {report.leaves_used} leaves (vs {scope}), is " + reason]


def _explain_cost(report: CostReport, why: list[str]) -> None:
    """The predicted cost and its interpretable counts, then the slowest group of each kind."""
    why.append(
        f"cost: predicted {report.predicted_s * 1e3:.3f} ms/step vs ideal "
        f"{report.ideal_s * 1e3:.3f} ms (slowdown {report.slowdown:.3f}); "
        f"{report.leaves_used} leaves; DP ring edges crossing a leaf "
        f"{report.dp_edges_cross_leaf}/{report.dp_ring_edges}, a spine "
        f"{report.dp_edges_cross_spine}; PP pairs crossing a leaf "
        f"{report.pp_pairs_cross_leaf}/{report.pp_pairs}; NVLink violations "
        f"{report.nvlink_violations}"
    )
    why.append(
        "per group (the slowest of each kind, and the tier that bounds it; xF = uplink "
        "congestion): "
        + (
            ", ".join(
                f"{d} {report.per_group[d] * 1e3:.3f} ms ({report.bound_by.get(d, '-')})"
                for d in sorted(report.per_group, key=lambda d: -report.per_group[d])
                if report.per_group[d] > 0
            )
            or "no communication"
        )
    )


def _finish(
    req: PlanRequest,
    st: _Static,
    order: list[str],
    report: CostReport,
    why: list[str],
    pin_segment: int | None = None,
) -> Plan:
    """What to ask Slurm: ``--nodelist`` (pin, with the ``--segment`` topology/block needs
    to take it) or ``--switches``/``--segment`` (constrain)."""
    topology, job, mode = req.topology, req.job, req.mode
    leaves = tuple(dict.fromkeys(st.leaf_of[n] for n in order))
    switches: str | None = None
    segment: int | None = None
    options: list[str] = []
    if mode == "pin":
        from slurmfm.topology.hostlist import nodelist

        options.append(f"--nodelist={nodelist(order)}")
        why.append("mode pin: --nodelist requests exactly these nodes; the job keeps this order")
        if pin_segment is not None:
            segment = pin_segment
            options.append(f"--segment={segment}")
    else:
        if topology.kind == "block":
            segment = _segment(st, topology, job, order, req.slurm_version, why)
        else:
            switches = f"{len(leaves)}@{req.switch_wait}"
            why.append(
                f"mode constrain: --switches={switches}: Slurm waits up to {req.switch_wait} "
                "(capped by max_switch_wait, default 300 s) for at most "
                f"{len(leaves)} leaf switches (https://slurm.schedmd.com/sbatch.html#OPT_switches)"
            )
            if job.nvlink_unit() > 1:
                why.append(
                    "warning: topology/tree cannot see NVLink domains; Slurm may split "
                    "TP*CP/EP units across UltraServers: use pin mode or a block topology"
                )
        why.append(
            "mode constrain: the job sorts its allocation by a rank key for every fabric node "
            "(fabric DFS order)"
        )
        if switches:
            options.append(f"--switches={switches}")
        if segment is not None:
            options.append(f"--segment={segment}")
    return Plan(
        nodes=tuple(order),
        leaves=leaves,
        switches=switches,
        segment=segment,
        sbatch_options=tuple(options),
        predicted=report,
        mode=mode,
        explanation=tuple(why),
        rank_key=st.rank_key if mode == "constrain" else {},
    )


def _pick(st: _Static, free_nodes: Sequence[str], need: int) -> list[str] | None:
    """The planner's own selection (steps 2-3) of ``need`` single-node units, or None.

    ``free_nodes`` in fabric order. Fewest leaves, under the lowest and tightest switch that
    achieves it, largest leaves first and the tightest leaf for the remainder.
    """
    bins_by_key: dict[str, _Bin] = {}
    for n in free_nodes:
        leaf = st.leaf_of[n]
        b = bins_by_key.get(leaf)
        if b is None:
            b = bins_by_key[leaf] = _Bin(leaf, leaf, [], 0, st.pos[n])
        b.members.append(n)
    bins = list(bins_by_key.values())
    cap: Counter[str] = Counter()
    caps_under: dict[str, list[int]] = {}
    for b in bins:
        b.cap = len(b.members)
        for sw in st.ancestors[b.attach]:
            cap[sw] += b.cap
            caps_under.setdefault(sw, []).append(b.cap)
    feasible = [s for s, c in cap.items() if c >= need]
    if not feasible:
        return None
    k_of = {s: _min_bins(caps_under[s], need) for s in feasible}
    k_best = min(k_of.values())
    top = min(
        (s for s in feasible if k_of[s] == k_best),
        key=lambda s: (st.level[s], cap[s], st.switch_pos[s]),
    )
    return [n for b, t in _select(st, bins, cap, top, need) for n in b.members[:t]]


def _balanced(bins: Sequence[_Bin], st: _Static, top: str, need: int) -> list[str] | None:
    """The fewest largest leaves under ``top``, filled evenly (or None if they cannot hold it).

    The best-fit selection finishes with the tightest leaf for the remainder, which can be one
    node: its uplink then carries a whole ring for one node's share of capacity, the worst
    congestion of the job once uplinks are oversubscribed. Here every chosen leaf gets at least
    ``min(smallest chosen leaf, need // k)`` nodes and the rest goes to the largest first.
    """
    under = sorted(
        (b for b in bins if b.cap > 0 and top in st.ancestors[b.attach]),
        key=lambda b: (-b.cap, b.pos),
    )
    k = _min_bins([b.cap for b in under], need)
    if k > len(under):
        return None
    chosen = under[:k]
    floor = min(chosen[-1].cap, need // k)
    take = [floor] * k
    rem = need - floor * k
    for i, b in enumerate(chosen):
        extra = min(b.cap - take[i], rem)
        take[i] += extra
        rem -= extra
    if rem:
        return None
    return [n for b, t in zip(chosen, take, strict=True) for n in b.members[:t]]


def _stagewise(st: _Static, free_nodes: Sequence[str], need: int, pp: int) -> list[str] | None:
    """One selection per PP stage, stage after stage, each as its own job (or None).

    Fewest leaves for the whole job can scatter every stage's DP rings over many spines; a
    stage is what a DP ring spans, so placing each stage alone (its own lowest switch) keeps
    rings under one spine when a spine holds a stage (a 512-node PP=4 job, one
    128-node stage per spine). Returned in stage order, each stage in fabric order.
    """
    if need % pp:
        return None
    per = need // pp
    left = list(free_nodes)
    out: list[str] = []
    for _ in range(pp):
        got = _pick(st, left, per)
        if got is None:
            return None
        taken = set(got)
        left = [n for n in left if n not in taken]
        out.extend(sorted(got, key=st.pos.__getitem__))
    return out


def _names(names: Sequence[str], limit: int = 8) -> str:
    """A short list for explanation lines."""
    head = ", ".join(names[:limit])
    return head + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _select(
    st: _Static, bins: list[_Bin], cap: Mapping[str, int], top: str, need: int
) -> list[tuple[_Bin, int]]:
    """Bins and node counts under ``top`` holding ``need`` nodes with the fewest bins."""
    under = [b for b in bins if b.cap > 0 and top in st.ancestors[b.attach]]
    k = _min_bins([b.cap for b in under], need)
    under = _narrow(st, under, top, need, k)
    # Largest first (fewest bins), then the closest and tightest bin for the remainder.
    ranked = sorted((b for b in under if b.cap > 0), key=lambda b: (-b.cap, b.pos))
    chosen: list[tuple[_Bin, int]] = []
    used: set[str] = set()
    near: set[str] = set()
    rem = need
    i = 0
    while rem > 0:
        while ranked[i].name in used:
            i += 1
        if ranked[i].cap >= rem:

            def closeness(b: _Bin) -> int:
                if not near:
                    return 0
                for s in reversed(st.ancestors[b.attach]):
                    if s in near:
                        return st.level[s]
                return 1 << 20  # pragma: no cover - all bins share ``top``

            fit = min(
                (b for b in ranked if b.cap >= rem and b.name not in used),
                key=lambda b: (closeness(b), b.cap, b.pos),
            )
            chosen.append((fit, rem))
            break
        b = ranked[i]
        chosen.append((b, b.cap))
        used.add(b.name)
        near.update(st.ancestors[b.attach])
        rem -= b.cap
    return chosen


# Scoring the second rank order costs one more cost-model evaluation (linear in the job's
# nodes and rings); past this size the fabric DFS order is kept without the comparison.
_ALT_ORDER_MAX_NODES = 1024
# Slurm's selection is simulated (for the guard) on fabrics up to this size, and on larger
# fabrics for jobs up to _GUARD_MAX_JOB nodes (slurm_sim costs about leaves x leaves used; a
# 4,096-node job on 16,384 nodes would take ~1 s per rule set).
_GUARD_MAX_FABRIC = 4096
_GUARD_MAX_JOB = 1024
# Balanced fills are tried under at most this many switches (lowest first).
_BALANCED_MAX = 4


def _top_sum(caps: list[int], k: int) -> int:
    """Sum of the ``k`` largest capacities (the most ``k`` bins can hold)."""
    if len(caps) <= k:
        return sum(caps)
    return sum(heapq.nlargest(k, caps))


def _top_sum_with(base: list[int], base_sum: int, caps: list[int], k: int) -> int:
    """``_top_sum(base + caps, k)`` when ``base`` (ascending, ``len <= k``) is already the
    ``k`` largest of its own set: add ``caps`` largest first into free slots, then swap them
    in for the smallest of ``base`` while larger. Linear in ``caps`` and the swaps, not in
    ``k`` (``_narrow`` asks once per candidate group: thousands on a 64k-node fabric).
    """
    total = base_sum
    free = k - len(base)
    i = 0  # next smallest of base to swap out
    for c in sorted(caps, reverse=True):
        if free > 0:
            total += c
            free -= 1
        elif i < len(base) and c > base[i]:
            total += c - base[i]
            i += 1
        else:
            break
    return total


def _narrow(st: _Static, under: list[_Bin], top: str, need: int, k: int) -> list[_Bin]:
    """Keep the fewest subtrees, level by level below ``top``, that still hold ``need`` in ``k``.

    At each depth the bins are grouped by the switch they hang under at that depth; groups are
    taken in order of what their own ``k`` largest bins hold (then fuller, then fabric order)
    until the union holds ``need`` in ``k`` bins, and the last group taken is swapped for the
    smallest one that also completes the set (tight fit). Every step keeps the minimum bin
    count ``k``, so the selection below stays minimal in leaves while touching few spines.
    """
    depth = len(st.ancestors[top])
    while True:
        groups: dict[str, list[_Bin]] = {}
        deeper = False
        for b in under:
            anc = st.ancestors[b.attach]
            key = anc[depth] if len(anc) > depth else b.name
            deeper = deeper or len(anc) > depth + 1
            groups.setdefault(key, []).append(b)
        if len(groups) > 1:
            info = []
            for key, bs in groups.items():
                caps = [b.cap for b in bs]
                info.append((-_top_sum(caps, k), -sum(caps), min(b.pos for b in bs), key, caps))
            info.sort()
            # Shortest prefix of groups whose union holds ``need`` in ``k`` bins (monotone in
            # the prefix length, so binary search).
            prefix: list[int] = [0]
            flat: list[int] = []
            for x in info:
                flat.extend(x[4])
                prefix.append(len(flat))
            lo, hi = 1, len(info)
            if _top_sum(flat, k) < need:  # pragma: no cover - ``top`` holds the job in k
                lo = hi + 1
            while lo < hi:
                mid = (lo + hi) // 2
                if _top_sum(flat[: prefix[mid]], k) >= need:
                    hi = mid
                else:
                    lo = mid + 1
            last = lo - 1
            if last < len(info):
                taken = [x[3] for x in info[: last + 1]]
                base = heapq.nlargest(k, flat[: prefix[last]])
                base_sum = sum(base)
                base.reverse()  # smallest first, for _top_sum_with
                # Tight fit: the smallest remaining group that also completes the set.
                for _, _, _, key, caps in sorted(
                    (x for x in info[last + 1 :] if -x[1] < -info[last][1]),
                    key=lambda x: (-x[1], x[2]),
                ):
                    if _top_sum_with(base, base_sum, caps, k) >= need:
                        taken[-1] = key
                        break
                keep = set(taken)
                under = [b for key, bs in groups.items() if key in keep for b in bs]
        if not deeper:
            return under
        depth += 1


def _fuller_first(st: _Static, nodes: Sequence[str]) -> list[str]:
    """DFS order with, under every switch, the child holding more of the job first."""
    under: Counter[str] = Counter()
    for n in nodes:
        for s in st.ancestors[st.leaf_of[n]]:
            under[s] += 1

    def key(n: str) -> tuple[tuple[int, int], ...]:
        return (
            *((-under[s], st.switch_pos[s]) for s in st.ancestors[st.leaf_of[n]]),
            (0, st.pos[n]),
        )

    return sorted(nodes, key=key)


def _segment(
    st: _Static,
    topology: Topology,
    job: JobShape,
    order: Sequence[str],
    slurm_version: SlurmVersion | None,
    why: list[str],
) -> int | None:
    """``--segment`` for a block topology, or None (with the reason in ``why``).

    S divides both the UltraServer (block) size and the node count (``--segment`` requires a
    multiple: https://slurm.schedmd.com/sbatch.html#OPT_segment), is a multiple of the NVLink unit
    so no TP*CP/EP block straddles
    two segments, and divides the plan's own per-block counts so that the plan itself is a
    valid segmentation. Among those, the largest (fewest blocks touched).
    """
    from slurmfm.catalog.slurm_features import supports

    if slurm_version is None:
        why.append("no --segment: Slurm version unknown (pass --slurm-version; needs >= 24.05)")
        return None
    if not supports("segment", slurm_version):
        why.append(
            f"no --segment: Slurm {slurm_version} < 24.05 has no --segment "
            "(https://slurm.schedmd.com/sbatch.html#OPT_segment); "
            "Slurm's block plugin may split NVLink units, prefer pin mode"
        )
        return None
    u = job.nvlink_unit()
    per_dom = Counter(st.domain[n] for n in order)
    sizes = {st.domain_size[d] for d in per_dom}
    g = math.gcd(job.nodes, *sizes, *per_dom.values())
    cands = [s for s in range(u, g + 1, u) if g % s == 0]
    if cands:
        seg = max(cands)
        why.append(
            f"--segment={seg}: divides the UltraServer size {sorted(sizes)} and {job.nodes} "
            f"nodes, holds whole {u}-node NVLink units, matches the plan's "
            f"{len(per_dom)} block(s) (https://slurm.schedmd.com/topology.html)"
        )
        return seg
    # No divisor works (e.g. 4-node units in 18-node UltraServers): NVIDIA's 16-of-18 shape.
    small = min(sizes)
    g2 = math.gcd(job.nodes, *per_dom.values())
    cands = [s for s in range(u, min(small, g2) + 1, u) if g2 % s == 0]
    if cands:
        seg = max(cands)
        why.append(
            f"--segment={seg}: no size divides both the UltraServer size {sorted(sizes)} and "
            f"whole {u}-node units; {seg} fits one UltraServer and leaves "
            f"{small - seg} node(s) of it spare (NVIDIA's segment-16 shape, "
            "docs/placement-plans.md)"
        )
        return seg
    why.append("no --segment: no segment size holds whole NVLink units; prefer pin mode")
    return None


def order_nodes(topology: Topology, nodes: Iterable[str], job: JobShape) -> list[str]:
    """Rank order for a given node set: the fabric DFS order, NVLink domains kept together.

    This is exactly what a constrain-mode job does with its rank key, so it is also the order
    to score "slurmfm ranks on Slurm's choice" with. ``job`` is accepted for interface
    stability (the order does not depend on it today).
    """
    del job
    st = _static(topology)
    try:
        return sorted(nodes, key=st.pos.__getitem__)
    except KeyError as exc:
        raise PlanError(f"host {exc.args[0]!r} is not in the topology") from exc


def job_for_recipe(recipe: Recipe, nodes: int | None = None) -> JobShape:
    """The planner's view of a recipe: whole nodes, GPUs (processes) per node, parallelism.

    SGLang's ``--tp`` may span nodes over EFA by the user's choice (its multi-node guide does),
    so for SGLang the planner keeps nodes close but applies no Megatron NVLink-unit rule.

    A model server's replicas are kept whole inside NVLink domains where NVLink spans nodes
    (GB200: one UltraServer): ``span`` is the replica's model-parallel span
    (:meth:`slurmfm.launchers.serving.ServerSpec.replica_spans`, the lcm of the prefill and
    decode servers' with disaggregation), so the planner places whole replicas in one
    domain and orders the nodes domain by domain; the job cuts replicas (and prefill/decode
    servers) from that order in whole spans, none across two domains. On HGX a node is the
    domain and a span over nodes is the user's choice of EFA: no rule there.
    """
    p = recipe.parallelism
    from slurmfm.catalog.instances import get_instance
    from slurmfm.launchers import SERVE_KINDS, server_spec, spec

    sglang = spec(recipe.launcher.kind).tp_spans_nodes
    span = 1
    if recipe.launcher.kind in SERVE_KINDS:
        inst = get_instance(recipe.cluster.instance_type)
        if inst.gpus and inst.nvlink.is_multi_node:
            spans = server_spec(recipe.launcher.kind).replica_spans(
                recipe.launcher,  # type: ignore[arg-type]  # a server: kind in SERVE_KINDS
                p,
            )
            span = math.lcm(*spans.values())
    return JobShape(
        nodes=nodes or recipe.resources.nodes,
        gpus_per_node=recipe.procs_per_node,
        tp=1 if sglang else p.tp,
        pp=p.pp,
        cp=p.cp,
        ep=1 if sglang else p.ep,
        span=span,
    )


def plan_for_recipe(
    recipe: Recipe,
    topology: Topology,
    *,
    mode: Mode = "pin",
    unavailable: Iterable[str] = (),
    slurm_version: SlurmVersion | str | None = None,
    params: CostParams | None = None,
    switch_wait: str = DEFAULT_SWITCH_WAIT,
    switch_order: Sequence[str] | None = None,
    simulate: bool = False,
    avoid: Mapping[str, str] | None = None,
    risk: Risk = "none",
) -> Plan:
    """Plan a recipe; the Slurm version defaults to the recipe's (or its flavor's assumed one).

    ``switch_order``: the cluster's topology.conf switch order; ``simulate``, ``avoid``,
    ``risk``: see :class:`PlanRequest`.

    Feed ``plan.placement()`` to ``api.submit(recipe, placement=...)`` or ``api.render``.
    """
    from slurmfm.catalog.slurm_features import SlurmVersion

    if isinstance(slurm_version, str):
        version: SlurmVersion | None = SlurmVersion.parse(slurm_version)
    elif slurm_version is None:
        from slurmfm.target import Target

        version = Target.for_recipe(recipe).slurm_version
    else:
        version = slurm_version

    def run(job: JobShape, more: Iterable[str] = ()) -> Plan:
        return plan(
            topology,
            job,
            unavailable=[*unavailable, *more],
            mode=mode,
            slurm_version=version,
            params=params,
            switch_wait=switch_wait,
            switch_order=switch_order,
            simulate=simulate,
            avoid=avoid,
            risk=risk,
        )

    serve = recipe.serve
    split = serve is not None and serve.placement == "split"
    spares = recipe.resources.spare_nodes
    if not split and not (spares and mode == "pin"):
        return run(job_for_recipe(recipe))
    from slurmfm.plan.split import Tail, plan_split, serving_unit

    unit = serving_unit(recipe)
    if mode == "pin":
        # Plan the trainer alone (its rings decide the cost), then add the server (or the
        # spares) after it, in the --nodelist Slurm allocates.
        trainer_job = job_for_recipe(recipe, recipe.train_nodes)
        return plan_split(
            topology,
            lambda more: run(trainer_job, more),
            serve.nodes if serve is not None else spares,
            tail=Tail.serving(unit) if serve is not None else Tail.spares(),
            trainer_unit=trainer_job.nvlink_unit(),
            unavailable=[*unavailable, *(avoid or {})],
            slurm_version=version,
        )
    # constrain: Slurm picks the nodes and the job sorts them domain by domain, so whole
    # units of both the trainer and the server's replicas keep the server's tail whole too
    job = job_for_recipe(recipe)
    if unit > 1:
        job = dataclasses.replace(job, span=math.lcm(job.span, unit * job.gpus_per_node))
    return run(job)
