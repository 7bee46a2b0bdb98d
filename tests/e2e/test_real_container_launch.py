"""Issue 11 on real Slurm: a training launch in a container runs no slurmfm in the image.

No Pyxis or Enroot runs here, so ``srun`` is the Pyxis stand-in (tests/standins/pyxis/srun: the
"image" is the host; it drops the ``--container-*`` options and runs the real ``srun``). What is
checked is Slurm's part and slurmfm's around it, on 22.05, 24.11 and 26.05: the tasks follow the
planned host order (``--distribution=arbitrary``), so each node's rank is its task id, which the
launcher gets through the ``sh`` program; the launcher is started by Slurm's step daemon, not by
the runtime; and on the save signal a host step on every node TERMs Megatron's workers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from lab import REPO_ROOT, SlurmLab, last_attempt_ranks, read_text, wait_until

from slurmfm import api
from slurmfm.backends.slurm_cli import SlurmCLI, parse_scontrol_record
from slurmfm.plan.types import Placement

pytestmark = [pytest.mark.slurm]

STANDINS = REPO_ROOT / "tests" / "standins"


def job_env(lab: SlurmLab) -> dict[str, str]:
    """The lab's client environment with the Pyxis stand-in first on PATH (sbatch exports it
    to the job, so the job's srun is the stand-in)."""
    return dict(lab.env, PATH=f"{STANDINS / 'pyxis'}:{lab.env['PATH']}")


def image_file(tmp_path: Path) -> Path:
    """An image file the preflight finds on the login node (the stand-in never opens it)."""
    image = tmp_path / "image.sqsh"
    image.write_bytes(b"")
    return image


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(m.group(0)) for m in re.finditer(r'\{"event"[^{}]*\}', text)]


def idle_nodes(lab: SlurmLab, k: int) -> list[str]:
    out = lab.run(["sinfo", "-h", "-N", "-p", "batch", "-t", "idle", "-o", "%N"]).stdout
    nodes = sorted(set(out.split()))
    assert len(nodes) >= k, out
    return nodes[-k:]


def test_ranks_follow_the_planned_order_and_no_runtime_runs_in_the_image(
    every_lab: SlurmLab, tmp_path: Path
) -> None:
    """The task layout is Slurm's (srun --distribution=arbitrary): on each Slurm version."""
    slurm_lab = every_lab
    order = tuple(reversed(idle_nodes(slurm_lab, 3)))  # not Slurm's own (name) order
    recipe = api.load(
        REPO_ROOT / "recipes" / "quickstart.yaml",
        {
            "resources.nodes": 3,
            "launcher.python": str(STANDINS / "torchrun.py"),
            "launcher.script": str(STANDINS / "report_rank.py"),
            "launcher.args": [],
            "container.image": str(image_file(tmp_path)),
            "storage.checkpoint_root": str(tmp_path / "ckpt"),
            "storage.log_dir": str(tmp_path / "logs"),
        },
    )
    env = job_env(slurm_lab)
    job = api.submit(
        recipe, backend=SlurmCLI(env), env=env, placement=Placement(mode="pin", nodes=order)
    )
    fields = slurm_lab.wait_job(job.job_id, timeout=240)
    log = read_text(tmp_path / "logs" / f"quickstart_{job.job_id}.out")
    assert fields.get("JobState") == "COMPLETED", f"{fields}\n{log[-3000:]}"
    ranks = last_attempt_ranks(events(log))
    assert len(ranks) == 6, log[-3000:]
    for r in ranks:
        assert r["node"] == order[r["node_rank"]], r  # rank i on the i-th planned node
        assert r["rank"] == 2 * r["node_rank"] + r["local_rank"], r
        assert r["host_order"].split() == list(order)
        # torchrun's parent is Slurm's step daemon, not the runtime's per-node entry
        assert ".pyz" not in r["launcher_parent"], r
        assert "slurmstepd" in r["launcher_parent"], r
    assert "slurmfm: node 0 runs (in the container): PET_NODE_RANK=0 " in log


def test_megatron_in_a_container_saves_on_the_signal_from_the_host(
    slurm_lab: SlurmLab, tmp_path: Path
) -> None:
    recipe = api.load(
        {
            "name": "mega",
            # the lab's nodes have 8 GPU GRES each; whole nodes, as a p5 job takes them
            "cluster": {"instance_type": "p5.48xlarge", "partition": "batch", "flavor": "generic"},
            "resources": {"nodes": 2, "procs_per_node": 2, "time_limit": "00:10:00"},
            "parallelism": {"tp": 1, "pp": 1},
            "resilience": {"health_gate": "off", "nccl_transport_check": "off"},
            "observability": {"enabled": "off"},
            "launcher": {
                "kind": "megatron",
                "python": str(STANDINS / "torchrun.py"),
                "megatron_path": str(STANDINS),
                "entrypoint": "megatron_pretrain.py",
                "model_args": {"train-iters": 100000},
            },
            "container": {"image": str(image_file(tmp_path))},
            "storage": {
                "checkpoint_root": str(tmp_path / "ckpt"),
                "log_dir": str(tmp_path / "logs"),
            },
        }
    )
    env = job_env(slurm_lab)
    job = api.submit(recipe, backend=SlurmCLI(env), env=env)
    log_path = tmp_path / "logs" / f"mega_{job.job_id}.out"
    state_path = tmp_path / "logs" / f"mega_{job.job_id}.state"
    try:
        wait_until(
            "all 4 workers started",
            lambda: sum(e["event"] == "start" for e in events(read_text(log_path))) == 4,
            120,
            lambda: read_text(log_path),
        )
        # Slurm's own pre-timeout request (--signal=B:USR2@N sends it the same way)
        sig = slurm_lab.run(["scancel", "--batch", "--signal=USR2", job.job_id])
        assert sig.returncode == 0, sig.stderr
        wait_until(
            "the requeue after the save",
            lambda: "event=requeue saved before the time limit" in read_text(state_path),
            120,
            lambda: read_text(log_path),
        )
        # one TERM per worker, which saves and exits 0: the launcher itself was not signalled
        assert "saved before the time limit (training exit 0)" in read_text(log_path)
        ev = events(read_text(log_path))
        saved = [e for e in ev if e["event"] == "saved-on-term"]
        assert sorted(e["rank"] for e in saved) == [0, 1, 2, 3], ev  # every worker got TERM
        starts = [e for e in ev if e["event"] == "start"]
        assert all(e["usr2_ignored"] for e in starts), starts  # the launcher's ignore, inherited
        rec = parse_scontrol_record(
            slurm_lab.run(["scontrol", "show", "job", "-o", job.job_id]).stdout
        )
        assert int(rec["Restarts"]) >= 1 or rec["JobState"] in ("PENDING", "REQUEUED"), rec
        done = (tmp_path / "ckpt").rglob("latest_checkpointed_iteration.txt")
        assert next(int(p.read_text()) for p in done) > 0
    finally:
        slurm_lab.run(["scancel", job.job_id])
