"""Issue 15 item 8 on real Slurm: one live job per run directory.

Two submissions of one recipe at the same time: exactly one is queued, the other is refused
with the live job's id (exit 2), because both would train into one checkpoint directory.
Once that job has ended, or with --allow-shared-run-dir, or with another run id, submitting
works again.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from lab import SlurmLab

pytestmark = [pytest.mark.slurm]


@pytest.fixture
def slurm_lab(every_lab: SlurmLab) -> SlurmLab:
    return every_lab


def recipe(tmp: Path) -> Path:
    """A one-node lab-cpu job that stays alive (sleeps) until the test cancels it."""
    (tmp / "sleep.py").write_text("import time\ntime.sleep(600)\n")
    path = tmp / "twice.yaml"
    path.write_text(
        "name: twice\n"
        "cluster: {partition: batch, instance_type: lab-cpu}\n"
        "resources: {nodes: 1, procs_per_node: 1, time_limit: 5, exclusive: false}\n"
        f"launcher: {{kind: torchrun, script: {tmp / 'sleep.py'}}}\n"
        f"storage: {{checkpoint_root: {tmp / 'ckpt'}, log_dir: {tmp / 'logs'}}}\n"
        "resilience: {health_gate: 'off', requeue: false, save_before_timeout_s: 0}\n"
    )
    return path


def test_a_second_live_job_on_one_run_directory_is_refused(
    slurm_lab: SlurmLab, tmp_path: Path
) -> None:
    lab = slurm_lab
    path = recipe(tmp_path)
    argv = [*lab.slurmfm_argv(), "submit", str(path)]
    from lab import REPO_ROOT

    procs = [
        subprocess.Popen(
            argv,
            cwd=REPO_ROOT,
            env=lab.env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(2)
    ]
    results = [(p.wait(timeout=240), *p.communicate()) for p in procs]
    jobs: list[str] = []
    try:
        jobs = [out.strip() for rc, out, _ in results if rc == 0]
        refused = [err for rc, _, err in results if rc != 0]
        assert len(jobs) == 1, results
        assert len(refused) == 1, results
        run_dir = tmp_path / "ckpt" / "twice" / "twice"
        assert refused[0] == (
            f"storage.run_id: job {jobs[0]} ("
            + refused[0].split("(", 1)[1].split(")", 1)[0]
            + f") already uses the run directory {run_dir}; a second job would overwrite its "
            "checkpoints and resume from them. Wait for it or cancel it, give this run its own "
            "id (--set storage.run_id=NEW), or pass --allow-shared-run-dir\n"
        )
        assert refused[0].split("(", 1)[1].startswith(("PENDING)", "RUNNING)", "CONFIGURING)"))
        # The explicit choices are honoured while the first job lives.
        other = lab.slurmfm("submit", str(path), "--set", "storage.run_id=second")
        assert other.returncode == 0, other.stderr
        jobs.append(other.stdout.strip())
        shared = lab.slurmfm("submit", str(path), "--allow-shared-run-dir")
        assert shared.returncode == 0, shared.stderr
        jobs.append(shared.stdout.strip())
        # Ended jobs do not block: cancel them all, then the run directory is free again.
        lab.run(["scancel", *jobs])
        for job in jobs:
            lab.wait_job(job, timeout=120)
        again = lab.slurmfm("submit", str(path))
        assert again.returncode == 0, again.stderr
        jobs.append(again.stdout.strip())
    finally:
        if jobs:
            lab.run(["scancel", *jobs])
