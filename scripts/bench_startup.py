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
per node count, and phases of slurmfm's: the batch script up to the runtime's ``batch``
step (extraction, ``sbcast``, ``prepare`` and its copy with bytecode), from there to the
last node's health verdict (the launch step and each node's entry and checks; the mtime of
the verdict file the entry writes, with the gate inside the launch step; NaN without a
gate), and to the last worker (the word ``go``, the launcher).

``--gate on`` makes the health gate check something: the recipe is a p5 (the lab's nodes carry
``Gres=gpu:8``), one process per node, and ``nvidia-smi`` and the EFA sysfs tree stand in on
every node as in the tests (8 GPUs, 32 EFA devices). ``--baseline CHECKOUT`` adds a third
script, rendered by another checkout of slurmfm (e.g. a worktree of an earlier commit), in the
same alternation: what a change did to start-up, measured in one run. ``--image SQSH`` runs
both in a Pyxis container of that image (the lab up with ``SLURMFM_LAB_PYXIS``, Enroot on PATH:
``scripts/pyxis-lab``): the hand-written ``srun`` gets ``--container-image`` and the work
directory mounted, slurmfm's recipe ``container:`` the same (unnamed: ``named: false``, as on
a cluster with ``use_squashfuse=1``). This script only measures and always exits 0; tests
never assert on time.

Robust against drift (issue 37: container start-ups at 64 lab nodes moved by seconds between
runs, more than what was measured): the jobs run in rounds, one job of each script per round,
in an order that reverses every other round (ABC, CBA, ...), so that a slope in the
machine's speed hits each script alike; the differences ("extra", and "entry" against the
baseline) are taken per round, between the jobs of one round, and the table gives their
median and spread (p25..p75 and min..max over the rounds) next to the medians of the times.

    python scripts/bench_startup.py --nodes 8 64 --runs 9 --image IMAGE.sqsh --baseline /tmp/old

    python scripts/bench_startup.py --nodes 8 16 --runs 5
    python scripts/bench_startup.py --nodes 8 16 32 --gate on --observe on --baseline /tmp/old
    python scripts/bench_startup.py --nodes 8 --runs 3 --json
"""

from __future__ import annotations

import argparse
import json
import math
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
BATCH_STAMP = 'echo "bench-stamp batch $(date +%s.%N)"'
SMI = """#!/bin/sh
for i in 0 1 2 3 4 5 6 7; do echo "GPU $i: NVIDIA H100 80GB HBM3 (UUID: GPU-$i)"; done
"""
WORKER = """import os, sys, time
print("bench-stamp worker %.6f %s" % (time.time(), os.environ.get("SLURMD_NODENAME", "?")),
      flush=True)
"""


def handwritten(nodes: int, work: Path, image: str = "") -> str:
    # in a container the stand-in runs by its "#!/usr/bin/env python3": the image's
    pyxis = f"--container-image={image} --container-mounts={work}:{work} " if image else ""
    python = "" if image else f"{sys.executable} "
    return (
        "#!/bin/bash\n"
        f"#SBATCH --nodes={nodes}\n#SBATCH --ntasks-per-node=1\n#SBATCH --partition=batch\n"
        f"#SBATCH --output={work}/%j.out\n"
        f"{STAMP}\n"
        f"srun --ntasks-per-node=1 {pyxis}{python}{work / 'torchrun.py'} -m "
        "torch.distributed.run --nnodes=$SLURM_JOB_NUM_NODES --nproc-per-node=1 "
        f"--node-rank=$SLURM_NODEID {work / 'worker.py'}\n"
    )


def recipe_dict(
    nodes: int, work: Path, gate: str, observe: str, image: str = ""
) -> dict[str, object]:
    gpu = gate == "on"
    container = {"image": image, "mounts": [f"{work}:{work}"], "named": False}
    return {
        **({"container": container} if image else {}),
        "name": "bench-startup",
        "cluster": {"instance_type": "p5.48xlarge" if gpu else "lab-cpu", "partition": "batch"},
        "resources": {"nodes": nodes, "procs_per_node": 1, "exclusive": gpu},
        "launcher": {
            "kind": "torchrun",
            "script": str(work / "worker.py"),
            "python": str(work / "torchrun.py"),
        },
        "storage": {"checkpoint_root": str(work / "ckpt"), "log_dir": str(work)},
        "resilience": {
            "requeue": False,
            "save_before_timeout_s": 0,
            "health_gate": gate,
            "nccl_transport_check": "off",
        },
        "observability": {"enabled": observe, "textfile_dir": None, "dcgm_job_mapping_dir": None},
    }


RENDER = """import json, sys
sys.path.insert(0, sys.argv[1])
import slurmfm.api as fm
print(fm.dry_run(fm.load(json.loads(sys.argv[2]))).script.decode(), end="")
"""


def slurmfm_script(
    nodes: int, work: Path, gate: str, observe: str, checkout: Path = ROOT, image: str = ""
) -> str:
    """The script ``checkout``'s slurmfm renders, with the two stamps added."""
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            RENDER,
            str(checkout),
            json.dumps(recipe_dict(nodes, work, gate, observe, image)),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    head, sep, rest = proc.stdout.partition("set -euo pipefail\n")
    before, exec_sep, tail = rest.partition("\nexec python3 ")
    return head + sep + STAMP + "\n" + before + "\n" + BATCH_STAMP + exec_sep + tail


