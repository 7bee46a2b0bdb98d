"""The placement referee (bench.referee): its solver by hand and against SimGrid, its
fabric's physical capacities, NCCL's trees, other jobs' traffic, and its independence from the
planner it judges."""

from __future__ import annotations

import ast
import json
import math
import subprocess
from pathlib import Path

import pytest
from fabrics import NAMES, SCRAMBLED, tree

from bench.referee import BackgroundJob, FabricParams, PhysicalFabric, StepTraffic, fill, judge
from bench.referee.flows import Coflow, max_min_rates, run
from bench.referee.traffic import dtree, step_coflows
from slurmfm.plan import simulate as sim

REPO = Path(__file__).resolve().parents[2]
NIC = 3200e9 / 8


def test_max_min_shares_a_link_and_gives_a_capped_flow_only_its_cap() -> None:
    # Link L (10 B/s) carries a, b and c; c is capped at 1 B/s; b also crosses M (3 B/s).
    # By hand: c freezes at 1; b is held by M at 3; a takes the rest of L: 10 - 1 - 3 = 6.
    cap = {"L": 10.0, "M": 3.0}
    flows = [
        Coflow("a", {"L": 1}, 60.0),
        Coflow("b", {"L": 1, "M": 1}, 30.0),
        Coflow("c", {"L": 1}, math.inf, cap=1.0),
    ]
    assert max_min_rates(flows, cap) == pytest.approx({"a": 6.0, "b": 3.0, "c": 1.0})
    out = run(flows, cap)
    # Both finish at 10 s (a: 60/6, b: 30/3); c moved 1 B/s for the 10 s window.
    assert out.finish_s == pytest.approx({"a": 10.0, "b": 10.0})
    assert out.moved["c"] == pytest.approx(10.0)


def test_a_coflow_using_a_link_twice_gets_half_its_rate_and_others_speed_up_when_it_ends() -> None:
    # Ring r crosses L twice (two edges), flow f once: weights 2 and 1 on 12 B/s: r gets 4 per
    # edge (8 of L), f gets 4. r has 8 B per edge: done at 2 s. f then has L alone: its last
    # 20 - 8 = 12 B at 12 B/s, done at 3 s. Latency is added after the sharing.
    cap = {"L": 12.0}
    out = run([Coflow("r", {"L": 2}, 8.0, latency_s=0.5), Coflow("f", {"L": 1}, 20.0)], cap)
    assert out.finish_s == pytest.approx({"r": 2.5, "f": 3.0})


def test_uplinks_have_their_physical_capacity_whatever_the_job() -> None:
    fab = PhysicalFabric(tree(), FabricParams.uniform(2))
    cap = fab.capacity
    # leaf0 has 4 nodes: 4 NICs / 2; spine0 has 8: 8 NICs / 2 (not the job's share).
    assert cap["sw:up:leaf0"] == pytest.approx(2 * NIC)
    assert cap["sw:dn:spine0"] == pytest.approx(4 * NIC)
    assert "sw:up:core" not in cap  # the root has no uplink
    links, _ = fab.route("n00", "n05")
    assert links == ["nic:up:n00", "sw:up:leaf0", "sw:dn:leaf1", "nic:dn:n05"]
    links, _ = fab.route("n00", "n09")
    assert links == [
        "nic:up:n00", "sw:up:leaf0", "sw:up:spine0", "sw:dn:spine1", "sw:dn:leaf2", "nic:dn:n09",
    ]  # fmt: skip


def test_double_binary_tree_is_ncclS() -> None:
    # ncclGetBtree over 8 ranks: 0 -> 4 -> {2, 6}, 2 -> {1, 3}, 6 -> {5, 7}; the second tree
    # mirrors it (ncclGetDtree, even count), so every rank is a leaf in at most one tree.
    t1, t2 = dtree(8)
    assert sorted(t1) == [(1, 2), (2, 4), (3, 2), (4, 0), (5, 6), (6, 4), (7, 6)]
    assert sorted(t2) == sorted((7 - c, 7 - p) for c, p in t1)
    inner1 = {p for _, p in t1}
    inner2 = {p for _, p in t2}
    assert not (set(range(1, 7)) - inner1 - inner2)
    # Odd count: the second tree is the first shifted by one.
    assert sorted(dtree(5)[1]) == sorted(((c + 1) % 5, (p + 1) % 5) for c, p in dtree(5)[0])


