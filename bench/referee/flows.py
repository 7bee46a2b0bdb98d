"""Flow-level bandwidth sharing: max-min fair rates for coflows, and their completion times.

Why a solver of our own: the referee must not share code with the planner's simulator
(:mod:`slurmfm.plan.simulate`), and it needs one thing SimGrid's independent flows do not give
directly: an NCCL ring moves the same bytes over every edge in lock step, so a ring runs at the
rate of its slowest edge (NVIDIA/nccl ``src/device/all_reduce.h``: every step waits for the
previous chunk from its neighbour). A *coflow* here is a set of link uses (a link used by two
edges of one ring counts twice) that all advance at one common rate.

Rates are max-min fair (Bertsekas and Gallager, *Data Networks*, 2nd ed., section 6.5.2,
"progressive filling"): all unfrozen coflows grow together; when a link fills, the coflows on
it freeze at that rate. An optional ``cap`` bounds a coflow's rate (a background job that
communicates only part of the time). Completion times follow by advancing to the next coflow
that finishes and re-sharing (the fluid model SimGrid's flow-level models also use, Velho and
Legrand, SIMUTools 2009). ``tests/plan/test_referee.py`` checks this solver against a hand
computation and against SimGrid on the same links.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Coflow", "max_min_rates", "run"]


@dataclass(frozen=True)
class Coflow:
    """Transfers that advance together: ``uses`` link -> how many of its edges cross it.

    ``bytes``: what each edge carries (``math.inf`` for background traffic that lasts the whole
    window). ``cap``: the most bytes/s each edge may take (None: no limit). ``latency_s`` is
    added to the finish time (alpha terms: steps times per-hop latency), not to the sharing.
    """

    name: str
    uses: Mapping[str, int]
    bytes: float
    cap: float | None = None
    latency_s: float = 0.0
    tags: Mapping[str, str] = field(default_factory=dict)


def max_min_rates(coflows: Sequence[Coflow], capacity: Mapping[str, float]) -> dict[str, float]:
    """Per coflow name its max-min fair rate (bytes/s per edge) on links of ``capacity``.

    A coflow with no links and no cap would be unbounded; it gets ``math.inf``.
    """
    rate: dict[str, float] = {}
    left = dict(capacity)
    active = {c.name: c for c in coflows}
    for c in coflows:
        bad = [lk for lk in c.uses if lk not in capacity]
        if bad:
            raise ValueError(f"coflow {c.name}: unknown links {bad[:3]}")
    level = 0.0
    while active:
        # Each link's share if every active coflow on it rose by the same amount.
        weight: dict[str, float] = {}
        for c in active.values():
            for lk, k in c.uses.items():
                weight[lk] = weight.get(lk, 0.0) + k
        best = math.inf
        for lk, w in weight.items():
            if w > 0:
                best = min(best, left[lk] / w)
        caps = [c.cap - level for c in active.values() if c.cap is not None]
        step = min([best, *caps]) if caps else best
        if math.isinf(step):
            for name in active:
                rate[name] = math.inf
            break
        step = max(step, 0.0)
        level += step
        for lk, w in weight.items():
            left[lk] -= w * step
        full = {lk for lk, w in weight.items() if w > 0 and left[lk] <= 1e-9 * capacity[lk]}
        done = [
            name
            for name, c in active.items()
            if any(lk in full for lk in c.uses)
            or (c.cap is not None and c.cap - level <= 1e-12 * max(c.cap, 1.0))
        ]
        if not done:  # pragma: no cover - each round fills a link or reaches a cap
            raise RuntimeError("max-min filling made no progress")
        for name in done:
            rate[name] = level
            del active[name]
    return rate


@dataclass(frozen=True)
class Outcome:
    """Finish time per finite coflow; per background coflow the bytes it moved in the window."""

    finish_s: Mapping[str, float]
    moved: Mapping[str, float]
    window_s: float


def run(coflows: Sequence[Coflow], capacity: Mapping[str, float]) -> Outcome:
    """Advance all coflows from time 0 until every finite one has finished.

    Background coflows (infinite bytes) keep their share throughout; ``moved`` says how many
    bytes each edge of every coflow carried until the last finite one ended (the window), so
    a caller can compare a background job's throughput with and without a new job.
    """
    names = [c.name for c in coflows]
    if len(set(names)) != len(names):
        raise ValueError("coflow names must be unique")
    left = {c.name: c.bytes for c in coflows}
    moved = {c.name: 0.0 for c in coflows}
    finish: dict[str, float] = {}
    by_name = {c.name: c for c in coflows}
    now = 0.0
    live = [c for c in coflows if c.bytes > 0]
    for c in coflows:
        if c.bytes <= 0:
            finish[c.name] = c.latency_s
    while any(math.isfinite(left[c.name]) for c in live):
        rates = max_min_rates(live, capacity)
        dt = math.inf
        for c in live:
            r = rates[c.name]
            if math.isfinite(left[c.name]) and r > 0:
                dt = min(dt, left[c.name] / r)
        if math.isinf(dt):
            raise ValueError("a finite coflow gets no bandwidth (a link of capacity 0?)")
        now += dt
        still = []
        for c in live:
            r = rates[c.name]
            got = r * dt if math.isfinite(r) else left[c.name]
            moved[c.name] += got
            if math.isfinite(left[c.name]):
                left[c.name] -= got
                if left[c.name] <= 1e-9 * max(by_name[c.name].bytes, 1.0):
                    finish[c.name] = now + c.latency_s
                    continue
            still.append(c)
        live = still
    return Outcome(finish, moved, now)
