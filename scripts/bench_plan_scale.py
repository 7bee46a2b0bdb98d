#!/usr/bin/env python3
"""CPU time of one whole ``slurmfm plan`` process on a 65,536-node fabric, against baselines.

Why: issue 14 asks that a 64k-node fabric plan in under 1 s, whole process (interpreter start,
imports, parsing topology.conf and the busy list, planning, printing). CPU time (user + system
of the child, from ``os.wait4``) rather than wall time, because on a shared machine wall time
measures the neighbours; and baselines measured in the same run, round-robin with the plan,
so that a loaded or throttled machine shows in them too:

* ``python -c pass``: the interpreter's own start-up, the floor of any process;
* ``slurmfm plan --help``: start-up plus the CLI's imports, the floor of any ``slurmfm``
  command;
* ``slurmfm plan``: the fabric's topology.conf (``bench_placement.make_fabric``: uneven
  leaves, host names unrelated to the fabric, 65,536 nodes), half of the nodes busy
  (``--unavailable @FILE``), a 16,384-node TP=8 PP=8 job, ``--json``.

Bytecode: the children write and read it under a fresh ``PYTHONPYCACHEPREFIX`` in a temporary
directory (the warm-up run writes it, even when the caller sets ``PYTHONDONTWRITEBYTECODE``), so
the runs measure an installed slurmfm (pip compiles bytecode at install), not the compiler, and
leave no ``__pycache__`` in the checkout.

After the runs, one in-process breakdown of the plan's phases (CPU seconds) says where the
time goes. This script only measures and always exits 0; tests do not assert on time.

    python scripts/bench_plan_scale.py            # 65,536 nodes, 5 rounds
    python scripts/bench_plan_scale.py --nodes 16384 --runs 3
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

TARGET_CPU_S = 1.0


def child_cpu(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(CPU seconds user+system, wall seconds) of one child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[:4]}... exited {proc.returncode}")
    return usage.ru_utime + usage.ru_stime, wall


def phases(conf: Path, busy: Path, nodes: int) -> list[tuple[str, float]]:
    """CPU seconds of each phase of a plan, in this process (imports first)."""
    clock = time.process_time
    out: list[tuple[str, float]] = []
    t = clock()
    from slurmfm.api import load_topology
    from slurmfm.cli.plan import _unavailable
    from slurmfm.plan.cost import JobShape, evaluate
    from slurmfm.plan.planner import _static, plan

    out.append(("imports", clock() - t))
    t = clock()
    topo = load_topology(str(conf))
    out.append(("parse topology.conf", clock() - t))
    t = clock()
    unavailable = _unavailable(f"@{busy}")
    out.append(("parse --unavailable", clock() - t))
    job = JobShape(nodes, 8, tp=8, pp=8)
    t = clock()
    _static(topo)
    out.append(("per-topology tables (cached)", clock() - t))
    t = clock()
    result = plan(topo, job, unavailable=unavailable, mode="pin")
    out.append(("plan (selection, order, cost)", clock() - t))
    t = clock()
    evaluate(topo, list(result.nodes), job)
    out.append(("one cost evaluation (included above)", clock() - t))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=65536, help="fabric nodes (job: a quarter)")
    ap.add_argument("--runs", type=int, default=5, help="rounds of each command")
    ap.add_argument("--seed", type=int, default=65536)
    args = ap.parse_args(argv)

    import bench_placement as bp

    rng = random.Random(args.seed)
    fab = bp.make_fabric(rng, args.nodes)
    busy = bp.make_busy(rng, fab, 0.5)
    job_nodes = args.nodes // 4
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    py = sys.executable
    with tempfile.TemporaryDirectory() as tmp:
        env["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pycache")
        conf = Path(tmp) / "topology.conf"
        conf.write_text(fab.conf)
        bad = Path(tmp) / "busy.txt"
        bad.write_text("\n".join(sorted(busy)))
        plan_argv = [
            *(py, "-m", "slurmfm.cli", "plan", "--topology", str(conf)),
            *("--nodes", str(job_nodes), "--tp", "8", "--pp", "8"),
            *("--unavailable", f"@{bad}", "--json"),
        ]
        commands = {
            "python -c pass": [py, "-c", "pass"],
            "slurmfm plan --help": [py, "-m", "slurmfm.cli", "plan", "--help"],
            "slurmfm plan": plan_argv,
        }
        cpu: dict[str, list[float]] = {k: [] for k in commands}
        wall: dict[str, list[float]] = {k: [] for k in commands}
        child_cpu(plan_argv, env)  # warm the page cache and bytecode once
        for _ in range(args.runs):
            for label, cmd in commands.items():
                c, w = child_cpu(cmd, env)
                cpu[label].append(c)
                wall[label].append(w)
        print(
            f"slurmfm plan on a {args.nodes:,}-node fabric ({len(busy):,} busy), a "
            f"{job_nodes:,}-node TP=8 PP=8 job: {args.runs} rounds, round-robin"
        )
        print(f"{'command':24} {'cpu s median':>13} {'min':>7} {'wall s median':>14}")
        for label in commands:
            print(
                f"{label:24} {statistics.median(cpu[label]):13.3f} {min(cpu[label]):7.3f} "
                f"{statistics.median(wall[label]):14.3f}"
            )
        med = statistics.median(cpu["slurmfm plan"])
        floor = statistics.median(cpu["slurmfm plan --help"])
        print(
            f"target: whole `slurmfm plan` process < {TARGET_CPU_S:.1f} s CPU: "
            f"{'PASS' if med < TARGET_CPU_S else 'FAIL'} ({med:.3f} s; "
            f"{med - floor:.3f} s above the `plan --help` floor)"
        )
        print("\nphases in one process (CPU s):")
        for name, s in phases(conf, bad, job_nodes):
            print(f"  {name:38} {s:7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
