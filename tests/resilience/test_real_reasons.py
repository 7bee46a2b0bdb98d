"""Issue 15.16a on real Slurm (22.05): an operator's requeue and a cancel leave their reasons.

Two quickstart jobs run side by side on the host lab. The test requeues the first with
``scontrol requeue`` (as an operator or the owner would, not the runtime) and cancels the
second with ``scancel``, each once the runtime runs the launch. The state files and
``slurmfm status`` then say what happened: the TERM's ``stop`` record with what Slurm said,
and, in the requeued job's next attempt, a ``restart`` record saying slurmfm did not ask for
it. Neither job needs to train: the payload only has to be running.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lab import SlurmLab, job_processes, wait_for_text, wait_until
from resilience.test_real_slurm_resilience import submit, wait_done

pytestmark = [pytest.mark.slurm, pytest.mark.torch]

LONG = "launcher.args=[--steps, '100000', --checkpoint-every, '1000', --sleep, '0.5']"


def test_operator_requeue_and_scancel_leave_their_reasons(
    host_b_lab: SlurmLab, tmp_path: Path
) -> None:
    quick = (LONG, "resilience.save_before_timeout_s=0")
    requeued = submit(host_b_lab, tmp_path, *quick, "storage.run_id=requeued")
    cancelled = submit(host_b_lab, tmp_path, *quick, "storage.run_id=cancelled")
    logs = tmp_path / "logs"
    for job_id in (requeued, cancelled):
        # the runtime handles TERM once it printed the launch
        wait_for_text(logs / f"quickstart_{job_id}.out", "slurmfm: launch: ", 180)

    assert host_b_lab.run(["scontrol", "requeue", requeued]).returncode == 0
    assert host_b_lab.run(["scancel", cancelled]).returncode == 0

    state = wait_for_text(logs / f"quickstart_{cancelled}.state", " event=stop ", 60)
    assert (
        " restart=0 event=stop cancelled (scancel by the owner or an admin) "
        "(Slurm: JobState=COMPLETING Reason=None Restarts=0)"
    ) in state, state
    assert wait_done(host_b_lab, cancelled, timeout=60)["JobState"] == "CANCELLED"
    # nothing of it runs on: the launcher started as the cancel came gets its TERM too
    wait_until(
        f"no process of job {cancelled}",
        lambda: not job_processes(cancelled),
        30,
        lambda: "\n".join(job_processes(cancelled)),
    )
    st = host_b_lab.slurmfm("status", cancelled)
    assert st.returncode == 0, st.stderr
    assert "last stop" in st.stdout
    assert "cancelled (scancel by the owner or an admin)" in " ".join(st.stdout.split())

    path = logs / f"quickstart_{requeued}.state"
    state = wait_for_text(path, " restart=0 event=stop ", 60)
    assert (
        " restart=0 event=stop requeued by Slurm or an operator (scontrol requeue, preemption, "
        "a failed node) (Slurm: JobState=COMPLETING Reason=None Restarts=1)"
    ) in state, state
    # The requeued job starts again once the credential lifetime has passed (lab: 10 s).
    state = wait_for_text(path, " restart=1 event=restart ", 120)
    line = next(x for x in state.splitlines() if " restart=1 event=restart " in x)
    assert "requeued by Slurm or an operator (not by slurmfm): " in line
    assert "the last attempt recorded at its TERM: requeued by Slurm or an operator" in line
    assert "scontrol: requeued at " in line
    assert line.endswith(", Restarts=1")
    assert " event=requeue " not in state  # the runtime never requeued it itself
    st = host_b_lab.slurmfm("status", requeued, "--json")
    assert st.returncode == 0, st.stderr
    info = json.loads(st.stdout)
    assert info["restarts"] == 1
    assert info["last_requeue_reason"].startswith(
        "requeued by Slurm or an operator (not by slurmfm): the last attempt recorded"
    )
    assert info["last_stop_reason"].startswith("requeued by Slurm or an operator")
    host_b_lab.run(["scancel", requeued])
    wait_done(host_b_lab, requeued, timeout=60)
