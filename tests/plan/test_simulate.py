"""Flow-level simulation (SimGrid) of a step's DP rings and PP pairs.

The scenario builder is checked without SimGrid; the simulations need Debian's
``python3-simgrid`` (scripts/run-tests installs it and sets ``SLURMFM_REQUIRE_SIMGRID=1``, so
there a missing simulator fails instead of skipping).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fabrics import NAMES, SCRAMBLED, tree

from slurmfm.plan import simulate as sim
from slurmfm.plan.cost import CostParams, JobShape, evaluate
from slurmfm.topology.model import Topology

NIC = 3200e9 / 8  # p5-class bytes/s


def _links(scenario: dict[str, object]) -> dict[str, float]:
    return {name: bw for name, bw, _lat in scenario["links"]}  # type: ignore[attr-defined]


def test_scenario_routes_stay_in_the_leaf_or_climb_to_the_common_switch() -> None:
    topo = tree()
    sc, meta = sim.build_scenario(topo, NAMES[:8], JobShape(8, 8, tp=8))
    routes = {(s, d): [n for n, _ in hops] for s, d, hops in sc["routes"]}
    # n0 -> n1: same leaf, only the two EFA ports.
    assert routes[("n0", "n1")] == ["nic0", "nic1"]
    # n3 -> n4: leaf0 -> leaf1 under spine0: both leaves' uplinks, not the spine's.
    assert len(routes[("n3", "n4")]) == 4
    # The ring closes n7 -> n0 across the same two leaves.
    assert len(routes[("n7", "n0")]) == 4
    assert [d for d, _ in meta] == ["dp"]


def test_uplinks_are_the_jobs_fair_share_over_the_oversubscription() -> None:
    topo = tree()
    sc, _ = sim.build_scenario(
        topo, NAMES[:8], JobShape(8, 8, tp=8), params=sim.SimParams.uniform(2)
    )
    links = _links(sc)
    assert links["nic0"] == pytest.approx(NIC)
    ups = sorted(v for k, v in links.items() if k.startswith("up"))
    # Two leaves with 4 job nodes each, one spine with 8: 4*NIC/2, 4*NIC/2, 8*NIC/2.
    assert ups == pytest.approx([2 * NIC, 2 * NIC, 4 * NIC])


def test_ring_bytes_are_reduce_scatter_plus_all_gather() -> None:
    cost = CostParams.default()
    sc, meta = sim.build_scenario(tree(), NAMES[:4], JobShape(4, 8, tp=8), cost)
    (group,) = sc["groups"]
    # 8 DP rings (one per local rank) over the same 4 nodes: one flow per edge, 8x the bytes;
    # each member sends 2(p-1)/p * n in 2(p-1) steps, batched into min(6, 8) rounds.
    per_member = 2 * 3 / 4 * cost.message_bytes["dp"]
    assert group["rounds"] == 6
    assert group["edges"][0][2] * group["rounds"] == pytest.approx(8 * per_member)
    assert meta == [("dp", 0.0)]


def test_pp_sends_both_ways_between_neighbouring_stages() -> None:
    sc, meta = sim.build_scenario(tree(), NAMES[:4], JobShape(4, 8, tp=8, pp=2))
    pp = [g for g, (d, _) in zip(sc["groups"], meta, strict=True) if d == "pp"]
    pairs = sorted((s, d) for g in pp for s, d, _ in g["edges"])
    assert pairs == [("n0", "n2"), ("n1", "n3"), ("n2", "n0"), ("n3", "n1")]


def test_spearman() -> None:
    assert sim.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert sim.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert sim.spearman([1, 1, 2], [5, 5, 6]) == pytest.approx(1.0)


def test_missing_simulator_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sim, "available", lambda: False)
    with pytest.raises(sim.SimulationError, match="python3-simgrid"):
        sim.run_scenarios([])


def test_one_ring_in_one_leaf_matches_the_bandwidth_term(simgrid: None) -> None:
    cost = CostParams.from_mapping({"message_bytes": {"dp": 1e9}})
    r = sim.simulate(tree(), NAMES[:4], JobShape(4, 8, tp=8), cost)
    # 8 rings share each node's port: each edge moves 8 * 1.5 GB at NIC speed, plus latency.
    expect = 8 * 2 * 3 / 4 * 1e9 / NIC
    assert expect < r.per_dim["dp"] < expect * 1.01
    assert r.makespan_s == r.per_dim["dp"]


def test_contention_comes_from_sharing_not_a_formula(simgrid: None) -> None:
    topo = tree()
    job = JobShape(16, 8, tp=8)
    one, two, four = (
        sim.simulate(topo, order, job, params=sim.SimParams.uniform(o))
        for order, o in ((SCRAMBLED, 1), (SCRAMBLED, 2), (SCRAMBLED, 4))
    )
    ordered = [sim.simulate(topo, NAMES, job, params=sim.SimParams.uniform(o)) for o in (1, 2, 4)]
    # A topology-ordered ring leaves each leaf once per direction: no uplink is ever full.
    assert ordered[0].makespan_s == pytest.approx(ordered[2].makespan_s, rel=1e-6)
    # A scrambled ring sends everything through the uplinks: at o = 1 they are exactly full,
    # at 2 and 4 the rings slow down by about o.
    assert one.makespan_s == pytest.approx(ordered[0].makespan_s, rel=0.01)
    assert two.makespan_s == pytest.approx(2 * one.makespan_s, rel=0.05)
    assert four.makespan_s == pytest.approx(4 * one.makespan_s, rel=0.05)


def test_cost_model_ranks_like_the_simulation(simgrid: None) -> None:
    topo = tree()
    job = JobShape(16, 8, tp=8, pp=2)
    orders = [NAMES, SCRAMBLED, NAMES[8:] + NAMES[:8], NAMES[::2] + NAMES[1::2]]
    params = sim.SimParams.uniform(2)
    cost = CostParams.from_mapping(
        {"tiers": {t: {"oversubscription": 2} for t in ("leaf", "spine", "core")}}
    )
    simulated = [r.makespan_s for r in sim.simulate_many(topo, orders, job, cost, params)]
    modelled = [evaluate(topo, o, job, cost).predicted_s for o in orders]
    # Every pair the simulation tells apart by more than 2 % is ordered the same way by the
    # model (near-ties, the PP-aligned orders, are decided by guessed latencies).
    assert sim.concordance(modelled, simulated) == 1.0
    assert sim.spearman(modelled, simulated) > 0


def test_concordance_ignores_near_ties() -> None:
    assert sim.concordance([1.0, 2.0, 3.0], [10.0, 10.1, 20.0]) == 1.0
    assert sim.concordance([3.0, 2.0, 1.0], [10.0, 10.1, 20.0]) == 0.0
    assert sim.concordance([1.0, 1.0], [5.0, 5.0]) == 1.0


def _uneven() -> tuple[Topology, list[str]]:
    """Three spines of uneven leaves; busy nodes scattered so Slurm's greedy scan spreads."""
    paths = {}
    sizes = [[5, 3, 2], [4, 4], [6, 1, 1]]
    k = 0
    for s, leaves in enumerate(sizes):
        for li, size in enumerate(leaves):
            for _ in range(size):
                paths[f"h{k:02d}"] = ("core", f"spine{s}", f"leaf{s}{li}")
                k += 1
    topo = Topology.from_paths(paths)
    return topo, ["h00", "h05", "h10", "h14", "h19"]


