#!/usr/bin/env python3
"""Placement judged by a referee the planner cannot see: busy clusters and other jobs' traffic.

Why: ``bench_placement.py`` scores the planner with the planner's own cost model and the
simulator it consults; agreement with oneself is not quality. Here every placement is
judged by :mod:`bench.referee`: physical uplinks shared by all jobs at an oversubscription the
planner is not told (1, 2 or 4), NCCL-like collectives (ring or tree as NCCL's tuner picks,
pipeline point-to-point), and other jobs running rings on the busy nodes (the Philly trace's
size mix, placed one after another by Slurm's own tree rules, then churned). The planner gets
what a user has: the topology, the busy node set and the Slurm version.

Compared, on the same free nodes (jobs of >= 64 nodes, clusters 50-80 % busy):

* ``plan``: ``slurmfm.plan.planner.plan`` (pin mode: the job runs on these nodes in this order);
* ``slurm-topo``: Slurm's own node choice (``slurm_sim.select_tree``, the cluster's version's
  rules) in topology (leaf) rank order, 26.05's default;
* ``slurm-name``: the same nodes in node-name rank order, every release before 26.05.

Reported per case and as medians: communication time of one step (gain = 1 - plan/slurm),
step time with compute overlap, how much the job slows the running jobs, leaf switches used
and the free capacity it leaves (largest free run in one leaf / one spine). Every case where the
plan is slower than ``slurm-topo`` is listed.

Seeds: the held-out seeds :data:`HELD_OUT_SEEDS` were fixed when this script was written,
before it was first run; ``--quick`` runs the first two and prints **no verdict** on a target
(its sample is below :data:`MIN_CASES_FOR_VERDICT` cases), only the numbers.

Usage::

    python scripts/bench_referee.py --quick
    python scripts/bench_referee.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import bench_placement as bp  # noqa: E402

from bench.referee import PHILLY_NODE_MIX, FabricParams, StepTraffic, fill, judge  # noqa: E402
from bench.referee import cluster as cl  # noqa: E402
from slurmfm.catalog.slurm_features import SlurmVersion  # noqa: E402
from slurmfm.plan.cost import JobShape  # noqa: E402
from slurmfm.plan.slurm_sim import Rules, rank_order, select_tree  # noqa: E402
from slurmfm.topology.model import Topology  # noqa: E402

# Fixed before the first run (held-out seeds chosen before running); never tuned. The planner's
# robustness rule was designed after seeing them, so --seeds 2231 ... 2238 (chosen before that
# set was run) is the confirmation set docs/placement-plans.md reports too.
HELD_OUT_SEEDS = (2201, 2202, 2203, 2204, 2205, 2206, 2207, 2208)
OVERSUB = (1.0, 2.0, 4.0)
MIN_CASES_FOR_VERDICT = 30
VERSIONS: dict[str, tuple[SlurmVersion, Rules]] = {
    "22.05": (SlurmVersion.parse("22.05.8"), "21.08"),
    "24.11": (SlurmVersion.parse("24.11.5"), "24.05.3"),
}
METHODS = ("plan", "slurm-topo", "slurm-name")


@dataclass
class Case:
    name: str
    seed: int
    kind: str  # 3-level / 4-level
    fabric_nodes: int
    busy: float
    job: JobShape
    version: str
    rows: dict[float, dict[str, dict[str, float]]] = field(default_factory=dict)
    leaves: dict[str, int] = field(default_factory=dict)
    free_leaf: dict[str, int] = field(default_factory=dict)
    free_spine: dict[str, int] = field(default_factory=dict)
    note: str = ""
    differs: bool = False  # the plan's nodes or order differ from Slurm's in topology order


def build_cases(seeds: Sequence[int]) -> list[Case]:
    """Per seed: 64- to 256-node jobs (PP 1, 2 or 4) on 3- and 4-level fabrics."""
    out: list[Case] = []
    for seed in seeds:
        rng = random.Random(seed)
        for i, nodes in enumerate((64, 96, 128, 192, 256)):
            kind = ("3-level", "4-level")[(seed + i) % 2]
            busy = rng.uniform(0.5, 0.8)
            need = nodes / (1 - busy) * 1.3
            fabric = next(f for f in (512, 1024, 2048, 4096) if f >= need)
            pp = rng.choice((1, 2, 4))
            version = ("22.05", "24.11")[(seed + i) % 2]
            out.append(
                Case(
                    f"s{seed}-{nodes}",
                    seed * 10 + i,
                    kind,
                    fabric,
                    busy,
                    JobShape(nodes, 8, tp=8, pp=pp),
                    version,
                )
            )
    return out


def _free_runs(topo: Topology, free: set[str]) -> tuple[int, int]:
    """The largest number of free nodes under one leaf and under one spine (level 1)."""
    leaf = max((sum(n in free for n in topo.nodes_under(lf)) for lf in topo.leaves), default=0)
    spines = [s for s in topo.parent_of if topo.level(s) == 1]
    spine = max((sum(n in free for n in topo.nodes_under(s)) for s in spines), default=0)
    return leaf, spine


def run_case(
    case: Case, plan: Callable[..., Any], log: Callable[[str], None], algorithm: str = "auto"
) -> None:
    rng = random.Random(case.seed)
    make = bp.make_fabric if case.kind == "3-level" else bp.make_fabric4
    fab = make(rng, case.fabric_nodes)
    topo = fab.topology
    version, rules = VERSIONS[case.version]
    background = fill(topo, case.busy, seed=case.seed, rules=rules, switch_order=fab.switch_order)
    busy = {n for j in background for n in j.order}
    free = set(topo.nodes) - busy
    chosen = select_tree(topo, free, case.job.nodes, rules=rules, switch_order=fab.switch_order)
    if chosen is None:
        case.note = "Slurm would not start the job now (no switch has room)"
        return
    p = plan(
        topo,
        case.job,
        unavailable=busy,
        switch_order=fab.switch_order,
        slurm_version=version,
    )
    orders = {
        "plan": list(p.nodes),
        "slurm-topo": rank_order(chosen, topo, policy="leaf", switch_order=fab.switch_order),
        "slurm-name": rank_order(chosen, topo, policy="name"),
    }
    case.differs = orders["plan"] != orders["slurm-topo"]
    for m, order in orders.items():
        case.leaves[m] = len({topo.leaf_of[n] for n in order})
        case.free_leaf[m], case.free_spine[m] = _free_runs(topo, free - set(order))
    traffic = StepTraffic(algorithm=algorithm)
    for o in OVERSUB:
        params = FabricParams.uniform(o)
        case.rows[o] = {}
        for m, order in orders.items():
            v = judge(
                topo,
                order,
                gpus_per_node=case.job.gpus_per_node,
                tp=case.job.tp,
                pp=case.job.pp,
                background=background,
                params=params,
                traffic=traffic,
            )
            case.rows[o][m] = {
                "comm_s": v.comm_s,
                "step_s": v.step_s,
                "others_mean": v.others_slowdown_mean,
                "others_max": v.others_slowdown_max,
            }
        log(
            f"{case.name} o={o:g}: "
            + ", ".join(f"{m} {r['comm_s'] * 1e3:.2f} ms" for m, r in case.rows[o].items())
        )


def _gain(case: Case, o: float, base: str, key: str = "comm_s") -> float:
    r = case.rows[o]
    return 1 - r["plan"][key] / r[base][key]


def summarize(cases: Sequence[Case]) -> dict[str, Any]:
    done = [c for c in cases if c.rows]
    out: dict[str, Any] = {"cases": len(done), "skipped": [c.name for c in cases if not c.rows]}
    for o in OVERSUB:
        s: dict[str, Any] = {}
        for base in ("slurm-topo", "slurm-name"):
            g = [_gain(c, o, base) for c in done]
            st = [_gain(c, o, base, "step_s") for c in done]
            gd = [_gain(c, o, base) for c in done if c.differs]
            s[base] = {
                "median_comm_gain": statistics.median(g) if g else None,
                "median_comm_gain_where_differs": statistics.median(gd) if gd else None,
                "worst_comm_gain": min(g, default=None),
                "median_step_gain": statistics.median(st) if st else None,
                "losses": [
                    (c.name, round(-_gain(c, o, base) * 100, 2))
                    for c in done
                    if _gain(c, o, base) < -1e-6
                ],
            }
        s["others_slowdown_plan_median"] = (
            statistics.median(c.rows[o]["plan"]["others_mean"] for c in done) if done else None
        )
        s["others_slowdown_slurm_median"] = (
            statistics.median(c.rows[o]["slurm-topo"]["others_mean"] for c in done)
            if done
            else None
        )
        s["others_slowed_cases"] = {
            m: [c.name for c in done if c.rows[o][m]["others_max"] > 1.01] for m in METHODS
        }
        s["others_slowdown_name_worst"] = max(
            (c.rows[o]["slurm-name"]["others_max"] for c in done), default=None
        )
        s["others_slowdown_plan_worst"] = max(
            (c.rows[o]["plan"]["others_max"] for c in done), default=None
        )
        s["others_slowdown_slurm_worst"] = max(
            (c.rows[o]["slurm-topo"]["others_max"] for c in done), default=None
        )
        out[f"o={o:g}"] = s
    out["plan_differs_from_slurm"] = [c.name for c in done if c.differs]
    out["more_leaves_than_slurm"] = [
        c.name for c in done if c.leaves["plan"] > c.leaves["slurm-topo"]
    ]
    out["less_free_leaf_run"] = [
        c.name for c in done if c.free_leaf["plan"] < c.free_leaf["slurm-topo"]
    ]
    out["less_free_spine_run"] = [
        c.name for c in done if c.free_spine["plan"] < c.free_spine["slurm-topo"]
    ]
    return out


def verdicts(summary: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(target, PASS/FAIL/NO VERDICT, detail). No verdict below MIN_CASES_FOR_VERDICT cases."""
    n = summary["cases"]
    targets: list[tuple[str, str, str]] = []
    enough = n >= MIN_CASES_FOR_VERDICT
    for o in OVERSUB:
        s = summary[f"o={o:g}"]["slurm-topo"]
        med = s["median_comm_gain"]
        worst = s["worst_comm_gain"]
        targets.append(
            (
                f"o={o:g}: median >= 10% less communication time than Slurm (topology order)",
                ("PASS" if med >= 0.10 else "FAIL") if enough and med is not None else "NO VERDICT",
                f"median {med * 100:+.1f}% over {n} cases" if med is not None else "no cases",
            )
        )
        targets.append(
            (
                f"o={o:g}: no case more than 2% slower than Slurm (topology order)",
                ("PASS" if worst >= -0.02 else "FAIL")
                if enough and worst is not None
                else "NO VERDICT",
                f"worst {worst * 100:+.1f}%" if worst is not None else "no cases",
            )
        )
    frag = summary["more_leaves_than_slurm"] + summary["less_free_spine_run"]
    targets.append(
        (
            "no more fragmentation than Slurm (leaves used, free spine run left)",
            ("PASS" if not frag else "FAIL") if enough else "NO VERDICT",
            f"{len(summary['more_leaves_than_slurm'])} cases with more leaves, "
            f"{len(summary['less_free_spine_run'])} with a smaller free spine run",
        )
    )
    if not enough:
        targets.append(
            (
                "sample",
                "NO VERDICT",
                f"{n} cases < {MIN_CASES_FOR_VERDICT}: run without --quick for verdicts",
            )
        )
    return targets


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:+.1f}%"


