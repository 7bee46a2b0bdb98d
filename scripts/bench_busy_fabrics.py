#!/usr/bin/env python3
"""Never worse than Slurm's own selection: plans on generated busy fabrics, judged by the referee.

Why (issue 42 item 4): an independent model the planner cannot see found plans of 32-64-node
jobs on busy EC2-like fabrics 3-70 % slower than Slurm's own choice and spread over more
leaves (8 where Slurm's best fit took 4). This script regenerates such cases and checks the
two rules every plan must keep, whatever the planner's cost model predicts:

* **leaves**: the plan uses no more leaf switches than Slurm's selection for that Slurm
  version (``slurm_sim.select_tree`` under the version's rule set; with the version unknown,
  under *each* rule set, since either may be the cluster's);
* **time**: under :mod:`bench.referee` (physical uplinks at oversubscription 1, 2 and 4 shared
  with the other jobs' ring traffic, NCCL-like collectives) the plan's communication time per
  step is at most 1 % above Slurm's choice in its topology (leaf) rank order.

Cases (fixed by the seeds; the defaults were chosen before the first run): two- and
three-level fabrics (``bench_placement.make_fabric``: uneven leaves of 4-24 nodes, host names
a random permutation of the fabric, switch lines shuffled), 50-80 % of the nodes busy with
other jobs placed by Slurm's tree rules (``bench.referee.fill``: the Philly trace's size mix,
churned), jobs of 32-256 nodes: TP 8 with PP 1, 2 or 4, and data-parallel-only jobs (TP 1,
PP 1: every GPU a DP rank). The planner gets the topology, the busy nodes, the topology.conf
switch order and the Slurm version (22.05.8, 24.11.5, or none).

Exit status 1 when any case breaks either rule (the table says which). Usage::

    python scripts/bench_busy_fabrics.py            # 48 cases
    python scripts/bench_busy_fabrics.py --quick    # 12 cases
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import bench_placement as bp  # noqa: E402

from bench.referee import FabricParams, StepTraffic, fill, judge  # noqa: E402
from slurmfm.catalog.slurm_features import SlurmVersion  # noqa: E402
from slurmfm.plan.cost import JobShape  # noqa: E402
from slurmfm.plan.planner import plan  # noqa: E402
from slurmfm.plan.slurm_sim import Rules, rank_order, select_tree  # noqa: E402
from slurmfm.topology.model import Topology  # noqa: E402

SEEDS = range(4201, 4249)  # fixed before the first run
OVERSUB = (1.0, 2.0, 4.0)
TOLERANCE = 0.01  # "no plan more than 1 % slower than Slurm's choice"
VERSIONS: dict[str, tuple[SlurmVersion | None, tuple[Rules, ...]]] = {
    "22.05.8": (SlurmVersion.parse("22.05.8"), ("21.08",)),
    "24.11.5": (SlurmVersion.parse("24.11.5"), ("24.05.3",)),
    "unknown": (None, ("21.08", "24.05.3")),
}
SHAPES = ((8, 1), (8, 2), (8, 4), (1, 1))  # (tp, pp); (1, 1) is data-parallel only


def two_level(rng: random.Random, n_nodes: int) -> bp.Fabric:
    """``make_fabric`` without its top level: leaves under spines under the root."""
    base = bp.make_fabric(rng, n_nodes)
    t = base.topology
    topo = Topology.from_paths({h: ("root", *t.path(h)[2:]) for h in base.hosts})
    order = [s for s in base.switch_order if not s.startswith("top")]
    return bp.Fabric(topo, order, base.conf, base.hosts)


@dataclass
class Case:
    seed: int
    levels: int
    fabric_nodes: int
    busy: float
    job: JobShape
    version: str
    leaves_plan: int = 0
    leaves_slurm: dict[str, int] = field(default_factory=dict)  # per rule set
    ratio: dict[tuple[float, str], float] = field(default_factory=dict)  # (oversub, rules)
    differs: bool = False

    @property
    def name(self) -> str:
        j = self.job
        shape = "dp-only" if j.tp == 1 and j.pp == 1 else f"tp{j.tp}-pp{j.pp}"
        return f"s{self.seed} {self.levels}-level {j.nodes}n {shape} Slurm {self.version}"


def build_cases(seeds: Sequence[int]) -> list[Case]:
    out = []
    for seed in seeds:
        rng = random.Random(seed)
        nodes = rng.choice((32, 48, 64, 96, 128, 192, 256))
        busy = rng.uniform(0.5, 0.8)
        tp, pp = SHAPES[seed % len(SHAPES)]
        out.append(
            Case(
                seed,
                2 + rng.randrange(2),
                max(128, int(nodes / (1 - busy) * 1.4)),
                busy,
                JobShape(nodes, 8, tp=tp, pp=pp),
                tuple(VERSIONS)[(seed // len(SHAPES)) % len(VERSIONS)],
            )
        )
    return out


def run_case(case: Case) -> None:
    rng = random.Random(case.seed * 7 + 1)
    fab = (two_level if case.levels == 2 else bp.make_fabric)(rng, case.fabric_nodes)
    topo = fab.topology
    version, rule_sets = VERSIONS[case.version]
    background = fill(
        topo, case.busy, seed=case.seed, rules=rule_sets[-1], switch_order=fab.switch_order
    )
    busy = {n for j in background for n in j.order}
    free = set(topo.nodes) - busy
    p = plan(topo, case.job, unavailable=busy, switch_order=fab.switch_order, slurm_version=version)
    case.leaves_plan = len({topo.leaf_of[n] for n in p.nodes})
    slurm: dict[str, list[str]] = {}
    for rules in rule_sets:
        chosen = select_tree(topo, free, case.job.nodes, rules=rules, switch_order=fab.switch_order)
        assert chosen is not None, case.name  # the planner planned it: it fits
        case.leaves_slurm[rules] = len({topo.leaf_of[n] for n in chosen})
        slurm[rules] = rank_order(chosen, topo, policy="leaf", switch_order=fab.switch_order)
    case.differs = all(list(p.nodes) != o for o in slurm.values())
    j = case.job
    for o in OVERSUB:
        params = FabricParams.uniform(o)

        def comm(order: Sequence[str], params: FabricParams = params) -> float:
            v = judge(
                topo,
                order,
                gpus_per_node=j.gpus_per_node,
                tp=j.tp,
                pp=j.pp,
                background=background,
                params=params,
                traffic=StepTraffic(),
            )
            return v.comm_s

        mine = comm(list(p.nodes))
        for rules, order in slurm.items():
            theirs = mine if order == list(p.nodes) else comm(order)
            case.ratio[(o, rules)] = mine / theirs if theirs > 0 else 1.0


def report(cases: Sequence[Case], seconds: float) -> int:
    """The table (known Slurm versions), the unknown-version line, the verdict; exit status."""
    print(
        f"busy-fabric bench: {len(cases)} cases in {seconds:.1f} s (seeds "
        f"{cases[0].seed}-{cases[-1].seed}); plan / Slurm's own choice in topology order, "
        "communication time per step under the referee"
    )
    known = [c for c in cases if c.version != "unknown"]
    unknown = [c for c in cases if c.version == "unknown"]
    worse_leaves = [c for c in cases if any(c.leaves_plan > n for n in c.leaves_slurm.values())]
    bad = bool(worse_leaves)
    print()
    print(f"Slurm version known ({len(known)} cases; all {len(cases)} for leaves):")
    print()
    print("| referee oversub. | median | worst | plans > 1 % slower | plans with more leaves |")
    print("|---|---|---|---|---|")
    for o in OVERSUB:
        rs = [r for c in known for (oo, _), r in c.ratio.items() if oo == o]
        slow = [
            c for c in known if any(r > 1 + TOLERANCE for (oo, _), r in c.ratio.items() if oo == o)
        ]
        bad |= bool(slow)
        print(
            f"| {o:g} | {statistics.median(rs):.3f} | {max(rs):.3f} | {len(slow)} | "
            f"{len(worse_leaves)} |"
        )
        for c in slow:
            print(
                f"  slower: {c.name}: "
                + ", ".join(
                    f"{r:.3f} vs {rules} rules" for (oo, rules), r in c.ratio.items() if oo == o
                )
            )
    for c in worse_leaves:
        print(f"  more leaves: {c.name}: {c.leaves_plan} vs {c.leaves_slurm}")
    if unknown:
        print()
        print(
            f"Slurm version unknown ({len(unknown)} cases; the plan is judged against each "
            "rule set's choice, either of which may be the cluster's, so no verdict on time):"
        )
        for o in OVERSUB:
            worst = {
                rules: max(c.ratio[(o, rules)] for c in unknown) for rules in ("21.08", "24.05.3")
            }
            print(
                f"  oversub. {o:g}: worst "
                + ", ".join(f"{r:.3f} vs the {rules} rules' choice" for rules, r in worst.items())
            )
    print()
    by_shape: dict[str, int] = {}
    for c in cases:
        key = "dp-only" if c.job.tp == 1 else f"pp{c.job.pp}"
        by_shape[key] = by_shape.get(key, 0) + 1
    differ = sum(c.differs for c in cases)
    print(
        "cases: "
        + ", ".join(f"{k} {v}" for k, v in sorted(by_shape.items()))
        + "; Slurm versions: "
        + ", ".join(f"{v} {sum(c.version == v for c in cases)}" for v in VERSIONS)
        + f"; plan differs from every Slurm choice in {differ}; "
        + f"leaves plan/Slurm median {statistics.median(c.leaves_plan for c in cases)}"
        + f"/{statistics.median(min(c.leaves_slurm.values()) for c in cases)}"
    )
    print(
        "verdict:",
        "FAIL"
        if bad
        else "PASS (no plan > 1 % slower where the version is known, none with "
        "more leaves than any rule set's choice)",
    )
    return 1 if bad else 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="the first 12 seeds")
    ap.add_argument("--seeds", type=int, nargs="+", help="other seeds (a fresh set)")
    ap.add_argument("-v", "--verbose", action="store_true", help="one line per case")
    args = ap.parse_args(argv)
    seeds = list(args.seeds) if args.seeds else list(SEEDS)[: 12 if args.quick else None]
    cases = build_cases(seeds)
    t0 = time.perf_counter()
    for c in cases:
        run_case(c)
        if args.verbose:
            print(
                f"{c.name}: leaves {c.leaves_plan} vs {c.leaves_slurm}; "
                + ", ".join(f"o={o:g} {r:.3f} ({rules})" for (o, rules), r in c.ratio.items()),
                flush=True,
            )
    return report(cases, time.perf_counter() - t0)


if __name__ == "__main__":
    sys.exit(main())
