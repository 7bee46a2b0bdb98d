"""scripts/bench_placement.py's simulated-time section on two small cases (needs SimGrid)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from slurmfm.plan.cost import JobShape
from slurmfm.plan.planner import plan

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_placement as bp


@pytest.mark.slow
def test_sim_section_compares_plan_slurm_and_optimum(simgrid: None) -> None:
    cases = [
        bp.SimCase("a", "3-level", 5, 256, 0.5, JobShape(64, 8, tp=8)),
        bp.SimCase("b", "4-level", 6, 256, 0.4, JobShape(32, 8, tp=8, pp=2)),
    ]
    for c in cases:
        bp.run_sim_case(c, plan, lambda s: None)
        assert set(c.rows) == set(bp.SIM_OVERSUB)
    assert "optimum" in cases[0].rows[2]["sim"]  # PP=1, 64 nodes: the MILP's answer
    out = bp.sim_summary(cases, "slurmfm+sim")
    for o in ("1", "2", "4"):
        r = out[o]
        # The simulation check keeps the plan or Slurm's choice, whichever simulates faster.
        assert r["slower_than_slurm"] == []
        assert r["vs_slurm_leaf_worst"] <= 1 + 1e-6
        assert 0.0 <= r["concordance_min"] <= 1.0
        assert r["optimum_cases"] == 2  # one PP=1 case, two Slurm versions' plans
        assert r["optimum_gap_model_median"] >= -1e-9
        # PP=2: no exact optimum, a proven lower bound instead (never above the plan).
        assert r["bound_cases"] == 2
        assert r["bound_gap_model_median"] >= -1e-9


def test_full_sim_cases_span_8_to_4096_nodes_on_every_fabric_kind() -> None:
    """The placement table of docs/placement-plans.md: 8-4,096 nodes on 3- and 4-level fabrics and GB200 blocks, 30-70 %
    busy, each fabric big enough for the job at its busy fraction."""
    cases = bp.build_sim_cases(quick=False, seed=1)
    sizes = {c.job.nodes for c in cases}
    assert min(sizes) == 8
    assert max(sizes) == 4096
    assert {c.kind for c in cases} == {"3-level", "4-level", "gb200"}
    assert all(0.3 <= c.busy_fraction <= 0.7 for c in cases)
    assert all(c.fabric_nodes * (1 - c.busy_fraction) >= c.job.nodes for c in cases)
    assert any(c.job.pp > 1 for c in cases if c.job.nodes >= 64)
    assert [c.job.nodes for c in bp.build_sim_cases(False, 1, max_nodes=512)] == [
        c.job.nodes for c in cases if c.job.nodes <= 512
    ]


def test_gb200_cases_are_compared_with_slurms_block_choice() -> None:
    """On GB200 fabrics the baseline is topology/block (with and without --segment), in name
    and block order; a --segment job has each segment inside one UltraServer."""
    import random

    rng = random.Random(3)
    fab = bp.make_gb200(rng, 144)
    busy = bp.make_busy_gb200(rng, fab, 0.4)
    assert len(busy) == int(len(fab.hosts) * 0.4)
    free = set(fab.hosts) - busy
    job = JobShape(32, 4, tp=4)
    orders = bp.slurm_block_orders(fab.topology, free, job)
    assert set(orders) <= {"slurmblk-name", "slurmblk-leaf", "slurmblkseg-name", "slurmblkseg-leaf"}
    assert "slurmblkseg-leaf" in orders
    for order in orders.values():
        assert len(set(order)) == 32
        assert set(order) <= free
    seg = orders["slurmblkseg-leaf"]
    domains = [fab.topology.leaf(n) for n in seg]
    assert sorted(domains.count(d) for d in set(domains)) == [16, 16]  # a segment per domain