def print_report(
    cases: Sequence[Case],
    summary: dict[str, Any],
    seconds: float,
    seeds: Sequence[int],
    algorithm: str = "auto",
    risk: str = "none",
) -> None:
    print(
        f"referee bench: {summary['cases']} cases in {seconds:.1f} s (seeds {tuple(seeds)}; "
        f"DP all-reduce: {'NCCL tuner pick' if algorithm == 'auto' else algorithm}; "
        f"planner risk={risk})"
    )
    if summary["skipped"]:
        print(f"  not started by Slurm (skipped): {', '.join(summary['skipped'])}")
    print()
    print("per case: communication ms/step (plan / slurm-topo / slurm-name), referee o = 1, 2, 4")
    print(
        f"{'case':<12} {'fabric':>8} {'busy':>5} {'job':>12} {'Slurm':>6} {'leaves p/s':>10} "
        + " ".join(f"{f'o={o:g}':>24}" for o in OVERSUB)
    )
    for c in cases:
        if not c.rows:
            continue
        cells = []
        for o in OVERSUB:
            r = c.rows[o]
            cells.append(
                f"{r['plan']['comm_s'] * 1e3:6.1f}/{r['slurm-topo']['comm_s'] * 1e3:6.1f}/"
                f"{r['slurm-name']['comm_s'] * 1e3:6.1f}"
            )
        job = f"{c.job.nodes}n pp{c.job.pp}"
        leaves = f"{c.leaves['plan']}/{c.leaves['slurm-topo']}"
        print(
            f"{c.name:<12} {c.kind[0] + 'L ' + str(c.fabric_nodes):>8} {c.busy:5.2f} "
            f"{job:>12} {c.version:>6} {leaves:>10} " + " ".join(f"{x:>24}" for x in cells)
        )
    print()
    print("summary (gain = 1 - plan/baseline; positive = the plan is faster)")
    print(
        f"{'o':>3} {'vs':>11} {'median comm':>12} {'worst comm':>11} {'median step':>12} "
        f"{'losses':>7}  {'others slowed (plan/slurm median, worst)':>40}"
    )
    for o in OVERSUB:
        s = summary[f"o={o:g}"]
        for base in ("slurm-topo", "slurm-name"):
            b = s[base]
            others = (
                f"{s['others_slowdown_plan_median']:.3f}/{s['others_slowdown_slurm_median']:.3f}, "
                f"{s['others_slowdown_plan_worst']:.3f}/{s['others_slowdown_slurm_worst']:.3f}"
                if base == "slurm-topo" and s["others_slowdown_plan_median"] is not None
                else ""
            )
            print(
                f"{o:3g} {base:>11} {_pct(b['median_comm_gain']):>12} "
                f"{_pct(b['worst_comm_gain']):>11} {_pct(b['median_step_gain']):>12} "
                f"{len(b['losses']):>7}  {others:>40}"
            )
    print()
    differ = summary["plan_differs_from_slurm"]
    print(
        f"the plan differs from Slurm's choice in topology order in {len(differ)} of "
        f"{summary['cases']} cases" + (f": {', '.join(differ)}" if differ else "")
    )
    for o in OVERSUB:
        b = summary[f"o={o:g}"]["slurm-topo"]
        print(
            f"  o={o:g}: median gain over Slurm's topology order where the plan differs: "
            f"{_pct(b['median_comm_gain_where_differs'])}"
        )
    for o in OVERSUB:
        s = summary[f"o={o:g}"]
        slowed = s["others_slowed_cases"]
        print(
            f"  o={o:g}: cases where a running job is slowed > 1 %: "
            + ", ".join(f"{m} {len(slowed[m])}" for m in METHODS)
            + f"; worst slowdown plan/slurm-topo/slurm-name {s['others_slowdown_plan_worst']:.3f}/"
            f"{s['others_slowdown_slurm_worst']:.3f}/{s['others_slowdown_name_worst']:.3f}"
        )
    print()
    print("every loss (plan slower than Slurm in topology order, % slower):")
    any_loss = False
    for o in OVERSUB:
        losses = summary[f"o={o:g}"]["slurm-topo"]["losses"]
        if losses:
            any_loss = True
            print(f"  o={o:g}: " + ", ".join(f"{n} {p:.2f}%" for n, p in losses))
    if not any_loss:
        print("  none")
    print()
    frag_cases = [c for c in cases if c.rows]
    if frag_cases:
        print(
            "fragmentation (median over cases, plan / slurm-topo): leaves used "
            f"{statistics.median(c.leaves['plan'] for c in frag_cases):g} / "
            f"{statistics.median(c.leaves['slurm-topo'] for c in frag_cases):g}; largest free "
            f"leaf run {statistics.median(c.free_leaf['plan'] for c in frag_cases):g} / "
            f"{statistics.median(c.free_leaf['slurm-topo'] for c in frag_cases):g}; largest free "
            f"spine run {statistics.median(c.free_spine['plan'] for c in frag_cases):g} / "
            f"{statistics.median(c.free_spine['slurm-topo'] for c in frag_cases):g}"
        )
        print(
            f"  more leaves than Slurm: {summary['more_leaves_than_slurm'] or 'none'}; smaller "
            f"free spine run: {summary['less_free_spine_run'] or 'none'}"
        )
    print()
    print("targets (the referee's verdict):")
    for name, verdict, detail in verdicts(summary):
        print(f"  [{verdict}] {name}: {detail}")