def test_plan_simulation_check_is_never_slower_than_slurm(simgrid: None) -> None:
    from slurmfm.plan.planner import plan
    from slurmfm.plan.slurm_sim import rank_order, select_tree

    topo, busy = _uneven()
    job = JobShape(8, 8, tp=8, pp=2)
    cost = CostParams.from_mapping(
        {"tiers": {t: {"oversubscription": 4} for t in ("leaf", "spine", "core")}}
    )
    p = plan(topo, job, unavailable=busy, params=cost, simulate=True)
    assert any(w.startswith("simulation check (SimGrid): ") for w in p.explanation)
    free = set(topo.nodes) - set(busy)
    orders = [list(p.nodes)]
    for rules in ("21.08", "24.05.3"):
        chosen = select_tree(topo, free, 8, rules=rules)  # type: ignore[arg-type]
        assert chosen is not None
        orders += [rank_order(chosen, topo, policy=pol) for pol in ("leaf", "name")]  # type: ignore[arg-type]
    times = [
        r.makespan_s
        for r in sim.simulate_many(topo, orders, job, cost, sim.SimParams.from_cost(cost))
    ]
    assert times[0] <= min(times[1:]) * (1 + 1e-9)


def test_plan_simulation_check_needs_simgrid(monkeypatch: pytest.MonkeyPatch) -> None:
    from slurmfm.plan.planner import PlanError, plan

    monkeypatch.setattr(sim, "available", lambda: False)
    topo, busy = _uneven()
    with pytest.raises(PlanError, match="python3-simgrid"):
        plan(topo, JobShape(4, 8, tp=8), unavailable=busy, simulate=True)


