"""Exact optimum of the cost model for data-parallel jobs, by mixed-integer programming (HiGHS).

Why: "within x % of the optimum" needs the optimum, and exhaustive search stops at a handful
of nodes, below where fewest-leaves and few-congested-uplinks disagree. For jobs
without pipeline stages whose TP*CP/EP groups fit in one node (``pp == 1``, NVLink unit 1,
every node its own NVLink domain) the cost model's optimum has a closed shape:

* Only the DP rings depend on the placement (TP/CP/EP stay inside a node). A ring over the
  job's nodes leaves each used leaf, and each used switch below the rings' lowest common switch,
  at least once per direction, and fabric (DFS) order achieves exactly once. So that order is
  optimal for any node set, and the flows on an uplink are the rings' count ``c``.
* The uplink of a switch with ``k`` of the job's nodes carries ``c`` flows over a capacity of
  ``k * G / o`` (``slurmfm.plan.cost``), so the rings' congestion is ``max(1, o / k_min)`` with
  ``k_min`` the fewest job nodes under any used switch below the common one (for one ``o``).
* With the common switch ``s`` fixed (its tier fixes the ring's latency and bandwidth), the
  optimum therefore maximises ``k_min``: a MILP with integer node counts per leaf, a binary
  "used" per leaf and per intermediate switch, and ``k_min <= count + M (1 - used)``.

Solving it for every switch with room and scoring each answer with ``evaluate`` gives the
exact minimum of the model over node subsets and rank orders. HiGHS (PyPI ``highspy``,
https://highs.dev) is an optional extra; :func:`available` says whether it imports.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmfm.plan.cost import CostParams, CostReport, JobShape, evaluate

if TYPE_CHECKING:
    from slurmfm.topology.model import Topology


def available() -> bool:
    """Whether HiGHS's Python bindings import."""
    try:
        import highspy  # noqa: F401
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class Optimum:
    """The best node order found, its cost, and how many MILPs were solved."""

    order: tuple[str, ...]
    report: CostReport
    milps: int


def applies(topology: Topology, job: JobShape) -> bool:
    """Whether the closed shape above holds: no PP, single-node NVLink units, 8-GPU domains."""
    return (
        job.pp == 1
        and job.nvlink_unit() == 1
        and topology.kind == "tree"
        and not any(n.nvlink_domain for n in topology.nodes.values())
    )


def _solve_under(
    topology: Topology,
    top: str,
    free_by_leaf: dict[str, list[str]],
    need: int,
    time_limit_s: float,
) -> list[str] | None:
    """Node counts per leaf under ``top`` maximising the fewest job nodes under a used switch."""
    import highspy

    leaves = [lf for lf in free_by_leaf if top in topology.path(free_by_leaf[lf][0])]
    if sum(len(free_by_leaf[lf]) for lf in leaves) < need:
        return None
    h = highspy.Highs()  # type: ignore[no-untyped-call]
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit_s))
    h.setOptionValue("mip_rel_gap", 0.0)
    integer = highspy.HighsVarType.kInteger
    big = float(need)
    m = h.addVariable(lb=0, ub=big)
    x: dict[str, Any] = {}
    used: dict[str, Any] = {}
    for lf in leaves:
        cap = len(free_by_leaf[lf])
        x[lf] = h.addVariable(lb=0, ub=min(cap, need), type=integer)
        used[lf] = h.addVariable(lb=0, ub=1, type=integer)
        h.addConstr(x[lf] <= min(cap, need) * used[lf])
        h.addConstr(x[lf] >= used[lf])
        h.addConstr(m <= x[lf] + big * (1 - used[lf]))
    # Intermediate switches: strictly below ``top``, above the leaves.
    depth = topology.path(free_by_leaf[leaves[0]][0]).index(top) + 1
    mids: dict[str, list[str]] = {}
    for lf in leaves:
        path = topology.path(free_by_leaf[lf][0])
        for sw in path[depth:-1]:
            mids.setdefault(sw, []).append(lf)
    for lfs in mids.values():
        z = h.addVariable(lb=0, ub=1, type=integer)
        total = sum((x[lf] for lf in lfs[1:]), x[lfs[0]])
        h.addConstr(total <= big * z)
        h.addConstr(m <= total + big * (1 - z))
    h.addConstr(sum((x[lf] for lf in leaves[1:]), x[leaves[0]]) == need)
    h.maximize(m)
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        return None
    out: list[str] = []
    for lf in leaves:
        k = round(h.val(x[lf]))
        out.extend(free_by_leaf[lf][:k])
    return out if len(out) == need else None


