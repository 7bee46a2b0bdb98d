"""A real Ray driver for the real-tier tests of ``launcher.kind: ray``: each step runs one task
pinned to every Ray node (hard node affinity) and records where each ran, then saves the step
in the job's checkpoint directory; a relaunch resumes after the last saved step.

Prints one JSON event per line: ``cluster`` (nodes alive, the head's Slurm node, RAY_ADDRESS),
``resume``, ``step`` (the SLURMD_NODENAME and hostname each node's task saw), ``done``.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


@ray.remote(num_cpus=0, max_retries=0)
def where() -> tuple[str, str]:
    """The Slurm node whose `ray start` started this task's raylet, and the host."""
    return os.environ.get("SLURMD_NODENAME", ""), socket.gethostname()


def save(path: str, step: int) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump({"step": step}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--sleep", type=float, default=0.0)
    a = p.parse_args()
    ckpt = os.path.join(os.environ["SLURMFM_CHECKPOINT_DIR"], "driver-step.json")
    start = 0
    if os.path.exists(ckpt):
        with open(ckpt) as fh:
            start = int(json.load(fh)["step"])
        emit("resume", step=start)
    ray.init()  # RAY_ADDRESS: the job's own cluster
    alive = [n for n in ray.nodes() if n["Alive"]]
    emit(
        "cluster",
        nodes=len(alive),
        head=os.environ.get("SLURMD_NODENAME", ""),
        order=os.environ.get("SLURMFM_HOST_ORDER", ""),
        address=os.environ.get("RAY_ADDRESS", ""),
    )
    for step in range(start + 1, a.steps + 1):
        refs = [
            where.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote()
            for n in alive
        ]
        seen = ray.get(refs)
        save(ckpt, step)
        emit("step", step=step, nodes=sorted(s[0] for s in seen), hosts=sorted(s[1] for s in seen))
        if a.sleep:
            time.sleep(a.sleep)
    emit("done", step=a.steps)
    return 0


if __name__ == "__main__":
    sys.exit(main())
