#!/usr/bin/env python3
"""Stands in for ``python3 -m torch.distributed.run`` (torchrun) in tests where torch is not the
subject (placement, rank order, Slurm semantics): it starts in milliseconds instead of importing
torch in every launcher and worker, which on a 2-core machine cost each 20-node job minutes.

It follows torchrun's documented contract for a static rendezvous
(https://docs.pytorch.org/docs/stable/elastic/run.html, "Environment Variables"): it starts
``--nproc-per-node`` copies of SCRIPT, each with ``LOCAL_RANK``, ``RANK = node_rank * nproc +
local_rank``, ``GROUP_RANK = node_rank``, ``LOCAL_WORLD_SIZE``, ``WORLD_SIZE = nnodes * nproc``,
``MASTER_ADDR`` and ``MASTER_PORT``. Like torchrun it exits 1 when a worker fails, whatever the
worker's own status (torchrun raises ``ChildFailedError``; checked with torch 2.13: a worker's
``sys.exit(3)`` ends torchrun with 1). It does no rendezvous: that is torch's subject, tested
with the real torchrun elsewhere.

Use it as a recipe's ``launcher.python``: slurmfm then runs ``THIS -m torch.distributed.run
--opt=value ... SCRIPT ARGS`` (options also as ``--opt value``, underscores or dashes).
"""

from __future__ import annotations

import os
import subprocess
import sys

# torchrun options that take a value (torch/distributed/run.py, get_args_parser)
VALUED = {
    "nnodes",
    "nproc_per_node",
    "node_rank",
    "master_addr",
    "master_port",
    "rdzv_backend",
    "rdzv_endpoint",
    "rdzv_id",
    "rdzv_conf",
    "max_restarts",
    "monitor_interval",
    "start_method",
    "role",
    "log_dir",
    "redirects",
    "tee",
    "local_addr",
    "logs_specs",
}


def parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """torchrun's options (dashes as underscores) and the command after them."""
    if argv[:1] == ["-m"]:
        argv = argv[2:]
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv) and argv[i].startswith("--"):
        key, eq, val = argv[i][2:].partition("=")
        key = key.replace("-", "_")
        if not eq and key in VALUED:
            i += 1
            val = argv[i]
        opts[key] = val if (eq or key in VALUED) else "1"
        i += 1
    return opts, argv[i:]


def main(argv: list[str]) -> int:
    opts, command = parse(argv)
    if not command:
        print("torchrun stand-in: no script given", file=sys.stderr)
        return 2
    nproc = int(opts.get("nproc_per_node", "1"))
    nnodes = int(opts.get("nnodes", "1").split(":")[-1])
    # torchrun's --node-rank falls back to $PET_NODE_RANK (torch/distributed/argparse_util.py:
    # an option with action=env defaults to PET_<DEST>), as a launch in a container sets it
    node_rank = int(opts.get("node_rank", os.environ.get("PET_NODE_RANK", "0")))
    host, _, port = opts.get("rdzv_endpoint", "").partition(":")
    if command[0].endswith(".py"):
        command = [sys.executable, *command]
    workers = []
    for local in range(nproc):
        env = dict(
            os.environ,
            LOCAL_RANK=str(local),
            RANK=str(node_rank * nproc + local),
            GROUP_RANK=str(node_rank),
            ROLE_RANK=str(node_rank * nproc + local),
            LOCAL_WORLD_SIZE=str(nproc),
            WORLD_SIZE=str(nnodes * nproc),
            MASTER_ADDR=opts.get("master_addr", host or "127.0.0.1"),
            MASTER_PORT=opts.get("master_port", port or "29500"),
        )
        workers.append(subprocess.Popen(command, env=env))
    codes = [w.wait() for w in workers]  # every worker, as torchrun waits for all
    return 1 if any(codes) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
