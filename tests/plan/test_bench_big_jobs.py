"""The big-job referee bench (scripts/bench_big_jobs.py): its generator and one small case."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_big_jobs as bb

from slurmfm.plan.cost import nvlink_domain
from slurmfm.plan.planner import plan

if TYPE_CHECKING:
    from bench.referee.background import BackgroundJob


def test_four_level_fabrics_keep_every_node_and_the_nvlink_domains() -> None:
    for kind in ("PP", "EP"):
        fabs = {
            lv: bb.make_group_fabric(bb.Group(7, 64, lv, kind, 0.5, 2048, "24.11"))
            for lv in bb.LEVELS
        }
        t3, t4 = fabs["3-level"].topology, fabs["4-level"].topology
        assert t4.depth == t3.depth + 1 == 5  # leaf, spine, top, (pod,) root
        assert set(t3.nodes) == set(t4.nodes)
        assert all(t3.leaf_of[n] == t4.leaf_of[n] for n in t3.nodes)
        order = fabs["4-level"].switch_order
        assert sorted(order) == sorted(t4.parent_of)
        assert order[-1] == "root"
        pods = [s for s in t4.parent_of if t4.parent_of[s] == "root"]
        assert 1 <= len(pods) <= 4
        assert all(t4.level(p) == 3 for p in pods)
        if kind == "EP":  # GB200: 18-node UltraServers, one NVLink domain each, as leaves
            doms = {nvlink_domain(t4, n) for n in t4.nodes}
            assert len(doms) == len(t4.leaves) == 2048 // 18
            assert all(nvlink_domain(t4, n) == t4.leaf_of[n] for n in t4.nodes)


def test_big_cases_are_pp4_pp8_and_32_64_gpu_expert_groups() -> None:
    groups = bb.build_groups(bb.BIG_SEEDS)
    assert {g.size for g in groups} == {1024, 2048, 4096}
    assert {(g.levels, g.kind) for g in groups} == {
        (lv, k) for lv in bb.LEVELS for k in ("PP", "EP")
    }
    for g in groups:
        assert 0.5 <= g.busy <= 0.8
        assert g.fabric_nodes <= bb.MAX_FABRIC
        assert g.fabric_nodes >= g.size / (1 - g.busy) * 1.3
        for c in g.cases:
            job = c.job
            assert not job.problems()
            assert job.pp in (4, 8)
            assert job.nodes == g.size
            if g.kind == "EP":
                assert job.tp * job.ep in (32, 64)  # GPUs of one expert group
                assert job.dp % job.ep == 0  # inside a DP group
            else:
                assert job.ep == 1
    # Seeds fixed in the code: the same draw every time.
    again = bb.build_groups(bb.BIG_SEEDS)
    assert [(g.busy, g.fabric_nodes, g.version) for g in again] == [
        (g.busy, g.fabric_nodes, g.version) for g in groups
    ]


def test_one_small_case_runs_the_whole_path() -> None:
    """A 64-node PP=4 job and a 32-GPU expert group on 4-level fabrics (the big cases' code
    path at a size the unit tier affords)."""
    for kind in ("PP", "EP"):
        g = bb.Group(11, 64, "4-level", kind, 0.5, 512, "24.11")
        label, gpn, tp, pp, ep = bb.SHAPES[kind][0]
        g.cases.append(
            bb.br.Case(
                f"t-{label}",
                g.seed,
                "4-level",
                512,
                0.5,
                bb.JobShape(64, gpn, tp=tp, pp=pp, ep=ep),
                "24.11",
            )
        )
        bb.run_group(g, plan, lambda s: None)
        c = g.cases[0]
        assert c.rows, c.note
        assert bb.gain(c) >= -bb.LIMIT
        assert c.leaves["plan"] <= c.leaves["slurm-topo"]
        if kind == "EP":  # Slurm's order splits expert groups across UltraServers; the plan not
            assert bb.gain(c) > 0.5


def test_fabric_size_rule() -> None:
    assert bb.fabric_for(1024, 0.5) == 4096
    assert bb.fabric_for(4096, 0.67) == 16384
    assert bb.fabric_for(2048, 0.8) == 16384


def test_block_fill_places_jobs_as_slurm_topology_block_does() -> None:
    """The GB200 fill's fast path picks what ``select_block`` picks (with the ``--segment``
    a user of the block cluster asks), on random busy patterns of a small GB200 fabric."""
    import random

    from bench.referee.background import _BlockPacker
    from slurmfm.plan.slurm_sim import block_geometry, segment_for, select_block

    fab = bb.make_group_fabric(bb.Group(7, 64, "3-level", "EP", 0.6, 512, "24.11"))
    geometry = block_geometry(fab.topology)
    assert geometry is not None
    blocks, sizes = geometry
    rng = random.Random(3)
    for _ in range(10):
        busy_p = rng.uniform(0.2, 0.8)
        free = {n for n in fab.topology.nodes if rng.random() > busy_p}
        packer = _BlockPacker(fab.topology, blocks, sizes, "24.11")
        for _ in range(30):
            size = rng.choice([1, 2, 4, 8, 16, 32, 64])
            seg = segment_for(size, sizes[0])
            want = select_block(blocks, free, size, block_sizes=sizes, rules="24.11", segment=seg)
            before = set(free)
            got = packer.place(free, size)
            assert free == before
            assert got == want, (size, sorted(free))
            if got:
                free.difference_update(got)


def _ep_fabric() -> tuple[bb.bp.Fabric, tuple[list[list[str]], list[int]]]:
    """The 2,048-node 3-level GB200 fabric of the fill tests (seed 7, 60 % busy) and its base
    blocks and BlockSizes."""
    from slurmfm.plan.slurm_sim import block_geometry

    fab = bb.make_group_fabric(bb.Group(7, 64, "3-level", "EP", 0.6, 2048, "24.11"))
    geometry = block_geometry(fab.topology)
    assert geometry is not None
    return fab, geometry


def _room16(geometry: tuple[list[list[str]], list[int]], jobs: list[BackgroundJob]) -> int:
    """UltraServers (base blocks) with 16 free nodes left by ``jobs``: room for a 64-GPU
    expert group."""
    busy = {n for j in jobs for n in j.order}
    return sum(sum(n not in busy for n in b) >= 16 for b in geometry[0])


def test_block_fill_packs_other_jobs_by_ultraserver() -> None:
    """The GB200 fill places other jobs by ``topology/block``: each job of up to 16 nodes in
    one UltraServer, a 32-node job in two 16-node segments, the busy share as asked, and
    UltraServers with 16 free nodes (a 64-GPU expert group) left at 60 % busy."""
    from bench.referee import fill

    fab, geometry = _ep_fabric()
    topo = fab.topology

    by_block = fill(topo, 0.6, seed=7, blocks=geometry)
    by_tree = fill(topo, 0.6, seed=7, rules="24.11", switch_order=fab.switch_order)
    for jobs in (by_block, by_tree):
        assert abs(sum(len(j.order) for j in jobs) / len(topo.nodes) - 0.6) < 0.02
    assert _room16(geometry, by_block) >= 10
    # 2..16-node jobs stay in one UltraServer; 32-node jobs in two 16-node segments
    for j in by_block:
        doms = {topo.leaf_of[n] for n in j.order}
        assert len(doms) == (1 if len(j.order) <= 16 else 2)


def test_whole_fill_sizes_other_jobs_in_nvidia_segment_classes() -> None:
    """The GB200 fill "whole" (seed 4301 by default): jobs of 16, 32 and 64 nodes in 16-node
    segments, one per UltraServer, smaller jobs packed into one UltraServer, few one-node jobs;
    it leaves more UltraServers with 16 free nodes than Philly's mix on the same fabric."""
    from collections import Counter

    from bench.referee import GB200_SEGMENT_MIX, PHILLY_NODE_MIX, fill

    assert bb.fill_for(4301) == "whole"
    assert bb.fill_for(4201) == bb.fill_for(4251) == "block"
    assert bb.fill_for(4201, "whole") == "whole"
    assert {g.gb200_fill for g in bb.build_groups((4301,), sizes=(1024,))} == {"whole"}
    assert abs(sum(w for _, w in GB200_SEGMENT_MIX) - 1) < 1e-9
    assert sum(w for s, w in GB200_SEGMENT_MIX if s >= 16) >= 0.5
    assert dict(GB200_SEGMENT_MIX)[1] < dict(PHILLY_NODE_MIX)[1]

    fab, geometry = _ep_fabric()
    topo = fab.topology

    whole = fill(topo, 0.6, seed=7, mix=GB200_SEGMENT_MIX, blocks=geometry)
    philly = fill(topo, 0.6, seed=7, blocks=geometry)
    share = sum(len(j.order) for j in whole) / len(topo.nodes)
    assert 0.6 <= share < 0.6 + 64 / len(topo.nodes)  # stops at the last job that keeps 60 %
    sizes = Counter(len(j.order) for j in whole)
    assert set(sizes) <= {s for s, _ in GB200_SEGMENT_MIX}
    assert sizes[64] > 0
    for j in whole:
        per_us = Counter(topo.leaf_of[n] for n in j.order)
        if len(j.order) <= 16:
            assert len(per_us) == 1
        else:  # one 16-node segment per UltraServer
            assert set(per_us.values()) == {16}
    assert _room16(geometry, whole) > _room16(geometry, philly)