def test_cli_simulate_flag(simgrid: None, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from slurmfm.cli.plan import plan_command

    conf = tmp_path / "topology.conf"
    conf.write_text(
        "SwitchName=leaf0 Nodes=n[00-03]\nSwitchName=leaf1 Nodes=n[04-07]\n"
        "SwitchName=core Switches=leaf[0-1]\n"
    )
    base = ["--topology", str(conf), "--nodes", "6", "--tp", "8", "--explain"]
    res = CliRunner().invoke(plan_command, [*base, "--simulate", "--oversubscription", "2"])
    assert res.exit_code == 0, res.output
    assert "simulation check (SimGrid): the plan " in res.stdout
    res = CliRunner().invoke(plan_command, [*base, "--simulate", "--mode", "constrain"])
    assert res.exit_code == 0, res.output
    assert "simulation check: pin mode only" in res.stdout


def test_each_distinct_scenario_is_simulated_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench and the planner's check ask for the same placements again; the worker sees
    each distinct scenario once per process, and every caller gets its own result back."""
    monkeypatch.setattr(sim, "available", lambda: True)
    monkeypatch.setattr(sim, "simgrid_python", lambda: "/nonexistent/python")
    monkeypatch.setattr(sim, "_RESULTS", {})
    seen: list[list[object]] = []

    def worker(scenarios: list[dict[str, object]]) -> list[dict[str, object]]:
        seen.append(list(scenarios))
        return [{"run": len(seen), "index": i} for i in range(len(scenarios))]

    monkeypatch.setattr(sim, "_run_worker", worker)
    topo = tree()
    job = JobShape(4, 8, tp=8)
    a, _ = sim.build_scenario(topo, NAMES[:4], job)
    b, _ = sim.build_scenario(topo, [NAMES[0], NAMES[4], NAMES[1], NAMES[5]], job)
    assert a != b
    first = sim.run_scenarios([a, b, a])
    assert [len(batch) for batch in seen] == [2]  # a once, b once
    assert first == [{"run": 1, "index": 0}, {"run": 1, "index": 1}, {"run": 1, "index": 0}]
    again = sim.run_scenarios([b, a])
    assert len(seen) == 1  # nothing new to simulate
    assert again == [first[1], first[0]]


def test_plan_simulate_on_gb200_also_races_slurms_block_choice(simgrid: None) -> None:
    """GB200 clusters run topology/block: ``plan --simulate`` simulates its choices (``-N``
    alone and ``--segment``) next to the plan, and keeps whichever is fastest."""
    from slurmfm.catalog.slurm_features import SlurmVersion
    from slurmfm.plan.planner import plan
    from slurmfm.topology.model import Node

    paths: dict[str, tuple[str, ...]] = {}
    nodes = []
    for u in range(4):
        for k in range(18):
            name = f"gb-{u * 18 + k + 1:03d}"
            paths[name] = ("root", f"spine{u // 2}", f"us{u}")
            nodes.append(Node(name, nvlink_domain=f"us{u}"))
    topo = Topology.from_paths(paths, nodes)
    busy = [f"gb-{i:03d}" for i in (1, 2, 19, 20, 21, 22)]
    got = plan(
        topo,
        JobShape(32, 4, tp=4),
        unavailable=busy,
        slurm_version=SlurmVersion.parse("24.11"),
        params=CostParams.default().with_oversubscription(2),
        simulate=True,
    )
    line = next(x for x in got.explanation if x.startswith("simulation check"))
    assert "topology/block, --segment=16" in line
