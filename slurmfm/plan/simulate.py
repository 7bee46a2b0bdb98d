"""Simulated communication time of one training step, on SimGrid (optional).

Why a simulator next to the cost model (:mod:`slurmfm.plan.cost`): the model charges each
group at its worst tier with a formula for congestion; whether that ranks placements the way
a network would is a claim to check, not to assume. SimGrid is a validated
flow-level simulator (https://simgrid.org; Velho and Legrand, "Accuracy study and improvement
of network simulation in the SimGrid framework", SIMUTools 2009): every transfer is a flow over
a route of links and concurrent flows share each link's bandwidth (max-min fairness), so
contention comes out of the flows, not out of a formula.

What is simulated (:func:`build_scenario`):

* **Fabric.** One host per job node. Each node has an EFA port (one split-duplex link, the
  instance's network bandwidth, :data:`NIC_GBPS`); nodes of one multi-node NVLink domain (GB200
  UltraServer) also have an NVLink port (``gpus * nvlink_GBps``) and talk over it. Every switch
  below the root has one split-duplex uplink whose bandwidth is the job's fair share of that
  switch's uplinks: ``job nodes under the switch * NIC / oversubscription`` (the same
  assumption as the cost model; other jobs use the rest). Oversubscription is a parameter per
  tier (``leaf``, ``spine``, ``core`` = the uplinks of switches at level 0, 1, >= 2).
* **Traffic.** Megatron rank order ``tp-cp-ep-dp-pp`` (:func:`slurmfm.plan.cost._groups`).
  Each DP group runs an NCCL ring reduce-scatter + all-gather in rank order: ``2(p-1)`` steps
  of ``n/p`` bytes per member, in lock step (NCCL's ring algorithm; NVIDIA/nccl
  ``src/device/all_reduce.h``). Steps are batched into at most ``max_rounds`` rounds (each the
  same bytes), and the latency of the omitted steps is added back per ring. Batching is exact
  for one ring: every step moves the same bytes over the same edges, and max-min sharing of
  flows that start together is scale-invariant in their bytes, so ``k`` steps in one round take
  ``k`` times one step's transfer time. With several groups at once it lets a group's steps
  follow back to back while the others' are still in flight: on a 1,024-node PP=4 job one
  round gave 1.4 % more than four, on a PP=1 job 0.05 % (the omitted steps' latency). Jobs
  above 1,024 nodes run one round (:func:`_auto_rounds`): the simulator's cost grows with
  flows times completion events, about 20 s CPU for one round of a 4,096-node ring. DP groups
  of the
  same node sequence (e.g. the 8 local-rank rings of TP=8 nodes) are one flow per edge with
  their bytes added. Each pipeline sends ``pp`` bytes forward and back between neighbouring
  stages. TP/CP/EP stay inside an NVLink domain (the planner's hard rule) and do not depend
  on which nodes are chosen, so they are not simulated. All groups start at once.
* **Result.** Per group the finish time; per dimension the slowest group; ``makespan``.

The simulator runs in a subprocess under the interpreter that has SimGrid's bindings
(Debian's ``python3-simgrid`` is built for ``/usr/bin/python3``; ``SLURMFM_SIMGRID_PYTHON``
overrides) and scenarios go in and out as JSON. A subprocess rather than importing the module
here because (1) SimGrid allows one ``Engine`` per process, never reset, so each scenario needs
a fresh process (the worker forks one per scenario), and (2) adding Debian's dist-packages to
slurmfm's own interpreter would mix two package trees (numpy etc.). Nothing else in slurmfm
needs SimGrid: :func:`available` says whether it can run.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import shutil
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from slurmfm.errors import SlurmfmError
from slurmfm.plan.cost import CostParams, JobShape, _groups, _node_groups, _ring_edges

if TYPE_CHECKING:
    from slurmfm.topology.model import Topology

WORKER = Path(__file__).with_name("_simgrid_worker.py")

# Per-instance network bandwidth in Gbit/s, from EC2 DescribeInstanceTypes as generated into
# aws/karpenter-provider-aws:pkg/providers/instancetype/zz_generated.bandwidth.go.
NIC_GBPS: Mapping[str, float] = {
    "p4d.24xlarge": 400,
    "p4de.24xlarge": 400,
    "p5.48xlarge": 3200,
    "p5e.48xlarge": 3200,
    "p5en.48xlarge": 3200,
    "p6-b200.48xlarge": 3200,
    "p6-b300.48xlarge": 6400,
    "p6e-gb200.36xlarge": 3200,
}
DEFAULT_NIC_GBPS = 3200.0
# One-way NVLink bandwidth per GPU: NVLink4 (H100/H200) 900 GB/s and NVLink5 (B200/GB200)
# 1.8 TB/s bidirectional (https://www.nvidia.com/en-us/data-center/nvlink/), halved.
NVLINK_GBPS_PER_GPU = 900.0


class SimulationError(SlurmfmError):
    """SimGrid is missing or a scenario failed in the simulator."""


@dataclass(frozen=True)
class SimParams:
    """Assumptions of the simulated fabric; every default is a documented guess.

    ``oversubscription``: downlink:uplink ratio of the uplinks of switches at each tier. AWS
    does not publish them (the bench reports 1, 2 and 4). Latencies are not published for EFA
    either: ``nic_latency_s`` per EFA port (two per transfer: the 10 us leaf alpha of the cost
    model) and ``hop_latency_s`` per uplink crossed (its 2 us per tier) are placeholders to
    calibrate with nccl-tests, like the cost model's.
    """

    oversubscription: Mapping[str, float] = field(
        default_factory=lambda: {"leaf": 1.0, "spine": 1.0, "core": 1.0}
    )
    nic_gbps: float | None = None  # None: from the nodes' instance type, else 3,200
    nvlink_GBps_per_gpu: float = NVLINK_GBPS_PER_GPU
    nic_latency_s: float = 5e-6
    hop_latency_s: float = 1e-6
    nvlink_latency_s: float = 1.5e-6
    max_rounds: int | None = None  # None: 8 up to 512 nodes, 4 up to 1,024, else 1

    @classmethod
    def from_cost(cls, cost: CostParams, **kw: Any) -> SimParams:
        """The cost model's oversubscription per tier, so model and simulation agree on it."""
        return cls(
            oversubscription={t: cost.tiers[t].oversubscription for t in ("leaf", "spine", "core")},
            **kw,
        )

    @classmethod
    def uniform(cls, oversubscription: float, **kw: Any) -> SimParams:
        """Every tier at the same oversubscription."""
        o = float(oversubscription)
        return cls(oversubscription={"leaf": o, "spine": o, "core": o}, **kw)


