"""The guard of the planner's step 3a: Slurm's own choice simulated and the candidates judged.

Why a module apart from :mod:`slurmfm.plan.planner`: the planner's selection (fewest leaves,
tight fit, rank order) and the rules that decide whether its answer may replace Slurm's are
separate jobs. This module holds the second: which Slurm rule set the cluster runs
(:func:`guard_rule_sets`), the candidates against Slurm's simulated choice with cluster
citizenship (:func:`slurm_guard`: never more leaves, never less free room than Slurm), the
robustness rule of pin mode (:func:`keep_slurm_unless_robust`: Slurm's own choice in its
topology order unless a gain holds in every scenario the planner cannot rule out, because
judged by the referee the model's preferred placements lost up to 37.8 %:
docs/placement-plans.md, "Referee"), and the optional SimGrid check
(:func:`simulation_check`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from slurmfm.plan.cost import CostParams, CostReport, JobShape, evaluate
from slurmfm.topology.model import natural_key

if TYPE_CHECKING:
    from slurmfm.catalog.slurm_features import SlurmVersion
    from slurmfm.plan.planner import _Static
    from slurmfm.plan.slurm_sim import Rules
    from slurmfm.topology.model import Topology

Mode = Literal["pin", "constrain"]
Risk = Literal["none", "model"]

__all__ = [
    "MIN_GAIN",
    "busy_counts",
    "guard_rule_sets",
    "keep_slurm_unless_robust",
    "robust_gains",
    "scenario_oversubscriptions",
    "scenarios_for",
    "simulation_check",
    "slurm_guard",
    "switch_order_for",
]


def switch_order_for(
    topology: Topology, given: Sequence[str] | None
) -> tuple[list[str] | None, str]:
    """The topology.conf switch order for the guard and where it came from (for ``why``)."""
    from slurmfm.plan.planner import PlanError

    if given is not None:
        order = list(given)
        unknown = [s for s in order if s not in topology.parent_of]
        if unknown or len(set(order)) != len(order):
            raise PlanError(
                "switch_order must name each switch of the topology at most once"
                + (f"; unknown: {', '.join(unknown[:5])}" if unknown else "")
            )
        missing = sorted(set(topology.leaf_of.values()) - set(order), key=natural_key)
        if missing:
            raise PlanError(f"switch_order misses leaf switches: {', '.join(missing[:5])}")
        return order, "given topology.conf switch order"
    if topology.kind != "tree":
        return None, "default switch order"
    from slurmfm.topology.slurm_model import switch_order as recorded

    rec = recorded(topology)
    if rec is not None:
        return rec, "switch order recorded from topology.conf/scontrol"
    return None, "default switch order (none recorded; pass switch_order)"


def guard_rule_sets(slurm_version: SlurmVersion | None) -> tuple[Rules, ...]:
    """The ``slurm_sim`` rule sets the guard simulates for ``slurm_version``.

    A known version runs exactly one: "24.05.3" when it has ``tree_selection_rules_2405_3``
    (24.05.3 and later), else "21.08" (21.08-24.05.2). Unknown (None): both, in that order.
    """
    if slurm_version is None:
        return ("21.08", "24.05.3")
    from slurmfm.catalog.slurm_features import supports

    return ("24.05.3",) if supports("tree_selection_rules_2405_3", slurm_version) else ("21.08",)


# (nodes, origin, whether it is one of Slurm's own choices): a node set the guard judges
_NodeSet = tuple[Sequence[str], str, bool]


@dataclass(frozen=True)
class _GuardInputs:
    """What every step of :func:`slurm_guard` reads: one value instead of eight arguments
    per helper, so each step's signature shows only what it adds."""

    topology: Topology
    st: _Static
    free: frozenset[str]
    job: JobShape
    mode: Mode
    params: CostParams | None
    switch_order: Sequence[str] | None

    @property
    def table(self) -> list[str]:
        """Slurm's node table (cached by ``_Static``)."""
        return self.st.slurm_node_table()


@dataclass
class _Judged:
    """The candidates' judgement: the best so far, every placement that passed citizenship
    (for pin mode's robustness check) and the faster ones refused (for the note)."""

    best: CostReport | None
    pool: list[tuple[list[str], str]]
    found: tuple[list[str], CostReport, str] | None = None
    skipped: list[tuple[float, str]] = field(default_factory=list)  # (predicted s, why)


