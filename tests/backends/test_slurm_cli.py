"""The Slurm CLI backend against the real local cluster: submit, status, cancel, errors."""

from __future__ import annotations

import time

import pytest
from lab import SlurmLab

from slurmfm.backends.slurm_cli import SlurmCLI, parse_scontrol_record
from slurmfm.errors import BackendError
from slurmfm.request import SubmitRequest

SLEEPER = """#!/bin/bash
#SBATCH --job-name=sleeper
#SBATCH --nodes=1
#SBATCH --output=/dev/null
sleep 300
"""


def test_parse_scontrol_record_keeps_values_with_spaces() -> None:
    rec = parse_scontrol_record(
        "JobId=7 JobName=a b JobState=PENDING Reason=Node down (by admin) Command=/x y/z.sh"
    )
    assert rec["JobName"] == "a b"
    assert rec["Reason"] == "Node down (by admin)"
    assert rec["Command"] == "/x y/z.sh"


def test_bad_job_ids_never_reach_a_command() -> None:
    cli = SlurmCLI(env={"PATH": "/nonexistent"})
    for bad in ["1;id", "-1", "$(id)", "", "12 13", "7\n"]:
        with pytest.raises(BackendError, match="is not a Slurm job id"):
            cli.status(bad)


def test_missing_commands_are_explained() -> None:
    with pytest.raises(BackendError, match="command not found"):
        SlurmCLI(env={"PATH": "/nonexistent"}).version()


@pytest.mark.slurm
def test_version_submit_status_cancel(slurm_lab: SlurmLab) -> None:
    cli = SlurmCLI(env=slurm_lab.env)
    assert cli.version().split(".")[:2] == slurm_lab.version.split(".")[:2]
    res = cli.submit(SubmitRequest.of_script(SLEEPER))
    assert res.job_id.isdigit()
    deadline = time.monotonic() + 30
    st = cli.status(res.job_id)
    while st.state != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
        st = cli.status(res.job_id)
    assert st.state == "RUNNING"
    assert st.name == "sleeper"
    assert st.nodes
    cli.cancel(res.job_id)
    final = cli.wait(res.job_id, timeout=30, interval=0.2)
    assert final.state.startswith("CANCELLED")
    assert final.done
    assert not final.ok


@pytest.mark.slurm
def test_slurm_error_is_shown_verbatim(slurm_lab: SlurmLab) -> None:
    cli = SlurmCLI(env=slurm_lab.env)
    with pytest.raises(BackendError) as info:
        cli.submit(
            SubmitRequest.of_script(
                SLEEPER.replace("--nodes=1", "--nodes=1\n#SBATCH --partition=nosuch")
            )
        )
    assert "sbatch: error:" in str(info.value)
    assert "invalid partition" in str(info.value).lower()


@pytest.mark.slurm
def test_test_only_reports_where_it_would_run(slurm_lab: SlurmLab) -> None:
    cli = SlurmCLI(env=slurm_lab.env)
    msg = cli.test_only(SLEEPER)
    assert "to start at" in msg
    with pytest.raises(BackendError, match="allocation failure"):
        cli.test_only(SLEEPER.replace("--nodes=1", f"--nodes={slurm_lab.nodes + 1}"))


@pytest.mark.slurm
def test_unknown_job(slurm_lab: SlurmLab) -> None:
    with pytest.raises(BackendError):
        SlurmCLI(env=slurm_lab.env).status("999999")


@pytest.mark.slurm
def test_cancel_of_a_job_that_never_existed_fails(slurm_lab: SlurmLab) -> None:
    """22.05's scancel exits 0 for an unknown job id; slurmfm must not report success."""
    with pytest.raises(BackendError, match="999999"):
        SlurmCLI(env=slurm_lab.env).cancel("999999")


def test_array_records_are_summarized_and_hetjobs_keep_component_zero() -> None:
    from slurmfm.backends.slurm_cli import array_representative

    def rec(**kw: str) -> dict[str, str]:
        return dict(kw)

    done = [
        rec(JobId="12", ArrayJobId="10", ArrayTaskId="2", JobState="COMPLETED"),
        rec(JobId="11", ArrayJobId="10", ArrayTaskId="10", JobState="FAILED"),
        rec(JobId="10", ArrayJobId="10", ArrayTaskId="0", JobState="COMPLETED"),
    ]
    got = array_representative(done)
    assert got["JobId"] == "11"  # a failure shows
    assert got["ArrayTasks"] == "0:COMPLETED 2:COMPLETED 10:FAILED"
    running = [*done, rec(JobId="10", ArrayJobId="10", ArrayTaskId="3-5%2", JobState="PENDING")]
    assert array_representative(running)["JobState"] == "PENDING"  # not done while one waits
    het = [
        rec(JobId="20", HetJobId="20", HetJobOffset="0", JobState="RUNNING"),
        rec(JobId="21", HetJobId="20", HetJobOffset="1", JobState="PENDING"),
    ]
    assert array_representative(het) == het[0]


def test_only_the_client_runs_slurm_commands() -> None:
    # One client (SlurmCLI) talks to Slurm: nobody else calls its private _run, and the CLI
    # package starts no processes of its own (the topology commands had a second runner).
    import ast
    from pathlib import Path

    pkg = Path(__file__).resolve().parents[2] / "slurmfm"
    offenders = []
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "_run"
                and rel != "backends/slurm_cli.py"
            ):
                offenders.append(f"{rel}:{node.lineno}: ._run")
            if rel.startswith("cli/") and isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                if "subprocess" in names:
                    offenders.append(f"{rel}:{node.lineno}: imports subprocess")
    assert offenders == []
