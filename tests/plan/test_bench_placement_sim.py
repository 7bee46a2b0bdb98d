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
