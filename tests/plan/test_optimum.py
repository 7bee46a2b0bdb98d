"""Exact optimum of the cost model (MILP on HiGHS) against brute force, and the planner's gap."""

from __future__ import annotations

import itertools
import random

from bench import optimum as opt
from slurmfm.plan.cost import CostParams, JobShape, evaluate
from slurmfm.plan.planner import order_nodes, plan
from slurmfm.topology.model import Topology


def uneven(seed: int) -> Topology:
    rng = random.Random(seed)
    paths = {}
    k = 0
    for sp in range(3):
        for lf in range(rng.randint(1, 3)):
            for _ in range(rng.randint(1, 4)):
                paths[f"h{k:02d}"] = ("root", f"top{sp // 2}", f"spine{sp}", f"leaf{sp}{lf}")
                k += 1
    return Topology.from_paths(paths)


def brute_force(topo: Topology, free: list[str], job: JobShape, params: CostParams) -> float:
    return min(
        evaluate(topo, order_nodes(topo, c, job), job, params).predicted_s
        for c in itertools.combinations(free, job.nodes)
    )


def test_milp_matches_brute_force_on_small_fabrics() -> None:
    assert opt.available()
    params = CostParams.default().with_oversubscription(4)
    for seed in range(6):
        topo = uneven(seed)
        rng = random.Random(seed)
        free = sorted(rng.sample(sorted(topo.nodes), min(11, len(topo.nodes))))
        job = JobShape(min(5, len(free)), 8, tp=8)
        got = opt.exact(topo, job, free, params)
        assert got is not None
        assert abs(got.report.predicted_s - brute_force(topo, free, job, params)) < 1e-12


def test_planner_gap_is_measured() -> None:
    topo = uneven(3)
    params = CostParams.default().with_oversubscription(2)
    job = JobShape(6, 8, tp=8)
    best = opt.exact(topo, job, topo.nodes, params)
    assert best is not None
    p = plan(topo, job, params=params)
    assert opt.gap(p.predicted.predicted_s, best.report.predicted_s) >= -1e-12


def test_only_where_the_closed_shape_holds() -> None:
    topo = uneven(0)
    assert not opt.applies(topo, JobShape(4, 8, tp=8, pp=2))
    assert opt.exact(topo, JobShape(4, 8, tp=8, pp=2), topo.nodes) is None


def brute_force_any_order(
    topo: Topology, free: list[str], job: JobShape, params: CostParams
) -> float:
    """The model's minimum over every node subset in every rank order (PP included)."""
    return min(
        evaluate(topo, list(perm), job, params).predicted_s
        for c in itertools.combinations(free, job.nodes)
        for perm in itertools.permutations(c)
    )


def test_lower_bound_for_pipelines_is_below_every_placement_and_tight_when_one_leaf_fits() -> None:
    for o in (1, 4):
        params = CostParams.default().with_oversubscription(o)
        for seed in range(3):
            topo = uneven(seed)
            rng = random.Random(seed)
            free = sorted(rng.sample(sorted(topo.nodes), min(6, len(topo.nodes))))
            job = JobShape(4, 8, tp=8, pp=2)
            lb = opt.lower_bound(topo, job, free, params)
            assert 0 < lb <= brute_force_any_order(topo, free, job, params) * (1 + 1e-12)
    # Four free nodes on one leaf: every group can sit as low as it ever could.
    topo = Topology.from_paths({f"h{i}": ("root", "spine0", "leaf0") for i in range(4)})
    job = JobShape(4, 8, tp=8, pp=2)
    params = CostParams.default()
    free = sorted(topo.nodes)
    assert opt.lower_bound(topo, job, free, params) == brute_force_any_order(
        topo, free, job, params
    )


def test_lower_bound_uses_nvlink_domains_that_hold_a_group() -> None:
    from slurmfm.topology.model import Node

    paths = {f"g{i}": ("root", "spine0", f"us{i // 4}") for i in range(8)}
    nodes = [Node(f"g{i}", nvlink_domain=f"us{i // 4}") for i in range(8)]
    topo = Topology.from_paths(paths, nodes)
    job = JobShape(4, 4, tp=4, pp=2)
    params = CostParams.default().with_oversubscription(2)
    # One UltraServer with all four free: every ring and pipeline hop stays on NVLink.
    one = [f"g{i}" for i in range(4)] + ["g4"]
    lb_one = opt.lower_bound(topo, job, one, params)
    assert lb_one == brute_force_any_order(topo, one, job, params)
    # Two free per UltraServer: the DP rings (2 nodes) still fit one, the job does not.
    two = ["g0", "g1", "g4", "g5"]
    lb_two = opt.lower_bound(topo, job, two, params)
    assert lb_one <= lb_two <= brute_force_any_order(topo, two, job, params) * (1 + 1e-12)
