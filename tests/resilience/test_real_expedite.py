"""Issue 15 item 15 on real Slurm 26.05: a requeue the job asks for restarts at once.

A requeued job is held until the job credential's lifetime has passed (``AuthInfo=cred_expire``,
120 s by default, 10 s in the lab: https://slurm.schedmd.com/slurm.conf.html#OPT_cred_expire):
Slurm sets its EligibleTime to the requeue (its new SubmitTime) + cred_expire + 1 s. With
``resilience.expedited_requeue`` the job is submitted with ``--requeue=expedite`` (Slurm 25.11+,
allowed by the lab's ``SlurmctldParameters=enable_expedited_requeue``) and is eligible at the
moment of the requeue. Both jobs here fail their first run with an exit the recipe marks
retryable, so slurmfm's runtime requeues them; Slurm's own record of when each became eligible
tells the two apart (no wall-clock measurement). Slurm requeues an expedited job's non-zero
exit *held* (REQUEUE_HOLD on 26.05), so a job the runtime fails must still end FAILED. Stand-ins for torchrun and the step: torch is
not the subject.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

import pytest
from lab import REPO_ROOT, SlurmLab, SuiteLabFactory

from slurmfm.backends.slurm_cli import parse_scontrol_record

pytestmark = [pytest.mark.slurm, pytest.mark.slurm_newer]

STEP = """\
import os, sys
sys.exit(3 if os.environ.get("SLURMFM_RESTART", "0") == "0" else 0)
"""


def recipe(tmp: Path, name: str, expedite: bool, step: str = STEP, retry: str = "[1]") -> Path:
    (tmp / "step.py").write_text(step)
    path = tmp / f"{name}.yaml"
    path.write_text(
        f"name: {name}\n"
        "cluster: {partition: batch, instance_type: lab-cpu}\n"
        "resources: {nodes: 1, procs_per_node: 1, time_limit: 5, exclusive: false}\n"
        f"launcher: {{kind: torchrun, script: {tmp / 'step.py'}, "
        f"python: {REPO_ROOT / 'tests' / 'standins' / 'torchrun.py'}}}\n"
        f"storage: {{checkpoint_root: {tmp / 'ckpt'}, log_dir: {tmp / 'logs'}}}\n"
        "resilience: {health_gate: 'off', save_before_timeout_s: 0, max_restarts: 2, "
        f"retry_exit_codes: {retry}, expedited_requeue: {str(expedite).lower()}}}\n"
    )
    return path


def eligible_after_requeue_s(lab: SlurmLab, tmp: Path, name: str, expedite: bool) -> float:
    path = recipe(tmp, name, expedite)
    proc = lab.slurmfm("submit", str(path), "--wait", "--timeout", "120", timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = proc.stdout.strip().splitlines()[0]
    rec = parse_scontrol_record(lab.run(["scontrol", "show", "job", "-o", job_id]).stdout)
    assert (rec["JobState"], rec["Restarts"]) == ("COMPLETED", "1"), rec
    state = next((tmp / "logs").glob(f"{name}_{job_id}.state")).read_text()
    assert "event=requeue" in state
    t = datetime.fromisoformat
    return (t(rec["EligibleTime"]) - t(rec["SubmitTime"])).total_seconds()


@pytest.mark.parametrize("suite", ["sid"])
def test_expedited_requeue_skips_the_credential_wait(
    slurm_lab_suite: SuiteLabFactory, suite: str, tmp_path: Path
) -> None:
    lab = slurm_lab_suite(suite)
    (tmp_path / "plain").mkdir()
    (tmp_path / "fast").mkdir()
    plain = eligible_after_requeue_s(lab, tmp_path / "plain", "plain", expedite=False)
    fast = eligible_after_requeue_s(lab, tmp_path / "fast", "fast", expedite=True)
    conf = lab.run(["scontrol", "show", "config"]).stdout
    cred = int(conf.split("cred_expire=")[1].split(",")[0].split()[0])
    assert plain >= cred  # held for the credential's lifetime
    assert fast == 0  # eligible when requeued


@pytest.mark.parametrize("suite", ["sid"])
def test_an_expedited_job_slurmfm_fails_ends_failed(
    slurm_lab_suite: SuiteLabFactory, suite: str, tmp_path: Path
) -> None:
    lab = slurm_lab_suite(suite)
    path = recipe(tmp_path, "bad", True, step="import sys\nsys.exit(3)\n", retry="[]")
    proc = lab.slurmfm("submit", str(path), "--wait", "--timeout", "120", timeout=180)
    assert proc.returncode != 0
    job_id = proc.stdout.strip().splitlines()[0]
    rec = parse_scontrol_record(lab.run(["scontrol", "show", "job", "-o", job_id]).stdout)
    assert (rec["JobState"], rec["Restarts"]) == ("FAILED", "0"), rec
    state = next((tmp_path / "logs").glob(f"bad_{job_id}.state")).read_text()
    assert "event=fail" in state
