"""``launcher.kind: ray`` on the real local Slurm with real Ray 2.60 (the test venv's): a Ray
head on node 0 of the job's host order, Ray workers on the others, and a driver
(``ray_driver.py``) that runs a task on every Ray node and checkpoints each step in the job's
checkpoint directory.

* two nodes: the cluster comes up, every node's task reports its own SLURMD_NODENAME, the
  workers end with the head (the job COMPLETED, nothing of its Ray left, private dirs gone);
* a worker node killed mid-run (its slurmd and the job's processes on it, Ray's included): the
  driver fails, the job requeues off the dead node and the driver resumes from its checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lab import (
    REPO_ROOT,
    OwnLab,
    SlurmLab,
    job_record,
    live_pids,
    own_lab_fixture,
    read_text,
    wait_job_done,
    wait_until,
)

pytestmark = [pytest.mark.slurm]

DRIVER = Path(__file__).resolve().parent / "ray_driver.py"
RAY = str(Path(sys.executable).parent / "ray")


# A four-node host lab of its own: a Ray cluster's start takes the machine's cores for a minute
# and the killed-node test takes one node down and brings it back; in a group of its own both
# run beside the other labs' tests (on host-b they made that group the real tier's longest).
RAY_LAB = OwnLab("ray-host", ctld_port=19187, slurmd_port=18931, nodes=4)


@pytest.fixture(scope="session")
@own_lab_fixture(RAY_LAB)
def ray_lab() -> SlurmLab:
    """The Ray lab (``RAY_LAB``), brought up on first use."""
    return RAY_LAB.up()


def recipe(tmp: Path, name: str, steps: int, sleep: float) -> dict[str, Any]:
    return {
        "name": name,
        "cluster": {"instance_type": "lab-cpu", "partition": "batch"},
        "resources": {
            "nodes": 2,
            "procs_per_node": 1,
            "time_limit": "00:10:00",
            "exclusive": False,
        },
        "parallelism": {"tp": 1, "pp": 1},
        "launcher": {
            "kind": "ray",
            "driver": str(DRIVER),
            "python": sys.executable,
            "ray": RAY,
            "join_timeout_s": 300,
            "args": ["--steps", str(steps), "--sleep", str(sleep)],
        },
        "env": {
            "OMP_NUM_THREADS": "1",
            # the raylet waits this long for its dashboard agent's port file; the agent
            # imports for 20 s and more on the lab's two busy cores, past the default, and
            # the raylet then exits ("Timed out waiting for file .../metrics_agent_port")
            "RAY_agent_register_timeout_ms": "180000",
        },
        "storage": {"checkpoint_root": str(tmp / "ckpt"), "log_dir": str(tmp / "logs")},
        "resilience": {"save_before_timeout_s": 0},
    }


def submit(lab: SlurmLab, tmp: Path, rec: dict[str, Any]) -> str:
    path = tmp / "recipe.yaml"
    path.write_text(json.dumps(rec))  # JSON is YAML
    proc = lab.run([*lab.slurmfm_argv(), "submit", str(path)], cwd=REPO_ROOT, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.split()[0]


def events(log: str) -> list[dict[str, Any]]:
    return [json.loads(m.group(0)) for m in re.finditer(r'\{"event"[^\n]*\}(?=\n|$)', log)]


job = job_record
wait_done = wait_job_done


def ray_of(job_id: str) -> list[int]:
    """Processes on this host that carry the job's Ray mark (node.stop_own_ray's)."""
    return [
        p
        for p in live_pids("SLURM_JOB_ID", job_id)
        if _env(p).get("SLURMFM_RAY_OWNER", "").startswith(f"{job_id}.")
    ]


def _env(pid: int) -> dict[str, str]:
    from slurmfm.job.node import environ

    return environ(pid)


def test_ray_cluster_head_workers_and_a_driver_on_every_node(
    ray_lab: SlurmLab, tmp_path: Path
) -> None:
    job_id = submit(ray_lab, tmp_path, recipe(tmp_path, "ray-two", steps=2, sleep=0))
    rec = wait_done(ray_lab, job_id, timeout=420)
    log = read_text(tmp_path / "logs" / f"ray-two_{job_id}.out")
    assert rec["JobState"] == "COMPLETED", log[-4000:]
    nodes = ray_lab.hostnames(rec["NodeList"])
    ev = events(log)
    [cluster] = [e for e in ev if e["event"] == "cluster"]
    assert cluster["nodes"] == 2
    # the driver ran on the head, node 0 of the job's host order
    assert sorted(cluster["order"].split()) == sorted(nodes)
    assert cluster["head"] == cluster["order"].split()[0]
    # RAY_ADDRESS: the head's address and the job's rendezvous port, out of the ephemeral range
    port = int(cluster["address"].rsplit(":", 1)[1])
    assert 20000 <= port < 26000, cluster
    steps = [e for e in ev if e["event"] == "step"]
    assert [e["step"] for e in steps] == [1, 2]
    for e in steps:  # a task ran on each node, under that node's own slurmd
        assert e["nodes"] == sorted(nodes), e
    assert "slurmfm: Ray cluster has 2 nodes; starting the driver" in log
    assert "is gone (its driver ended); this worker stops" in log
    # each node's Ray stopped, its private directory removed
    wait_until("the job's Ray stopped", lambda: not ray_of(job_id), 30)
    assert not list(Path("/tmp").glob(f"slurmfm-ray-{job_id}-*"))
    state = read_text(tmp_path / "logs" / f"ray-two_{job_id}.state")
    assert "event=finished" in state, state


@pytest.fixture
def restored_ray_lab(ray_lab: SlurmLab) -> Iterator[SlurmLab]:
    """host-b with a slurmd killed by the test brought back and its nodes resumed."""
    yield ray_lab
    ray_lab.run(["scancel", "--user=root"])
    RAY_LAB.command("--nodes", str(RAY_LAB.nodes), "up", timeout=300)
    ray_lab.run(["scontrol", "update", "NodeName=ALL", "State=RESUME"])


def test_a_killed_worker_node_requeues_and_the_driver_resumes_from_its_checkpoint(
    restored_ray_lab: SlurmLab, tmp_path: Path
) -> None:
    lab = restored_ray_lab
    total = 40
    job_id = submit(lab, tmp_path, recipe(tmp_path, "ray-kill", steps=total, sleep=0.5))
    log_path = tmp_path / "logs" / f"ray-kill_{job_id}.out"

    def stepped() -> bool:
        return any(e["event"] == "step" and e["step"] >= 3 for e in events(read_text(log_path)))

    wait_until("the driver's third step", stepped, 240, lambda: read_text(log_path))
    [cluster] = [e for e in events(read_text(log_path)) if e["event"] == "cluster"]
    nodes = lab.hostnames(job(lab, job_id)["NodeList"])
    victim = next(n for n in nodes if n != cluster["head"])  # a Ray worker node
    os.kill(int((lab.lab_dir / "run" / f"slurmd-{victim}.pid").read_text()), signal.SIGKILL)
    for pid in live_pids("SLURM_JOB_ID", job_id):
        if _env(pid).get("SLURMD_NODENAME") == victim:  # its entry, `ray start`, raylet, workers
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    rec = wait_done(lab, job_id, timeout=600)
    log = read_text(log_path)
    assert rec["JobState"] == "COMPLETED", log[-4000:]
    assert int(rec["Restarts"]) >= 1
    assert victim not in lab.hostnames(rec["NodeList"])
    ev = events(log)
    resumed = [e["step"] for e in ev if e["event"] == "resume"]
    assert resumed, log[-4000:]
    assert resumed[0] >= 3  # from the checkpoint in the job's checkpoint dir
    done = [e["step"] for e in ev if e["event"] == "step"]
    assert done[-1] == total
    # the relaunch ran its tasks on its own two nodes, the dead one not among them
    last = [e for e in ev if e["event"] == "step"][-1]
    assert last["nodes"] == sorted(lab.hostnames(rec["NodeList"]))
    state = read_text(tmp_path / "logs" / f"ray-kill_{job_id}.state")
    assert f"unresponsive: {victim}" in state, state
