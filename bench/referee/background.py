"""Other jobs on the busy nodes: sizes from a public trace's mix, placed by Slurm's own rules.

Why: a placement is only better if it is better on a cluster where other jobs run and talk.
The referee fills a fabric the way a Slurm cluster fills: jobs drawn from a job-size mix are
placed one after another by Slurm's ``topology/tree`` selection (:func:`slurmfm.plan.slurm_sim.
select_tree`, checked against real Slurm) or ``topology/block`` (:func:`~slurmfm.plan.slurm_sim.
select_block`), then some of them end (churn), which leaves the holes a real queue leaves. Each
remaining multi-node job runs an NCCL ring over its nodes in Slurm's rank order (node-table,
that is natural name, order before 26.05: SchedMD/slurm ``src/slurmctld/read_config.c``, and
``slurm_sim.rank_order``) for a fraction ``duty`` of its time.

Traffic model: a training job alternates compute and communication phases, and in its
communication phase its collectives take whatever the links give them; jobs whose
communication phases overlap on a link slow each other down, and ones whose phases interleave
do not (Rajasekaran, Ghobadi, Akella, "CASSINI: Network-Aware Job Scheduling in Machine
Learning Clusters", NSDI'24, arXiv 2308.00852). So while the judged step runs, each other job is
either communicating, with a ring that is not rate-limited (NCCL drives the NICs at line rate),
or silent. Which one is fixed per job by a stable hash of its name against ``duty``
(:meth:`BackgroundJob.communicating`): about ``duty`` of the jobs talk, and every placement
compared on one cluster meets the same ones. ``duty`` = 0.3 (30 % of a step spent in exposed
communication) is an assumption, not a measured figure; it is a parameter.

Job-size mix: the Microsoft Philly trace (Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU
Clusters for DNN Training Workloads", USENIX ATC'19; data at msr-fiddle/philly-traces), whose
analysis buckets jobs by GPUs as 1, 2-4, 5-8 and >8 (msr-fiddle/philly-traces:analysis/Philly
Trace Analysis.ipynb, ``get_bucket_from_num_gpus``). On whole 8-GPU nodes the first three
buckets are one-node jobs (no fabric traffic); the >8 bucket is split into 2-32 nodes.
The weights (share of the busy *nodes* per size) are **unverified**: read from the published
figures' shape (most jobs are small, most GPU time is in multi-GPU jobs), not computed from the
trace here; :data:`PHILLY_NODE_MIX` is a parameter so a user can put their own cluster's mix in.
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from slurmfm.plan.slurm_sim import Rules, rank_order, select_tree
from slurmfm.topology.model import Topology

__all__ = ["PHILLY_NODE_MIX", "BackgroundJob", "fill"]

# (nodes per job, share of busy nodes). Unverified weights (module docstring).
PHILLY_NODE_MIX: tuple[tuple[int, float], ...] = (
    (1, 0.35),
    (2, 0.15),
    (4, 0.15),
    (8, 0.15),
    (16, 0.12),
    (32, 0.08),
)


@dataclass(frozen=True)
class BackgroundJob:
    """A running job: its nodes in rank order, and the share of time it communicates."""

    name: str
    order: tuple[str, ...]
    duty: float = 0.3

    @property
    def communicating(self) -> bool:
        """Whether this job is in its communication phase while the judged step runs.

        A stable hash of the name (CRC-32, not Python's salted ``hash``) against ``duty``:
        reproducible across runs, the same for every placement compared, about ``duty`` of the
        jobs in all.
        """
        return zlib.crc32(self.name.encode()) / 2**32 < self.duty


def _draw(rng: random.Random, mix: Sequence[tuple[int, float]]) -> int:
    # Node-weighted shares -> job counts: a size's jobs are drawn with weight share / size.
    sizes = [s for s, _ in mix]
    weights = [w / s for s, w in mix]
    return rng.choices(sizes, weights)[0]


def fill(
    topology: Topology,
    busy_fraction: float,
    *,
    seed: int,
    mix: Sequence[tuple[int, float]] = PHILLY_NODE_MIX,
    rules: Rules = "21.08",
    switch_order: Sequence[str] | None = None,
    churn: float = 0.3,
    duty: float = 0.3,
) -> list[BackgroundJob]:
    """Jobs that keep about ``busy_fraction`` of the fabric busy, placed by Slurm's tree rules.

    The fabric is first filled to ``busy_fraction + churn`` (capped at 0.95), then random jobs
    end until ``busy_fraction`` is reached.
    """
    if not 0 <= busy_fraction < 1:
        raise ValueError("busy_fraction must be in [0, 1)")
    rng = random.Random(seed)  # noqa: S311 - a reproducible draw, not a secret
    total = len(topology.nodes)
    free = set(topology.nodes)
    jobs: list[BackgroundJob] = []
    target = min(0.95, busy_fraction + churn) * total
    misses = 0
    while total - len(free) < target and misses < 50:
        size = _draw(rng, mix)
        got = select_tree(topology, free, size, rules=rules, switch_order=switch_order)
        if got is None:
            misses += 1
            continue
        free.difference_update(got)
        order = tuple(rank_order(got, topology, policy="name"))
        jobs.append(BackgroundJob(f"bg{len(jobs)}", order, duty))
    rng.shuffle(jobs)
    busy = total - len(free)
    while jobs and busy - len(jobs[-1].order) >= busy_fraction * total:
        busy -= len(jobs.pop().order)
    return sorted(jobs, key=lambda j: int(j.name[2:]))