@dataclass(frozen=True)
class SimReport:
    """Simulated communication time of one step: slowest group per dimension, and overall."""

    makespan_s: float
    per_dim: Mapping[str, float]


def _auto_rounds(nodes: int) -> int:
    """Lock-step rounds per ring: fewer for big jobs, whose simulation is quadratic-ish in the
    flows re-shared at every round (a 4,096-node job at 8 rounds takes minutes). Above 1,024
    nodes one round: one ring step's concurrent flows with all ``2(p-1)`` steps' bytes, which
    for one ring is exactly ``2(p-1)`` times one step (module docstring)."""
    return 8 if nodes <= 512 else 4 if nodes <= 1024 else 1


def _tier(level: int) -> str:
    return "leaf" if level <= 0 else "spine" if level == 1 else "core"


def _nic_bytes_per_s(topology: Topology, order: Sequence[str], params: SimParams) -> float:
    if params.nic_gbps is not None:
        return params.nic_gbps * 1e9 / 8
    types = Counter(topology.nodes[h].instance_type for h in order)
    itype = types.most_common(1)[0][0] if types else None
    return NIC_GBPS.get(itype or "", DEFAULT_NIC_GBPS) * 1e9 / 8


class _Routes:
    """The scenario's hosts, links and the one-way routes between job nodes.

    Why a class: the DP and PP groups ask for routes as they go, and the worker wants each
    route once (keyed by host pair) with its latency known to the group that asked.
    """

    def __init__(self, topology: Topology, order: Sequence[str], params: SimParams, g: int) -> None:
        from slurmfm.plan.cost import nvlink_domain

        self.params = params
        self.paths = [topology.path(h) for h in order]
        self.domains = [nvlink_domain(topology, h) for h in order]
        self.hosts = [f"n{i}" for i in range(len(order))]
        self.links = self._links(topology, order, g)
        self.routes: list[list[Any]] = []
        self._latency: dict[tuple[int, int], float] = {}

    def _links(self, topology: Topology, order: Sequence[str], g: int) -> list[list[Any]]:
        """Each node's NIC, NVLink for nodes that share a domain, and one uplink per switch
        (but the root) the job uses: its own nodes' NICs over the tier's oversubscription."""
        params, domains = self.params, self.domains
        nic = _nic_bytes_per_s(topology, order, params)
        dom_size = Counter(domains)
        under: Counter[str] = Counter()
        for p in self.paths:
            under.update(p)
        links: list[list[Any]] = [[f"nic{i}", nic, params.nic_latency_s] for i in range(len(order))]
        nvl_bw = g * params.nvlink_GBps_per_gpu * 1e9
        links += [
            [f"nvl{i}", nvl_bw, params.nvlink_latency_s]
            for i in range(len(order))
            if dom_size[domains[i]] > 1
        ]
        self.sw_index: dict[str, int] = {}
        for sw, cnt in under.items():
            if topology.parent_of.get(sw) is None:
                continue  # the root has no uplink
            o = params.oversubscription.get(_tier(topology.level(sw)), 1.0)
            self.sw_index[sw] = len(self.sw_index)
            links.append([f"up{self.sw_index[sw]}", cnt * nic / o, params.hop_latency_s])
        return links

    def route(self, a: int, b: int) -> float:
        """Add the one-way route a->b once; its latency."""
        hit = self._latency.get((a, b))
        if hit is not None:
            return hit
        params = self.params
        if self.domains[a] == self.domains[b]:
            hops: list[list[str]] = [[f"nvl{a}", "UP"], [f"nvl{b}", "DOWN"]]
            lat = 2 * params.nvlink_latency_s
        else:
            pa, pb = self.paths[a], self.paths[b]
            c = 0
            while c < min(len(pa), len(pb)) and pa[c] == pb[c]:
                c += 1
            ups = [[f"up{self.sw_index[s]}", "UP"] for s in reversed(pa[c:])]
            downs = [[f"up{self.sw_index[s]}", "DOWN"] for s in pb[c:]]
            hops = [[f"nic{a}", "UP"], *ups, *downs, [f"nic{b}", "DOWN"]]
            lat = 2 * params.nic_latency_s + (len(ups) + len(downs)) * params.hop_latency_s
        self.routes.append([self.hosts[a], self.hosts[b], hops])
        self._latency[(a, b)] = lat
        return lat