def run_job(script: str, work: Path, env: dict[str, str]) -> tuple[float, float, float] | None:
    """(batch script start to the last worker, the runtime's batch step to the last worker,
    the batch step to the last node's health verdict: the mtime of its verdict file in the
    attempt's evidence directory, NaN where there is none)."""
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
    start, batch, workers = None, None, []
    for raw in out.read_text(errors="replace").splitlines() if out.exists() else []:
        line = raw.split(": ", 1)[1] if raw[:1].isdigit() and ": " in raw else raw  # --label
        if line.startswith("bench-stamp start "):
            start = float(line.split()[2])
        elif line.startswith("bench-stamp batch "):
            batch = float(line.split()[2])
        elif line.startswith("bench-stamp worker "):
            workers.append(float(line.split()[2]))
    if start is None or not workers:
        print(f"job {job}: no stamps in {out}", file=sys.stderr)
        return None
    since = start if batch is None else batch
    verdicts = [p.stat().st_mtime for p in work.glob(f"*_{job}.evidence/*/*.gate")]
    gate = max(verdicts) - since if verdicts else float("nan")
    return max(workers) - start, max(workers) - since, gate


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--gate", default="off", help="resilience.health_gate (on|off)")
    ap.add_argument("--observe", default="off", help="observability.enabled (on|off)")
    ap.add_argument("--baseline", type=Path, help="another slurmfm checkout to compare with")
    ap.add_argument("--image", default="", help="run both in a Pyxis container of this image")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    env = dict(os.environ)
    work = Path(tempfile.mkdtemp(prefix="slurmfm-bench-startup-", dir="/var/tmp"))
    (work / "worker.py").write_text(WORKER)
    (work / "torchrun.py").write_text((ROOT / "tests" / "standins" / "torchrun.py").read_text())
    (work / "torchrun.py").chmod(0o755)
    if a.gate == "on":  # what the gate checks on a p5, standing in on the lab's nodes
        (work / "bin").mkdir()
        (work / "bin" / "nvidia-smi").write_text(SMI)
        (work / "bin" / "nvidia-smi").chmod(0o755)
        for i in range(32):
            (work / "sys" / "class" / "infiniband" / f"rdmap{i}s0").mkdir(parents=True)
        env.update(PATH=f"{work / 'bin'}:{env['PATH']}", SLURMFM_SYSFS=str(work / "sys"))
    rows = []
    for n in a.nodes:
        scripts = {
            "hand-written": handwritten(n, work, a.image),
            "slurmfm": slurmfm_script(n, work, a.gate, a.observe, image=a.image),
        }
        if a.baseline:
            scripts["baseline"] = slurmfm_script(
                n, work, a.gate, a.observe, a.baseline, image=a.image
            )
        times: dict[str, list[tuple[float, float, float]]] = {k: [] for k in scripts}
        rounds: list[dict[str, float]] = []  # per round: each script's start-up
        kinds = list(scripts)
        for i in range(a.runs):
            # ABC, CBA, ...: a drift within a round hits each script alike over two rounds
            done: dict[str, float] = {}
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                t = run_job(scripts[kind], work, env)
                if t is not None:
                    times[kind].append(t)
                    done[kind] = t[0]
            rounds.append(done)

        def med(
            kind: str, i: int = 0, times: dict[str, list[tuple[float, float, float]]] = times
        ) -> float:
            v = [t[i] for t in times.get(kind, []) if not math.isnan(t[i])]  # NaN: not measured
            return round(statistics.median(v), 3) if v else float("nan")

        row: dict[str, object] = {
            "nodes": n,
            "runs": a.runs,
            "hand_written_s": med("hand-written"),
            "slurmfm_s": med("slurmfm"),
            "extra_s": round(med("slurmfm") - med("hand-written"), 3),
            "slurmfm_script_s": round(med("slurmfm") - med("slurmfm", 1), 3),
            "slurmfm_batch_to_launch_s": med("slurmfm", 1),
            "slurmfm_batch_to_verdicts_s": med("slurmfm", 2),
        }
        row["extra_paired"] = spread(paired(rounds, "slurmfm", "hand-written"))
        if a.baseline:
            row["baseline_s"] = med("baseline")
            row["baseline_extra_s"] = round(med("baseline") - med("hand-written"), 3)
            row["baseline_batch_to_launch_s"] = med("baseline", 1)
            row["entry_paired"] = spread(paired(rounds, "slurmfm", "baseline"))
        rows.append(row)
    shutil.rmtree(work, ignore_errors=True)
    if a.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(f"health gate {a.gate}, observability {a.observe}; medians over the runs")
    base = " | baseline s | baseline extra s | baseline batch→launch s" if a.baseline else ""
    print(
        "| nodes | runs | hand-written s | slurmfm s | extra s | script→batch s "
        f"| batch→verdicts s | batch→launch s{base} |"
    )
    print("|---:" * (8 + (3 if a.baseline else 0)) + "|")
    for r in rows:
        line = (
            f"| {r['nodes']} | {r['runs']} | {r['hand_written_s']:.2f} | {r['slurmfm_s']:.2f} "
            f"| {r['extra_s']:+.2f} | {r['slurmfm_script_s']:.2f} "
            f"| {r['slurmfm_batch_to_verdicts_s']:.2f} | {r['slurmfm_batch_to_launch_s']:.2f}"
        )
        if a.baseline:
            line += (
                f" | {r['baseline_s']:.2f} | {r['baseline_extra_s']:+.2f} "
                f"| {r['baseline_batch_to_launch_s']:.2f}"
            )
        print(line + " |")
    print()
    print("per round (paired), median [p25..p75] (min..max) over the rounds with both jobs:")
    for r in rows:
        print(f"{r['nodes']} nodes: slurmfm - hand-written {fmt(r['extra_paired'])}")
        if a.baseline:
            print(f"{r['nodes']} nodes: slurmfm - baseline {fmt(r['entry_paired'])}")
    return 0


def paired(rounds: list[dict[str, float]], a: str, b: str) -> list[float]:
    """``a``'s start-up minus ``b``'s, per round where both jobs ran."""
    return [r[a] - r[b] for r in rounds if a in r and b in r]


def spread(values: list[float]) -> dict[str, float]:
    """Median, quartiles, extremes and count of ``values`` (NaN where there are none)."""
    if not values:
        nan = float("nan")
        return {"median": nan, "p25": nan, "p75": nan, "min": nan, "max": nan, "n": 0}
    v = sorted(values)
    q = statistics.quantiles(v, n=4, method="inclusive") if len(v) > 1 else [v[0]] * 3
    return {
        "median": round(statistics.median(v), 3),
        "p25": round(q[0], 3),
        "p75": round(q[2], 3),
        "min": round(v[0], 3),
        "max": round(v[-1], 3),
        "n": len(v),
    }


def fmt(s: object) -> str:
    d = s if isinstance(s, dict) else {}
    return "{:+.2f} s [{:+.2f}..{:+.2f}] ({:+.2f}..{:+.2f}), {} rounds".format(
        d["median"], d["p25"], d["p75"], d["min"], d["max"], d["n"]
    )


if __name__ == "__main__":
    sys.exit(main())