def _tree_choices(
    g: _GuardInputs,
    rule_sets: Sequence[Rules],
    sets: list[_NodeSet],
    slurm_sets: list[tuple[str, list[str]]],
) -> list[int]:
    """Slurm's ``topology/tree`` choice under each rule set, added to ``sets`` and
    ``slurm_sets``; each one's leaf count (1 << 30 when Slurm would not start the job)."""
    from slurmfm.plan.planner import PlanError
    from slurmfm.plan.slurm_sim import select_tree

    counts: list[int] = []
    for rules in rule_sets:
        try:
            chosen = select_tree(
                g.topology,
                g.free,
                g.job.nodes,
                rules=rules,
                node_order=g.table,
                switch_order=g.switch_order,
            )
        except ValueError as exc:  # pragma: no cover - switch_order is checked by the caller
            raise PlanError(f"switch_order: {exc}") from exc
        if chosen is not None:
            sets.append((chosen, f"Slurm's own choice ({rules} rules)", True))
            slurm_sets.append((f"{rules} rules", chosen))
            counts.append(len({g.st.leaf_of[n] for n in chosen}))
        else:  # pragma: no cover - one root: Slurm starts the job whenever it fits
            counts.append(1 << 30)
    return counts


def _block_sets(
    g: _GuardInputs, sets: list[_NodeSet], slurm_sets: list[tuple[str, list[str]]]
) -> None:
    """Slurm's ``topology/block`` choices (``-N`` alone and with ``--segment``, under both
    block rule sets), each distinct one added to ``sets`` and ``slurm_sets``."""
    from slurmfm.plan.slurm_sim import BLOCK_RULE_SETS, block_choices

    seen_block: set[tuple[str, tuple[str, ...]]] = set()
    for block_rules in BLOCK_RULE_SETS:  # the block rule sets differ only on one-node jobs
        for job_label, chosen in block_choices(
            g.topology, g.free, g.job.nodes, rules=block_rules, node_order=g.table
        ):
            if (job_label, tuple(chosen)) in seen_block:
                continue
            seen_block.add((job_label, tuple(chosen)))
            label = job_label
            if block_rules != BLOCK_RULE_SETS[0]:
                label = f"{job_label}, {block_rules} rules"
            sets.append((chosen, f"Slurm's topology/block choice ({label})", True))
            slurm_sets.append(
                (f"topology/block, {label.removeprefix('block').strip() or '-N only'}", chosen)
            )


def _room_floor(g: _GuardInputs, sets: Sequence[_NodeSet]) -> tuple[int, int]:
    """The free room a candidate must leave: the smallest of Slurm's choices' free runs.

    Nor may a candidate leave less free room behind than Slurm's choice: the largest free run
    of nodes in one leaf and under one spine (level-1 switch) after the job starts, which is
    what the next large job needs (the referee's held-out set: the fewest-leaves choice took
    the largest free leaves and left a smaller free spine run than Slurm in 25 of 40 held-out
    cases). With the version unknown, the smaller of the rule sets' runs (either may be the
    cluster's).
    """
    runs = [_free_runs(g.topology, g.st, g.free, nodes) for nodes, _, slurms in sets if slurms]
    return (min((r[0] for r in runs), default=0), min((r[1] for r in runs), default=0))


def _roomy(g: _GuardInputs, nodes: Sequence[str], floor: tuple[int, int]) -> bool:
    """Whether allocating ``nodes`` leaves at least the free room ``floor`` behind."""
    got = _free_runs(g.topology, g.st, g.free, nodes)
    return got[0] >= floor[0] and got[1] >= floor[1]


