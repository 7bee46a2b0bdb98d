#!/usr/bin/env python3
"""Placement benchmark: slurmfm's planner against Slurm's own choice, and against the optimum.

Why: the planner is only worth its complexity if it beats what Slurm already does with the
same free nodes. This script measures that, in one process, on generated EC2-like fabrics
(3 switch levels plus a common root, uneven leaf sizes, host names unrelated to the fabric,
30-70 % of nodes busy) for jobs of 8 to 1,024 nodes with TP 8 and PP 1-16.

Methods, all scored with ``slurmfm.plan.cost.evaluate`` on the same topology and job:

* ``slurmfm@22.05`` / ``slurmfm@24.11``: ``slurmfm.plan.planner.plan(topology, job,
  unavailable=busy, switch_order=..., slurm_version=...)`` (rank order), given the fabric's
  topology.conf switch order and the cluster's Slurm version as a real cluster's planner would
  know them. A cluster runs one Slurm, so the planner is run once per tree rule set, for a
  version of that rule set (22.05: 21.08-24.05.2 rules; 24.11: 24.05.3+ rules), and each
  Slurm baseline is compared with the plan made for its own version.
* ``slurm21-name`` / ``slurm21-leaf`` / ``slurm2405-name`` / ``slurm2405-leaf``: Slurm's tree
  selection reproduced by ``slurmfm.plan.slurm_sim.select_tree`` (``_eval_nodes_topo`` in
  SchedMD/slurm:src/plugins/topology/tree/eval_nodes_tree.c; rules 21.08-24.05.2 and 24.05.3+,
  checked against real
  Slurm 22.05.8 in tests/plan/test_slurm_sim.py), with name-order ranks (Slurm up to 25.11)
  and leaf-order ranks (26.05's default: https://slurm.schedmd.com/topology.html).
* ``real-slurm``: the local lab's ``sbatch --test-only -N k --exclusive`` choice for the same
  busy pattern, with name-order ranks (``--real-lab DIR``; small fabrics of the lab's size).
* ``optimum``: the exact minimum of the predicted step time over node subsets and rank orders,
  by exhaustive search over leaf sequences (nodes of one leaf are interchangeable in the cost
  model), on small cases only.

Simulated time (``--sim-only``, or after the tables unless ``--no-sim``; needs SimGrid):
jobs of 8 to 4,096 nodes on 3- and 4-level fabrics and GB200 UltraServer blocks, 30-70 % of
the fabric busy, each placement's step simulated by ``slurmfm.plan.simulate`` at
oversubscription 1, 2 and 4 (plan / Slurm's choice with its topology and name orders, median
and worst; the model's rank agreement; the gap to the optimum). Jobs above 1,024 nodes are
simulated as one round per ring: one ring step's concurrent flows carrying all ``2(p-1)``
steps' bytes, which for one ring is exactly ``2(p-1)`` times one step (flows that start
together share max-min, which is scale-invariant in bytes); the output says so.

Targets (printed as PASS/FAIL), per version pair (slurmfm@22.05 vs slurm21-*, slurmfm@24.11
vs slurm2405-*; real-slurm vs the plan for the lab's version): never more leaves than Slurm
unless the plan is predicted faster (leaf count is only a tie-break);
predicted slowdown never worse than the Slurm baseline. With the 24.11 plan: >= 3x fewer
DP-ring edges crossing a leaf than name-order ranks in aggregate; within 2 % of the optimum; a
4,096-node job on a 16,384-node fabric planned in under 0.5 s (median of 5, one core). Exit
status is 0 whatever the targets show (this measures, it does not gate), and 2 when
``--real-lab`` names a lab that is not running.

Usage::

    python scripts/bench_placement.py --quick
    python scripts/bench_placement.py --real-lab /var/tmp/slurmfm-lab/sim-host --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Single-threaded numerics for the timing section (must be set before numpy/scipy load).
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

from slurmfm.catalog.slurm_features import SlurmVersion, supports  # noqa: E402
from slurmfm.plan.cost import CostReport, JobShape, evaluate  # noqa: E402
from slurmfm.plan.slurm_sim import natural_key, rank_order, select_tree  # noqa: E402
from slurmfm.topology.model import Topology  # noqa: E402

PlanFn = Callable[..., Any]
GPUS = 8
TP = 8
SLURM_METHODS = ("slurm21-name", "slurm21-leaf", "slurm2405-name", "slurm2405-leaf")
# One planner run per tree rule set, for a Slurm version of that rule set, and the Slurm
# baselines (simulated under the same rules) it is compared with.
FM_VERSIONS = ("22.05", "24.11")
FM_BASELINES = {
    "22.05": ("slurm21-name", "slurm21-leaf"),
    "24.11": ("slurm2405-name", "slurm2405-leaf"),
}
FM_MAIN = "slurmfm@24.11"  # DP-edge ratio, optimum and speed targets use this plan
FM_METHODS = tuple(f"slurmfm@{v}" for v in FM_VERSIONS)


def fm_version_for(slurm_version: str) -> str:
    """The FM_VERSIONS entry with the same tree rule set as ``slurm_version``."""
    new = supports("tree_selection_rules_2405_3", SlurmVersion.parse(slurm_version))
    return next(
        v
        for v in FM_VERSIONS
        if supports("tree_selection_rules_2405_3", SlurmVersion.parse(v)) == new
    )


def fm_for(method: str, real_version: str = "") -> str:
    """The slurmfm plan a method is compared with (its own Slurm version's plan)."""
    for v, bases in FM_BASELINES.items():
        if method in bases:
            return f"slurmfm@{v}"
    if method == "real-slurm":
        try:
            return f"slurmfm@{fm_version_for(real_version)}"
        except ValueError:
            return FM_MAIN
    if method in FM_METHODS:
        return method
    return FM_MAIN


def load_planner() -> tuple[PlanFn | None, str]:
    """The planner (slurmfm.plan.planner), or None with the reason it did not import."""
    try:
        from slurmfm.plan.planner import plan
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"
    return plan, ""


# ---------------------------------------------------------------------------- fabrics
@dataclass
class Fabric:
    topology: Topology
    switch_order: list[str]  # topology.conf line order (leaves, spines, tops, root)
    conf: str  # topology.conf text in that order
    hosts: list[str]


def make_fabric(
    rng: random.Random,
    n_nodes: int,
    *,
    leaf_size: tuple[int, int] = (4, 24),
    leaves_per_spine: tuple[int, int] = (2, 12),
    spines_per_top: tuple[int, int] = (2, 8),
    host_names: Sequence[str] | None = None,
) -> Fabric:
    """An EC2-like fabric: NN0 (top) / NN1 (spine) / NN2 (leaf) plus a common root.

    Leaves hold an uneven number of instances and host names are a random permutation
    relative to the fabric (EC2 host names follow the private IP, not the network position:
    https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/ec2-instance-naming.html). Switch lines are
    written leaves first in a shuffled
    order, so Slurm's config-order tie-breaks are exercised too.
    """
    hosts = (
        list(host_names)
        if host_names is not None
        else [f"p5-{i:05d}" for i in range(1, n_nodes + 1)]
    )
    perm = hosts[:]
    rng.shuffle(perm)
    leaves: list[list[str]] = []
    k = 0
    while k < len(perm):
        s = rng.randint(*leaf_size)
        leaves.append(perm[k : k + s])
        k += s
    spines: list[list[int]] = []
    j = 0
    while j < len(leaves):
        s = rng.randint(*leaves_per_spine)
        spines.append(list(range(j, min(j + s, len(leaves)))))
        j += s
    tops: list[list[int]] = []
    j = 0
    while j < len(spines):
        s = rng.randint(*spines_per_top)
        tops.append(list(range(j, min(j + s, len(spines)))))
        j += s
    paths: dict[str, list[str]] = {}
    for t_i, sp_list in enumerate(tops):
        for sp in sp_list:
            for lf in spines[sp]:
                for h in leaves[lf]:
                    paths[h] = ["root", f"top{t_i}", f"spine{sp}", f"leaf{lf}"]
    topo = Topology.from_paths(paths)
    leaf_names = [f"leaf{i}" for i in range(len(leaves))]
    rng.shuffle(leaf_names)
    order = leaf_names + [f"spine{i}" for i in range(len(spines))]
    order += [f"top{i}" for i in range(len(tops))] + ["root"]
    lines = [f"SwitchName={lf} Nodes={','.join(leaves[int(lf[4:])])}" for lf in leaf_names]
    lines += [
        f"SwitchName=spine{i} Switches={','.join(f'leaf{x}' for x in lfs)}"
        for i, lfs in enumerate(spines)
    ]
    lines += [
        f"SwitchName=top{i} Switches={','.join(f'spine{x}' for x in sps)}"
        for i, sps in enumerate(tops)
    ]
    lines.append(f"SwitchName=root Switches={','.join(f'top{i}' for i in range(len(tops)))}")
    return Fabric(topo, order, "\n".join(lines) + "\n", hosts)


def make_busy(rng: random.Random, fab: Fabric, fraction: float) -> set[str]:
    """Busy nodes: half from earlier jobs packed by leaf, half scattered (drains, small jobs)."""
    want = int(len(fab.hosts) * fraction)
    busy: set[str] = set()
    leaves = list(fab.topology.leaves)
    while len(busy) < want // 2:
        lf = rng.choice(leaves)
        ns = list(fab.topology.nodes_under(lf))
        busy.update(ns[: rng.randint(1, len(ns))])
    rest = [h for h in fab.hosts if h not in busy]
    busy.update(rng.sample(rest, max(0, want - len(busy))))
    return busy


# ---------------------------------------------------------------------------- cases
@dataclass
class Case:
    name: str
    seed: int
    fabric_nodes: int
    busy_fraction: float
    job: JobShape
    small: bool = False
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def params(self) -> str:
        return (
            f"seed={self.seed} fabric={self.fabric_nodes} busy={self.busy_fraction:.2f} "
            f"nodes={self.job.nodes} tp={self.job.tp} pp={self.job.pp}"
        )


def report_dict(r: CostReport, leaves: int | None = None) -> dict[str, Any]:
    d: dict[str, Any] = dict(r.as_dict())
    if leaves is not None:
        d["leaves_used"] = leaves
    return d


def run_slurm_sims(case: Case, fab: Fabric, free: set[str]) -> None:
    for rules, tag in (("21.08", "slurm21"), ("24.05.3", "slurm2405")):
        chosen = select_tree(
            fab.topology,
            free,
            case.job.nodes,
            rules=rules,  # type: ignore[arg-type]
            switch_order=fab.switch_order,
        )
        for policy in ("name", "leaf"):
            key = f"{tag}-{policy}"
            if chosen is None:
                case.results[key] = {"error": "Slurm would not start the job now"}
                continue
            order = rank_order(
                chosen,
                fab.topology,
                policy=policy,
                switch_order=fab.switch_order,
            )
            case.results[key] = report_dict(evaluate(fab.topology, order, case.job))


def run_planner(plan: PlanFn | None, case: Case, fab: Fabric, busy: set[str]) -> None:
    for version in FM_VERSIONS:
        key = f"slurmfm@{version}"
        if plan is None:
            case.results[key] = {"error": "planner not importable"}
            continue
        try:
            t0 = time.perf_counter()
            # The cluster's topology.conf order and Slurm version are known to a real planner
            # (parsed with the topology, sinfo --version); give it the same shuffled order
            # Slurm's simulation uses.
            p = plan(
                fab.topology,
                case.job,
                unavailable=sorted(busy),
                mode="pin",
                switch_order=fab.switch_order,
                slurm_version=SlurmVersion.parse(version),
            )
            dt = time.perf_counter() - t0
            nodes = list(p.nodes)
            bad = [n for n in nodes if n in busy]
            rep = report_dict(evaluate(fab.topology, nodes, case.job))
            rep["plan_s"] = dt
            if bad:
                rep["error"] = f"planner used busy nodes {bad[:3]}"
            case.results[key] = rep
        except Exception as exc:
            case.results[key] = {"error": f"{type(exc).__name__}: {exc}"}


# ---------------------------------------------------------------------------- optimum
def optimum(
    fab: Fabric, free: set[str], job: JobShape, *, limit: int = 20_000
) -> tuple[dict[str, Any] | None, int]:
    """Exact minimum predicted step time over node subsets and rank orders, or None.

    In the cost model nodes of one leaf are interchangeable (8-GPU nodes are their own NVLink
    domain), so it suffices to enumerate leaf sequences: position i holds "a node of leaf L".
    Unused leaves with the same parent and the same free count are interchangeable too, so a
    new leaf is only opened as the first of its class. Gives up (None) past ``limit`` orders.
    """
    topo = fab.topology
    cap: dict[str, list[str]] = {}
    for n in sorted(free, key=natural_key):
        cap.setdefault(topo.leaf(n), []).append(n)
    leaves = sorted(cap, key=lambda lf: (topo.parent_of[lf] or "", -len(cap[lf]), lf))
    cls = {lf: (topo.parent_of[lf], len(cap[lf])) for lf in leaves}
    best: tuple[float, list[str]] | None = None
    count = 0
    seq: list[str] = []
    used: dict[str, int] = {}

    def rec() -> bool:
        nonlocal best, count
        if len(seq) == job.nodes:
            count += 1
            if count > limit:
                return False
            order = [cap[lf][i] for lf, i in _indexed(seq)]
            r = evaluate(topo, order, job)
            if best is None or r.predicted_s < best[0] - 1e-15:
                best = (r.predicted_s, order)
            return True
        opened: set[tuple[str | None, int]] = set()
        for lf in leaves:
            u = used.get(lf, 0)
            if u >= len(cap[lf]):
                continue
            if u == 0:
                if cls[lf] in opened:
                    continue
                opened.add(cls[lf])
            seq.append(lf)
            used[lf] = u + 1
            ok = rec()
            seq.pop()
            used[lf] = u
            if not ok:
                return False
        return True

    if sum(len(v) for v in cap.values()) < job.nodes:
        return None, 0
    if not rec() or best is None:
        return None, count
    return report_dict(evaluate(topo, best[1], job)), count


def _indexed(seq: Sequence[str]) -> list[tuple[str, int]]:
    seen: dict[str, int] = {}
    out = []
    for lf in seq:
        out.append((lf, seen.get(lf, 0)))
        seen[lf] = seen.get(lf, 0) + 1
    return out


# ---------------------------------------------------------------------------- real Slurm


class LabNotRunning(Exception):
    """``--real-lab`` names a lab whose slurmctld does not answer (or that does not exist)."""


class RealLab:
    """A running scripts/slurm-lab lab (ports from its lab.conf); never the shared ones."""

    def __init__(self, lab_dir: Path) -> None:
        self.dir = lab_dir
        if lab_dir.resolve() in (Path("/var/tmp/slurmfm-lab/host"), Path("/trixie")):
            raise SystemExit(f"refusing to use the shared lab {lab_dir}")
        conf = dict(
            line.split("=", 1)
            for line in (lab_dir / "lab.conf").read_text().splitlines()
            if "=" in line
        )
        self.nodes = int(conf["NODES"])
        self.version = conf.get("VERSION", "")
        out = subprocess.run(
            ["bash", "-c", '. "$1" && env -0', "env", str(lab_dir / "env.sh")],
            capture_output=True,
            check=True,
        ).stdout
        self.env = dict(item.decode().split("=", 1) for item in out.split(b"\0") if b"=" in item)
        self.saved = (lab_dir / "etc" / "topology.conf").read_text()
        self.jobs = lab_dir / "jobs"
        # A stopped lab must not quietly turn the real-slurm column into errors (and its
        # targets into "no data"): ask slurmctld first and stop with one line if it is silent.
        ping = self.run("scontrol", "ping")
        if ping.returncode != 0 or "UP" not in ping.stdout:
            raise LabNotRunning(
                f"bench_placement: --real-lab {lab_dir}: slurmctld does not answer "
                f"({(ping.stdout + ping.stderr).strip().splitlines()[-1:] or ['no output']}); "
                f"start it first: scripts/slurm-lab --lab {lab_dir} up "
                "(ports in scripts/README-lab.md)"
            )

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, check=False, cwd=self.jobs
        )

    def lab(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(REPO / "scripts" / "slurm-lab"), "--lab", str(self.dir), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=300,
        )

    def install(self, conf: str) -> None:
        path = self.jobs / "bench-topology.conf"
        path.write_text(conf)
        proc = self.lab("topology", str(path), "--plugin", "tree")
        if proc.returncode != 0:
            raise RuntimeError(proc.stdout + proc.stderr)

    def cancel_all(self) -> None:
        self.run("scancel", "--full", "-u", "root")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            q = self.run("squeue", "-h", "-o", "%i").stdout.strip()
            states = set(self.run("sinfo", "-h", "-N", "-o", "%t").stdout.split())
            if not q and states <= {"idle"}:
                return
            time.sleep(0.3)

    def make_busy(self, busy: Sequence[str]) -> None:
        """Occupy exactly ``busy`` with one sleeping job (``slurm-lab hold``)."""
        if not busy:
            return
        proc = self.lab("hold", ",".join(busy))
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr)

    def test_only(self, k: int) -> list[str] | None:
        """Slurm's own nodes for a k-node exclusive job now (``slurm-lab pick``), or None."""
        proc = self.lab("pick", str(k))
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr)
        return proc.stdout.split() or None

    def restore(self) -> None:
        self.cancel_all()
        with contextlib.suppress(Exception):
            self.install(self.saved)


