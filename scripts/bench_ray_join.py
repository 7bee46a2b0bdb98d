#!/usr/bin/env python3
"""Time to a joined Ray cluster (``launcher.kind: ray``) at N lab nodes.

On a running lab (``scripts/slurm-lab up``; pass its directory), submits a Ray job of N nodes
with real Ray (the venv's) whose driver only connects and exits
(tests/launchers/ray_driver.py, ``--steps 0``), and measures from the job log, polled every
0.1 s: from the launch line (the batch step starts the launch's srun) to the runtime's
``Ray cluster has N nodes; starting the driver`` (every node's raylet alive in the head's
GCS). Runs alternate between the node counts, so each count sees the same machine; medians
are printed. The join time is Ray's own start-up on each node (GCS, raylet, agents) plus
the head's wait: on a lab every node runs on this one host, so N nodes start N raylets on
the same cores at once.

    SLURMFM_LAB_ROOT=... scripts/slurm-lab up
    .venv/bin/python scripts/bench_ray_join.py --lab "$SLURMFM_LAB_ROOT/host" --nodes 2 8 --runs 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.lab import lab_env  # noqa: E402

DRIVER = REPO / "tests" / "launchers" / "ray_driver.py"


def recipe(tmp: Path, nodes: int) -> dict[str, object]:
    return {
        "name": f"ray-join-{nodes}",
        "cluster": {"instance_type": "lab-cpu", "partition": "batch"},
        "resources": {
            "nodes": nodes,
            "procs_per_node": 1,
            "time_limit": "00:20:00",
            "exclusive": False,
        },
        "parallelism": {"tp": 1, "pp": 1},
        "launcher": {
            "kind": "ray",
            "driver": str(DRIVER),
            "python": sys.executable,
            "ray": str(Path(sys.executable).parent / "ray"),
            "join_timeout_s": 900,
            "args": ["--steps", "0"],
        },
        "env": {"OMP_NUM_THREADS": "1"},
        "storage": {"checkpoint_root": str(tmp / "ckpt"), "log_dir": str(tmp / "logs")},
        "resilience": {"requeue": False, "save_before_timeout_s": 0},
    }


def one(env: dict[str, str], nodes: int, timeout: float) -> float | None:
    """Seconds from the launch line to all N nodes joined, or None (the job's log said why)."""
    with tempfile.TemporaryDirectory(prefix="bench-ray-", dir=env.get("SLURMFM_SCRATCH")) as d:
        tmp = Path(d)
        path = tmp / "recipe.yaml"
        path.write_text(json.dumps(recipe(tmp, nodes)))
        proc = subprocess.run(
            [sys.executable, "-m", "slurmfm.cli", "submit", str(path)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            sys.exit(proc.stdout + proc.stderr)
        job = proc.stdout.split()[0]
        log = tmp / "logs" / f"ray-join-{nodes}_{job}.out"
        launched: float | None = None
        end = time.monotonic() + timeout
        joined = f"slurmfm: Ray cluster has {nodes} nodes; starting the driver"
        try:
            while time.monotonic() < end:
                text = log.read_text(errors="replace") if log.exists() else ""
                if launched is None and "slurmfm: launch: " in text:
                    launched = time.monotonic()
                if launched is not None and joined in text:
                    return time.monotonic() - launched
                if "slurmfm: not requeueing" in text or "give-up" in text:
                    print(text[-3000:], file=sys.stderr)
                    return None
                time.sleep(0.1)
            return None
        finally:
            subprocess.run(["scancel", job], env=env, check=False)
            subprocess.run(
                ["scontrol", "show", "job", job], env=env, capture_output=True, check=False
            )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--lab", required=True, help="the lab's directory")
    p.add_argument("--nodes", type=int, nargs="+", default=[2, 8])
    p.add_argument("--runs", type=int, default=1)
    p.add_argument("--timeout", type=float, default=900.0)
    a = p.parse_args()
    env = lab_env(a.lab)
    env.setdefault("SLURMFM_SCRATCH", str(Path(a.lab).parent / "scratch"))
    Path(env["SLURMFM_SCRATCH"]).mkdir(parents=True, exist_ok=True)
    times: dict[int, list[float]] = {n: [] for n in a.nodes}
    for _ in range(a.runs):
        for n in a.nodes:
            t = one(env, n, a.timeout)
            print(f"{n} nodes: " + ("no join (see above)" if t is None else f"{t:.1f} s"))
            if t is not None:
                times[n].append(t)
    for n, ts in times.items():
        if ts:
            print(f"median, {n} nodes: {statistics.median(ts):.1f} s over {len(ts)} run(s)")
    return 0 if all(times.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