def _orders_of(
    g: _GuardInputs, nodes: Sequence[str], slurms: bool
) -> list[tuple[list[str], str, bool]]:
    """The rank orders a node set competes in, as (order, how, strict).

    A strict candidate must be predicted faster; the tie-breaks of _better (fewer DP ring
    edges crossing a leaf, fewer leaves) do not count for it.
    """
    from slurmfm.plan.planner import _ALT_ORDER_MAX_NODES, _fuller_first, order_nodes
    from slurmfm.plan.slurm_sim import rank_order

    topology, job, mode = g.topology, g.job, g.mode
    cands: list[tuple[list[str], str, bool]] = []
    if slurms:
        # Slurm's own set in its topology (leaf) order first: on Slurm's nodes the plan
        # changes the rank order only where the model predicts a gain. Ties keep Slurm's
        # order: they are decided by what the model leaves out (NCCL's trees, other jobs'
        # traffic), where the referee found either order can lose.
        leaf_order = rank_order(
            nodes, topology, policy="leaf", node_order=g.table, switch_order=g.switch_order
        )
        cands.append((leaf_order, "in Slurm's topology order", False))
    cands.append((order_nodes(topology, nodes, job), "in the planner's rank order", slurms))
    if mode == "pin" and not slurms:
        cands.append((list(nodes), "in stage order", False))
    if mode == "pin" and job.pp > 1 and job.nodes <= _ALT_ORDER_MAX_NODES:
        cands.append((_fuller_first(g.st, nodes), "fuller subtrees first", slurms))
    if mode == "pin" and slurms:
        # Pin mode keeps the planned order, so Slurm's name order competes too (PP blocks).
        cands.append((rank_order(nodes, topology, policy="name", node_order=g.table), "", True))
    if mode != "pin" and slurms:
        # Constrain mode: the job sorts whatever it gets by the rank key (planner order).
        cands = [(cands[1][0], cands[1][1], False)]
    return cands


def _judge(
    g: _GuardInputs,
    sets: Sequence[_NodeSet],
    limit: int,
    floor: tuple[int, int],
    judged: _Judged,
    seen: set[tuple[str, ...]],
) -> None:
    """Every node set that passes citizenship, in each of its orders, against the best so
    far (:func:`_better`); the refused ones are kept in ``judged.skipped`` with their time."""
    from slurmfm.plan.planner import order_nodes

    topology, job, params = g.topology, g.job, g.params
    for nodes, origin, slurms in sets:
        too_many = len({g.st.leaf_of[n] for n in nodes}) > limit
        if too_many or (not slurms and not _roomy(g, nodes, floor)):
            rep = evaluate(topology, order_nodes(topology, nodes, job), job, params)
            judged.skipped.append(
                (rep.predicted_s, "more leaves" if too_many else "it leaves less free room")
            )
            continue
        for cand, how, strict in _orders_of(g, nodes, slurms):
            if tuple(cand) in seen:
                continue
            seen.add(tuple(cand))
            judged.pool.append((cand, f"{origin} {how or 'in its own rank order'}"))
            rep = evaluate(topology, cand, job, params)
            best = judged.best
            if (
                best is None
                or (strict and rep.predicted_s < best.predicted_s * (1 - 1e-9))
                or (not strict and _better(rep, best))
            ):
                judged.best = rep
                judged.found = (cand, rep, f"{origin} {how or 'in its own rank order'}")


def _note_refused(judged: _Judged, report: CostReport, notes: list[str]) -> None:
    """Say when citizenship refused a placement predicted faster than the one chosen."""
    final = judged.best.predicted_s if judged.best is not None else report.predicted_s
    faster = [x for x in judged.skipped if x[0] < final * (1 - 1e-9)]
    if faster:
        t, reason = min(faster)
        notes.append(
            f"citizenship: a placement predicted {t * 1e3:.3f} ms/step (vs "
            f"{final * 1e3:.3f}) was not used: {reason} than Slurm's choice"
        )


