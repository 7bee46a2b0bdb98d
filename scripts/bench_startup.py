#!/usr/bin/env python3
"""Time from a job's start to its launch command, slurmfm's script against a hand-written one.

On the running lab (``eval "$(scripts/slurm-lab env)"``), in the same session and alternating,
so that load and drift hit both alike:

* **hand-written**: ``#!/bin/bash``, a time stamp, then ``srun --ntasks-per-node=1`` of the
  launch: the least any sbatch file costs;
* **slurmfm**: the script ``slurmfm`` renders for a torchrun recipe on the lab (health gate and
  observability as the recipe says), with one line added after ``set -euo pipefail`` that
  stamps the time. The launcher is the torchrun stand-in (``tests/standins/torchrun.py``:
  torchrun's rank arithmetic, no torch import), whose worker stamps the time it starts.

Start-up is the time from the batch script's first stamp to the last node's worker stamp
(every node has started the launch), per job; the table shows medians over ``--runs`` jobs
per node count. This script only measures and always exits 0; tests never assert on time.

    python scripts/bench_startup.py --nodes 8 16 --runs 5
    python scripts/bench_startup.py --nodes 8 --runs 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = 'echo "bench-stamp start $(date +%s.%N)"'
WORKER = """import os, sys, time
print("bench-stamp worker %.6f %s" % (time.time(), os.environ.get("SLURMD_NODENAME", "?")),
      flush=True)
"""


def handwritten(nodes: int, work: Path) -> str:
    return (
        "#!/bin/bash\n"
        f"#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node=1\n#SBATCH --partition=batch\n"
        f"#SBATCH --output={work}/%j.out\n"
        f"{STAMP}\n"
        f"srun --ntasks-per-node=1 {sys.executable} {work / 'torchrun.py'} -m "
        "torch.distributed.run --nnodes=$SLURM_JOB_NUM_NODES --nproc-per-node=1 "
        f"--node-rank=$SLURM_NODEID {work / 'worker.py'}\n"
    )


def slurmfm_script(nodes: int, work: Path, gate: str, observe: str) -> str:
    sys.path.insert(0, str(ROOT))
    import slurmfm.api as fm

    recipe = fm.load(
        {
            "name": "bench-startup",
            "cluster": {"instance_type": "lab-cpu", "partition": "batch"},
            "resources": {"nodes": nodes, "procs_per_node": 1},
            "launcher": {
                "kind": "torchrun",
                "script": str(work / "worker.py"),
                "python": str(work / "torchrun.py"),
            },
            "storage": {"checkpoint_root": str(work / "ckpt"), "log_dir": str(work)},
            "resilience": {"requeue": False, "save_before_timeout_s": 0, "health_gate": gate},
            "observability": {"enabled": observe},
        }
    )
    text = fm.dry_run(recipe).script.decode()
    head, sep, rest = text.partition("set -euo pipefail\n")
    return head + sep + STAMP + "\n" + rest


def run_job(script: str, work: Path, env: dict[str, str]) -> float | None:
    path = work / f"job-{time.monotonic_ns()}.sh"
    path.write_text(script)
    proc = subprocess.run(
        ["sbatch", "--parsable", f"--output={work}/%j.out", f"--chdir={work}", str(path)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
        return None
    job = proc.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        q = subprocess.run(
            ["squeue", "-h", "-j", job], env=env, capture_output=True, text=True, check=False
        )
        if not q.stdout.strip():
            break
        time.sleep(0.5)
    out = work / f"{job}.out"
    start, workers = None, []
    for line in out.read_text(errors="replace").splitlines() if out.exists() else []:
        if line.startswith("bench-stamp start "):
            start = float(line.split()[2])
        elif line.startswith("bench-stamp worker "):
            workers.append(float(line.split()[2]))
    if start is None or not workers:
        print(f"job {job}: no stamps in {out}", file=sys.stderr)
        return None
    return max(workers) - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--gate", default="off", help="resilience.health_gate (auto|on|off)")
    ap.add_argument("--observe", default="off", help="observability.enabled (auto|on|off)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    env = dict(os.environ)
    work = Path(tempfile.mkdtemp(prefix="slurmfm-bench-startup-", dir="/var/tmp"))
    (work / "worker.py").write_text(WORKER)
    (work / "torchrun.py").write_text((ROOT / "tests" / "standins" / "torchrun.py").read_text())
    (work / "torchrun.py").chmod(0o755)
    rows = []
    for n in a.nodes:
        scripts = {
            "hand-written": handwritten(n, work),
            "slurmfm": slurmfm_script(n, work, a.gate, a.observe),
        }
        times: dict[str, list[float]] = {k: [] for k in scripts}
        for _ in range(a.runs):
            for kind, text in scripts.items():  # alternating: drift hits both alike
                t = run_job(text, work, env)
                if t is not None:
                    times[kind].append(t)
        med = {k: statistics.median(v) if v else float("nan") for k, v in times.items()}
        rows.append(
            {
                "nodes": n,
                "runs": a.runs,
                "hand_written_s": round(med["hand-written"], 3),
                "slurmfm_s": round(med["slurmfm"], 3),
                "extra_s": round(med["slurmfm"] - med["hand-written"], 3),
            }
        )
    shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(rows, indent=2))
    else:
        print(f"health gate {a.gate}, observability {a.observe}; medians over the runs")
        print("| nodes | runs | hand-written s | slurmfm s | extra s |")
        print("|---:|---:|---:|---:|---:|")
        for r in rows:
            print(
                f"| {r['nodes']} | {r['runs']} | {r['hand_written_s']:.2f} | {r['slurmfm_s']:.2f} "
                f"| {r['extra_s']:+.2f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