def test_ring_worked_by_hand_on_two_leaves_at_oversubscription_two() -> None:
    # 8 nodes of TP=8 over leaf0 and leaf1, ring in fabric order: the ring crosses each leaf's
    # uplink once per direction. Uplink 4*NIC/2 = 2 NIC, NICs 1 NIC, so the NICs bound it:
    # per edge 8 local-rank rings x 2(p-1)/p x n, p = 8 DP ranks (one per node).
    topo = tree()
    traffic = StepTraffic(dp_bytes=1e9, bucket_bytes=1e9, algorithm="ring", compute_s=0.0)
    v = judge(topo, NAMES[:8], gpus_per_node=8, tp=8, traffic=traffic,
              params=FabricParams.uniform(2, nic_latency_s=0.0, hop_latency_s=0.0))  # fmt: skip
    per_edge = 8 * 2 * 7 / 8 * 1e9
    assert v.comm_s == pytest.approx(per_edge / NIC)
    # Scrambled across the two spines: 16 nodes, every edge climbs to the core; each spine
    # uplink (8 NIC / 2 = 4 NIC) carries 8 edges: a quarter of a NIC each, 4x slower than NICs.
    v2 = judge(topo, SCRAMBLED, gpus_per_node=8, tp=8, traffic=traffic,
               params=FabricParams.uniform(2, nic_latency_s=0.0, hop_latency_s=0.0))  # fmt: skip
    per_edge16 = 8 * 2 * 15 / 16 * 1e9
    assert v2.comm_s == pytest.approx(per_edge16 / (NIC * 4 / 8))


def test_other_jobs_traffic_slows_the_job_and_the_job_slows_them() -> None:
    # A background ring over leaf0 <-> leaf2 at full duty fills leaf0's uplink with the job's
    # ring over leaf0/leaf1 at oversubscription 4 (uplink = one NIC): both now share it.
    topo = tree()
    params = FabricParams.uniform(4, nic_latency_s=0.0, hop_latency_s=0.0)
    traffic = StepTraffic(dp_bytes=1e9, bucket_bytes=1e9, algorithm="ring", compute_s=0.0)
    job = ["n00", "n01", "n04", "n05"]
    bg = [BackgroundJob("bg0", ("n02", "n08"), duty=1.0)]
    alone = judge(topo, job, gpus_per_node=8, tp=8, traffic=traffic, params=params)
    shared = judge(topo, job, gpus_per_node=8, tp=8, traffic=traffic, params=params,
                   background=bg)  # fmt: skip
    # leaf0 up: the job's one crossing edge and bg's one, one NIC: half each.
    assert shared.comm_s == pytest.approx(2 * alone.comm_s)
    assert shared.others_slowdown_max == pytest.approx(2.0)
    with pytest.raises(ValueError, match="busy"):
        judge(topo, ["n02", "n03"], gpus_per_node=8, background=bg)


def test_tree_is_picked_for_small_buckets_on_many_nodes_and_ring_for_few() -> None:
    topo = tree()
    fab = PhysicalFabric(topo)
    small = StepTraffic(dp_bytes=8e6, bucket_bytes=8e6)
    (few,) = step_coflows(fab, NAMES[:2], gpus_per_node=8, tp=8, traffic=small)
    (many,) = step_coflows(fab, NAMES, gpus_per_node=8, tp=8, traffic=small)
    assert few.tags["algo"] == "ring"
    assert many.tags["algo"] == "tree"


def test_pipeline_and_expert_traffic_become_coflows() -> None:
    topo = tree()
    fab = PhysicalFabric(topo)
    cos = step_coflows(fab, NAMES[:8], gpus_per_node=8, tp=1, pp=2, ep=16)
    dims = sorted(c.tags["dim"] for c in cos)
    assert "pp" in dims
    assert "ep" in dims
    (pp,) = [c for c in cos if c.tags["dim"] == "pp"]
    # Stages are nodes 0-3 and 4-7: 32 rank pairs, 8 per node pair, forward and back.
    assert pp.uses["nic:up:n00"] == 8
    assert pp.uses["nic:dn:n00"] == 8


def test_background_is_placed_by_slurms_rules_to_the_busy_fraction() -> None:
    topo = tree(leaves=8, per_leaf=8, leaves_per_spine=4)
    jobs = fill(topo, 0.6, seed=5)
    busy = [n for j in jobs for n in j.order]
    assert len(busy) == len(set(busy))
    assert 0.5 * 64 <= len(busy) <= 0.7 * 64
    again = fill(topo, 0.6, seed=5)
    assert [j.order for j in again] == [j.order for j in jobs]
    # Each job's ranks in name order (Slurm's rank order before 26.05).
    for j in jobs:
        assert list(j.order) == sorted(j.order)


def test_the_planner_never_imports_the_referee() -> None:
    """Nothing installed imports the benchmark tools (``bench/``, not in the wheel)."""
    for path in (REPO / "slurmfm").rglob("*.py"):
        tree_ = ast.parse(path.read_text())
        for node in ast.walk(tree_):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            assert not any(n == "bench" or n.startswith("bench.") for n in names), path
    # And the referee uses nothing of the planner's models: only Slurm's rules and topology.
    for path in (REPO / "bench" / "referee").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert node.module not in (
                    "slurmfm.plan.cost", "slurmfm.plan.simulate", "slurmfm.plan.planner",
                ), path  # fmt: skip