# ---------------------------------------------------------------------------- run
def build_cases(quick: bool, seed: int) -> list[Case]:
    rng = random.Random(seed)
    sizes = [8, 16, 32, 64, 128, 256, 512, 1024]
    n = 10 if quick else 40
    if quick:
        sizes = [8, 16, 32, 64, 128, 256]
    cases = []
    for i in range(n):
        nodes = sizes[i % len(sizes)]
        pps = [p for p in (1, 2, 4, 8, 16) if p <= nodes and nodes % p == 0]
        pp = rng.choice(pps)
        busy = rng.uniform(0.3, 0.7)
        need = nodes / (1 - busy) * 1.25
        fabric = next(f for f in (256, 512, 1024, 2048, 4096, 8192) if f >= need)
        cases.append(
            Case(f"c{i:02d}", seed * 1000 + i, fabric, busy, JobShape(nodes, GPUS, tp=TP, pp=pp))
        )
    return cases


def build_small_cases(quick: bool, seed: int, n_nodes: int) -> list[Case]:
    rng = random.Random(seed + 7)
    cases = []
    for i in range(4 if quick else 12):
        nodes = (4, 6, 8, 4)[i % 4]  # exhaustive optimum is affordable up to about 6 nodes
        pp = rng.choice([p for p in (1, 2, 4, 8) if nodes % p == 0])
        busy = rng.uniform(0.3, 0.6)
        cases.append(
            Case(
                f"s{i:02d}",
                seed * 1000 + 500 + i,
                n_nodes,
                busy,
                JobShape(nodes, GPUS, tp=TP, pp=pp),
                small=True,
            )
        )
    return cases


