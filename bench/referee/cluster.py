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

from bench.referee.background import PHILLY_NODE_MIX, BackgroundJob
from bench.referee.fabric import FabricParams
from bench.referee.judge import judge
from bench.referee.traffic import StepTraffic
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

    Small jobs draw their size from ``mix`` (node-weighted, as :func:`~bench.referee.
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


class _Run:
    """One run of the stream: free nodes, queue, running jobs, the clock and the result.

    Why a class: starting a job reads and changes all of them, and the event loop advances
    the clock between starts; one object keeps that state in one place.
    """

    def __init__(
        self,
        topology: Topology,
        slurm: Placer,
        policy: Placer | None,
        probe: Placer | None,
        params: FabricParams | None,
        traffic: StepTraffic,
        stranded_below: int | None,
    ) -> None:
        self.topology = topology
        self.slurm, self.policy, self.probe = slurm, policy, probe
        self.params = params
        self.tr = traffic
        self.stranded_below = stranded_below
        self.res = ClusterResult()
        self.free = set(topology.nodes)
        self.queue: list[ArrivingJob] = []
        self.running: dict[str, tuple[float, BackgroundJob]] = {}  # name -> (end, its ranks)
        self.now = 0.0
        self.units_all = sorted({_unit(topology, n) for n in topology.nodes})
        self.members: dict[str, list[str]] = {}
        for n in topology.nodes:
            self.members.setdefault(_unit(topology, n), []).append(n)
        self.spines = [s for s in topology.parent_of if topology.level(s) == 1]

    def try_start(self) -> None:
        """Start queued jobs in arrival order until the head cannot start (no backfill);
        a large head left pending is offered to ``probe``."""
        while self.queue:
            job = self.queue[0]
            place = self.policy if (self.policy is not None and job.large) else self.slurm
            got = place(frozenset(self.free), job)
            if got is None:
                probe = self.probe
                if probe is not None and job.large and probe(frozenset(self.free), job) is not None:
                    self.res.pending_a_policy_starts.add(job.name)
                return
            self.queue.pop(0)
            self._start(job, got)

    def _stretch(self, job: ArrivingJob, got: list[str]) -> float:
        """How much longer than its work ``job`` runs on ``got``: its step time over pure
        compute, judged against the jobs running now (1.0 on one node)."""
        res, tr = self.res, self.tr
        background = [b for _, b in self.running.values()]
        if len(got) <= 1:
            return 1.0
        v = judge(
            self.topology,
            got,
            gpus_per_node=job.gpus_per_node,
            tp=job.tp,
            pp=job.pp,
            background=background,
            params=self.params,
            traffic=tr,
        )
        res.step_s[job.name] = v.step_s
        res.comm_s[job.name] = v.comm_s
        res.others_slowdown[job.name] = v.others_slowdown_mean
        return v.step_s / tr.compute_s

    def _start(self, job: ArrivingJob, got: list[str]) -> None:
        """Start ``job`` on ``got`` now and record its wait, units and the room left."""
        res = self.res
        res.wait_s[job.name] = self.now - job.arrive_s
        res.units[job.name] = len({_unit(self.topology, n) for n in got})
        stretch = self._stretch(job, got)
        self.free.difference_update(got)
        self.running[job.name] = (
            self.now + job.work_s * stretch,
            BackgroundJob(job.name, tuple(got)),
        )
        self._record_room()

    def _record_room(self) -> None:
        """The free room after a start: the largest free unit and spine run, and the
        stranded units (some free nodes, fewer than ``stranded_below``)."""
        res, free, members = self.res, self.free, self.members
        res.free_unit_run.append(
            max((sum(n in free for n in members[u]) for u in self.units_all), default=0)
        )
        res.free_spine_run.append(
            max(
                (sum(n in free for n in self.topology.nodes_under(s)) for s in self.spines),
                default=0,
            )
        )
        if self.stranded_below is not None:
            res.stranded_units.append(
                sum(
                    1
                    for u in self.units_all
                    if 0 < sum(n in free for n in members[u]) < self.stranded_below
                )
            )

    def run(self, jobs: Sequence[ArrivingJob]) -> ClusterResult:
        """The event loop: the next arrival or end, whichever comes first, then starts."""
        events = sorted(jobs, key=lambda j: j.arrive_s)
        i = 0
        running = self.running
        while i < len(events) or running:
            next_end = min((e for e, _ in running.values()), default=math.inf)
            next_arr = events[i].arrive_s if i < len(events) else math.inf
            if next_arr <= next_end:
                self.now = next_arr
                self.queue.append(events[i])
                i += 1
            else:
                self.now = next_end
                for name in [k for k, (e, _) in running.items() if e <= self.now]:
                    self.free.update(running.pop(name)[1].order)
            self.try_start()
            if not running and i >= len(events) and self.queue:
                break  # the head can never start (larger than the fabric's room)
        self.res.never_started = [j.name for j in self.queue]
        self.res.makespan_s = self.now
        return self.res


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
    tr = traffic or StepTraffic()
    return _Run(topology, slurm, policy, probe, params, tr, stranded_below).run(jobs)