_SIMGRID = r"""
import json, sys
from simgrid import Engine, NetZone, LinkInRoute, Mailbox, Actor
spec = json.loads(sys.argv[1])
e = Engine(["sim", "--log=root.thres:critical", "--cfg=network/model:CM02",
            "--cfg=network/bandwidth-factor:1", "--cfg=network/latency-factor:1",
            "--cfg=network/weight-S:0"])
zone = NetZone.create_full_zone("f")
hosts = {h: zone.create_host(h, 1e9) for h in spec["hosts"]}
links = {n: zone.create_link(n, bw).set_latency(0) for n, bw in spec["links"].items()}
for i, (src, dst, route) in enumerate(spec["flows"]):
    zone.add_route(hosts[src].netpoint, hosts[dst].netpoint, None, None,
                   [LinkInRoute(links[x]) for x in route], False)
zone.seal()
done = {}
def send(i, size): Mailbox.by_name(f"m{i}").put(b"x", int(size))
def recv(i):
    Mailbox.by_name(f"m{i}").get(); done[i] = Engine.clock
for i, (src, dst, _) in enumerate(spec["flows"]):
    Actor.create("s", hosts[src], send, i, spec["sizes"][i])
    Actor.create("r", hosts[dst], recv, i)
e.run()
print(json.dumps([done[i] for i in range(len(spec["flows"]))]))
"""


def test_flow_solver_agrees_with_simgrid_on_physical_links(simgrid: None) -> None:
    # Independent flows over the referee's own fabric (uplinks at oversubscription 2, one
    # background-like flow through a spine): SimGrid's CM02 max-min model with its bandwidth
    # and latency factors set to 1 (plain max-min sharing, no TCP corrections) must give the
    # same finish times as the referee's solver.
    topo = tree()
    fab = PhysicalFabric(topo, FabricParams.uniform(2))
    pairs = [("n00", "n04", 4e9), ("n01", "n05", 3e9), ("n02", "n09", 2e9), ("n03", "n12", 5e9),
             ("n08", "n13", 1e9), ("n06", "n10", 2.5e9)]  # fmt: skip
    flows, spec_flows, sizes, used = [], [], [], set()
    for i, (a, b, size) in enumerate(pairs):
        links, _ = fab.route(a, b)
        used.update(links)
        flows.append(Coflow(f"f{i}", dict.fromkeys(links, 1), size))
        # One host per flow end, so SimGrid routes are unique per flow.
        spec_flows.append([f"s{i}", f"d{i}", [lk.replace(":", "_") for lk in links]])
        sizes.append(size)
    cap = fab.capacity
    # Make node uplinks tighter than NICs for some flows: shrink leaf0's uplink.
    cap["sw:up:leaf0"] = 1.5 * NIC
    mine = run(flows, cap)
    spec = {
        "hosts": [h for f in spec_flows for h in f[:2]],
        "links": {lk.replace(":", "_"): cap[lk] for lk in used},
        "flows": spec_flows,
        "sizes": sizes,
    }
    proc = subprocess.run(
        [sim.simgrid_python() or "/usr/bin/python3", "-c", _SIMGRID, json.dumps(spec)],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    ours = [mine.finish_s[f"f{i}"] for i in range(len(pairs))]
    assert ours == pytest.approx(theirs, rel=1e-3)
    assert len({round(t, 6) for t in ours}) > 2  # the case exercises re-sharing


def test_other_jobs_talk_only_in_their_communication_phase_and_then_at_line_rate() -> None:
    """A background job communicates while the step runs with a probability of its duty
    (a stable hash of its name), and then its ring is not rate-limited: on a shared uplink
    the job and it split the capacity, so its slowdown is measured, not capped away."""
    topo = tree()
    params = FabricParams.uniform(4, nic_latency_s=0.0, hop_latency_s=0.0)
    traffic = StepTraffic(dp_bytes=1e9, bucket_bytes=1e9, algorithm="ring", compute_s=0.0)
    job = ["n00", "n01", "n04", "n05"]
    silent = BackgroundJob("bg0", ("n02", "n08"), duty=0.0)
    talking = BackgroundJob("bg0", ("n02", "n08"), duty=1.0)
    assert not silent.communicating
    assert talking.communicating
    alone = judge(topo, job, gpus_per_node=8, tp=8, traffic=traffic, params=params)
    quiet = judge(topo, job, gpus_per_node=8, tp=8, traffic=traffic, params=params,
                  background=[silent])  # fmt: skip
    assert quiet.comm_s == pytest.approx(alone.comm_s)
    assert quiet.others_slowdown_max == 1.0
    loud = judge(topo, job, gpus_per_node=8, tp=8, traffic=traffic, params=params,
                 background=[talking])  # fmt: skip
    assert loud.others_slowdown_max == pytest.approx(2.0)
    # About ``duty`` of many jobs are in their communication phase, the same ones every time.
    many = [BackgroundJob(f"bg{i}", ("n02", "n08"), duty=0.3) for i in range(2000)]
    share = sum(j.communicating for j in many) / len(many)
    assert 0.25 < share < 0.35
    assert [j.communicating for j in many] == [j.communicating for j in many]