def slurm_guard(
    topology: Topology,
    st: _Static,
    free_nodes: Sequence[str],
    job: JobShape,
    mode: Mode,
    order: list[str],
    report: CostReport,
    params: CostParams | None,
    alternatives: Sequence[Sequence[str]],
    switch_order: Sequence[str] | None,
    rule_sets: Sequence[Rules],
    slurm_sets: list[tuple[str, list[str]]],
    notes: list[str],
    risk: Risk = "none",
) -> tuple[tuple[list[str], CostReport, str] | None, list[int], tuple[int, int] | None, bool]:
    """A better placement by :func:`_better` (or None), each Slurm choice's leaves, the
    free-room floor when the planner's own choice fell below it (else None), and whether
    Slurm's own choice was kept because nothing beat it robustly (pin mode,
    :func:`keep_slurm_unless_robust`, with ``risk``).

    Slurm's selection is simulated under each of ``rule_sets`` (:func:`guard_rule_sets`: the
    one the cluster's Slurm version runs, or both when it is unknown) with ``switch_order``
    (the cluster's topology.conf order). Candidates: the planner's own choice (``order``, the
    fabric's fewest leaves), ``alternatives`` (selections under lower switches, more leaves)
    and Slurm's node sets, each in the planner's rank order (in pin mode also
    fuller-subtrees-first with PP, and Slurm's own name and leaf rank orders for Slurm's sets).
    Alternatives are also tried in their own order (stage order) in pin mode. The best by
    :func:`_better` wins (predicted time, then DP ring edges crossing a leaf, then leaves);
    Slurm's own sets are candidates, so the result is never predicted slower than any
    simulated Slurm choice. The second value: each rule set's leaf count, in ``rule_sets``
    order. ``slurm_sets`` is filled with each rule set's chosen nodes (labelled by rule set).

    On fabrics whose NVLink domains span nodes (GB200 UltraServers) the cluster runs
    ``topology/block`` (ParallelCluster >= 3.14 and HyperPod configure it for p6e-gb200), so
    that plugin's choices (``slurm_sim.block_choices``: ``-N`` alone and with ``--segment``,
    under both block rule sets, which differ only for one-node jobs) are Slurm's sets too;
    they do not count in the leaf counts.

    Citizenship: candidates on more leaf switches than Slurm's own choice uses (the larger of
    the two rule sets' counts when the version is unknown) are not considered (see the comment
    at the check).
    """
    g = _GuardInputs(topology, st, frozenset(free_nodes), job, mode, params, switch_order)
    sets: list[_NodeSet] = [(a, "the selection under a lower switch", False) for a in alternatives]
    counts = _tree_choices(g, rule_sets, sets, slurm_sets)
    _block_sets(g, sets, slurm_sets)
    # Cluster citizenship: no candidate may use more leaf switches than Slurm's own choice
    # (with the version unknown, the smaller of the two rule sets' counts: either may be the
    # cluster's, and a plan must not spread wider than the one it runs; with the larger, an
    # independent referee found plans on 8 leaves where the 24.05.3 rules took 4, issue 42
    # item 4). Extra leaves fragment the cluster for the next
    # job, and whether they pay for this one depends on other jobs' traffic and the fabric's
    # oversubscription, which the planner cannot see (the referee, bench.referee, judges
    # that from outside: scripts/bench_referee.py). The planner's own choice holds the job in
    # the fewest leaves of the fabric, so it always passes.
    limit = min(counts, default=1 << 30)
    # Nor may it leave less free room behind than Slurm's choice (_room_floor).
    floor = _room_floor(g, sets)
    own_ok = _roomy(g, order, floor)
    # Every placement that passes citizenship, for the robustness check after the loop.
    judged = _Judged(
        best=report if own_ok else None,
        pool=[(order, "the planner's own choice")] if own_ok else [],
    )
    _judge(g, sets, limit, floor, judged, seen={tuple(order)})
    _note_refused(judged, report, notes)
    baseline = _baseline(g, sets)
    if mode == "pin" and baseline is not None:
        pinned, kept = keep_slurm_unless_robust(
            topology,
            st,
            job,
            params,
            baseline,
            judged.pool,
            g.table,
            switch_order,
            notes,
            risk,
            busy_under=busy_counts(topology, g.free),
        )
        return pinned, counts, None, kept
    return judged.found, counts, (None if own_ok else floor), False


