"""The placement referee: judges a placement on a busy cluster the planner cannot see.

Why a package apart from :mod:`slurmfm.plan`: a benchmark that scores the planner with the
planner's own model (or the simulator the planner consults) measures agreement, not quality.
The referee has its own fabric (physical link capacities shared by every job,
oversubscription the planner is never told), its own NCCL-like traffic (ring or tree as NCCL's
tuner would pick, pipeline point-to-point, expert all-to-all), other jobs' traffic on the busy
nodes (a public trace's size mix, placed by Slurm's rules), and its own flow solver. Nothing in
:mod:`slurmfm.plan` imports it (``tests/plan/test_referee.py``,
``test_the_planner_never_imports_the_referee``); it imports from the planner's side only
Slurm's own selection rules (``slurm_sim``, the baseline both sides share because it is
checked against real Slurm) and the topology model.
"""

from bench.referee.background import GB200_SEGMENT_MIX, PHILLY_NODE_MIX, BackgroundJob, fill
from bench.referee.fabric import FabricParams, PhysicalFabric
from bench.referee.judge import Verdict, judge
from bench.referee.traffic import StepTraffic

__all__ = [
    "GB200_SEGMENT_MIX",
    "PHILLY_NODE_MIX",
    "BackgroundJob",
    "FabricParams",
    "PhysicalFabric",
    "StepTraffic",
    "Verdict",
    "fill",
    "judge",
]
