"""A cluster over time: jobs arrive, wait, start where a placement policy puts them, and end.

Why: a placement that speeds up one job can cost the queue (it takes the leaves or UltraServers
the next job needed, or it waits for a shape Slurm would have started at once). This simulation
runs one job stream twice, once with Slurm's own placement for every job and once with a
policy (the bench passes slurmfm's planner) for the large jobs, and reports what a cluster
operator sees: time to start, leaves/blocks per job, free contiguous capacity, step time (the
referee's, with the jobs already running as background) and how much each start slows the jobs
already running.

Scheduling is strict priority order (FIFO; no backfill): at each arrival or end the queue is
tried head first and stops at the first job that cannot start, as Slurm's main scheduling loop
does for one partition without ``sched/backfill`` (https://slurm.schedmd.com/sched_config.html,
"main scheduling loop"). A job's run time is its compute-only work stretched by the referee's
step time over its compute time, judged once at its start.

The placement policies are callables, so this module needs nothing of the planner (the referee
package never imports it).
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from slurmfm.referee.background import PHILLY_NODE_MIX, BackgroundJob
from slurmfm.referee.fabric import FabricParams
from slurmfm.referee.judge import judge
from slurmfm.referee.traffic import StepTraffic
from slurmfm.topology.model import Topology

__all__ = ["ArrivingJob", "ClusterResult", "Placer", "job_stream", "simulate"]


@dataclass(frozen=True)
class ArrivingJob:
    """A job of the stream: ``work_s`` is its run time if communication cost nothing."""

    name: str
    arrive_s: float
    nodes: int
    work_s: float
    gpus_per_node: int = 8
    tp: int = 8
    pp: int = 1
    large: bool = False


# (free nodes, job) -> nodes in rank order, or None to stay pending.
Placer = Callable[[frozenset[str], ArrivingJob], list[str] | None]


@dataclass
class ClusterResult:
    """Per job: wait, units (leaves or UltraServers) used, step time, others' slowdown."""

    wait_s: dict[str, float] = field(default_factory=dict)
    units: dict[str, int] = field(default_factory=dict)
    step_s: dict[str, float] = field(default_factory=dict)
    comm_s: dict[str, float] = field(default_factory=dict)
    others_slowdown: dict[str, float] = field(default_factory=dict)
    free_unit_run: list[int] = field(default_factory=list)  # at each start: largest free unit
    free_spine_run: list[int] = field(default_factory=list)
    stranded_units: list[int] = field(default_factory=list)  # units: 0 < free < stranded_below
    pending_a_policy_starts: set[str] = field(default_factory=set)
    never_started: list[str] = field(default_factory=list)
    makespan_s: float = 0.0

    def large(self, jobs: Sequence[ArrivingJob]) -> list[str]:
        return [j.name for j in jobs if j.large and j.name in self.wait_s]