def _baseline(g: _GuardInputs, sets: Sequence[_NodeSet]) -> tuple[str, Sequence[str]] | None:
    """The Slurm choice pin mode keeps unless beaten robustly.

    With one choice (the version known), that one. With several (the version unknown: each
    rule set's), the one on the fewest leaves, so a kept choice never spreads wider than
    either rule set's; on a tie, the one whose worst predicted time over the scenarios
    (:func:`scenarios_for`, other jobs' traffic included) is lowest, then the first.
    """
    from slurmfm.plan.slurm_sim import rank_order

    own = [(nodes, o) for nodes, o, slurms in sets if slurms]
    if len(own) <= 1:
        return (own[0][1], own[0][0]) if own else None

    def leaves(nodes: Sequence[str]) -> int:
        return len({g.st.leaf_of[n] for n in nodes})

    fewest = min(leaves(nodes) for nodes, _ in own)
    tied = [(nodes, o) for nodes, o in own if leaves(nodes) == fewest]
    if len(tied) > 1:
        qs = scenarios_for(g.params, busy_counts(g.topology, g.free))

        def worst(nodes: Sequence[str]) -> float:
            order = rank_order(
                nodes, g.topology, policy="leaf", node_order=g.table, switch_order=g.switch_order
            )
            return max(evaluate(g.topology, order, g.job, q).predicted_s for q in qs)

        tied.sort(key=lambda no: worst(no[0]))  # stable: the first on a tie
    nodes, origin = tied[0]
    return origin, nodes


def busy_counts(topology: Topology, free: frozenset[str]) -> dict[str, int]:
    """Per switch, the nodes under it that are not free: other jobs' nodes (or drained ones,
    which the planner cannot tell apart), whose traffic shares the switch's physical uplinks
    in the ``uplink_share="busy"`` scenario."""
    out: Counter[str] = Counter()
    for n in topology.nodes:
        if n not in free:
            for sw in topology.path(n):
                out[sw] += 1
    return dict(out)


def keep_slurm_unless_robust(
    topology: Topology,
    st: _Static,
    job: JobShape,
    params: CostParams | None,
    baseline: tuple[str, Sequence[str]],
    pool: Sequence[tuple[list[str], str]],
    table: Sequence[str],
    switch_order: Sequence[str] | None,
    notes: list[str],
    risk: Risk = "none",
    *,
    busy_under: Mapping[str, int] | None = None,
) -> tuple[tuple[list[str], CostReport, str], bool]:
    """Pin mode's choice: Slurm's own choice in topology order, unless a placement of ``pool``
    robustly beats it over the scenarios of :func:`robust_gains`. ``risk="none"``: predicted
    at least :data:`MIN_GAIN` faster in every scenario; ``risk="model"``: never predicted
    slower in any and at least that much faster in one. Of those, the one with the largest
    worst-case gain (then best case). Returns (order, its report, origin) and whether Slurm's
    choice was kept.

    Why: the planner sees neither the fabric's taper nor the other jobs' traffic nor NCCL's
    exact algorithm choice. Judged by the referee, placements the ring model preferred lost up
    to 37.8 %, and even ``risk="model"`` lost 2.5 % in one case of a fresh seed set
    (docs/placement-plans.md, "Referee"). Slurm's own choice kept is never slower than
    Slurm's own choice, which is why ``none`` is the default.
    """
    from slurmfm.plan.slurm_sim import rank_order

    base_origin, base_nodes = baseline
    base = rank_order(
        base_nodes, topology, policy="leaf", node_order=table, switch_order=switch_order
    )
    scenarios = "ring and tree all-reduce, oversubscription " + " and ".join(
        f"{o:g}" for o in scenario_oversubscriptions(params)
    )
    scenarios += ", the job's share of each uplink or the whole switch" + (
        " or its share of the physical uplinks with the busy nodes' traffic" if busy_under else ""
    )
    pick: tuple[float, float, list[str], str] | None = None
    qs = scenarios_for(params, busy_under)
    base_times = [evaluate(topology, base, job, q).predicted_s for q in qs]
    floor = MIN_GAIN if risk == "none" else -1e-9
    for cand, origin in pool:
        if cand == base:
            continue
        worst, top = robust_gains(
            topology,
            cand,
            base,
            job,
            params,
            base_times=base_times,
            floor=floor,
            busy_under=busy_under,
        )
        ok = worst >= floor and top >= MIN_GAIN
        if ok and (pick is None or (worst, top) > pick[:2]):
            pick = (worst, top, cand, origin)
    base_leaves = len({st.leaf_of[n] for n in base})
    if pick is None:
        rule = (
            f"at least {MIN_GAIN * 100:g}% faster in every scenario"
            if risk == "none"
            else f"at least {MIN_GAIN * 100:g}% faster in some scenario and never slower"
        )
        notes.append(
            f"guard: kept {base_origin} in Slurm's topology order ({base_leaves} leaves): no "
            f"other placement is predicted {rule} ({scenarios}; risk={risk})"
        )
        rep = evaluate(topology, base, job, params)
        return (base, rep, f"{base_origin} in Slurm's topology order"), True
    worst, top, cand, origin = pick
    notes.append(
        f"robust gain over Slurm's own choice in topology order: {worst * 100:+.1f}% to "
        f"{top * 100:+.1f}% over the scenarios ({scenarios}; risk={risk})"
    )
    return (cand, evaluate(topology, cand, job, params), origin), False


