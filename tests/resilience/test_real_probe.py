"""The runtime's node probe on real Slurm, beside a launch step that holds the job's memory.

Why: after a failed step the runtime asks every node to answer one step (``slurm.probe``)
and sets the silent ones DOWN. The labs schedule memory (``CR_Core_Memory``), and a step
with ``--overlap`` but the default memory was refused at once while the failed launch step
was still being torn down: srun's "Unable to create step ... Memory required by task is not
available" named no node, the runtime downed both nodes of its own job, and Slurm requeued it
for a node failure past its restart cap (seen in CI, 22.05). Here the launch step is kept
running on purpose, so the refusal is certain without the fix, on each Slurm version:

- the probe as the runtime runs it must hear from every node;
- the same step without ``--mem=0`` must be refused with the words ``slurm.NOT_CREATED``
  looks for (so the unit tests' stand-in of that refusal is Slurm's own).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from lab import SlurmLab, SuiteLabFactory, read_text, wait_until

pytestmark = [pytest.mark.slurm]

REPO = Path(__file__).resolve().parents[2]

JOB = """#!/bin/bash
# the launch step: holds the job's memory on both nodes until the probe has run
srun --nodes=2 --ntasks=2 --ntasks-per-node=1 sleep 120 &
until squeue -h -s -j "$SLURM_JOB_ID" -o %i | grep -q '[.]0$'; do sleep 0.2; done
PYTHONPATH="$PKG" python3 - <<'PY'
import os
from slurmfm.job import slurm as sl
nodes = sl.hostnames(os.environ["SLURM_JOB_NODELIST"])
found = sl.probe(nodes, timeout_s=60)
print("probe dead=%s unknown=%s" % (",".join(found.dead) or "-", found.unknown or "-"))
argv = sl.srun_per_node(len(nodes)) + ["--overlap", "--immediate=5", "printenv", "SLURMD_NODENAME"]
rc, out = sl.run_command(argv, 60)
print("default memory: refused=%s" % (sl.NOT_CREATED in out))
print(out.strip())
PY
kill %1
wait
"""


def probe_beside_the_launch(lab: SlurmLab, tmp: Path) -> None:
    pkg = tmp / "pkg" / "slurmfm"
    pkg.mkdir(parents=True)
    shutil.copy(REPO / "slurmfm" / "__init__.py", pkg)
    shutil.copytree(REPO / "slurmfm" / "job", pkg / "job")
    (tmp / "job.sh").write_text(JOB)
    out = tmp / "job.out"
    sub = lab.run(
        [
            "sbatch",
            "--parsable",
            "-N2",
            "-o",
            str(out),
            f"--export=ALL,PKG={tmp / 'pkg'}",
            str(tmp / "job.sh"),
        ]
    )
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    rec = lab.wait_job(job_id, timeout=180)
    wait_until("the job's output", lambda: "default memory" in read_text(out), 30)
    text = out.read_text()
    assert rec["JobState"] == "COMPLETED", text
    assert "probe dead=- unknown=-" in text, text
    assert "default memory: refused=True" in text, text


def test_the_probe_hears_every_node_beside_the_launch_step(
    host_b_lab: SlurmLab, tmp_path: Path
) -> None:
    """Slurm 22.05 (the host lab)."""
    probe_beside_the_launch(host_b_lab, tmp_path)


@pytest.mark.parametrize("suite", ["trixie", "sid"])
def test_the_probe_hears_every_node_beside_the_launch_step_newer_slurm(
    slurm_lab_suite: SuiteLabFactory, suite: str, tmp_path: Path
) -> None:
    """Slurm 24.11 (trixie) and 26.05 (sid)."""
    probe_beside_the_launch(slurm_lab_suite(suite), tmp_path)
