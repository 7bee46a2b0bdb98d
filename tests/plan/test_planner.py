"""Planner properties on random fabrics and busy sets (hypothesis), plus fixed examples."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmfm.catalog.slurm_features import SlurmVersion
from slurmfm.plan.cost import JobShape, nvlink_domain
from slurmfm.plan.planner import PlanError, natural_key, order_nodes, plan
from slurmfm.topology.model import Node, Topology

V2211 = SlurmVersion.parse("22.05.8")
V2411 = SlurmVersion.parse("24.11.5")


def make_tree(spines: int, leaves_per_spine: int, per_leaf: int, seed: int) -> Topology:
    """A 3-level tree whose node names are permuted (launch order, not topology order)."""
    import random

    total = spines * leaves_per_spine * per_leaf
    names = [f"p5-{i:04d}" for i in range(total)]
    random.Random(seed).shuffle(names)
    paths = {}
    for i, n in enumerate(names):
        leaf = i // per_leaf
        paths[n] = ("core", f"spine{leaf // leaves_per_spine}", f"leaf{leaf}")
    return Topology.from_paths(paths)


def make_gb200(blocks: int, size: int, seed: int, *, kind: str = "block") -> Topology:
    import random

    total = blocks * size
    names = [f"gb-{i:03d}" for i in range(total)]
    random.Random(seed).shuffle(names)
    leaf_of = {n: f"block{i // size + 1}" for i, n in enumerate(names)}
    if kind == "block":
        return Topology.from_parents([Node(n) for n in names], leaf_of, {}, kind="block")
    # EC2 tree with CapacityBlockId domains, two UltraServers per leaf
    nodes = [Node(n, nvlink_domain=leaf_of[n]) for n in names]
    leaf2 = {n: f"leaf{(i // size) // 2}" for i, n in enumerate(names)}
    return Topology.from_parents(nodes, leaf2, {})


@st.composite
def tree_case(draw: st.DrawFn) -> tuple[Topology, list[str], int]:
    topo = make_tree(
        draw(st.integers(1, 3)),
        draw(st.integers(1, 4)),
        draw(st.integers(1, 5)),
        draw(st.integers(0, 9)),
    )
    names = sorted(topo.nodes)
    busy = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names)))
    n = draw(st.integers(1, len(names)))
    return topo, busy, n


def min_leaves_under(topo: Topology, switch: str, free: set[str], need: int) -> int:
    caps = sorted(
        (
            sum(1 for n in topo.nodes_under(leaf) if n in free)
            for leaf in topo.leaves
            if switch in topo.path(topo.nodes_under(leaf)[0])
        ),
        reverse=True,
    )
    total = 0
    for i, c in enumerate(caps):
        total += c
        if total >= need:
            return i + 1
    raise AssertionError("infeasible")


@settings(max_examples=150, deadline=None)
@given(tree_case(), st.sampled_from(["pin", "constrain"]))
def test_tree_plans_are_free_minimal_and_deterministic(
    case: tuple[Topology, list[str], int], mode: str
) -> None:
    topo, busy, n = case
    free = set(topo.nodes) - set(busy)
    job = JobShape(n, 8, tp=8)
    if len(free) < n:
        with pytest.raises(PlanError, match="not enough free nodes"):
            plan(topo, job, unavailable=busy)
        return
    p = plan(topo, job, unavailable=busy, mode=mode, slurm_version=V2211)  # type: ignore[arg-type]
    assert len(p.nodes) == n
    assert len(set(p.nodes)) == n
    assert set(p.nodes) <= free
    # Lowest feasible switch: the lowest-level switch with >= n free nodes below it.
    feasible = [s for s in topo.switches if sum(1 for x in topo.nodes_under(s) if x in free) >= n]
    lowest = min(topo.level(s) for s in feasible)
    lca_level = max((topo.level(topo.lca(a, b)) for a in p.nodes[:1] for b in p.nodes), default=0)
    assert lca_level == lowest
    top = next(s for s in topo.path(p.nodes[0]) if topo.level(s) == lowest)
    assert len(p.leaves) == min_leaves_under(topo, top, free, n)
    assert p.predicted.leaves_used == len(p.leaves)
    # Rank order: grouped by leaf (each leaf one contiguous run), leaves in DFS order.
    runs = [
        topo.leaf(x)
        for i, x in enumerate(p.nodes)
        if i == 0 or topo.leaf(p.nodes[i - 1]) != topo.leaf(x)
    ]
    assert len(runs) == len(set(runs))
    again = plan(topo, job, unavailable=list(reversed(busy)), mode=mode, slurm_version=V2211)  # type: ignore[arg-type]
    assert again == p
    assert again.rank_key == p.rank_key
    if mode == "constrain":
        assert p.switches == f"{len(p.leaves)}@00:10:00"
        assert p.sbatch_options == (f"--switches={p.switches}",)
        assert set(p.rank_key) == set(topo.nodes)
        assert sorted(p.nodes, key=p.rank_key.__getitem__) == list(p.nodes)
        assert p.placement().mode == "constrain"
        assert not p.placement().nodes
    else:
        assert p.sbatch_options[0].startswith("--nodelist=")
        assert p.placement().nodes == p.nodes


@st.composite
def gb_case(draw: st.DrawFn) -> tuple[Topology, list[str], JobShape]:
    size = draw(st.sampled_from([9, 18]))
    topo = make_gb200(
        draw(st.integers(1, 4)),
        size,
        draw(st.integers(0, 9)),
        kind=draw(st.sampled_from(["block", "tree"])),
    )
    names = sorted(topo.nodes)
    busy = draw(st.lists(st.sampled_from(names), unique=True, max_size=len(names) // 2))
    tp = draw(st.sampled_from([1, 2, 4, 8, 16]))
    cp = draw(st.sampled_from([1, 2]))
    ep = draw(st.sampled_from([1, 2, 4]))
    unit = JobShape(1, 4, tp=tp, cp=cp, ep=ep).nvlink_unit()
    units = draw(st.integers(1, max(1, len(names) // unit)))
    return topo, busy, JobShape(units * unit, 4, tp=tp, cp=cp, ep=ep)


@settings(max_examples=150, deadline=None)
@given(gb_case(), st.sampled_from([V2211, V2411]))
def test_gb200_groups_never_span_ultraservers(
    case: tuple[Topology, list[str], JobShape], version: SlurmVersion
) -> None:
    topo, busy, job = case
    if job.problems():
        with pytest.raises(PlanError):
            plan(topo, job, unavailable=busy)
        return
    try:
        p = plan(topo, job, unavailable=busy, mode="constrain", slurm_version=version)
    except PlanError as exc:
        assert str(exc)  # a reason is given
        return
    assert set(p.nodes).isdisjoint(busy)
    assert p.predicted.nvlink_violations == 0
    g = job.gpus_per_node
    for size in (job.tp * job.cp, job.tp * job.ep):
        for start in range(0, job.world, size):
            doms = {nvlink_domain(topo, p.nodes[r // g]) for r in range(start, start + size)}
            assert len(doms) == 1
    if topo.kind != "block":
        assert p.segment is None
    elif version < SlurmVersion.parse("24.05"):
        assert p.segment is None
        assert any("no --segment" in line for line in p.explanation)
    elif p.segment is not None:
        us = {
            len([n for n in topo.nodes if nvlink_domain(topo, n) == d])
            for d in {nvlink_domain(topo, n) for n in p.nodes}
        }
        assert job.nodes % p.segment == 0
        assert p.segment % job.nvlink_unit() == 0
        if all(u % job.nvlink_unit() == 0 for u in us):
            assert all(u % p.segment == 0 for u in us)
        else:  # the documented fallback: fits one UltraServer (NVIDIA's 16-of-18 shape)
            assert p.segment <= min(us)
        assert f"--segment={p.segment}" in p.sbatch_options


def test_impossible_requests_say_why() -> None:
    topo = make_tree(1, 2, 4, 0)
    with pytest.raises(PlanError, match="not enough free nodes under any common switch"):
        plan(topo, JobShape(9, 8))
    with pytest.raises(PlanError, match="largest NVLink domain"):
        plan(topo, JobShape(2, 8, tp=16))
    with pytest.raises(PlanError, match="does not divide"):
        plan(topo, JobShape(2, 8, tp=3))
    gb = make_gb200(2, 18, 0)
    with pytest.raises(PlanError, match="whole 2-node NVLink units"):
        plan(gb, JobShape(18, 4, tp=8), unavailable=[n for n in sorted(gb.nodes) if n < "gb-020"])
    with pytest.raises(PlanError, match="job shape: tp\\*cp\\*pp = 24 does not divide"):
        plan(gb, JobShape(3, 4, tp=8, pp=3))


def test_best_fit_takes_the_tightest_leaf_and_whole_leaves() -> None:
    topo = make_tree(2, 2, 4, 0)
    leaves = {leaf: sorted(topo.nodes_under(leaf), key=natural_key) for leaf in topo.leaves}
    busy = leaves["leaf0"][:1] + leaves["leaf2"][:3]  # leaf0: 3 free, leaf2: 1 free
    p = plan(topo, JobShape(1, 8), unavailable=busy)
    assert p.leaves == ("leaf2",)  # tightest single leaf
    p = plan(topo, JobShape(7, 8), unavailable=busy)
    assert p.leaves == ("leaf0", "leaf1")  # spine0 holds 7 exactly
    assert "leftover 0" in "\n".join(p.explanation)


def test_order_nodes_is_the_rank_key_order() -> None:
    topo = make_tree(2, 2, 3, 4)
    names = sorted(topo.nodes)[::2]
    job = JobShape(len(names), 8)
    p = plan(topo, JobShape(2, 8), mode="constrain")
    assert order_nodes(topo, names, job) == sorted(names, key=p.rank_key.__getitem__)
    with pytest.raises(PlanError, match="not in the topology"):
        order_nodes(topo, ["nope"], job)


def test_segment_examples() -> None:
    gb = make_gb200(2, 18, 1)
    p = plan(gb, JobShape(18, 4, tp=8), mode="constrain", slurm_version=V2411)
    assert p.segment == 18
    assert p.leaves == ("block1",)
    p = plan(gb, JobShape(16, 4, tp=16), mode="constrain", slurm_version=V2411)
    assert p.segment == 16  # fallback: 4-node units cannot tile 18
    p = plan(gb, JobShape(18, 4, tp=8), mode="constrain", slurm_version=V2211)
    assert p.segment is None
    assert p.sbatch_options == ()
    p = plan(gb, JobShape(12, 4, tp=4), mode="constrain", slurm_version=None)
    assert p.segment is None
    assert math.gcd(12, 18) == 6
    p = plan(gb, JobShape(12, 4, tp=4), mode="constrain", slurm_version=V2411)
    assert p.segment == 12 or 18 % p.segment == 0
