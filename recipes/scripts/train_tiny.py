"""A tiny CPU data-parallel training job (torch + gloo) for the quickstart and the tests.

It shows the contract a torchrun script has with slurmfm: ranks come from torchrun, the
checkpoint directory from ``SLURMFM_CHECKPOINT_DIR``, resuming means loading the checkpoint that
the atomic ``latest`` pointer names (``slurmfm.checkpoint``), and SIGUSR2 before the time limit
means "save and exit 0" (the job then requeues itself). All ranks agree on stopping through an
all-reduce of the flag, so they save at the same step. Each rank prints one JSON line with
where it ran, so tests can check world size and node placement from the job's own output
(``hostname`` is the same on every virtual node of the local cluster; ``SLURMD_NODENAME`` is
not).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist

from slurmfm import checkpoint as ck


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds per step (slow demo)")
    ap.add_argument("--lr", type=float, default=0.05, help="SGD learning rate (sweeps vary it)")
    args = ap.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    node = os.environ.get("SLURMD_NODENAME", "?")
    info = {
        "event": "rank",
        "rank": rank,
        "world_size": world,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "node": node,
        "node_rank": int(os.environ.get("SLURMFM_NODE_RANK", "-1")),
        "host_order": os.environ.get("SLURMFM_HOST_ORDER", ""),
        "topology_addr": os.environ.get("SLURM_TOPOLOGY_ADDR", ""),
        "job_id": os.environ.get("SLURM_JOB_ID", ""),
    }
    print(json.dumps(info), flush=True)

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    ckpt_dir = ck.run_dir()
    stop = ck.SaveRequest()  # SIGUSR2 from slurmfm before the time limit
    start = 0
    resume = ck.latest(ckpt_dir)
    if resume is not None:
        state = torch.load(resume / "state.pt", weights_only=True)  # tensors only, no code
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        start = int(state["step"])
        if rank == 0:
            print(json.dumps({"event": "resume", "step": start,
                              "restart": os.environ.get("SLURMFM_RESTART", "0")}), flush=True)

    def save(step: int) -> None:
        if rank == 0:
            state = {"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step}
            path = ck.save(ckpt_dir, step, lambda tmp: torch.save(state, tmp / "state.pt"))
            print(json.dumps({"event": "checkpoint", "step": step, "path": str(path)}),
                  flush=True)
        dist.barrier()

    g = torch.Generator().manual_seed(1234 + rank)
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(32, 16, generator=g)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 0:
            print(json.dumps({"event": "step", "step": step, "loss": round(loss.item(), 5)}),
                  flush=True)
            ck.report_progress(step)  # for the job's metrics (throttled; see slurmfm.checkpoint)
        flag = torch.tensor([1.0 if stop.requested else 0.0])
        dist.all_reduce(flag)  # every rank learns that one was asked to stop
        if flag.item() > 0:
            save(step)
            if rank == 0:
                print(json.dumps({"event": "saved-before-timeout", "step": step}), flush=True)
            stop.finish()  # a late duplicate signal must not kill the clean exit
            dist.destroy_process_group()
            return 0
        if step % args.checkpoint_every == 0 or step == args.steps:
            save(step)
        if args.sleep:
            time.sleep(args.sleep)
    dist.barrier()
    if rank == 0:
        ck.report_progress(args.steps, force=True)
        # nothing left of what was asked: no requeue even if a save signal came late
        ck.mark_done(ckpt_dir, steps=args.steps)
        print(json.dumps({"event": "done", "steps": args.steps, "world_size": world,
                          "lr": args.lr, "run_id": os.environ.get("SLURMFM_RUN_ID", ""),
                          "checkpoint_dir": str(ckpt_dir)}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    code = main()
    # Leave without the interpreter's teardown: once the process group is destroyed, gloo's
    # C++ threads can still race the static destructors, and a rank that finished its work then
    # aborts ("terminate called without an active exception", exit -6), which torchrun reports
    # as a failed worker. Everything this trainer writes is flushed and fsynced by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