def _dp_groups(
    rt: _Routes, ranges: list[range], g: int, nbytes: float, max_rounds: int
) -> tuple[list[dict[str, Any]], list[tuple[str, float]]]:
    """One group per distinct DP node ring, run in lock-step rounds, and its (dimension,
    latency the rounds leave out) for the caller to add back."""
    groups_json: list[dict[str, Any]] = []
    meta: list[tuple[str, float]] = []
    hosts = rt.hosts
    for nodes, count in _node_groups(ranges, g).items():
        edges = _ring_edges(nodes)
        if not edges:
            continue
        ranks = len(nodes)
        steps = 2 * (ranks - 1)
        rounds = max(1, min(steps, max_rounds))
        per_round = count * steps / ranks * nbytes / rounds
        lat = max(rt.route(a, b) for a, b in edges)
        groups_json.append(
            {"rounds": rounds, "edges": [[hosts[a], hosts[b], per_round] for a, b in edges]}
        )
        meta.append(("dp", (steps - rounds) * lat))
    return groups_json, meta


def _pp_edges(rt: _Routes, ranges: list[range], g: int, nbytes: float) -> list[list[Any]]:
    """Every pipeline's sends between neighbouring stages on two nodes, both ways.

    They start at once and take one round, so all of them are one group: the slowest pair
    is the PP time (one actor instead of thousands).
    """
    pp_edges: list[list[Any]] = []
    hosts = rt.hosts
    for nodes, count in _node_groups(ranges, g).items():
        for a, b in itertools.pairwise(nodes):
            if a == b:
                continue
            for x, y in ((a, b), (b, a)):
                rt.route(x, y)
                pp_edges.append([hosts[x], hosts[y], count * nbytes])
    return pp_edges


