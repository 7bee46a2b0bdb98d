"""Issue 12.6 on real Slurm: a node the job owner may not drain is kept out of the requeue.

The job runs as an unprivileged user (``sbatch --uid``; the lab runs as root), pinned to two
nodes with ``--nodelist``. Its first run plays a failed health gate on its second node through
the runtime's own requeue path (``Batch.drain`` then ``Batch.act``): the drain is refused, the
job is requeued with that node excluded, and the second run lands elsewhere.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lab import SlurmLab, wait_for_text

pytestmark = [pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]
USER = "slurmfm-owner"

JOB = """#!/bin/bash
echo "run restart=${SLURM_RESTART_COUNT:-0} nodes=$SLURM_JOB_NODELIST"
if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then
  BAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -n 1)
  cd "$EXP" && BAD=$BAD /usr/bin/python3 - <<'PY'
import os, sys
sys.path.insert(0, os.environ["EXP"])
from sfjob.options import BatchOptions
from sfjob.batch import Batch
from sfjob import decide as dec
bad = os.environ["BAD"]
b = Batch(BatchOptions.from_argv(["--drain", "1", "--requeue-delay-s", "1"]))
ok = b.drain(bad, "health gate: test")
print("drained:", ok, flush=True)
b.act(dec.Decision("requeue", "health gate failed on " + bad, 3), exclude=[] if ok else [bad])
PY
  sleep 300
fi
"""


@pytest.fixture
def exp() -> Iterator[Path]:
    if os.geteuid() != 0:
        pytest.skip("needs root to run a job as another user")
    try:
        pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/bin/bash", USER], check=True)
    d = Path(tempfile.mkdtemp(prefix="slurmfm-owner-", dir="/var/tmp"))
    shutil.copytree(REPO / "slurmfm" / "job", d / "sfjob")
    (d / "logs").mkdir()
    (d / "job.sh").write_text(JOB)
    for p in [d, *d.rglob("*")]:
        p.chmod(0o777 if p.is_dir() or p.name == "job.sh" else 0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def test_owner_requeue_never_lands_on_the_failed_node(host_b_lab: SlurmLab, exp: Path) -> None:
    pinned = host_b_lab.hostnames(host_b_lab.run(["sinfo", "-h", "-o", "%N"]).stdout.split()[0])[:2]
    proc = host_b_lab.run(
        [
            "sbatch",
            "--parsable",
            f"--uid={USER}",
            f"--gid={USER}",
            "--requeue",
            "--open-mode=append",
            "-N2",
            "--nodelist=" + ",".join(pinned),
            "-o",
            f"{exp}/logs/job-%j.out",
            f"--export=ALL,EXP={exp},SLURMFM_LOG_DIR={exp}/logs",
            str(exp / "job.sh"),
        ]
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    # The second run's first line, not Slurm's Restarts=1 alone: a job is RUNNING in Slurm
    # a moment before its batch script has written anything (the CI run of 86ee13d saw that).
    # The second run ends at once; its record is read once it ended (COMPLETING, seen in a CI
    # simulation, is neither running nor ended).
    try:
        wait_for_text(exp / "logs" / f"job-{job_id}.out", "run restart=1", 240)
        rec = host_b_lab.wait_job(job_id, timeout=120)
        log = (exp / "logs" / f"job-{job_id}.out").read_text()
        assert rec.get("JobState") == "COMPLETED", (rec, log)
        assert "drained: False" in log  # an owner may not drain
        bad = pinned[1]
        assert rec["ExcNodeList"] == bad
        assert bad not in host_b_lab.hostnames(rec["NodeList"])
        assert pinned[0] in host_b_lab.hostnames(rec["NodeList"])
        state = next((exp / "logs").glob("*.state")).read_text()
        assert f"(excluded {bad})" in state
    finally:
        host_b_lab.run(["scancel", job_id])