# ---------------------------------------------------------------------------- cluster streams
CLUSTER_SEEDS = (2211, 2212, 2213)  # fixed with HELD_OUT_SEEDS, before the first run
# The Slurm the streams' plans are made for (--cluster-slurm): 24.11 takes a GB200 plan's
# --nodelist only inside one block of the job's level, 26.05 also cut into --segment pieces.
CLUSTER_VERSION = SlurmVersion.parse("24.11.5")


def _placers(
    fab: bp.Fabric,
    kind: str,
    plan: Callable[..., Any],
    version: SlurmVersion,
    refused: list[str] | None = None,
    fallback: bool = False,
) -> tuple[cl.Placer, cl.Placer]:
    """(Slurm alone, slurmfm's plan) as placement callables for :func:`cl.simulate`.

    GB200 clusters run ``topology/block`` on the UltraServers, so the plans are asked for
    under it (``topology_plugin="block"``: only a ``--nodelist`` Slurm takes, with the
    ``--segment`` it needs). ``refused`` collects the jobs started on a plan whose
    ``--nodelist`` (and ``--segment``) ``topology/block`` would refuse at submission
    (:func:`slurmfm.plan.slurm_sim.nodelist_accepted`): none since the planner checks it.
    ``fallback``: where the planner has no plan (``PlanError``: on 24.11 no block of the job's
    level has room), the job is submitted without one, so Slurm's own choice starts it.
    """
    from slurmfm.plan.planner import PlanError
    from slurmfm.plan.slurm_sim import block_choices, block_geometry, nodelist_accepted

    topo = fab.topology
    geometry = block_geometry(topo) if kind == "gb200" else None
    block_rules = "26.05" if version >= SlurmVersion(26, 5) else "24.11"

    def slurm(free: frozenset[str], job: cl.ArrivingJob) -> list[str] | None:
        if kind == "gb200" and job.nodes > 1:
            for label, blk in block_choices(topo, free, job.nodes, rules="24.11"):
                if "--segment" in label:
                    return blk
            return None
        got = select_tree(
            topo, set(free), job.nodes, rules="24.05.3", switch_order=fab.switch_order
        )
        if got is None:
            return None
        return rank_order(got, topo, policy="leaf", switch_order=fab.switch_order)

    def slurmfm(free: frozenset[str], job: cl.ArrivingJob) -> list[str] | None:
        busy = set(topo.nodes) - free
        extra = {"topology_plugin": "block"} if geometry is not None else {}
        try:
            p = plan(
                topo,
                JobShape(job.nodes, job.gpus_per_node, tp=job.tp, pp=job.pp),
                unavailable=busy,
                switch_order=fab.switch_order,
                slurm_version=version,
                **extra,
            )
        except PlanError:
            return slurm(free, job) if fallback else None
        if refused is not None and geometry is not None:
            blocks, sizes = geometry
            if not nodelist_accepted(
                blocks, p.nodes, block_sizes=sizes, rules=block_rules, segment=p.segment
            ):
                refused.append(job.name)
        return list(p.nodes)

    return slurm, slurmfm


