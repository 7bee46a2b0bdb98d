"""Prints the ``rank`` record of recipes/scripts/train_tiny.py from the launcher's environment.

For tests of placement and rank order under the torchrun stand-in (``torchrun.py`` here): the
same fields, with the rank from ``RANK`` (what torchrun hands a worker) instead of a process
group. Standard library only, so it starts at once.
"""

from __future__ import annotations

import json
import os


def launcher_parent() -> str:
    """The command line of the process that started this worker's launcher (torchrun): the
    runtime's per-node entry on the host, or Slurm's step daemon for a launch in a container."""
    try:
        with open(f"/proc/{os.getppid()}/stat") as fh:
            grand = fh.read().rsplit(")", 1)[1].split()[1]
        with open(f"/proc/{grand}/cmdline", "rb") as fh:
            words = fh.read().split(b"\0")
        # each word cut to 60 characters and the whole to 200: the runtime check program is
        # argv there (and the launcher's words follow it), and srun splits an output line of
        # more than 1 KiB, which then mixes with other tasks' lines (a record lost in a CI
        # simulation once the node entry ran in the container with the launch's words)
        return b" ".join(w[:60] for w in words).decode(errors="replace").strip()[:200]
    except (OSError, IndexError):
        return "?"


env = os.environ
print(
    json.dumps(
        {
            "event": "rank",
            "rank": int(env["RANK"]),
            "world_size": int(env["WORLD_SIZE"]),
            "local_rank": int(env.get("LOCAL_RANK", "0")),
            "node": env.get("SLURMD_NODENAME", "?"),
            "node_rank": int(env.get("SLURMFM_NODE_RANK", "-1")),
            "host_order": env.get("SLURMFM_HOST_ORDER", ""),
            "topology_addr": env.get("SLURM_TOPOLOGY_ADDR", ""),
            "job_id": env.get("SLURM_JOB_ID", ""),
            "launcher_parent": launcher_parent(),
            # set only by the test image's /etc/environment (scripts/pyxis-lab)
            "image_var": env.get("SLURMFM_IMAGE_VAR", ""),
        }
    ),
    flush=True,
)
