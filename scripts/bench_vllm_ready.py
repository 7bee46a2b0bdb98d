#!/usr/bin/env python3
"""Time from a vLLM serving job's start to its ready endpoint, on one node and across nodes.

Real vLLM (the CPU build ``scripts/vllm-lab build`` installs, with its tiny Llama) served by
slurmfm on the running lab (``eval "$(scripts/slurm-lab env)"``, at least as many nodes as the
largest ``--nodes``). Each job is the serving recipe a user writes (``launcher.kind: vllm``,
one process per node, ``multinode: auto``: across nodes the node entry's gate picks vLLM's
own multi-node launch, ``--nnodes/--node-rank/--headless``, as the CPU build refuses Ray).
Across nodes the model is split by tensor parallel (``tp`` = nodes, gloo on the CPU).

Start is the job's ``StartTime`` (``scontrol show job``, whole seconds); ready is the mtime of
the endpoint file ``<log_dir>/endpoints/<run_id>.json``, which the batch step writes as soon
as ``GET /health`` on node 0 answered 200. Runs alternate between the node counts so that
load and drift hit each alike; the table shows each run and the median per node count. This
script only measures and always exits 0; tests never assert on time.

    eval "$(scripts/slurm-lab env)"
    python scripts/bench_vllm_ready.py --nodes 1 2 --runs 1
    python scripts/bench_vllm_ready.py --nodes 1 2 --runs 3 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NAME = "bench-vllm-ready"


def vllm_env() -> dict[str, str]:
    """``SLURMFM_VLLM`` and ``SLURMFM_VLLM_MODEL`` from ``scripts/vllm-lab env``."""
    proc = subprocess.run(
        [str(ROOT / "scripts" / "vllm-lab"), "env"], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        sys.exit("real vLLM is not built: run scripts/vllm-lab build (" + proc.stderr.strip() + ")")
    return dict(word.split("=", 1) for word in proc.stdout.split())


def recipe(work: Path, nodes: int, vllm: str, model: str, port: int) -> dict[str, Any]:
    """The serving recipe: ``nodes`` lab nodes, tensor parallel across them."""
    return {
        "name": NAME,
        "cluster": {"instance_type": "lab-cpu", "partition": "batch"},
        "resources": {
            "nodes": nodes,
            "procs_per_node": 1,
            "time_limit": "00:20:00",
            "exclusive": False,
        },
        "parallelism": {"tp": nodes, "pp": 1},
        "launcher": {
            "kind": "vllm",
            "model": model,
            "served_model_name": "tiny",
            "command": vllm,
            "port": port,
            "ready_poll_s": 1,
            "ready_timeout_s": 1200,
            "extra_args": ["--max-model-len=256", "--dtype=float32", "--enforce-eager"],
        },
        "env": {
            "VLLM_TARGET_DEVICE": "cpu",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_CACHE_ROOT": str(work / "vllm-cache"),
            "HF_HUB_OFFLINE": "1",
            "OMP_NUM_THREADS": "1",
        },
        "storage": {"checkpoint_root": str(work / "ckpt"), "log_dir": str(work / "logs")},
        "resilience": {"requeue": False, "save_before_timeout_s": 0},
    }


def job_field(job_id: str, field: str) -> str:
    out = subprocess.run(
        ["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, check=False
    ).stdout
    for word in out.split():
        key, _, value = word.partition("=")
        if key == field:
            return value
    return ""


def one_run(nodes: int, env: dict[str, str], port: int) -> float | None:
    """Seconds from the job's start to its endpoint file, None when it never got ready."""
    with tempfile.TemporaryDirectory(prefix="bench-vllm-") as tmp:
        work = Path(tmp)
        path = work / "recipe.yaml"
        path.write_text(
            json.dumps(recipe(work, nodes, env["SLURMFM_VLLM"], env["SLURMFM_VLLM_MODEL"], port))
        )
        sub = subprocess.run(
            [sys.executable, "-m", "slurmfm.cli", "submit", str(path)],
            capture_output=True,
            text=True,
            cwd=ROOT,
            check=False,
        )
        if sub.returncode != 0:
            print(sub.stdout + sub.stderr, file=sys.stderr)
            return None
        job_id = sub.stdout.split()[0]
        ep = work / "logs" / "endpoints" / f"{NAME}.json"
        try:
            deadline = time.monotonic() + 1500
            while not ep.exists() and time.monotonic() < deadline:
                if job_field(job_id, "JobState") not in {"PENDING", "RUNNING", "CONFIGURING"}:
                    break
                time.sleep(0.5)
            if not ep.exists():
                out = work / "logs" / f"{NAME}_{job_id}.out"
                tail = out.read_text()[-3000:] if out.exists() else ""
                print(f"job {job_id} ({nodes} nodes) never got ready:\n{tail}", file=sys.stderr)
                return None
            ready = ep.stat().st_mtime
            start = datetime.strptime(job_field(job_id, "StartTime"), "%Y-%m-%dT%H:%M:%S")
            return ready - start.timestamp()
        finally:
            subprocess.run(["scancel", job_id], check=False)
            for _ in range(240):
                if job_field(job_id, "JobState") not in {"PENDING", "RUNNING", "COMPLETING"}:
                    break
                time.sleep(0.5)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--port", type=int, default=24800, help="the server's HTTP port")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if "SLURM_CONF" not in os.environ:
        sys.exit('no lab: eval "$(scripts/slurm-lab env)" first')
    env = vllm_env()
    got: dict[int, list[float]] = {n: [] for n in a.nodes}
    for run in range(a.runs):
        for n in a.nodes:
            s = one_run(n, env, a.port)
            print(f"run {run + 1}: {n} node(s): " + ("no endpoint" if s is None else f"{s:.1f} s"))
            if s is not None:
                got[n].append(s)
    medians = {n: statistics.median(v) if v else None for n, v in got.items()}
    if a.json:
        print(json.dumps({n: {"runs": got[n], "median_s": medians[n]} for n in got}))
    else:
        print("nodes  median start->ready (s)  runs")
        for n, runs in got.items():
            m = medians[n]
            med = "-" if m is None else f"{m:.1f}"
            print(f"{n:5d}  {med:>24}  {', '.join(f'{x:.1f}' for x in runs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
