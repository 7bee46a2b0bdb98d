#!/usr/bin/env python3
"""Time and memory of importing/exporting a 16,384-instance EC2 topology, against json.loads.

Why: the largest AWS training clusters are in the tens of thousands of GPUs (16,384 instances
x 8 GPUs = 131,072), and the topology import runs on a login or head node, often inside a
Slurm prolog-adjacent tool or a cron job; it should stay a couple of seconds and a few hundred
MiB at that size. The baseline is plain ``json.loads`` of the same response text, measured in
the same run, so a slow or busy machine shows up in both columns.

Cases (all on one CPU, pinned with ``sched_setaffinity`` where available):

* ``baseline json.loads``: parse the DescribeInstanceTopology response text.
* ``import``: ``json.loads`` + :func:`parse_topology_json` + :func:`to_topology` (names =
  instance ids).
* ``export slurmfm json``: :func:`dumps_topology`.
* ``export topology.conf``: ``slurm_formats.export_tree(t, "24.11")``, when that module exists.

Time is the median of ``--runs`` (default 5) runs in this process. Memory is measured once per
case in a fresh child process: the tracemalloc peak of the operation, and the RSS growth (peak
RSS from ``getrusage`` minus RSS just before the operation, inputs already loaded).
Targets: each of import and export under 2 s and 300 MiB. Always exits 0.

    python scripts/bench_topology.py [--instances 16384] [--runs 5] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "topology"))

from ec2gen import generate_response  # noqa: E402

from slurmfm.topology.ec2 import parse_topology_json, to_topology  # noqa: E402
from slurmfm.topology.model import Topology  # noqa: E402
from slurmfm.topology.store import dumps_topology  # noqa: E402

TARGET_SECONDS = 2.0
TARGET_MIB = 300.0
CASES = ("baseline json.loads", "import", "export slurmfm json", "export topology.conf")
MiB = 1024 * 1024


def _pin_one_core() -> None:
    if hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[0]})


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _export_tree() -> Callable[[Topology], str] | None:
    try:
        from slurmfm.topology import slurm_formats
    except ImportError:
        return None
    fn = getattr(slurm_formats, "export_tree", None)
    if fn is None:
        return None
    return lambda t: str(fn(t, "24.11"))


def _import(text: str) -> Topology:
    return to_topology(parse_topology_json(json.loads(text)), None)


def _operation(case: str, text: str) -> Callable[[], object] | None:
    """The zero-argument callable to measure for a case (inputs prepared outside it)."""
    if case == "baseline json.loads":
        return lambda: json.loads(text)
    if case == "import":
        return lambda: _import(text)
    topo = _import(text)
    # replace() gives a copy without the model's cached derived maps (levels, paths), so each
    # run pays for them as a real one-shot export would.
    if case == "export slurmfm json":
        return lambda: dumps_topology(replace(topo))
    export = _export_tree()
    if export is None:
        return None
    return lambda: export(replace(topo))


def _time(fn: Callable[[], object], runs: int) -> float:
    times: list[float] = []
    for _ in range(runs):
        gc.collect()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _child(case: str, path: str) -> None:
    """Run one case once in this fresh process; print its memory figures as JSON."""
    _pin_one_core()
    text = Path(path).read_text()
    fn = _operation(case, text)
    if fn is None:
        print(json.dumps(None))
        return
    gc.collect()
    before = _rss_bytes()
    fn()
    peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    gc.collect()
    tracemalloc.start()
    fn()
    _, peak_traced = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    print(json.dumps({"rss_delta": max(0, peak_rss - before), "traced_peak": peak_traced}))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--instances", type=int, default=16_384)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", nargs=2, metavar=("CASE", "FILE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child[0], args.child[1])
        return 0

    _pin_one_core()
    resp = generate_response(args.instances, instance_type="p5.48xlarge", seed=0)
    text = json.dumps(resp, indent=4)  # the AWS CLI prints indented JSON
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "topology.json"
        path.write_text(text)
        for case in CASES:
            fn = _operation(case, text)
            if fn is None:
                rows.append({"case": case, "skipped": "slurm_formats.export_tree not available"})
                continue
            seconds = _time(fn, args.runs)
            out = subprocess.run(
                [sys.executable, __file__, "--child", case, str(path)],
                capture_output=True,
                text=True,
                check=False,
            )
            try:
                mem = json.loads(out.stdout.strip().splitlines()[-1])
            except (json.JSONDecodeError, IndexError):
                mem = None
            row: dict[str, Any] = {"case": case, "seconds": seconds}
            if mem:
                row["traced_peak_mib"] = mem["traced_peak"] / MiB
                row["rss_delta_mib"] = mem["rss_delta"] / MiB
            else:
                row["memory_error"] = out.stderr.strip()[-300:]
            rows.append(row)

    base = next((r for r in rows if r["case"] == "baseline json.loads" and "seconds" in r), None)
    for r in rows:
        if base and "seconds" in r:
            r["x_baseline"] = r["seconds"] / base["seconds"]
        if "seconds" in r and r["case"] != "baseline json.loads":
            mem_mib = max(r.get("traced_peak_mib", 0.0), r.get("rss_delta_mib", 0.0))
            r["target_met"] = r["seconds"] < TARGET_SECONDS and mem_mib < TARGET_MIB
    if args.json:
        print(json.dumps({"instances": args.instances, "bytes": len(text), "rows": rows}, indent=2))
        return 0

    print(
        f"{args.instances} instances, response {len(text) / MiB:.1f} MiB, median of "
        f"{args.runs} runs, one core; targets < {TARGET_SECONDS} s and < {TARGET_MIB:.0f} MiB"
    )
    print(f"{'case':<24}{'time s':>9}{'x json':>8}{'traced MiB':>12}{'RSS+ MiB':>10}  target")
    for r in rows:
        if "skipped" in r:
            print(f"{r['case']:<24}  skipped: {r['skipped']}")
            continue
        traced = f"{r['traced_peak_mib']:.1f}" if "traced_peak_mib" in r else "?"
        rss = f"{r['rss_delta_mib']:.1f}" if "rss_delta_mib" in r else "?"
        met = "" if "target_met" not in r else ("met" if r["target_met"] else "NOT MET")
        print(
            f"{r['case']:<24}{r['seconds']:>9.3f}{r.get('x_baseline', 0):>8.1f}"
            f"{traced:>12}{rss:>10}  {met}"
        )
        if "memory_error" in r:
            print(f"    memory measurement failed: {r['memory_error']}")
    return 0


if __name__ == "__main__":
    try:
        main()
    except Exception as exc:  # the benchmark reports, it never fails a pipeline
        print(f"bench_topology: error: {exc!r}", file=sys.stderr)
    sys.exit(0)