def run_case(
    case: Case,
    plan: PlanFn | None,
    *,
    real: RealLab | None,
    want_opt: bool,
    log: Callable[[str], None],
) -> None:
    rng = random.Random(case.seed)
    if case.small:
        hosts = [f"node{i:03d}" for i in range(1, case.fabric_nodes + 1)]
        fab = make_fabric(
            rng,
            case.fabric_nodes,
            leaf_size=(1, 6),
            leaves_per_spine=(1, 3),
            spines_per_top=(1, 3),
            host_names=hosts,
        )
    else:
        fab = make_fabric(rng, case.fabric_nodes)
    busy = make_busy(rng, fab, case.busy_fraction)
    free = set(fab.hosts) - busy
    if len(free) < case.job.nodes:
        case.results["note"] = {"error": "not enough free nodes"}
        return
    run_planner(plan, case, fab, busy)
    run_slurm_sims(case, fab, free)
    if case.small and want_opt:
        t0 = time.perf_counter()
        rep, count = optimum(fab, free, case.job)
        case.results["optimum"] = rep or {"error": f"gave up after {count} orders"}
        case.results["optimum"]["search_orders"] = count
        case.results["optimum"]["search_s"] = time.perf_counter() - t0
    if case.small and real is not None:
        try:
            real.cancel_all()
            real.install(fab.conf)
            real.make_busy(sorted(busy, key=natural_key))
            chosen = real.test_only(case.job.nodes)
            if chosen is None:
                case.results["real-slurm"] = {"error": "sbatch --test-only: not now"}
            else:
                order = rank_order(chosen, fab.topology, policy="name")
                rep = report_dict(evaluate(fab.topology, order, case.job))
                sim = select_tree(
                    fab.topology, free, case.job.nodes, rules="21.08", switch_order=fab.switch_order
                )
                rep["sim21_agrees"] = sim == chosen
                case.results["real-slurm"] = rep
        except Exception as exc:
            case.results["real-slurm"] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            real.cancel_all()
    log(
        f"  {case.name} {case.params()}: "
        + ", ".join(
            f"{m}={r.get('slowdown', float('nan')):.4f}/{r.get('leaves_used', '-')}L"
            for m, r in case.results.items()
            if "slowdown" in r
        )
    )


def ok(r: dict[str, Any] | None) -> bool:
    return r is not None and "error" not in r and "slowdown" in r


