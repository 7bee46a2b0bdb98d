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

On SIGTERM or SIGINT it does what torchrun does, not die of the signal: torchrun's handler
raises ``SignalException`` (pytorch/pytorch
torch/distributed/elastic/multiprocessing/api.py, ``_terminate_process_handler``), its agent
passes the signal to the workers and waits for them (``_shutdown``: the same signal, then
SIGKILL after a grace period; torch/distributed/elastic/agent/server/api.py), and ``@record``
re-raises, so the launcher exits 1 (torch 2.13: ``kill -TERM`` of torchrun prints
``SignalException: Process N got signal: 15`` and exits 1). So when srun ends the other
nodes' tasks for one rank's failure, every task exits 1, as on a cluster.

Use it as a recipe's ``launcher.python``: slurmfm then runs ``THIS -m torch.distributed.run
--opt=value ... SCRIPT ARGS`` (options also as ``--opt value``, underscores or dashes).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

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
    elif argv[:1] == ["-c"]:  # python -c RUN_MODULE torch.distributed.run (slurmfm/job/safepath)
        argv = argv[3:]
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
    workers: list[subprocess.Popen[bytes]] = []
    got: list[int] = []

    def on_signal(signum: int, frame: object) -> None:
        got.append(signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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
    while not got and any(w.poll() is None for w in workers):
        if any(w.poll() for w in workers):
            # a worker failed: torchrun stops the others (TERM) and exits 1 (its agent's
            # monitor loop, torch/distributed/elastic/agent/server/api.py, with the default
            # --max-restarts=0)
            shutdown(workers, signal.SIGTERM, say=False)
            return 1
        time.sleep(0.1)
    if got:
        return shutdown(workers, got[0])
    codes = [w.wait() for w in workers]
    return 1 if any(codes) else 0


def shutdown(
    workers: list[subprocess.Popen[bytes]], signum: int, grace_s: float = 30.0, say: bool = True
) -> int:
    """torchrun's answer to a TERM or INT: the signal to every worker, a wait, then KILL to
    the ones left; exit 1 with the ``SignalException`` line (see the module docstring)."""
    for w in workers:
        if w.poll() is None:
            w.send_signal(signum)
    deadline = time.monotonic() + grace_s
    while any(w.poll() is None for w in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    for w in workers:
        if w.poll() is None:
            w.kill()
        w.wait()
    if say:
        exc = "torch.distributed.elastic.multiprocessing.api.SignalException"
        print(f"{exc}: Process {os.getpid()} got signal: {signum}", file=sys.stderr, flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
