"""``--backend ssh``: Slurm's commands on a login node over OpenSSH. Unit tests for the ssh
command line (host keys checked, one shared connection in a private directory, every word
through the one quoting function); real tests against Debian's sshd, run by an unprivileged
user on the host lab (``scripts/slurm-lab ssh-up``), with key authentication only."""

from __future__ import annotations

import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from lab import REPO_ROOT, SlurmLab
from remote_lab import SshLab, cmdlines, run_cli, ssh_lab

from slurmfm.backends.ssh import SshBackend, SshTransportError, control_dir
from slurmfm.errors import BackendError
from slurmfm.request import SubmitRequest

QUICK = REPO_ROOT / "recipes" / "quickstart.yaml"


@pytest.fixture
def ctl() -> Iterator[Path]:
    """A fresh private control directory, short enough for a Unix socket path."""
    d = Path(tempfile.mkdtemp(prefix="fmssh", dir="/tmp"))
    yield d
    for sock in d.iterdir():  # a master left by a failed test: end it
        subprocess.run(
            ["ssh", "-o", f"ControlPath={sock}", "-O", "exit", "x"],
            capture_output=True,
            check=False,
        )
    import shutil

    shutil.rmtree(d, ignore_errors=True)


# -- unit ---------------------------------------------------------------------------------------
def test_host_keys_are_checked_and_one_connection_is_shared(ctl: Path) -> None:
    be = SshBackend("alice@login", {"SLURMFM_SSH_CONTROL_DIR": str(ctl), "PATH": "/usr/bin"})
    argv = be.ssh_argv()
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    assert "StrictHostKeyChecking=yes" in opts
    assert "BatchMode=yes" in opts
    assert "ControlMaster=auto" in opts
    assert f"ControlPath={ctl}/%C" in opts
    assert argv[-2:] == ["--", "alice@login"]
    new = SshBackend("h", {"SLURMFM_SSH_CONTROL_DIR": str(ctl), "SLURMFM_SSH_ACCEPT_NEW": "1"})
    assert "StrictHostKeyChecking=accept-new" in new.ssh_argv()
    assert not any("StrictHostKeyChecking=no" in a for a in argv + new.ssh_argv())


def test_the_control_directory_must_be_private(tmp_path: Path) -> None:
    open_dir = tmp_path / "open"
    open_dir.mkdir(mode=0o755)
    open_dir.chmod(0o755)
    with pytest.raises(BackendError, match="mode 0700"):
        control_dir({"SLURMFM_SSH_CONTROL_DIR": str(open_dir)})
    link = tmp_path / "link"
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link.symlink_to(private)
    with pytest.raises(BackendError, match="mode 0700"):
        control_dir({"SLURMFM_SSH_CONTROL_DIR": str(link)})
    assert control_dir({"SLURMFM_SSH_CONTROL_DIR": str(private)}) == private


def test_a_host_that_looks_like_an_option_is_refused() -> None:
    for bad in ["-oProxyCommand=id", "a b", ""]:
        with pytest.raises(BackendError):
            SshBackend(bad, {})


