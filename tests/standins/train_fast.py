"""Stands in for recipes/scripts/train_tiny.py where torch is not the subject (observability,
Slurm semantics): the same arguments, the same JSON events and the same checkpoint contract
(``slurmfm.checkpoint``: atomic save, the ``latest`` pointer, the DONE marker, progress for the
job's metrics, the USR2 save request), but no torch, so it starts in milliseconds.

Rank 0 steps and saves; every rank prints its ``rank`` record (from what torchrun or its
stand-in, ``torchrun.py`` here, hands a worker). Without a process group the other ranks have
nothing to agree on, so they exit after their record; with ``--others-wait S`` they stay until
the run's DONE marker is there (at most S seconds), as every rank of a data-parallel run
lives as long as the run, and with it each node's launch (the observability tests: each
node's agent lives as long as its launch).

Fault options for the resilience tests (tests/resilience/test_real_slurm_resilience.py):
``--save-sleep S`` makes the save asked for by the pre-timeout signal take S seconds more
(inside the write, before the atomic rename: a save cut short leaves no checkpoint), and
``--fail-if PATH`` makes rank 0 exit 3 at the first step that finds PATH, as a crash would.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from slurmfm import checkpoint as ck


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--save-sleep", type=float, default=0.0)
    ap.add_argument("--fail-if", type=Path, default=None)
    ap.add_argument("--others-wait", type=float, default=0.0)
    args = ap.parse_args()
    env = os.environ
    rank = int(env["RANK"])
    print(
        json.dumps(
            {
                "event": "rank",
                "rank": rank,
                "world_size": int(env["WORLD_SIZE"]),
                "local_rank": int(env.get("LOCAL_RANK", "0")),
                "node": env.get("SLURMD_NODENAME", "?"),
                "node_rank": int(env.get("SLURMFM_NODE_RANK", "-1")),
                "host_order": env.get("SLURMFM_HOST_ORDER", ""),
                "job_id": env.get("SLURM_JOB_ID", ""),
            }
        ),
        flush=True,
    )
    if rank != 0:
        deadline = time.monotonic() + args.others_wait
        while time.monotonic() < deadline and not ck.is_done():
            time.sleep(0.2)
        return 0
    ckpt_dir = ck.run_dir()
    stop = ck.SaveRequest()
    start = 0
    resume = ck.latest(ckpt_dir)
    if resume is not None:
        start = int((resume / "state.json").read_text())
        print(json.dumps({"event": "resume", "step": start}), flush=True)

    def save(step: int, slow: float = 0.0) -> None:
        def write(tmp: Path) -> None:
            Path(tmp, "state.json").write_text(str(step))
            if slow:
                print(json.dumps({"event": "saving", "step": step, "sleep": slow}), flush=True)
                time.sleep(slow)

        path = ck.save(ckpt_dir, step, write)
        print(json.dumps({"event": "checkpoint", "step": step, "path": str(path)}), flush=True)

    for step in range(start + 1, args.steps + 1):
        print(json.dumps({"event": "step", "step": step}), flush=True)
        ck.report_progress(step)
        if args.fail_if is not None and args.fail_if.exists():
            print(json.dumps({"event": "fail", "step": step}), flush=True)
            return 3
        if stop.requested:
            save(step, args.save_sleep)
            print(json.dumps({"event": "saved-before-timeout", "step": step}), flush=True)
            stop.finish()
            return 0
        if step % args.checkpoint_every == 0 or step == args.steps:
            save(step)
        if args.sleep:
            time.sleep(args.sleep)
    ck.report_progress(args.steps, force=True)
    ck.mark_done(ckpt_dir, steps=args.steps)
    print(json.dumps({"event": "done", "steps": args.steps}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