# A pin-mode plan leaves Slurm's own choice (nodes and topology order) only for a predicted
# gain of at least this much (in every scenario of robust_gains, or with risk="model" in one
# and no loss in any): the referee's rule is "no case more than 2 % slower than Slurm's
# choice", and a smaller predicted gain is within what the model leaves out.
MIN_GAIN = 0.02


def scenario_oversubscriptions(params: CostParams | None) -> tuple[float, ...]:
    """The fabric tapers a plan is checked under: the given one, or 1 and 4 when unknown.

    AWS does not publish EFA's oversubscription, and the default parameters say 1 (unknown);
    then a plan must not lose on a non-blocking fabric nor on a 4:1 taper, where crossings it
    thought free become the bottleneck.
    """
    p = params or CostParams.default()
    given = {p.tiers[t].oversubscription for t in ("leaf", "spine", "core")}
    return (1.0, 4.0) if given == {1.0} else tuple(sorted(given))


def scenarios_for(
    params: CostParams | None, busy_under: Mapping[str, int] | None = None
) -> list[CostParams]:
    """The cost parameters of every scenario the planner cannot tell apart: ring or tree DP
    all-reduce (NCCL's crossover constants vary between releases; a forced ``dp_algorithm`` is
    kept), each plausible oversubscription (:func:`scenario_oversubscriptions`, the lowest
    first), and the job's share of each uplink (its own nodes' share of a busy fabric, or the
    whole switch's capacity on an idle one: the planner does not see other jobs' traffic).
    With ``busy_under`` (the nodes under each switch that are not free, :func:`busy_counts`)
    a third share: the physical uplinks shared max-min with those nodes' traffic, each at its
    NIC rate (``CostParams.uplink_share="busy"``), the model of other jobs the independent
    referee judges with (issue 42 item 4).
    """
    p = params or CostParams.default()
    algos = (p.dp_algorithm,) if p.dp_algorithm != "auto" else ("ring", "tree")
    unknown = {p.tiers[t].oversubscription for t in ("leaf", "spine", "core")} == {1.0}
    out: list[CostParams] = []
    for o in scenario_oversubscriptions(p):
        scen = p.with_oversubscription(o) if unknown else p
        for algo in algos:
            for share in ("job", "switch", "busy") if busy_under else ("job", "switch"):
                out.append(
                    dataclasses.replace(
                        scen, dp_algorithm=algo, uplink_share=share, busy_under=busy_under
                    )
                )
    return out


def robust_gains(
    topology: Topology,
    order: Sequence[str],
    base: Sequence[str],
    job: JobShape,
    params: CostParams | None,
    *,
    base_times: Sequence[float] | None = None,
    floor: float | None = None,
    busy_under: Mapping[str, int] | None = None,
) -> tuple[float, float]:
    """The smallest and largest predicted gain ``1 - t(order)/t(base)`` over
    :func:`_scenarios`.

    ``base_times``: ``base``'s predicted time per scenario, when the caller has them (one
    baseline, many candidates). ``floor``: stop at the first gain below it (the candidate is
    out whatever the rest say) and return that gain as both values; the scenarios go from the
    lowest oversubscription up, where gains are smallest, so a strict rule rejects most
    candidates after one evaluation.
    """
    scenarios = scenarios_for(params, busy_under)
    if base_times is None:
        base_times = [evaluate(topology, base, job, q).predicted_s for q in scenarios]
    gains: list[float] = []
    for q, t_base in zip(scenarios, base_times, strict=True):
        t_new = evaluate(topology, order, job, q).predicted_s
        gain = 1 - t_new / t_base if t_base > 0 else 0.0
        if floor is not None and gain < floor:
            return gain, gain
        gains.append(gain)
    return min(gains), max(gains)


