"""The big-job referee bench (scripts/bench_big_jobs.py): its generator and one small case."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_big_jobs as bb

from slurmfm.plan.cost import nvlink_domain
from slurmfm.plan.planner import plan


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