@given(
    words=st.lists(
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\r")),
        min_size=1,
    )
)
def test_every_word_reaches_the_login_shell_as_it_was(
    words: list[str], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The remote command line is what the login node's shell parses: each word comes back
    whole (the one quoting function, slurmfm.quote.sh_join)."""
    ctl = tmp_path_factory.getbasetemp() / "ssh-control"  # made by the backend; nothing connects
    be = SshBackend("h", {"PATH": os.environ["PATH"], "SLURMFM_SSH_CONTROL_DIR": str(ctl)})
    remote = be._command(words, be.env)[-1]
    assert shlex.split(remote) == words


def test_sshs_own_failures_say_whether_anything_may_have_run(ctl: Path) -> None:
    be = SshBackend("h", {"SLURMFM_SSH_CONTROL_DIR": str(ctl)})
    before = [
        "alice@login: Permission denied (publickey).",
        "Host key verification failed.",
        "ssh: connect to host login port 22: Connection refused",
        "ssh: Could not resolve hostname login: Name or service not known",
    ]
    for text in before:
        with pytest.raises(SshTransportError) as info:
            be._checked(subprocess.CompletedProcess([], 255, "", text + "\n"), ["sbatch"])
        assert not info.value.connected
        assert str(info.value) == f"ssh: h: {text}"
    with pytest.raises(SshTransportError) as info:
        be._checked(
            subprocess.CompletedProcess([], 255, "", "client_loop: send disconnect: Broken pipe\n"),
            ["sbatch"],
        )
    assert info.value.connected  # sbatch may have run: look for its token first
    ok = subprocess.CompletedProcess([], 1, "", "sbatch: error: x")
    assert be._checked(ok, ["sbatch"]) is ok  # Slurm's own failure is Slurm's


# -- real sshd ----------------------------------------------------------------------------------
SCRIPT = """#!/bin/bash
#SBATCH --job-name={name}
#SBATCH --nodes=1
#SBATCH --output={out}/%x_%j.out
echo "it's $(id -un) in $PWD"
sleep {sleep}
"""


def _req(ssh: SshLab, name: str, sleep: int) -> tuple[SubmitRequest, Path]:
    out = ssh.job_dir()
    return SubmitRequest.of_script(SCRIPT.format(name=name, out=out, sleep=sleep)), out


def test_ssh_submit_status_wait_cancel_on_one_connection(slurm_lab: SlurmLab, ctl: Path) -> None:
    import slurmfm.api as fm

    ssh = ssh_lab(slurm_lab)
    before = ssh.connections()
    env = ssh.env(ctl)
    req, out = _req(ssh, "ssh-life", 60)
    job = fm.submit_request(req, backend="ssh", host=ssh.host, env=env, preflight=False)
    polls = [job.status().state for _ in range(5)]
    assert all(s in {"PENDING", "RUNNING", "CONFIGURING"} for s in polls), polls
    assert job.backend.version() == slurm_lab.version
    job.cancel()
    assert job.wait(timeout=30, interval=0.2).state.startswith("CANCELLED")
    quick, out = _req(ssh, "ssh-quick", 1)
    second = fm.submit_request(quick, backend=job.backend, preflight=False)
    followed = "".join(second.logs(follow=True, interval=0.3))  # until the job ends
    assert "it's slurmfm-ssh in" in followed
    assert second.status().ok
    assert followed == next(out.glob("ssh-quick_*.out")).read_text()
    # fm.submit renders for the login node's Slurm and submits there, on the same connection
    recipe = fm.load(QUICK, {"storage.log_dir": str(out), "storage.checkpoint_root": str(out)})
    third = fm.submit(recipe, backend=job.backend, preflight=False)
    assert third.request is not None
    assert third.request.target is not None
    assert str(third.request.target.slurm_version) == slurm_lab.version
    third.cancel()
    # Job.from_id reopens the job over the same connection
    again = fm.Job.from_id(job.job_id, backend="ssh", host=ssh.host, env=env)
    assert again.status().state.startswith("CANCELLED")
    assert ssh.connections() - before == 1  # every command above: one login
    job.close()
    again.close()


def test_ssh_finds_a_submission_whose_answer_was_lost(slurm_lab: SlurmLab, ctl: Path) -> None:
    ssh = ssh_lab(slurm_lab)

    class Lossy(SshBackend):
        """sbatch ran on the login node, then the connection dropped before its answer."""

        sent = 0

        def _submit_once(self, request: SubmitRequest, env: dict[str, str] | None):  # type: ignore[no-untyped-def]
            self.sent += 1
            result = super()._submit_once(request, env)
            if self.sent == 1:
                raise SshTransportError("ssh: lab-login: Broken pipe", connected=True)
            return result

    be = Lossy(ssh.host, ssh.env(ctl))
    name = f"ssh-lost-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    req, _ = _req(ssh, name, 30)
    found = be.submit(req)
    assert be.sent == 1  # found by its comment token: not sent twice
    assert ssh.queued(name) == [found.job_id]
    be.cancel(found.job_id)
    be.close()


def _refused(ssh: SshLab, env: dict[str, str], host: str) -> subprocess.CompletedProcess[str]:
    before = ssh.queued("quickstart")
    proc = run_cli(["submit", str(QUICK), "--backend", "ssh", "--host", host], env)
    assert proc.returncode == 2, proc
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert ssh.queued("quickstart") == before  # nothing queued
    return proc


def test_ssh_unreachable_refused_key_and_changed_host_key(
    slurm_lab: SlurmLab, ctl: Path, tmp_path: Path
) -> None:
    """Each is one line, exit 2, nothing queued; a host key is never accepted blindly."""
    ssh = ssh_lab(slurm_lab)
    conf = ssh.config.read_text()
    port = next(ln.split()[1] for ln in conf.splitlines() if ln.strip().startswith("Port "))
    env = ssh.env(ctl)
    # nothing listens on port 1 (a privileged port nobody here serves)
    proc = _refused(ssh, env, "ssh://slurmfm-ssh@127.0.0.1:1")
    assert "Connection refused" in proc.stderr
    other_key = tmp_path / "other"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True
    )
    bad_key = tmp_path / "config-key"
    bad_key.write_text(conf.replace(str(ssh.config.parent / "client_key"), str(other_key)))
    proc = _refused(ssh, {**env, "SLURMFM_SSH_CONFIG": str(bad_key)}, ssh.host)
    assert "Permission denied (publickey)" in proc.stderr
    wrong = tmp_path / "known_hosts"
    kind, body = Path(f"{other_key}.pub").read_text().split()[:2]
    wrong.write_text(f"[127.0.0.1]:{port} {kind} {body}\n")  # another key for the same host
    bad_host = tmp_path / "config-host"
    bad_host.write_text(conf.replace(str(ssh.config.parent / "known_hosts"), str(wrong)))
    proc = _refused(ssh, {**env, "SLURMFM_SSH_CONFIG": str(bad_host)}, ssh.host)
    assert "Host key verification failed" in proc.stderr


def test_ssh_recipe_submit_logs_report_from_the_cli(slurm_lab: SlurmLab, ctl: Path) -> None:
    """The README's quickstart recipe rendered here and run on the login node: its log
    directory made there, its logs and report read back over the connection. (The job ends
    FAILED: the unprivileged user's python3 has no torch; its log and state say so.)"""
    ssh = ssh_lab(slurm_lab)
    base = ssh.job_dir()
    env = {**ssh.env(ctl), "SLURMFM_SSH_HOST": ssh.host}
    sets = ["--set", f"storage.log_dir={base}/logs", "--set", f"storage.checkpoint_root={base}/ck"]
    proc = run_cli(
        ["submit", str(QUICK), "--backend", "ssh", *sets, "--wait", "--timeout", "90"], env
    )
    job_id = proc.stdout.strip()
    assert job_id.isdigit(), proc.stderr
    assert (base / "logs").is_dir()
    assert (base / "logs").stat().st_uid != 0
    logs = run_cli(["logs", job_id, "--backend", "ssh"], env)
    assert logs.returncode == 0, logs.stderr
    assert logs.stdout.startswith("== restart 0 ==")
    assert f"slurmfm: job {job_id} start 0" in logs.stdout
    rep = run_cli(["report", job_id, "--backend", "ssh", "--json"], env)
    assert rep.returncode == 0, rep.stderr
    assert f'"{base}/logs/quickstart_{job_id}.out"' in rep.stdout
    assert '"hosts"' in rep.stdout or "run" in rep.stdout
    key = (ssh.config.parent / "client_key").read_text().splitlines()[1]  # the key's body
    assert not [c for c in cmdlines() if key in c]
    history = Path(os.environ["SLURMFM_HISTORY"])
    assert job_id in history.read_text()
    assert key not in history.read_text()
    run_cli(["cancel", job_id, "--backend", "ssh"], env)
    SshBackend(ssh.host, env).close()
