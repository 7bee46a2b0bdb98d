"""The cluster stream simulation (bench.referee.cluster) and the referee bench on small cases."""

from __future__ import annotations

import sys
from pathlib import Path

from fabrics import tree

from bench.referee import cluster as cl
from slurmfm.plan.planner import plan
from slurmfm.plan.slurm_sim import select_tree
from slurmfm.topology.model import Topology

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_referee as br


def _slurm(topo: Topology) -> cl.Placer:
    def place(free: frozenset[str], job: cl.ArrivingJob) -> list[str] | None:
        return select_tree(topo, set(free), job.nodes, rules="24.05.3")

    return place


def test_fifo_head_waits_for_room_and_blocks_the_queue_behind_it() -> None:
    topo = tree()  # 16 nodes
    jobs = [
        cl.ArrivingJob("a", 0.0, 12, 100.0, large=True),
        cl.ArrivingJob("b", 1.0, 8, 100.0, large=True),  # waits for a to end
        cl.ArrivingJob("c", 2.0, 1, 10.0),  # fits now, but FIFO keeps it behind b
    ]
    r = cl.simulate(topo, jobs, slurm=_slurm(topo))
    assert r.wait_s["a"] == 0.0
    assert r.wait_s["b"] >= 99.0  # a ran at least its work (100 s), b arrived at 1 s
    assert r.wait_s["c"] == r.wait_s["b"] - 1.0  # started with b, not at its arrival
    assert r.units["a"] == 3  # 12 nodes over 4-node leaves
    assert not r.never_started


def test_probe_names_large_jobs_slurm_leaves_pending_that_a_policy_could_start() -> None:
    topo = tree()
    jobs = [
        cl.ArrivingJob("a", 0.0, 12, 100.0),
        cl.ArrivingJob("b", 1.0, 8, 100.0, large=True),
    ]

    def anything(free: frozenset[str], job: cl.ArrivingJob) -> list[str] | None:
        return sorted(free)[: job.nodes] if len(free) >= job.nodes else None

    r = cl.simulate(topo, jobs, slurm=_slurm(topo), probe=anything)
    assert r.pending_a_policy_starts == set()  # 4 free nodes: nobody can start b early
    jobs2 = [cl.ArrivingJob("b", 0.0, 4, 10.0, large=True)]
    never = cl.simulate(topo, jobs2, slurm=lambda f, j: None, probe=anything)
    assert never.pending_a_policy_starts == {"b"}
    assert never.never_started == ["b"]


def test_job_stream_is_reproducible_and_sized_to_the_load() -> None:
    a = cl.job_stream(512, seed=3, count=50, large_sizes=(64,))
    b = cl.job_stream(512, seed=3, count=50, large_sizes=(64,))
    assert a == b
    assert any(j.large and j.nodes == 64 for j in a)
    assert all(j.arrive_s > 0 for j in a)


def test_referee_bench_case_and_verdicts_need_a_sample() -> None:
    (case,) = [c for c in br.build_cases((2201,)) if c.job.nodes == 64]
    br.run_case(case, plan, lambda s: None)
    assert set(case.rows) == set(br.OVERSUB)
    for rows in case.rows.values():
        assert set(rows) == set(br.METHODS)
        assert all(r["comm_s"] > 0 for r in rows.values())
    # Citizenship holds on the bench's own case.
    assert case.leaves["plan"] <= case.leaves["slurm-topo"]
    summary = br.summarize([case])
    verdicts = br.verdicts(summary)
    # One case is no sample: no target gets PASS or FAIL.
    assert {v for _, v, _ in verdicts} == {"NO VERDICT"}


def test_gb200_plans_are_only_what_topology_block_takes() -> None:
    """The GB200 streams plan under topology/block. 17, 10, 10 and 17 nodes free in four
    UltraServers: a 16-node plan fits one of them (taken by 24.11 and 26.05); a 32-node job
    fits no aligned pair (27 free each), so on 24.11 it has no plan and waits, or with
    ``fallback`` gets Slurm's own --segment=16 choice (us0 and us3); on 26.05 a plan across
    UltraServers starts with a --segment."""
    import random

    import bench_placement as bp

    from slurmfm.catalog.slurm_features import SlurmVersion

    fab = bp.make_gb200(random.Random(1), 72)  # 4 UltraServers of 18
    us = [sorted(fab.topology.nodes_under(f"us{u}")) for u in range(4)]
    busy = set(us[0][:1] + us[1][:8] + us[2][:8] + us[3][:1])
    free = frozenset(set(fab.topology.nodes) - busy)
    small = cl.ArrivingJob("j", 0.0, 16, 3600.0, gpus_per_node=4, tp=4, large=True)
    big = cl.ArrivingJob("k", 0.0, 32, 3600.0, gpus_per_node=4, tp=4, large=True)
    v2411, v2605 = SlurmVersion.parse("24.11.5"), SlurmVersion.parse("26.05.5")
    for version in (v2411, v2605):
        refused: list[str] = []
        _, planned = br._placers(fab, "gb200", plan, version, refused)
        got = planned(free, small)
        assert got is not None
        assert not set(got) & busy
        assert len({fab.topology.leaf_of[n] for n in got}) == 1
        assert (planned(free, big) is not None) == (version == v2605)
        assert refused == []
    slurm, _ = br._placers(fab, "gb200", plan, v2411)
    own = slurm(free, big)
    assert own is not None
    assert {fab.topology.leaf_of[n] for n in own} == {"us0", "us3"}
    _, fallback = br._placers(fab, "gb200", plan, v2411, fallback=True)
    assert fallback(free, big) == own