def med(xs: Sequence[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _p90(xs: Sequence[float]) -> float | None:
    if not xs:
        return None
    ys = sorted(xs)
    return ys[min(len(ys) - 1, int(0.9 * len(ys)))]


def run_cluster(
    kind: str,
    seed: int,
    quick: bool,
    plan: Callable[..., Any],
    version: SlurmVersion = CLUSTER_VERSION,
    fallback: bool = False,
) -> dict[str, Any]:
    """One job stream on one fabric, Slurm alone and with slurmfm's plans for large jobs
    (planned for Slurm ``version``; ``fallback``: Slurm's own choice where there is no plan)."""
    seed = seed * 10 + ("3-level", "4-level", "gb200").index(kind)
    rng = random.Random(seed)
    large: tuple[int, ...]
    small_mix: tuple[tuple[int, float], ...]
    if kind == "gb200":
        fab = bp.make_gb200(rng, 288)
        gpus, tp, large, small_mix = 4, 4, (16, 32, 64), ((1, 0.3), (2, 0.2), (4, 0.3), (8, 0.2))
    else:
        make = bp.make_fabric if kind == "3-level" else bp.make_fabric4
        fab = make(rng, 512)
        gpus, tp, large, small_mix = 8, 8, (64, 128), PHILLY_NODE_MIX
    jobs = cl.job_stream(
        len(fab.topology.nodes),
        seed=seed,
        count=80 if quick else 200,
        large_sizes=large,
        gpus_per_node=gpus,
        tp=tp,
        mix=small_mix,
        utilization=0.95,
    )
    slurm, probe = _placers(fab, kind, plan, version)
    refused: list[str] = []
    _, slurmfm = _placers(fab, kind, plan, version, refused, fallback)
    params = FabricParams.uniform(2, gpus_per_node=gpus)
    seg = 16 if kind == "gb200" else None  # NVIDIA's segment for large GB200 jobs
    out: dict[str, Any] = {}
    for name, policy in (("slurm", None), ("slurmfm", slurmfm)):
        r = cl.simulate(
            fab.topology,
            jobs,
            slurm=slurm,
            policy=policy,
            params=params,
            stranded_below=seg,
            probe=probe if policy is None else None,
        )
        big = r.large(jobs)
        out[name] = {
            "large_started": len(big),
            "large_wait_mean_s": statistics.fmean([r.wait_s[j] for j in big]) if big else None,
            "large_wait_p90_s": _p90([r.wait_s[j] for j in big]),
            "all_wait_mean_s": statistics.fmean(r.wait_s.values()) if r.wait_s else None,
            "large_step_median_s": med([r.step_s[j] for j in big if j in r.step_s]),
            "large_comm_median_s": med([r.comm_s[j] for j in big if j in r.comm_s]),
            "large_units_median": med([r.units[j] for j in big]),
            "free_unit_run_median": med(r.free_unit_run),
            "free_spine_run_median": med(r.free_spine_run),
            "others_slowdown_median": med(
                [r.others_slowdown[j] for j in big if j in r.others_slowdown]
            ),
            "stranded_units_median": med(r.stranded_units) if seg else None,
            "pending_a_plan_starts": sorted(r.pending_a_policy_starts),
            "never_started": r.never_started,
            "makespan_s": r.makespan_s,
            "started_on_a_refused_nodelist": list(refused) if policy is not None else [],
        }
    return out


def print_cluster(results: dict[str, list[dict[str, Any]]]) -> None:
    print()
    print(
        "cluster streams (strict FIFO, 95 % offered load, referee o=2; large jobs by Slurm "
        "alone vs slurmfm's plan; waits are means and p90 per seed, the rest medians; then "
        "the median over seeds)"
    )
    cols = (
        ("large_wait_mean_s", "wait large (min)", 60.0),
        ("large_wait_p90_s", "p90 large (min)", 60.0),
        ("all_wait_mean_s", "wait all (min)", 60.0),
        ("large_comm_median_s", "comm large (ms)", 1e-3),
        ("large_step_median_s", "step large (ms)", 1e-3),
        ("large_units_median", "units/job", 1.0),
        ("free_unit_run_median", "free unit run", 1.0),
        ("free_spine_run_median", "free spine run", 1.0),
        ("others_slowdown_median", "others slowed", 1.0),
        ("stranded_units_median", "stranded US", 1.0),
        ("makespan_s", "makespan (h)", 3600.0),
    )
    print(f"{'fabric':<8} {'policy':<8} " + " ".join(f"{h:>16}" for _, h, _ in cols))
    for kind, runs in results.items():
        for pol in ("slurm", "slurmfm"):
            cells = []
            for key, _, div in cols:
                xs = [r[pol][key] for r in runs if r[pol][key] is not None]
                cells.append(f"{statistics.median(xs) / div:16.2f}" if xs else f"{'-':>16}")
            print(f"{kind:<8} {pol:<8} " + " ".join(cells))
        pend = sum(len(r["slurm"]["pending_a_plan_starts"]) for r in runs)
        never = {p: sum(len(r[p]["never_started"]) for r in runs) for p in ("slurm", "slurmfm")}
        refused = sum(len(r["slurmfm"].get("started_on_a_refused_nodelist", [])) for r in runs)
        print(
            f"{'':<8} large jobs Slurm left pending at a moment a plan could start them: {pend}; "
            f"never started: Slurm {never['slurm']}, slurmfm {never['slurmfm']}; "
            f"started on a --nodelist topology/block refuses: {refused}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="two seeds, numbers only, no verdict")
    ap.add_argument("--json", type=Path, help="write the cases and summary as JSON here")
    ap.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        help="case seeds instead of the held-out ones (a fresh confirmation set)",
    )
    ap.add_argument(
        "--risk",
        choices=("none", "model"),
        default="none",
        help="the planner's risk setting (slurmfm.plan.planner.PlanRequest.risk)",
    )
    ap.add_argument("-v", "--verbose", action="store_true")
    ap.add_argument("--no-cluster", action="store_true", help="skip the cluster streams")
    ap.add_argument(
        "--cluster-slurm",
        type=SlurmVersion.parse,
        default=CLUSTER_VERSION,
        help="the Slurm the cluster streams' plans are made for (default 24.11.5)",
    )
    ap.add_argument(
        "--cluster-fallback",
        action="store_true",
        help="cluster streams: a large job with no plan Slurm takes goes to Slurm's own choice",
    )
    ap.add_argument(
        "--nccl-algo",
        choices=("auto", "ring", "tree"),
        default="auto",
        help="DP all-reduce algorithm: NCCL's tuner's pick (auto), or forced (NCCL_ALGO)",
    )
    args = ap.parse_args(argv)
    log = (lambda s: print(s, flush=True)) if args.verbose else (lambda s: None)
    from functools import partial

    from slurmfm.plan.planner import plan as plan_any

    plan = partial(plan_any, risk=args.risk)
    seeds = (
        tuple(args.seeds) if args.seeds else HELD_OUT_SEEDS[:2] if args.quick else HELD_OUT_SEEDS
    )
    cases = build_cases(seeds)
    t0 = time.perf_counter()
    for c in cases:
        run_case(c, plan, log, args.nccl_algo)
    seconds = time.perf_counter() - t0
    summary = summarize(cases)
    print_report(cases, summary, seconds, seeds, args.nccl_algo, args.risk)
    clusters: dict[str, list[dict[str, Any]]] = {}
    if not args.no_cluster:
        t1 = time.perf_counter()
        cseeds = CLUSTER_SEEDS[:1] if args.quick else CLUSTER_SEEDS
        for kind in ("3-level", "4-level", "gb200"):
            clusters[kind] = [
                run_cluster(kind, sd, args.quick, plan, args.cluster_slurm, args.cluster_fallback)
                for sd in cseeds
            ]
        print_cluster(clusters)
        print(f"(cluster streams: seeds {cseeds}, {time.perf_counter() - t1:.1f} s)")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "cases": [
                        {
                            "name": c.name,
                            "kind": c.kind,
                            "fabric": c.fabric_nodes,
                            "busy": c.busy,
                            "nodes": c.job.nodes,
                            "pp": c.job.pp,
                            "version": c.version,
                            "rows": {f"{o:g}": r for o, r in c.rows.items()},
                            "leaves": c.leaves,
                            "free_leaf": c.free_leaf,
                            "free_spine": c.free_spine,
                            "note": c.note,
                            "differs": c.differs,
                        }
                        for c in cases
                    ],
                    "summary": summary,
                    "targets": verdicts(summary),
                    "clusters": clusters,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