def aggregate(
    cases: list[Case], methods: Sequence[str], real_version: str = ""
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for m in methods:
        rows = [c.results[m] for c in cases if ok(c.results.get(m))]
        if not rows:
            continue
        fm = fm_for(m, real_version)
        pairs = [
            (c.results[m], c.results[fm])
            for c in cases
            if ok(c.results.get(m)) and ok(c.results.get(fm))
        ]
        ratio = [b["slowdown"] / f["slowdown"] for b, f in pairs]
        cross_b = sum(b["dp_edges_cross_leaf"] for b, _ in pairs)
        cross_f = sum(f["dp_edges_cross_leaf"] for _, f in pairs)
        out[m] = {
            "vs": fm,
            "cases": len(rows),
            "failed": sum(1 for c in cases if m in c.results and not ok(c.results[m])),
            "median_slowdown": statistics.median(r["slowdown"] for r in rows),
            "mean_slowdown": statistics.fmean(r["slowdown"] for r in rows),
            "max_slowdown": max(r["slowdown"] for r in rows),
            "leaves_total": sum(r["leaves_used"] for r in rows),
            "dp_cross_leaf_total": sum(r["dp_edges_cross_leaf"] for r in rows),
            "dp_cross_spine_total": sum(r["dp_edges_cross_spine"] for r in rows),
            "pp_cross_leaf_total": sum(r["pp_pairs_cross_leaf"] for r in rows),
            "nvlink_violations": sum(r["nvlink_violations"] for r in rows),
            "paired_cases": len(pairs),
            "median_slowdown_ratio_vs_slurmfm": statistics.median(ratio) if ratio else math.nan,
            "dp_cross_leaf_ratio_vs_slurmfm": (cross_b / cross_f)
            if cross_f
            else (math.inf if cross_b else 1.0),
        }
    return out


def targets(
    cases: list[Case], speed: dict[str, Any], real_version: str = ""
) -> list[tuple[str, bool | None, str]]:
    res: list[tuple[str, bool | None, str]] = []
    # Per version pair: the plan made for Slurm X against Slurm X's own choices.
    for version in FM_VERSIONS:
        fm_key = f"slurmfm@{version}"
        bases = [
            *FM_BASELINES[version],
            *(
                ["real-slurm"]
                if any("real-slurm" in c.results for c in cases)
                and fm_for("real-slurm", real_version) == fm_key
                else []
            ),
        ]
        fm_ok = [c for c in cases if ok(c.results.get(fm_key))]
        fm_fail = [c for c in cases if fm_key in c.results and not ok(c.results[fm_key])]
        worse_leaves = []
        worse_slow = []
        for c in fm_ok:
            f = c.results[fm_key]
            for b in bases:
                r = c.results.get(b)
                if not ok(r):
                    continue
                assert r is not None
                # Leaf count is a tie-break: more leaves only where the plan is
                # predicted faster.
                if f["leaves_used"] > r["leaves_used"] and f["slowdown"] >= r["slowdown"] * (
                    1 - 1e-9
                ):
                    worse_leaves.append(
                        f"{c.name} ({c.params()}) vs {b}: "
                        f"{f['leaves_used']} > {r['leaves_used']} leaves"
                    )
                if f["slowdown"] > r["slowdown"] * (1 + 1e-9):
                    worse_slow.append(
                        f"{c.name} ({c.params()}) vs {b}: {f['slowdown']:.4f} > {r['slowdown']:.4f}"
                    )
        # A planner failure where Slurm would have started the job counts against the targets.
        lost = [
            f"{c.name} ({c.params()}): {c.results[fm_key].get('error')}"
            for c in fm_fail
            if any(ok(c.results.get(b)) for b in bases)
        ]
        have = bool(fm_ok)
        vs = ", ".join(bases)
        res.append(
            (
                f"{fm_key} never more leaves than Slurm {version} unless predicted faster ({vs})",
                (not worse_leaves and not lost) if have else None,
                "; ".join((worse_leaves + lost)[:8]) or f"{len(fm_ok)} cases",
            )
        )
        res.append(
            (
                f"{fm_key} slowdown never worse than Slurm {version} ({vs})",
                (not worse_slow and not lost) if have else None,
                "; ".join((worse_slow + lost)[:8]) or f"{len(fm_ok)} cases",
            )
        )
    fm_ok = [c for c in cases if ok(c.results.get(FM_MAIN))]
    for b in ("slurm21-name", "slurm2405-name", "real-slurm"):
        pairs = [c for c in fm_ok if ok(c.results.get(b))]
        if not pairs:
            continue
        cb = sum(c.results[b]["dp_edges_cross_leaf"] for c in pairs)
        cf = sum(c.results[FM_MAIN]["dp_edges_cross_leaf"] for c in pairs)
        ratio = cb / cf if cf else (math.inf if cb else 1.0)
        res.append(
            (
                f"{FM_MAIN} >= 3x fewer DP edges crossing a leaf than {b}",
                ratio >= 3 if cb else None,
                f"{cb} vs {cf} over {len(pairs)} cases: {ratio:.2f}x",
            )
        )
    opt = [c for c in fm_ok if ok(c.results.get("optimum"))]
    far = [
        f"{c.name} ({c.params()}): {c.results[FM_MAIN]['predicted_s']:.6g} "
        f"vs opt {c.results['optimum']['predicted_s']:.6g}"
        for c in opt
        if c.results[FM_MAIN]["predicted_s"] > 1.02 * c.results["optimum"]["predicted_s"]
    ]
    worst = max(
        (c.results[FM_MAIN]["predicted_s"] / c.results["optimum"]["predicted_s"] for c in opt),
        default=math.nan,
    )
    res.append(
        (
            f"{FM_MAIN} within 2 % of the optimum",
            (not far) if opt else None,
            "; ".join(far[:8]) or f"{len(opt)} cases, worst {100 * (worst - 1):.2f} % above",
        )
    )
    s16 = speed.get("16384")
    if s16 and "plan_median_s" in s16:
        res.append(
            (
                f"{FM_MAIN}: 4,096-node job on a 16,384-node fabric < 0.5 s",
                s16["plan_median_s"] < 0.5,
                f"median {s16['plan_median_s']:.3f} s",
            )
        )
    else:
        res.append(
            (f"{FM_MAIN}: 4,096-node job on a 16,384-node fabric < 0.5 s", None, "not measured")
        )
    s64 = speed.get("65536", {})
    cold = s64.get("cli_cold_cpu_s")
    res.append(
        (
            "65,536-node fabric, 16,384-node job: whole `slurmfm plan` process < 1 s CPU",
            None if cold is None else cold < 1.0,
            "not measured" if cold is None else f"{cold:.2f} s user+system",
        )
    )
    return res


def speed_section(
    plan: PlanFn | None, sizes: Sequence[int], log: Callable[[str], None]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in sizes:
        rng = random.Random(n)
        t0 = time.perf_counter()
        fab = make_fabric(rng, n)
        build = time.perf_counter() - t0
        busy = make_busy(rng, fab, 0.5)
        job = JobShape(n // 4, GPUS, tp=TP, pp=8)
        row: dict[str, Any] = {"fabric_nodes": n, "job_nodes": job.nodes, "build_s": build}
        free = set(fab.hosts) - busy
        t0 = time.perf_counter()
        select_tree(fab.topology, free, job.nodes, rules="21.08", switch_order=fab.switch_order)
        row["slurm_sim_s"] = time.perf_counter() - t0
        if plan is not None:
            times = []
            try:
                kw: dict[str, Any] = {
                    "unavailable": sorted(busy),
                    "mode": "pin",
                    "switch_order": fab.switch_order,
                    "slurm_version": SlurmVersion.parse(FM_MAIN.split("@")[1]),
                }
                plan(fab.topology, job, **kw)  # warm once
                for _ in range(5):
                    t0 = time.perf_counter()
                    plan(fab.topology, job, **kw)
                    times.append(time.perf_counter() - t0)
                row["plan_median_s"] = statistics.median(times)
                row["plan_runs_s"] = times
            except Exception as exc:
                row["error"] = f"{type(exc).__name__}: {exc}"
        if n >= 65536:
            row["cli_cold_cpu_s"] = cold_cli_cpu(fab, busy, job)
        out[str(n)] = row
        log(f"  speed {n}: {row}")
    return out


def cold_cli_cpu(fab: Fabric, busy: set[str], job: JobShape) -> float:
    """CPU seconds (user + system) of one whole ``slurmfm plan`` process on this fabric.

    CPU time rather than wall time: on a shared machine wall time measures the neighbours.
    The process parses the fabric's topology.conf and an ``--unavailable @FILE`` of the busy
    nodes, plans and prints JSON, as a user's first plan would.
    """
    import resource
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "topology.conf"
        conf.write_text(fab.conf)
        bad = Path(tmp) / "busy.txt"
        bad.write_text("\n".join(sorted(busy)))
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        subprocess.run(
            [
                sys.executable,
                "-m",
                "slurmfm.cli",
                "plan",
                "--topology",
                str(conf),
                "--nodes",
                str(job.nodes),
                "--tp",
                str(job.tp),
                "--pp",
                str(job.pp),
                "--unavailable",
                f"@{bad}",
                "--json",
            ],
            cwd=REPO,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdout=subprocess.DEVNULL,
            check=True,
        )
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def print_tables(
    cases: list[Case],
    agg: dict[str, dict[str, Any]],
    tg: list[tuple[str, bool | None, str]],
    speed: dict[str, Any],
    planner_note: str,
) -> None:
    print()
    print("== Per-method aggregate (slowdown = predicted/ideal step comm time; lower is better)")
    hdr = (
        f"{'method':16} {'cases':>5} {'fail':>4} {'med sd':>8} {'mean sd':>8} {'max sd':>8} "
        f"{'leaves':>7} {'dpXleaf':>8} {'dpXspine':>8} {'ppXleaf':>7} {'nvl':>4} "
        f"{'sd÷fm':>7} {'Xleaf÷fm':>8}"
    )
    print(hdr)
    print("-" * len(hdr))
    for m, a in agg.items():
        print(
            f"{m:16} {a['cases']:5d} {a['failed']:4d} {a['median_slowdown']:8.4f} "
            f"{a['mean_slowdown']:8.4f} "
            f"{a['max_slowdown']:8.4f} {a['leaves_total']:7d} {a['dp_cross_leaf_total']:8d} "
            f"{a['dp_cross_spine_total']:8d} {a['pp_cross_leaf_total']:7d} "
            f"{a['nvlink_violations']:4d} "
            f"{a['median_slowdown_ratio_vs_slurmfm']:7.3f} "
            f"{a['dp_cross_leaf_ratio_vs_slurmfm']:8.2f}"
        )
    print(
        "(sd÷fm: median over cases of baseline slowdown / slurmfm slowdown; Xleaf÷fm: total DP"
        " ring edges crossing a leaf, baseline / slurmfm, over the same cases; each baseline is"
        " compared with the slurmfm plan for its own Slurm version: slurm21-* with"
        " slurmfm@22.05, slurm2405-* with slurmfm@24.11, real-slurm with the lab version's,"
        f" optimum with {FM_MAIN})"
    )
    if planner_note:
        print(f"slurmfm planner unavailable: {planner_note}")
    print()
    print(
        f"== Speed ({FM_MAIN} plan(): median of 5 runs, one core; job = fabric/4 nodes, TP8 PP8,"
        " 50 % busy)"
    )
    print(f"{'fabric':>7} {'job':>6} {'build s':>8} {'slurm-sim s':>11} {'plan med s':>10}")
    for row in speed.values():
        pm = row.get("plan_median_s")
        print(
            f"{row['fabric_nodes']:7d} {row['job_nodes']:6d} {row['build_s']:8.2f} "
            f"{row['slurm_sim_s']:11.3f} "
            f"{(f'{pm:10.3f}' if pm is not None else row.get('error', 'n/a')[:40]):>10}"
        )
    print()
    print("== Targets")
    print(
        "(leaves/slowdown: per version pair, slurmfm@V vs Slurm V's own choice; DP edges,"
        f" optimum and speed: the {FM_MAIN} plan)"
    )
    for name, passed, detail in tg:
        tag = "PASS" if passed else ("N/A " if passed is None else "FAIL")
        print(f"{tag}  {name}: {detail}")


# ---------------------------------------------------------------------------- simulated time
SIM_OVERSUB = (1, 2, 4)
# The fewest >= 64-node ratios whose median the sim section calls PASS or FAIL.
SIM_MIN_CASES_FOR_VERDICT = 10
# Above this many nodes a case simulates no random placements (they only feed the model's
# rank correlation, which the smaller cases measure) and the ring runs as one round.
SIM_RANDOM_MAX_NODES = 1024
SIM_ROUNDS_NOTE = (
    "jobs above 1,024 nodes: each DP ring simulated as one round carrying all 2(p-1) ring "
    "steps' bytes (one step's concurrent flows; exactly 2(p-1) steps for one ring, see "
    "slurmfm.plan.simulate); no random placements"
)
# Exact optima (MILP, bench.optimum) for PP=1 jobs in this size range.
OPT_MIN_NODES = 64
OPT_MAX_NODES = 2048


def make_fabric4(rng: random.Random, n_nodes: int) -> Fabric:
    """A 4-level fabric (p6-b200/b300 report 4 NetworkNodes): the 3-level one under pods."""
    base = make_fabric(rng, n_nodes)
    topo = base.topology
    tops = sorted(
        (s for s, p in topo.parent_of.items() if p == topo.root), key=lambda s: int(s[3:])
    )
    per_pod = max(1, math.ceil(len(tops) / 4))
    pod_of = {t: f"pod{i // per_pod}" for i, t in enumerate(tops)}
    paths = {h: ("root", pod_of[p[1]], *p[1:]) for h in base.hosts for p in [topo.path(h)]}
    topo4 = Topology.from_paths(paths)
    pods = sorted(set(pod_of.values()), key=lambda p: int(p[3:]))
    order = [s for s in base.switch_order if s != "root"] + pods + ["root"]
    return Fabric(topo4, order, base.conf, base.hosts)


def make_gb200(rng: random.Random, n_nodes: int) -> Fabric:
    """GB200 NVL72: 18-instance UltraServers (one NVLink domain each) as leaves of the fabric."""
    from slurmfm.topology.model import Node

    n_us = max(2, n_nodes // 18)
    hosts = [f"gb-{i:05d}" for i in range(1, n_us * 18 + 1)]
    paths: dict[str, tuple[str, ...]] = {}
    nodes = []
    per_spine = rng.randint(4, 8)
    for u in range(n_us):
        for k in range(18):
            h = hosts[u * 18 + k]
            spine = u // per_spine
            paths[h] = ("root", f"top{spine // 4}", f"spine{spine}", f"us{u}")
            nodes.append(Node(h, nvlink_domain=f"us{u}"))
    topo = Topology.from_paths(paths, nodes)
    leaves = [f"us{u}" for u in range(n_us)]
    rng.shuffle(leaves)
    inner = sorted(
        (s for s in topo.parent_of if s not in leaves and s != "root"),
        key=lambda s: (topo.level(s), s),
    )
    return Fabric(topo, [*leaves, *inner, "root"], "", hosts)


def make_busy_gb200(rng: random.Random, fab: Fabric, fraction: float) -> set[str]:
    """Busy GB200 nodes: earlier jobs' segments inside one UltraServer each, a few drains.

    GB200 jobs ask ``--segment`` so that each segment shares an NVLink domain (topology.html),
    so what is busy comes in per-UltraServer chunks (2-18 nodes); one busy node in twenty
    is a lone drained node. :func:`make_busy`'s half-scattered pattern would leave hardly
    any UltraServer with a segment's worth of free nodes, and Slurm's block plugin would
    start no job at all.
    """
    want = int(len(fab.hosts) * fraction)
    busy: set[str] = set(rng.sample(fab.hosts, want // 20))
    domains = list(fab.topology.leaves)
    while len(busy) < want:
        us = rng.choice(domains)
        free = [n for n in sorted(fab.topology.nodes_under(us), key=natural_key) if n not in busy]
        if free:
            k = min(len(free), rng.choice((2, 4, 8, 9, 16, 18)), want - len(busy))
            busy.update(free[:k])
    return busy


@dataclass
class SimCase:
    name: str
    kind: str  # "3-level", "4-level", "gb200"
    seed: int
    fabric_nodes: int
    busy_fraction: float
    job: JobShape
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # per oversubscription


def build_sim_cases(quick: bool, seed: int, max_nodes: int = 4096) -> list[SimCase]:
    """Jobs of 8-4,096 nodes (quick: 8-256; at most ``max_nodes``) on 3- and 4-level fabrics
    and GB200 blocks.

    Every size up to 1,024 nodes twice (every other job without PP, which the exact optimum
    covers); 2,048 and 4,096 nodes once each, one with PP and one without: one simulation of
    a 4,096-node job costs about 20 s CPU (:data:`SIM_ROUNDS_NOTE`) and each case simulates
    every distinct placement at three oversubscriptions.
    """
    rng = random.Random(seed + 99)
    sizes = [8, 32, 64, 128, 256] if quick else [8, 16, 32, 64, 128, 256, 512, 1024]
    plan_sizes = [(n, i % 2 == 0) for i, n in enumerate(sizes * (1 if quick else 2))]
    if not quick:
        plan_sizes += [(2048, False), (4096, True)]
    kinds = ("3-level", "4-level", "gb200")
    out = []
    for i, (nodes, flat) in enumerate(plan_sizes):
        if nodes > max_nodes:
            continue
        kind = kinds[i % len(kinds)]
        gpus, tp = (4, 4) if kind == "gb200" else (GPUS, TP)
        pps = [p for p in (1, 2, 4, 8) if nodes % p == 0 and nodes // p >= 2]
        pp = 1 if flat else rng.choice(pps)
        busy = rng.uniform(0.3, 0.7)
        need = nodes / (1 - busy) * 1.25
        fabric = next(
            f for f in (64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768) if f >= need
        )
        out.append(
            SimCase(
                f"t{i:02d}",
                kind,
                seed * 1000 + 700 + i,
                fabric,
                busy,
                JobShape(nodes, gpus, tp=tp, pp=pp),
            )
        )
    return out


def oversub_params(o: float) -> Any:
    from slurmfm.plan.cost import CostParams

    return CostParams.from_mapping(
        {"tiers": {t: {"oversubscription": o} for t in ("leaf", "spine", "core")}}
    )


def slurm_block_orders(topo: Topology, free: set[str], job: JobShape) -> dict[str, list[str]]:
    """Slurm's ``topology/block`` choice for a GB200 job, without and with ``--segment``
    (``slurm_sim.block_choices``: one ``BlockName`` per UltraServer in fabric order,
    ``BlockSizes=18,36,72,...``), ranks in name order (Slurm up to 25.11) and block order
    (26.05's topology order). A job Slurm would leave pending gets no entry."""
    from slurmfm.plan.slurm_sim import block_choices

    names = sorted(topo.leaves, key=natural_key)
    out: dict[str, list[str]] = {}
    for label, chosen in block_choices(topo, free, job.nodes, rules="24.11", block_order=names):
        tag = "slurmblkseg" if "segment" in label else "slurmblk"
        out[f"{tag}-name"] = rank_order(chosen, topo, policy="name")
        out[f"{tag}-leaf"] = rank_order(chosen, topo, policy="leaf", switch_order=names)
    return out


# Baselines per fabric kind: (plan version, name-order baseline, topology-order baseline).
# GB200 clusters run topology/block (ParallelCluster >= 3.14 and HyperPod configure it for
# p6e-gb200), so there Slurm's own choice is the block plugin's, with and without --segment.
TREE_BASELINES = (
    ("22.05", "slurm21-name", "slurm21-leaf"),
    ("24.11", "slurm2405-name", "slurm2405-leaf"),
)
BLOCK_BASELINES = (
    ("24.11", "slurmblk-name", "slurmblk-leaf"),
    ("24.11", "slurmblkseg-name", "slurmblkseg-leaf"),
)


def run_sim_case(case: SimCase, plan: PlanFn, log: Callable[[str], None]) -> None:
    """Plan, Slurm's choices and two random placements, simulated at each oversubscription."""
    from slurmfm.plan import simulate as sim

    rng = random.Random(case.seed)
    maker = {"3-level": make_fabric, "4-level": make_fabric4, "gb200": make_gb200}[case.kind]
    fab = maker(rng, case.fabric_nodes)
    busy = (make_busy_gb200 if case.kind == "gb200" else make_busy)(rng, fab, case.busy_fraction)
    free = set(fab.hosts) - busy
    if len(free) < case.job.nodes:
        return
    job, topo = case.job, fab.topology
    slurm: dict[str, list[str]] = {}
    for rules, tag in (("21.08", "slurm21"), ("24.05.3", "slurm2405")):
        chosen = select_tree(topo, free, job.nodes, rules=rules, switch_order=fab.switch_order)  # type: ignore[arg-type]
        if chosen is None:
            return
        slurm[f"{tag}-leaf"] = rank_order(
            chosen, topo, policy="leaf", switch_order=fab.switch_order
        )
        slurm[f"{tag}-name"] = rank_order(chosen, topo, policy="name")
    if case.kind == "gb200":
        slurm.update(slurm_block_orders(topo, free, job))
    randoms = []
    free_sorted = sorted(free, key=natural_key)
    for _ in range(2 if job.nodes <= SIM_RANDOM_MAX_NODES else 0):
        sub = rng.sample(free_sorted, job.nodes)
        randoms.append(sorted(sub, key=natural_key))
    for o in SIM_OVERSUB:
        params = oversub_params(o)
        orders: dict[str, list[str]] = {}
        plan_s = 0.0
        for version in FM_VERSIONS:
            for prefix, check in (("slurmfm", False), ("slurmfm+sim", True)):
                t0 = time.perf_counter()
                p = plan(
                    topo,
                    job,
                    unavailable=sorted(busy),
                    mode="pin",
                    switch_order=fab.switch_order,
                    slurm_version=SlurmVersion.parse(version),
                    params=params,
                    simulate=check,
                )
                if not check:
                    plan_s = max(plan_s, time.perf_counter() - t0)
                orders[f"{prefix}@{version}"] = list(p.nodes)
        orders.update(slurm)
        for i, r in enumerate(randoms):
            orders[f"random{i}"] = r
        if OPT_MIN_NODES <= job.nodes <= OPT_MAX_NODES:
            from bench import optimum as opt

            best = opt.exact(topo, job, free, params)
            if best is not None:
                orders["optimum"] = list(best.order)
        bound = None
        if "optimum" not in orders:
            from bench import optimum as opt

            bound = opt.lower_bound(topo, job, free, params)
        names = list(orders)
        reps = sim.simulate_many(
            topo, [orders[n] for n in names], job, params, sim.SimParams.uniform(o)
        )
        simulated = {n: r.makespan_s for n, r in zip(names, reps, strict=True)}
        model = {n: evaluate(topo, orders[n], job, params).predicted_s for n in names}
        case.rows[o] = {
            "sim": simulated,
            "model": model,
            "dp_cross": {
                n: evaluate(topo, orders[n], job, params).dp_edges_cross_leaf for n in names
            },
            "plan_s": plan_s,
            "lower_bound": bound,
        }
        log(
            f"  {case.name} {case.kind} nodes={job.nodes} pp={job.pp} o={o}: "
            + ", ".join(f"{n}={t * 1e3:.2f}ms" for n, t in simulated.items())
        )


def sim_summary(cases: list[SimCase], prefix: str) -> dict[str, Any]:
    """Per oversubscription: plan vs Slurm (same rules, topology and name order), agreement.

    ``prefix``: ``slurmfm`` (the cost model alone) or ``slurmfm+sim`` (plus the planner's
    simulation check against Slurm's choice).
    """
    from slurmfm.plan import simulate as sim

    out: dict[str, Any] = {}
    for o in SIM_OVERSUB:
        ratios: dict[str, list[float]] = {"leaf": [], "name": []}
        big: list[float] = []
        rhos: list[float] = []
        conc: list[float] = []
        gain_err: list[float] = []
        opt_gap_model: list[float] = []
        opt_gap_sim: list[float] = []
        bound_gap: list[float] = []
        slower: list[str] = []
        more_cross: list[str] = []
        block: dict[str, list[float]] = {"slurmblk-leaf": [], "slurmblkseg-leaf": []}
        block_cases = pending = 0
        for c in cases:
            row = c.rows.get(o)
            if row is None:
                continue
            s, m, x = row["sim"], row["model"], row["dp_cross"]
            bases = BLOCK_BASELINES if c.kind == "gb200" else TREE_BASELINES
            if c.kind == "gb200":
                block_cases += 1
                pending += sum(1 for _, _, leaf_b in bases if leaf_b not in s)
            for version, name_b, leaf_b in bases:
                if leaf_b not in s:
                    continue  # Slurm would leave the job pending
                fm = f"{prefix}@{version}"
                r_leaf = s[fm] / s[leaf_b]
                ratios["leaf"].append(r_leaf)
                ratios["name"].append(s[fm] / s[name_b])
                if c.job.nodes >= 64:
                    big.append(r_leaf)
                if leaf_b in block:
                    block[leaf_b].append(r_leaf)
                if r_leaf > 1 + 1e-6:
                    slower.append(f"{c.name}@{version} vs {leaf_b} x{r_leaf:.4f}")
                if x[fm] > x[leaf_b] and s[fm] >= s[leaf_b] * (1 - 1e-6):
                    more_cross.append(f"{c.name}@{version} {x[fm]} vs {x[leaf_b]}")
                gain_s = 1 - s[fm] / s[leaf_b]
                gain_m = 1 - m[fm] / m[leaf_b]
                gain_err.append(abs(gain_m - gain_s))
                if row.get("lower_bound"):
                    bound_gap.append(m[fm] / row["lower_bound"] - 1)
                if "optimum" in m:
                    opt_gap_model.append(m[fm] / m["optimum"] - 1)
                    opt_gap_sim.append(s[fm] / s["optimum"] - 1)
            names = list(s)
            rhos.append(sim.spearman([m[n] for n in names], [s[n] for n in names]))
            conc.append(sim.concordance([m[n] for n in names], [s[n] for n in names]))
        if not ratios["leaf"]:
            continue
        out[str(o)] = {
            "cases": len(rhos),
            "vs_slurm_leaf_median": statistics.median(ratios["leaf"]),
            "vs_slurm_leaf_worst": max(ratios["leaf"]),
            "vs_slurm_name_median": statistics.median(ratios["name"]),
            "vs_slurm_name_worst": max(ratios["name"]),
            "ge64_vs_slurm_leaf_median": statistics.median(big) if big else None,
            "ge64_cases": len(big),
            "slower_than_slurm": slower,
            "more_crossings_without_gain": more_cross,
            "spearman_median": statistics.median(rhos),
            "spearman_min": min(rhos),
            "concordance_median": statistics.median(conc),
            "concordance_min": min(conc),
            "gain_error_median": statistics.median(gain_err),
            "gain_error_max": max(gain_err),
            "optimum_cases": len(opt_gap_model),
            "optimum_gap_model_median": statistics.median(opt_gap_model) if opt_gap_model else None,
            "optimum_gap_model_max": max(opt_gap_model) if opt_gap_model else None,
            "optimum_gap_sim_median": statistics.median(opt_gap_sim) if opt_gap_sim else None,
            "optimum_gap_sim_max": max(opt_gap_sim) if opt_gap_sim else None,
            "bound_cases": len(bound_gap),
            "bound_gap_model_median": statistics.median(bound_gap) if bound_gap else None,
            "bound_gap_model_max": max(bound_gap) if bound_gap else None,
            "gb200_cases": block_cases,
            "gb200_block_pending": pending,
            **{
                f"vs_{k.removesuffix('-leaf')}_{stat}": (fn(v) if v else None)
                for k, v in block.items()
                for stat, fn in (("median", statistics.median), ("worst", max))
            },
        }
    return out


def print_sim(summary: dict[str, Any], seconds: float, n_cases: int, prefix: str) -> None:
    print(
        f"\nsimulated communication time (SimGrid, {n_cases} cases, {seconds:.1f} s), {prefix}: "
        "ratio = plan / baseline (< 1: the plan is faster); Slurm's choice with its own rule set"
    )
    print(
        f"{'o':>3} {'vs Slurm topo order':>22} {'vs Slurm name order':>22} "
        f"{'>=64 nodes':>11} {'spearman':>14} {'concordance':>14} {'gain err':>14}"
    )
    for o, r in summary.items():
        big = r["ge64_vs_slurm_leaf_median"]
        print(
            f"{o:>3} {r['vs_slurm_leaf_median']:>10.4f} / {r['vs_slurm_leaf_worst']:<9.4f} "
            f"{r['vs_slurm_name_median']:>10.4f} / {r['vs_slurm_name_worst']:<9.4f} "
            f"{(f'{big:.4f}' if big is not None else '-'):>11} "
            f"{r['spearman_median']:>6.3f} / {r['spearman_min']:<5.3f} "
            f"{r['concordance_median']:>6.3f} / {r['concordance_min']:<5.3f} "
            f"{r['gain_error_median']:>6.3f} / {r['gain_error_max']:<5.3f}"
        )
    print("(median / worst; spearman, concordance: median / min per case; gain err: median / max)")
    for o, r in summary.items():
        if r["gb200_cases"]:
            print(
                f"o={o}: GB200 ({r['gb200_cases']} cases) vs Slurm's topology/block choice, "
                "block order: "
                + "; ".join(
                    f"{label} median {r[f'vs_{k}_median']:.4f} / worst {r[f'vs_{k}_worst']:.4f}"
                    if r[f"vs_{k}_median"] is not None
                    else f"{label} no case"
                    for k, label in (("slurmblk", "-N only"), ("slurmblkseg", "--segment"))
                )
                + f"; {r['gb200_block_pending']} choices Slurm would leave pending"
            )
    for o, r in summary.items():
        if r["optimum_cases"]:
            print(
                f"o={o}: gap to the exact optimum (MILP, PP=1, {OPT_MIN_NODES}-{OPT_MAX_NODES} "
                f"nodes, {r['optimum_cases']} plans): model median "
                f"{100 * r['optimum_gap_model_median']:.2f} % / max "
                f"{100 * r['optimum_gap_model_max']:.2f} %; simulated median "
                f"{100 * r['optimum_gap_sim_median']:.2f} % / max "
                f"{100 * r['optimum_gap_sim_max']:.2f} %"
            )
    for o, r in summary.items():
        if r["bound_cases"]:
            print(
                f"o={o}: gap to a proven lower bound (optimum.lower_bound; PP > 1 and GB200, "
                f"{r['bound_cases']} plans): model median "
                f"{100 * r['bound_gap_model_median']:.2f} % / max "
                f"{100 * r['bound_gap_model_max']:.2f} % (the gap to the optimum is at most this)"
            )
    for o, r in summary.items():
        target = r["ge64_vs_slurm_leaf_median"]
        print(
            f"o={o}: never slower than Slurm's choice: "
            + (
                "PASS"
                if not r["slower_than_slurm"]
                else "FAIL " + ", ".join(r["slower_than_slurm"][:5])
            )
            + "; more DP leaf crossings than Slurm's topology order without a gain: "
            + (", ".join(r["more_crossings_without_gain"][:5]) or "none")
        )
        if o == "2":
            n_big = r.get("ge64_cases", 0)
            # A median of a handful of ratios supports no verdict (--quick once printed PASS
            # on 4 ratios while the full run said the target was not met).
            verdict = (
                ("PASS" if target <= 0.9 else "FAIL")
                if n_big >= SIM_MIN_CASES_FOR_VERDICT
                else f"NO VERDICT ({n_big} ratios < {SIM_MIN_CASES_FOR_VERDICT})"
            )
            print(
                "target >= 10 % less simulated comm time than Slurm (median, >= 64 nodes, o=2): "
                + (
                    f"{verdict} ({(1 - target) * 100:.1f} % less)"
                    if target is not None
                    else "no case"
                )
                + "; this simulator is the planner's own check: scripts/bench_referee.py judges"
                " placements with a referee the planner cannot see"
            )


def run_sim_section(
    quick: bool,
    seed: int,
    plan: PlanFn | None,
    log: Callable[[str], None],
    max_nodes: int = 4096,
) -> dict[str, Any]:
    """The simulated-time section (needs SimGrid; says so and returns {} without it)."""
    from slurmfm.plan import simulate as sim

    if plan is None:
        return {}
    if not sim.available():
        print("\nsimulated time: skipped, SimGrid is not installed (python3-simgrid)")
        return {}
    t1 = time.perf_counter()
    sim_cases = build_sim_cases(quick, seed, max_nodes)
    if any(c.job.nodes > SIM_RANDOM_MAX_NODES for c in sim_cases):
        print(f"\nsimulated time: {SIM_ROUNDS_NOTE}")
    for sc in sim_cases:
        run_sim_case(sc, plan, log)
    seconds = time.perf_counter() - t1
    out = {}
    for prefix in ("slurmfm", "slurmfm+sim"):
        out[prefix] = sim_summary(sim_cases, prefix)
        print_sim(out[prefix], seconds, len(sim_cases), prefix)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick", action="store_true", help="a short run (fewer, smaller cases; 1k/4k/16k speed)"
    )
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--real-lab", type=Path, help="a running scripts/slurm-lab lab dir (not a shared one)"
    )
    ap.add_argument("--no-optimum", action="store_true")
    ap.add_argument(
        "--speed-sizes", default=None, help="comma list (default 1024,4096,16384,65536)"
    )
    ap.add_argument(
        "--no-sim", action="store_true", help="skip the SimGrid section (simulated time)"
    )
    ap.add_argument("--json", type=Path, help="write all results as JSON here")
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument(
        "--sim-only", action="store_true", help="only the SimGrid section (simulated time)"
    )
    ap.add_argument(
        "--sim-max-nodes",
        type=int,
        default=4096,
        help="largest job of the SimGrid section (default 4096)",
    )
    args = ap.parse_args(argv)
    log = (lambda s: print(s, flush=True)) if args.verbose else (lambda s: None)

    plan, note = load_planner()
    if args.sim_only:
        out = run_sim_section(args.quick, args.seed, plan, log, args.sim_max_nodes)
        if args.json:
            args.json.write_text(json.dumps({"simulated": out}, indent=1, default=str))
        return 0
    try:
        real = RealLab(args.real_lab) if args.real_lab else None
    except (LabNotRunning, OSError, KeyError, subprocess.CalledProcessError) as exc:
        msg = str(exc) if isinstance(exc, LabNotRunning) else f"not a lab: {exc}"
        print(
            msg if msg.startswith("bench_placement") else f"bench_placement: {msg}", file=sys.stderr
        )
        return 2
    small_nodes = real.nodes if real else 32
    cases = build_cases(args.quick, args.seed) + build_small_cases(
        args.quick, args.seed, small_nodes
    )
    t0 = time.perf_counter()
    try:
        for c in cases:
            run_case(c, plan, real=real, want_opt=not args.no_optimum, log=log)
    finally:
        if real is not None:
            real.restore()
    cases_s = time.perf_counter() - t0
    sizes = (
        [int(x) for x in args.speed_sizes.split(",")]
        if args.speed_sizes
        else ([1024, 4096, 16384] if args.quick else [1024, 4096, 16384, 65536])
    )
    speed = speed_section(plan, sizes, log)
    methods = [*FM_METHODS, *SLURM_METHODS, "real-slurm", "optimum"]
    real_version = real.version if real else ""
    agg = aggregate(cases, methods, real_version)
    tg = targets(cases, speed, real_version)
    print(
        f"placement bench: {len(cases)} cases ({sum(c.small for c in cases)} small) "
        f"in {cases_s:.1f} s; "
        f"real lab: {real.dir if real else 'none'}"
    )
    agree = [
        c.results["real-slurm"].get("sim21_agrees")
        for c in cases
        if ok(c.results.get("real-slurm"))
    ]
    if agree:
        print(
            f"real Slurm {real.version if real else ''} vs slurm_sim(21.08): "
            f"{sum(bool(a) for a in agree)}/{len(agree)} identical node sets"
        )
    print_tables(cases, agg, tg, speed, note)
    sim_out = (
        {} if args.no_sim else run_sim_section(args.quick, args.seed, plan, log, args.sim_max_nodes)
    )
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cases": [
                        {
                            "name": c.name,
                            "params": c.params(),
                            "small": c.small,
                            "results": c.results,
                        }
                        for c in cases
                    ],
                    "aggregate": agg,
                    "targets": [{"target": n, "pass": p, "detail": d} for n, p, d in tg],
                    "speed": speed,
                    "planner_note": note,
                    "simulated": sim_out,
                },
                indent=1,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    rc = 0
    try:
        rc = main()
    except Exception as exc:
        print(f"bench_placement: error: {type(exc).__name__}: {exc}", file=sys.stderr)
    sys.exit(rc)