def exact(
    topology: Topology,
    job: JobShape,
    free: Iterable[str],
    params: CostParams | None = None,
    *,
    time_limit_s: float = 20.0,
) -> Optimum | None:
    """The cost model's exact optimum for ``job`` on the ``free`` nodes (None if it does not
    apply, no placement exists, or a MILP did not prove optimality in ``time_limit_s``)."""
    from slurmfm.plan.planner import order_nodes

    if not applies(topology, job) or not available():
        return None
    free_by_leaf: dict[str, list[str]] = {}
    fs = set(free)
    for n in topology.natural_order:  # nodes of a leaf in Slurm's node-table order
        if n in fs:
            free_by_leaf.setdefault(topology.leaf(n), []).append(n)
    under: dict[str, int] = {}
    for ns in free_by_leaf.values():
        for sw in topology.path(ns[0]):
            under[sw] = under.get(sw, 0) + len(ns)
    best: Optimum | None = None
    milps = 0
    for top in sorted((s for s, k in under.items() if k >= job.nodes), key=topology.level):
        milps += 1
        nodes = _solve_under(topology, top, free_by_leaf, job.nodes, time_limit_s)
        if nodes is None:
            continue
        order = order_nodes(topology, nodes, job)
        rep = evaluate(topology, order, job, params)
        if best is None or rep.predicted_s < best.report.predicted_s * (1 - 1e-12):
            best = Optimum(tuple(order), rep, milps)
    if best is not None:
        best = Optimum(best.order, best.report, milps)
    return best


def lower_bound(
    topology: Topology,
    job: JobShape,
    free: Iterable[str],
    params: CostParams | None = None,
) -> float:
    """A proven lower bound on the cost model's step time for ``job`` on the ``free`` nodes.

    For jobs the MILP does not cover (PP > 1, multi-node NVLink domains): the model's time is
    the sum over dimensions of the slowest group's time (:func:`slurmfm.plan.cost.evaluate`),
    and a group's time depends on the placement only through the level of the lowest switch
    above its nodes (and, for DP rings, an uplink congestion factor that is never below 1). A
    group over ``k`` distinct nodes can sit no lower than the lowest level where one switch
    (or, at level -1, one NVLink domain) has ``k`` free nodes. So each group is charged its
    cheapest cost over the levels it can reach, congestion 1, and each dimension its slowest
    group: no placement costs less. The gap to it bounds the gap to the optimum from above.
    """
    from slurmfm.plan.cost import (
        _alltoall,
        _groups,
        _node_groups,
        _p2p,
        _ring,
        _tier_at,
        nvlink_domain,
    )

    params = params or CostParams.default()
    tiers, nbytes, g = params.tiers, params.message_bytes, job.gpus_per_node
    dom: dict[str, int] = {}
    most: dict[int, int] = {}  # level -> most free nodes under one switch at that level
    under: dict[str, int] = {}
    for n in free:
        d = nvlink_domain(topology, n)
        dom[d] = dom.get(d, 0) + 1
        for sw in topology.path(n):
            under[sw] = under.get(sw, 0) + 1
    for sw, c in under.items():
        lvl = topology.level(sw)
        most[lvl] = max(most.get(lvl, 0), c)
    most[-1] = max(dom.values(), default=0)
    levels = sorted(most)

    def cheapest(k: int, cost: Any) -> float:
        reach = [lvl for lvl in levels if lvl >= -1 and (k <= 1 or most[lvl] >= k)]
        if not reach:
            raise ValueError(f"no switch has {k} free nodes")
        return float(min(cost(_tier_at(tiers, lvl)) for lvl in reach))

    groups = _groups(job)
    total = 0.0
    for dim in ("tp", "cp", "ep", "dp"):
        worst = 0.0
        for nodes in _node_groups(groups[dim], g):
            p, k = len(nodes), len(set(nodes))
            nb = nbytes[dim]
            fn = _alltoall if dim == "ep" else _ring
            worst = max(worst, cheapest(k, lambda t, p=p, nb=nb, fn=fn: fn(p, nb, t)))
        total += worst
    worst = 0.0
    for nodes in _node_groups(groups["pp"], g):
        t = 0.0
        for a, b in itertools.pairwise(nodes):
            t += cheapest(1 if a == b else 2, lambda tier: _p2p(nbytes["pp"], tier))
        worst = max(worst, t)
    return total + worst


def gap(plan_s: float, optimum_s: float) -> float:
    """Relative excess of the plan over the optimum (0.0 = optimal)."""
    return plan_s / optimum_s - 1.0 if optimum_s > 0 else 0.0


__all__: Sequence[str] = ("Optimum", "applies", "available", "exact", "gap", "lower_bound")