def _free_runs(
    topology: Topology, st: _Static, free: frozenset[str], taken: Sequence[str]
) -> tuple[int, int]:
    """(largest free nodes under one spine, under one leaf) once ``taken`` is allocated.

    A spine is a level-1 switch; a fabric without one counts its leaves as spines.
    """
    gone = set(taken)
    leaf: Counter[str] = Counter()
    for n in free:
        if n not in gone:
            leaf[st.leaf_of[n]] += 1
    spine: Counter[str] = Counter()
    for lf, c in leaf.items():
        par = topology.parent_of.get(lf)
        spine[par if par is not None else lf] += c
    return max(spine.values(), default=0), max(leaf.values(), default=0)


def simulation_check(
    topology: Topology,
    st: _Static,
    job: JobShape,
    order: list[str],
    report: CostReport,
    params: CostParams | None,
    slurm_sets: Sequence[tuple[str, list[str]]],
    switch_order: Sequence[str] | None,
    why: list[str],
) -> tuple[list[str], CostReport]:
    """Keep the plan or Slurm's own choice (its leaf and name orders), whichever simulates faster.

    The cost model decides among many candidates; on near-ties (fractions of a percent, e.g.
    PP pairs sharing uplinks with DP rings) it cannot see what the flow-level simulation
    sees, so the few placements the plan must never lose to are simulated ("evaluate both and
    keep the better"). Equal times (within 1e-6) go to fewer DP ring edges crossing a
    leaf, then fewer leaves, then the plan.
    """
    from slurmfm.plan import simulate as sim
    from slurmfm.plan.planner import PlanError
    from slurmfm.plan.slurm_sim import rank_order

    if not sim.available():
        raise PlanError(
            "simulate: SimGrid is not installed (apt-get install python3-simgrid, or set "
            "SLURMFM_SIMGRID_PYTHON)"
        )
    table = st.slurm_node_table()
    cands: list[tuple[list[str], str]] = [(order, "the plan")]
    for rules, nodes in slurm_sets:
        for policy in ("leaf", "name"):
            cand = rank_order(
                nodes,
                topology,
                policy=policy,
                node_order=table,
                switch_order=switch_order,
            )
            if all(cand != c for c, _ in cands):
                cands.append((cand, f"Slurm's own choice ({rules}, {policy} order)"))
    cost = params or CostParams.default()
    reps = sim.simulate_many(
        topology, [c for c, _ in cands], job, cost, sim.SimParams.from_cost(cost)
    )
    times = [r.makespan_s for r in reps]
    reports = [report, *(evaluate(topology, c, job, params) for c, _ in cands[1:])]
    best = 0
    for i in range(1, len(cands)):
        # Faster wins; within 1e-6 (the same time) fewer DP ring edges crossing a leaf, then
        # fewer leaves: more crossings only where the simulation says they pay.
        if times[i] < times[best] * (1 - 1e-6) or (
            times[i] <= times[best] * (1 + 1e-6)
            and (reports[i].dp_edges_cross_leaf, reports[i].leaves_used)
            < (reports[best].dp_edges_cross_leaf, reports[best].leaves_used)
        ):
            best = i
    why.append(
        "simulation check (SimGrid): "
        + ", ".join(f"{name} {t * 1e3:.3f} ms" for (_, name), t in zip(cands, times, strict=True))
        + ("; keeping the plan" if best == 0 else f"; using {cands[best][1]}")
    )
    return cands[best][0], reports[best]


def _better(a: CostReport, b: CostReport) -> bool:
    """The planner's objective: predicted time, then DP ring edges crossing a leaf, then leaves.

    Times within a relative 1e-9 are a tie (the same placement scored twice, or placements the
    model cannot tell apart, as at oversubscription 1): then fewer DP ring edges that leave a
    leaf (they are what congestion would slow down), then fewer leaves.
    """
    if a.predicted_s < b.predicted_s * (1 - 1e-9):
        return True
    if a.predicted_s > b.predicted_s * (1 + 1e-9):
        return False
    return (a.dp_edges_cross_leaf, a.leaves_used) < (b.dp_edges_cross_leaf, b.leaves_used)
