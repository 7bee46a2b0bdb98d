"""A trainer stand-in for train-and-serve jobs: real torchrun ranks that use the job's server.

Rank 0 asks the server the job started (``SLURMFM_SERVE_URL``) for its models and its
stand-in info, as a GRPO trainer would send prompts to its generation server; every rank
prints one JSON line with its node, so the test can check the split from the job's output.
"""

from __future__ import annotations

import json
import os
import urllib.request

import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    line: dict[str, object] = {
        "event": "trainer",
        "rank": rank,
        "world_size": world,
        "node": os.environ.get("SLURMD_NODENAME"),
        "host_order": os.environ.get("SLURMFM_HOST_ORDER"),
        "net_env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "FI_"))},
    }
    if rank == 0:
        url = os.environ["SLURMFM_SERVE_URL"]
        with urllib.request.urlopen(url + "/v1/models", timeout=10) as r:  # noqa: S310 - http from the job
            line["models"] = [m["id"] for m in json.load(r)["data"]]
        with urllib.request.urlopen(url + "/standin/info", timeout=10) as r:  # noqa: S310 - http from the job
            line["server"] = json.load(r)
        line["url"] = url
    print(json.dumps(line), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    if rank == 0:
        # its work is done: say so for this launch (SLURMFM_ASK), as slurmfm.checkpoint.mark_done
        # does (the 5-minute test job gets the pre-timeout signal at once; without the marker
        # it would be a save)
        run = os.environ["SLURMFM_CHECKPOINT_DIR"]
        os.makedirs(run, exist_ok=True)
        record = {
            "ask": os.environ.get("SLURMFM_ASK", ""),
            "job_id": os.environ.get("SLURM_JOB_ID"),
        }
        with open(os.path.join(run, "DONE"), "w") as fh:
            json.dump(record, fh)


if __name__ == "__main__":
    main()
