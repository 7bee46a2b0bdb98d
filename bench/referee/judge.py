"""The referee's verdict on one placement: communication and step time, and what it costs others.

Everything the verdict depends on (physical capacities, oversubscription, the other jobs and
their traffic) is the referee's own; the planner sees only the topology and which nodes are
busy. :func:`judge` runs the job's step (:mod:`bench.referee.traffic`) together with every
background job's ring (:mod:`bench.referee.background`) on the physical fabric
(:mod:`bench.referee.fabric`) with the max-min solver (:mod:`bench.referee.flows`).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from bench.referee.background import BackgroundJob
from bench.referee.fabric import FabricParams, PhysicalFabric
from bench.referee.flows import Coflow, max_min_rates, run
from bench.referee.traffic import StepTraffic, step_coflows
from slurmfm.topology.model import Topology

__all__ = ["Verdict", "background_coflows", "judge"]


@dataclass(frozen=True)
class Verdict:
    """``comm_s``: the step's communication (slowest coflow, latency included);
    ``step_s``: compute plus what of the communication compute cannot hide;
    ``others_slowdown``: mean and worst factor by which running jobs' traffic slowed while
    this step ran (1.0 = not at all); ``algorithms``: the DP algorithm NCCL would pick."""

    comm_s: float
    step_s: float
    per_dim: dict[str, float]
    others_slowdown_mean: float
    others_slowdown_max: float
    algorithms: tuple[str, ...]


def background_coflows(
    fabric: PhysicalFabric, jobs: Sequence[BackgroundJob], gpus_per_node: int
) -> list[Coflow]:
    """One persistent ring per multi-node background job in its communication phase.

    The ring is not rate-limited: a job that communicates takes what max-min sharing gives it
    (:mod:`bench.referee.background`, traffic model), so a new job on the links it uses
    slows it down, and that slowdown is what ``others_slowdown_*`` reports.
    """
    out: list[Coflow] = []
    for j in jobs:
        if len(j.order) < 2 or not j.communicating:
            continue
        uses: dict[str, int] = {}
        seq = list(j.order)
        for a, b in zip(seq, seq[1:] + seq[:1], strict=True):
            links, _ = fabric.route(a, b)
            for lk in links:
                uses[lk] = uses.get(lk, 0) + 1
        out.append(Coflow(f"bg:{j.name}", uses, math.inf, tags={"dim": "bg"}))
    del gpus_per_node
    return out


def judge(
    topology: Topology,
    order: Sequence[str],
    *,
    gpus_per_node: int,
    tp: int = 1,
    cp: int = 1,
    pp: int = 1,
    ep: int = 1,
    background: Sequence[BackgroundJob] = (),
    params: FabricParams | None = None,
    traffic: StepTraffic | None = None,
) -> Verdict:
    """The referee's verdict on a job whose ranks follow ``order`` while ``background`` runs."""
    if len(set(order)) != len(order):
        raise ValueError("order must name each node once")
    taken = set(order)
    clash = [n for j in background for n in j.order if n in taken]
    if clash:
        raise ValueError(f"the job's nodes are busy with other jobs: {clash[:3]}")
    tr = traffic or StepTraffic()
    fab = PhysicalFabric(topology, params)
    mine = step_coflows(
        fab, order, gpus_per_node=gpus_per_node, tp=tp, cp=cp, pp=pp, ep=ep, traffic=tr
    )
    others = background_coflows(fab, background, gpus_per_node)
    cap = fab.capacity
    out = run([*mine, *others], cap)
    per_dim: dict[str, float] = {}
    for c in mine:
        d = c.tags["dim"]
        per_dim[d] = max(per_dim.get(d, 0.0), out.finish_s[c.name])
    comm = max(per_dim.values(), default=0.0)
    exposed = max(0.0, per_dim.get("dp", 0.0) - tr.overlap * tr.compute_s)
    rest = max((v for k, v in per_dim.items() if k != "dp"), default=0.0)
    step = tr.compute_s + max(exposed, rest)
    slow: list[float] = []
    if others and out.window_s > 0:
        alone = max_min_rates(others, cap)
        for c in others:
            rate_with = out.moved[c.name] / out.window_s
            slow.append(alone[c.name] / rate_with if rate_with > 0 else math.inf)
    return Verdict(
        comm_s=comm,
        step_s=step,
        per_dim=per_dim,
        others_slowdown_mean=statistics.fmean(slow) if slow else 1.0,
        others_slowdown_max=max(slow, default=1.0),
        algorithms=tuple(sorted({c.tags["algo"] for c in mine if "algo" in c.tags})),
    )
