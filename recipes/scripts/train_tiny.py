"""A tiny CPU data-parallel training job (torch + gloo) for the quickstart and the tests.

It shows the contract a torchrun script has with slurmfm: ranks come from torchrun, the
checkpoint directory from ``SLURMFM_CHECKPOINT_DIR``, and resuming means reading the
``latest`` pointer there. Each rank prints one JSON line with where it ran, so tests can check
world size and node placement from the job's own output (``hostname`` is the same on every
virtual node of the local cluster; ``SLURMD_NODENAME`` is not).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist


def save_checkpoint(ckpt_dir: Path, step: int, state: dict[str, object]) -> Path:
    """Write step_N.pt, then publish it through an atomic ``latest`` pointer."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = ckpt_dir / f"step_{step:06d}.pt"
    tmp = path.with_suffix(".pt.tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)
    pointer = ckpt_dir / "latest.tmp"
    with open(pointer, "w", encoding="utf-8") as fh:
        fh.write(path.name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(pointer, ckpt_dir / "latest")
    return path


def load_latest(ckpt_dir: Path) -> dict[str, object] | None:
    pointer = ckpt_dir / "latest"
    if not pointer.exists():
        return None
    return torch.load(ckpt_dir / pointer.read_text().strip(), weights_only=False)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--checkpoint-every", type=int, default=5)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds per step (slow demo)")
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
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    ckpt_dir = Path(os.environ.get("SLURMFM_CHECKPOINT_DIR", "checkpoints"))
    start = 0
    state = load_latest(ckpt_dir)
    if state is not None:
        model.module.load_state_dict(state["model"])  # type: ignore[arg-type]
        opt.load_state_dict(state["optim"])  # type: ignore[arg-type]
        start = int(state["step"])  # type: ignore[call-overload]
        if rank == 0:
            print(json.dumps({"event": "resume", "step": start}), flush=True)

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
        if step % args.checkpoint_every == 0 or step == args.steps:
            if rank == 0:
                path = save_checkpoint(
                    ckpt_dir,
                    step,
                    {"model": model.module.state_dict(), "optim": opt.state_dict(), "step": step},
                )
                print(json.dumps({"event": "checkpoint", "step": step, "path": str(path)}),
                      flush=True)
            dist.barrier()
        if args.sleep:
            time.sleep(args.sleep)
    dist.barrier()
    if rank == 0:
        print(json.dumps({"event": "done", "steps": args.steps, "world_size": world}), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