def job_stream(
    total_nodes: int,
    *,
    seed: int,
    count: int,
    large_sizes: Sequence[int],
    large_share: float = 0.2,
    utilization: float = 0.7,
    gpus_per_node: int = 8,
    tp: int = 8,
    mix: Sequence[tuple[int, float]] = PHILLY_NODE_MIX,
    pp_choices: Sequence[int] = (1, 2, 4),
) -> list[ArrivingJob]:
    """``count`` jobs, Poisson arrivals sized so the offered load is ``utilization``.

    Small jobs draw their size from ``mix`` (node-weighted, as :func:`~slurmfm.referee.
    background.fill`), large ones from ``large_sizes``; work is log-uniform 0.5-4 h.
    """
    rng = random.Random(seed)  # noqa: S311 - a reproducible draw, not a secret
    sizes = [s for s, _ in mix]
    weights = [w / s for s, w in mix]
    jobs: list[ArrivingJob] = []
    specs = []
    for i in range(count):
        large = rng.random() < large_share
        n = rng.choice(list(large_sizes)) if large else rng.choices(sizes, weights)[0]
        work = math.exp(rng.uniform(math.log(1800), math.log(14400)))
        pps = [p for p in pp_choices if n % p == 0 and n // p >= 2] or [1]
        specs.append((i, n, work, large, rng.choice(pps) if large else 1))
    mean_demand = statistics.fmean(n * w for _, n, w, _, _ in specs)
    rate = utilization * total_nodes / mean_demand  # jobs per second
    t = 0.0
    for i, n, work, large, pp in specs:
        t += rng.expovariate(rate)
        jobs.append(
            ArrivingJob(f"j{i}", t, n, work, gpus_per_node=gpus_per_node, tp=tp, pp=pp, large=large)
        )
    return jobs


def _unit(topology: Topology, n: str) -> str:
    node = topology.nodes[n]
    return node.nvlink_domain or topology.leaf_of[n]


def simulate(
    topology: Topology,
    jobs: Sequence[ArrivingJob],
    *,
    slurm: Placer,
    policy: Placer | None = None,
    params: FabricParams | None = None,
    traffic: StepTraffic | None = None,
    stranded_below: int | None = None,
    probe: Placer | None = None,
) -> ClusterResult:
    """Run the stream; large jobs go to ``policy`` when given, every other job to ``slurm``.

    ``stranded_below``: for block fabrics, a segment size (16: NVIDIA's for large GB200 jobs);
    at each start the UltraServers with some free nodes but fewer than that are counted as
    stranded (lost to fragmentation for large jobs).
    ``probe``: in a Slurm-only run, asked whenever Slurm leaves a large head job pending; the
    jobs it could have started at such a moment are ``pending_a_policy_starts`` (GB200: jobs
    the block plugin leaves pending that a plan starts).
    """
    res = ClusterResult()
    tr = traffic or StepTraffic()
    free = set(topology.nodes)
    queue: list[ArrivingJob] = []
    running: dict[str, tuple[float, BackgroundJob]] = {}  # name -> (end time, its ranks)
    events = sorted(jobs, key=lambda j: j.arrive_s)
    i = 0
    now = 0.0
    units_all = sorted({_unit(topology, n) for n in topology.nodes})
    members: dict[str, list[str]] = {}
    for n in topology.nodes:
        members.setdefault(_unit(topology, n), []).append(n)
    spines = [s for s in topology.parent_of if topology.level(s) == 1]

    def try_start() -> None:
        while queue:
            job = queue[0]
            place = policy if (policy is not None and job.large) else slurm
            got = place(frozenset(free), job)
            if got is None:
                if probe is not None and job.large and probe(frozenset(free), job) is not None:
                    res.pending_a_policy_starts.add(job.name)
                return
            queue.pop(0)
            res.wait_s[job.name] = now - job.arrive_s
            res.units[job.name] = len({_unit(topology, n) for n in got})
            background = [b for _, b in running.values()]
            if len(got) > 1:
                v = judge(
                    topology,
                    got,
                    gpus_per_node=job.gpus_per_node,
                    tp=job.tp,
                    pp=job.pp,
                    background=background,
                    params=params,
                    traffic=tr,
                )
                stretch = v.step_s / tr.compute_s
                res.step_s[job.name] = v.step_s
                res.comm_s[job.name] = v.comm_s
                res.others_slowdown[job.name] = v.others_slowdown_mean
            else:
                stretch = 1.0
            free.difference_update(got)
            running[job.name] = (now + job.work_s * stretch, BackgroundJob(job.name, tuple(got)))
            res.free_unit_run.append(
                max((sum(n in free for n in members[u]) for u in units_all), default=0)
            )
            res.free_spine_run.append(
                max((sum(n in free for n in topology.nodes_under(s)) for s in spines), default=0)
            )
            if stranded_below is not None:
                res.stranded_units.append(
                    sum(
                        1
                        for u in units_all
                        if 0 < sum(n in free for n in members[u]) < stranded_below
                    )
                )

    while i < len(events) or running:
        next_end = min((e for e, _ in running.values()), default=math.inf)
        next_arr = events[i].arrive_s if i < len(events) else math.inf
        if next_arr <= next_end:
            now = next_arr
            queue.append(events[i])
            i += 1
        else:
            now = next_end
            for name in [k for k, (e, _) in running.items() if e <= now]:
                free.update(running.pop(name)[1].order)
        try_start()
        if not running and i >= len(events) and queue:
            break  # the head can never start (larger than the fabric's room)
    res.never_started = [j.name for j in queue]
    res.makespan_s = now
    return res
