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

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from lab import REPO_ROOT, SlurmLab, SuiteLabFactory, lab_root

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
        "restart_in_job: false, "  # a requeue is the subject
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


# --- what the runtime asks for an unprivileged owner, with --requeue=expedite -------------------
OWNER = "slurmfm-owner"


@pytest.fixture
def owner_dir(slurm_lab_suite: SuiteLabFactory) -> Iterator[tuple[SlurmLab, Path]]:
    """The sid lab, a job owner who is not root (known inside the chroot, where slurmctld and
    slurmd resolve users), and a directory in the lab's scratch (visible in the chroot) that
    the owner may write."""
    import os
    import shutil
    import subprocess
    import tempfile

    if os.geteuid() != 0:
        pytest.skip("needs root to run a job as another user")
    lab = slurm_lab_suite("sid")
    chroot = lab_root() / "chroots" / "sid"
    if f"\n{OWNER}:" not in "\n" + (chroot / "etc" / "passwd").read_text():
        subprocess.run(["chroot", str(chroot), "useradd", "-M", "-U", OWNER], check=True)
    scratch = lab_root() / "scratch"
    scratch.mkdir(exist_ok=True)
    d = Path(tempfile.mkdtemp(prefix="owner-", dir=scratch))
    d.chmod(0o777)
    yield lab, d
    shutil.rmtree(d, ignore_errors=True)


def owner_job(lab: SlurmLab, d: Path, body: str, *opts: str) -> dict[str, str]:
    """Submit ``body`` as the owner with --requeue=expedite; its record once it ended."""
    script = d / "job.sh"
    script.write_text("#!/bin/bash\n" + body)
    script.chmod(0o755)
    proc = lab.run(
        ["sbatch", "--parsable", f"--uid={OWNER}", f"--gid={OWNER}", "--requeue=expedite"]
        + ["--open-mode=append", "-o", f"{d}/out", *opts, str(script)]
    )
    assert proc.returncode == 0, proc.stderr
    return lab.wait_job(proc.stdout.strip().split(";")[0], timeout=90)


@pytest.mark.parametrize("suite", ["sid"])
def test_an_owner_may_turn_requeue_off_on_an_expedited_job(
    owner_dir: tuple[SlurmLab, Path], suite: str
) -> None:
    """slurm.no_requeue as the job's owner: without it a non-zero end is requeued held."""
    lab, d = owner_dir
    off = 'scontrol update JobId="$SLURM_JOB_ID" Requeue=0 && echo requeue-off\nexit 3\n'
    rec = owner_job(lab, d, off)
    assert (rec["JobState"], rec["Restarts"], rec["Requeue"]) == ("FAILED", "0", "0"), rec
    assert "requeue-off" in (d / "out").read_text()


@pytest.mark.parametrize("suite", ["sid"])
def test_an_owner_keeps_an_expedited_requeue_off_the_failed_node(
    owner_dir: tuple[SlurmLab, Path], suite: str
) -> None:
    """slurm.requeue_excluding's calls as the job's owner on an expedited job: requeuehold,
    ExcNodeList, release (tests/job/test_slurm_calls.py pins the calls); the job restarts
    at once (eligible when requeued) and not on the excluded node."""
    lab, d = owner_dir
    body = (
        'echo "run ${SLURM_RESTART_COUNT:-0} $SLURM_JOB_NODELIST"\n'
        'if [ "${SLURM_RESTART_COUNT:-0}" = 0 ]; then\n'
        '  BAD=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | tail -n 1)\n'
        "  trap '' TERM  # requeuehold ends this run; the update and release must follow\n"
        '  scontrol requeuehold "$SLURM_JOB_ID" &&\n'
        '    scontrol update JobId="$SLURM_JOB_ID" ExcNodeList="$BAD" &&\n'
        '    scontrol release "$SLURM_JOB_ID" && echo "excluded $BAD"\n'
        "  sleep 60\n"
        "fi\n"
    )
    rec = owner_job(lab, d, body, "-N2")
    out = (d / "out").read_text()
    assert (rec["JobState"], rec["Restarts"]) == ("COMPLETED", "1"), (rec, out)
    bad = out.split("excluded ", 1)[1].split()[0]
    assert rec["ExcNodeList"] == bad
    assert bad not in lab.hostnames(rec["NodeList"])
    assert rec["EligibleTime"] == rec["SubmitTime"]  # expedited: no credential wait
