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

GB200 NVL72 mix (:data:`GB200_SEGMENT_MIX`, chosen for ``bench_big_jobs.py --gb200-fill whole``
before its held-out seed was first run): Philly's mix is of 8-GPU nodes in 2017 and a third of
its busy nodes are one-node jobs; a GB200 NVL72 cluster is run in NVLink domains of 18 4-GPU
nodes by Slurm's ``topology/block`` with ``--segment`` (https://slurm.schedmd.com/topology.html,
"--segment"; one block per UltraServer of up to 18 p6e-gb200 instances as SageMaker HyperPod
and AWS ParallelCluster configure it: https://docs.aws.amazon.com/sagemaker/latest/dg/
sagemaker-hyperpod-topology.html, aws/aws-parallelcluster-cookbook:cookbooks/
aws-parallelcluster-slurm/files/default/head_node_slurm/slurm/pcluster_topology_generator.py).
NVIDIA's guidance for such clusters sizes the work in segment classes: jobs of 128 GPUs or more
in segments of 16 nodes (16 of an UltraServer's 18, two left spare for failed or drained
trays), 32-64-GPU jobs in 4- to 16-node slices of one domain, and single nodes for small jobs
("Unlock Exascale Performance on NVIDIA GB200 NVL72 with Slurm Topology-Aware Job Scheduling",
https://developer.nvidia.com/blog/unlock-exascale-performance-on-nvidia-gb200-nvl72-with-slurm-topology-aware-job-scheduling/;
"Achieving Peak System and Workload Efficiency on NVIDIA GB200 NVL72 with Slurm Block
Scheduling", https://developer.nvidia.com/blog/?p=116606, on ``--segment=16``). So here 70 %
of the busy nodes are jobs of 16, 32 and 64 nodes (64-256 GPUs: one, two and four 16-node
segments), 20 % jobs of 4 and 8 nodes packed into one UltraServer, and 10 % one- and two-node
jobs (a third in Philly's mix). The weights are an assumption, like Philly's: no public
trace of a GB200 cluster's job sizes was found; they are a parameter. The rest of the fill is
unchanged (``topology/block`` placement, churn 0.3, ``duty``).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass

from slurmfm.plan.slurm_sim import (
    BlockRules,
    Rules,
    rank_order,
    segment_for,
    select_block,
    select_tree,
)
from slurmfm.topology.model import Topology, natural_key

__all__ = ["GB200_SEGMENT_MIX", "PHILLY_NODE_MIX", "BackgroundJob", "fill"]

# (nodes per job, share of busy nodes). Unverified weights (module docstring).
PHILLY_NODE_MIX: tuple[tuple[int, float], ...] = (
    (1, 0.35),
    (2, 0.15),
    (4, 0.15),
    (8, 0.15),
    (16, 0.12),
    (32, 0.08),
)

# (nodes per job, share of busy nodes) on a GB200 NVL72 cluster in NVIDIA's segment classes.
# Assumed weights (module docstring), fixed before the first run of the seed that uses them.
GB200_SEGMENT_MIX: tuple[tuple[int, float], ...] = (
    (1, 0.05),
    (2, 0.05),
    (4, 0.10),
    (8, 0.10),
    (16, 0.20),
    (32, 0.25),
    (64, 0.25),
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


class _BlockPacker:
    """``select_block`` for the fill's jobs, fast where each ``--segment`` fits one base block.

    Why: :func:`~slurmfm.plan.slurm_sim.select_block` recounts every base block and re-sorts
    the node table per call, minutes per 16,384-node fill. A segment no larger than the base
    block is placed at block level 0, where ``eval_nodes_block`` reduces to: the base block
    with the fewest free nodes that still holds the segment, the later one on ties, its free
    nodes in node-table order; a job of several segments starts only if the fitting base
    blocks hold them all (``segments`` counted for the first). That is what this does with
    free counts kept between calls; any other job goes to ``select_block`` itself. Checked
    against ``select_block`` in ``tests/plan/test_bench_big_jobs.py``.
    """

    def __init__(
        self,
        topology: Topology,
        blocks: Sequence[Sequence[str]],
        block_sizes: Sequence[int],
        rules: BlockRules,
    ) -> None:
        table = {n: k for k, n in enumerate(sorted(topology.nodes, key=natural_key))}
        self.blocks = [sorted(b, key=table.__getitem__) for b in blocks]
        self.block_sizes = list(block_sizes)
        self.rules: BlockRules = rules
        self.base = block_sizes[0]
        self.counts: list[int] | None = None

    def place(self, free: set[str], size: int) -> list[str] | None:
        seg = segment_for(size, self.base)
        if (size == 1 and self.rules != "24.11") or seg > self.base:
            self.counts = None
            return select_block(
                self.blocks,
                free,
                size,
                block_sizes=self.block_sizes,
                rules=self.rules,
                segment=seg,
            )
        if self.counts is None:  # free counts, recounted after a call not made here
            self.counts = [sum(n in free for n in b) for b in self.blocks]
        counts = self.counts
        if size // seg > 1 and sum(c // seg for c in counts) < size // seg:
            return None
        taken: list[str] = []
        for _ in range(size // seg):
            pick = -1
            for b, c in enumerate(counts):
                if c >= seg and (pick == -1 or c <= counts[pick]):
                    pick = b
            if pick == -1:
                for n in taken:
                    free.add(n)
                self.counts = None
                return None
            got = [n for n in self.blocks[pick] if n in free][:seg]
            free.difference_update(got)
            counts[pick] -= seg
            taken.extend(got)
        free.update(taken)  # the caller takes them
        return sorted(taken, key=natural_key)


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
    blocks: tuple[Sequence[Sequence[str]], Sequence[int]] | None = None,
    block_rules: BlockRules = "24.11",
) -> list[BackgroundJob]:
    """Jobs that keep about ``busy_fraction`` of the fabric busy, placed by Slurm's tree rules.

    The fabric is first filled to ``busy_fraction + churn`` (capped at 0.95), then random jobs
    end until ``busy_fraction`` is reached.

    ``blocks``: (base blocks, ``BlockSizes``) as :func:`slurmfm.plan.slurm_sim.block_geometry`
    gives them; with it the jobs are placed by ``topology/block`` instead
    (:func:`~slurmfm.plan.slurm_sim.select_block` under ``block_rules``), each with the
    ``--segment`` :func:`~slurmfm.plan.slurm_sim.segment_for` asks, as a block cluster's users
    submit (https://slurm.schedmd.com/topology.html, "--segment"). Why: a GB200 cluster runs
    ``topology/block``, which packs a job of up to one base block into one UltraServer (the
    tightest that fits); the tree rules spread such jobs over several and leave every
    UltraServer partly busy, so no large expert group would find one free.
    """
    if not 0 <= busy_fraction < 1:
        raise ValueError("busy_fraction must be in [0, 1)")
    packer = _BlockPacker(topology, *blocks, block_rules) if blocks is not None else None
    rng = random.Random(seed)  # noqa: S311 - a reproducible draw, not a secret
    total = len(topology.nodes)
    free = set(topology.nodes)
    jobs: list[BackgroundJob] = []
    target = min(0.95, busy_fraction + churn) * total
    misses = 0
    while total - len(free) < target and misses < 50:
        size = _draw(rng, mix)
        if packer is None:
            got = select_tree(topology, free, size, rules=rules, switch_order=switch_order)
        else:
            got = packer.place(free, size)
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