def build_scenario(
    topology: Topology,
    order: Sequence[str],
    job: JobShape,
    cost: CostParams | None = None,
    params: SimParams | None = None,
) -> tuple[dict[str, Any], list[tuple[str, float]]]:
    """The worker's scenario for ``job`` on ``order``, and per group (dimension, extra latency).

    Message sizes are the cost model's (``cost.message_bytes``), so model and simulation
    describe the same step.
    """
    cost = cost or CostParams.default()
    params = params or SimParams()
    bad = job.problems()
    if bad:
        raise ValueError("; ".join(bad))
    if len(order) != job.nodes or len(set(order)) != len(order):
        raise ValueError("order must name each of the job's nodes once")
    g = job.gpus_per_node
    rt = _Routes(topology, order, params, g)
    all_groups = _groups(job)
    nbytes = cost.message_bytes
    max_rounds = params.max_rounds or _auto_rounds(len(order))
    groups_json, meta = _dp_groups(rt, all_groups["dp"], g, nbytes["dp"], max_rounds)
    pp_edges = _pp_edges(rt, all_groups["pp"], g, nbytes["pp"])
    if pp_edges:
        groups_json.append({"rounds": 1, "edges": pp_edges})
        meta.append(("pp", 0.0))
    scenario = {"links": rt.links, "hosts": rt.hosts, "routes": rt.routes, "groups": groups_json}
    return scenario, meta


def simgrid_python() -> str | None:
    """The interpreter that has SimGrid's bindings, or None."""
    env = os.environ.get("SLURMFM_SIMGRID_PYTHON")
    if env:
        return env
    for cand in ("/usr/bin/python3", shutil.which("python3")):
        if cand and Path(cand).exists():
            return cand
    return None


@cache
def available() -> bool:
    """Whether SimGrid can run here (checked once per process)."""
    py = simgrid_python()
    if py is None:
        return False
    try:
        proc = subprocess.run(
            [py, "-I", "-c", "import simgrid"],
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


# Results of scenarios already simulated in this process, by the SHA-256 of their JSON. The
# simulation is deterministic, and the bench and the planner's simulation check ask for the
# same placements again (the plan for two Slurm versions, Slurm's leaf and name orders): a
# 4,096-node scenario costs tens of CPU seconds, its digest microseconds.
_RESULTS: dict[str, dict[str, Any]] = {}
_RESULTS_MAX = 512


def run_scenarios(scenarios: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Raw worker results per scenario; each distinct scenario is simulated once per process."""
    _require()
    keys = [hashlib.sha256(json.dumps(sc, sort_keys=True).encode()).hexdigest() for sc in scenarios]
    todo: dict[str, Mapping[str, Any]] = {}
    for k, sc in zip(keys, scenarios, strict=True):
        if k not in _RESULTS:
            todo.setdefault(k, sc)
    if todo:
        fresh = _run_worker(list(todo.values()))
        if len(_RESULTS) + len(todo) > _RESULTS_MAX:
            _RESULTS.clear()
        _RESULTS.update(zip(todo, fresh, strict=True))
    return [_RESULTS[k] for k in keys]


def _require() -> str:
    py = simgrid_python()
    if py is None or not available():
        raise SimulationError(
            "SimGrid is not available: install Debian's python3-simgrid (apt-get install "
            "python3-simgrid) or set SLURMFM_SIMGRID_PYTHON to an interpreter that has it"
        )
    return py


def _run_worker(scenarios: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Run scenarios in one worker process (one forked Engine each); raw worker results."""
    py = _require()
    proc = subprocess.run(
        [py, "-I", str(WORKER)],
        input=json.dumps({"scenarios": list(scenarios)}),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise SimulationError(f"SimGrid worker failed: {proc.stderr.strip()[-500:]}")
    results: list[dict[str, Any]] = json.loads(proc.stdout)["results"]
    for r in results:
        if "error" in r:
            raise SimulationError(f"SimGrid scenario failed: {r['error']}")
    return results


def simulate_many(
    topology: Topology,
    orders: Sequence[Sequence[str]],
    job: JobShape,
    cost: CostParams | None = None,
    params: SimParams | None = None,
) -> list[SimReport]:
    """Simulate ``job`` on each node order (rank order, node i holds ranks i*G..)."""
    built = [build_scenario(topology, o, job, cost, params) for o in orders]
    raw = run_scenarios([sc for sc, _ in built])
    out: list[SimReport] = []
    for (_, meta), res in zip(built, raw, strict=True):
        per_dim: dict[str, float] = {"dp": 0.0, "pp": 0.0}
        for (dim, extra), t in zip(meta, res["groups"], strict=True):
            per_dim[dim] = max(per_dim[dim], float(t) + extra)
        out.append(SimReport(makespan_s=max(per_dim.values()), per_dim=per_dim))
    return out


def simulate(
    topology: Topology,
    order: Sequence[str],
    job: JobShape,
    cost: CostParams | None = None,
    params: SimParams | None = None,
) -> SimReport:
    """Simulated communication time of one step of ``job`` with ranks in ``order``."""
    return simulate_many(topology, [order], job, cost, params)[0]


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks on ties); 1.0 for fewer than two points."""
    if len(xs) != len(ys):
        raise ValueError("spearman: sequences differ in length")
    if len(xs) < 2:
        return 1.0

    def ranks(v: Sequence[float]) -> list[float]:
        idx = sorted(range(len(v)), key=v.__getitem__)
        r = [0.0] * len(v)
        i = 0
        while i < len(idx):
            j = i
            while j + 1 < len(idx) and math.isclose(
                v[idx[j + 1]], v[idx[i]], rel_tol=1e-9, abs_tol=1e-15
            ):
                j += 1
            for k in range(i, j + 1):
                r[idx[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    vx = math.sqrt(sum((a - mx) ** 2 for a in rx))
    vy = math.sqrt(sum((b - my) ** 2 for b in ry))
    if vx == 0 or vy == 0:
        return 1.0 if vx == vy else 0.0
    return cov / (vx * vy)


def concordance(
    model: Sequence[float], simulated: Sequence[float], min_diff: float = 0.02
) -> float:
    """Share of placement pairs the model orders like the simulation (1.0 if none qualify).

    Only pairs whose simulated times differ by more than ``min_diff`` (relative) count: on
    near-ties the order is decided by latencies that both sides only guess, and Spearman's
    rho over mostly tied placements (oversubscription 1) says nothing about ranking.
    """
    if len(model) != len(simulated):
        raise ValueError("concordance: sequences differ in length")
    agree = total = 0
    for i in range(len(model)):
        for j in range(i + 1, len(model)):
            si, sj = simulated[i], simulated[j]
            if abs(si - sj) <= min_diff * max(si, sj):
                continue
            total += 1
            if (model[i] - model[j]) * (si - sj) > 0:
                agree += 1
    return agree / total if total else 1.0
