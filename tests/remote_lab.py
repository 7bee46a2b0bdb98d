"""The remote backends' side of a lab: its slurmrestd (``slurm-lab rest-up``) and its sshd
(``slurm-lab ssh-up``), started on first use and stopped by the lab's ``down``."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from lab import SlurmLab, _unavailable


def _read_env(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition("=")
        if key:
            out[key] = value
    return out


@dataclass(frozen=True)
class RestLab:
    """A lab's slurmrestd: its URL and the unprivileged user whose tokens the tests use."""

    lab: SlurmLab
    url: str
    user: str
    uid: int

    def token(self, lifespan: int = 300) -> str:
        """A fresh JWT for the user, as ``scontrol token`` prints it (``SLURM_JWT=...``)."""
        proc = self.lab.run(
            ["scontrol", "token", f"username={self.user}", f"lifespan={lifespan}"], cwd="/"
        )
        assert proc.returncode == 0, proc.stderr
        line = proc.stdout.strip()
        assert line.startswith("SLURM_JWT="), line
        return line

    def env(self, token: str) -> dict[str, str]:
        """The submitting environment: the server and the token, nothing of the lab's."""
        return {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/root"),
            "SLURMFM_REST_URL": self.url,
            "SLURM_JWT": token.removeprefix("SLURM_JWT="),
            "SLURMFM_HISTORY": os.environ["SLURMFM_HISTORY"],
        }

    def job_dir(self) -> Path:
        """A fresh directory the user's jobs may write (under the lab's jobs dir, which the
        chroot suites see at the same path)."""
        d = self.lab.jobs_dir / f"rest-{uuid.uuid4().hex[:8]}"
        d.mkdir(mode=0o755)
        os.chown(d, self.uid, -1)
        return d


def rest_lab(lab: SlurmLab) -> RestLab:
    proc = lab.lab_command("rest-up")
    if proc.returncode != 0:
        _unavailable(f"slurm-lab rest-up failed:\n{proc.stdout}{proc.stderr}")
    env = _read_env(lab.lab_dir / "rest.env")
    return RestLab(
        lab, env["SLURMFM_REST_URL"], env["SLURMFM_REST_USER"], int(env["SLURMFM_REST_UID"])
    )


@dataclass(frozen=True)
class SshLab:
    """A lab's sshd: the ssh config naming its login node, its user and sshd's log."""

    lab: SlurmLab
    config: Path
    host: str
    user: str
    log: Path

    def env(self, control_dir: Path) -> dict[str, str]:
        return {
            "PATH": os.environ["PATH"],
            "HOME": os.environ.get("HOME", "/root"),
            "SLURMFM_SSH_CONFIG": str(self.config),
            "SLURMFM_SSH_CONTROL_DIR": str(control_dir),
            "SLURMFM_HISTORY": os.environ["SLURMFM_HISTORY"],
        }

    def connections(self) -> int:
        """How many logins sshd has accepted so far (its log, LogLevel VERBOSE)."""
        return self.log.read_text(errors="replace").count("Accepted publickey for ")

    def job_dir(self) -> Path:
        d = self.lab.jobs_dir / f"ssh-{uuid.uuid4().hex[:8]}"
        d.mkdir(mode=0o755)
        os.chown(d, pwd.getpwnam(self.user).pw_uid, -1)
        return d

    def queued(self, name: str) -> list[str]:
        """Ids of the user's jobs named ``name``, in any state."""
        proc = self.lab.run(["squeue", "-h", "-t", "all", "-u", self.user, "-n", name, "-o", "%i"])
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.split()


def ssh_lab(lab: SlurmLab) -> SshLab:
    if lab.suite != "host":
        _unavailable("ssh-up runs on the host suite")
    if shutil.which("ssh") is None:
        _unavailable("no ssh client")
    proc = lab.lab_command("ssh-up")
    if proc.returncode != 0:
        _unavailable(f"slurm-lab ssh-up failed:\n{proc.stdout}{proc.stderr}")
    env = _read_env(lab.lab_dir / "ssh.env")
    return SshLab(
        lab,
        Path(env["SLURMFM_SSH_CONFIG"]),
        env["SLURMFM_SSH_HOST"],
        "slurmfm-ssh",
        lab.lab_dir / "log" / "sshd.log",
    )


def cmdlines() -> list[str]:
    """Every process's argv, as ``ps`` would show it."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                out.append(
                    (d / "cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
                )
            except OSError:
                continue
    return out


def run_cli(
    args: list[str], env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    from lab import REPO_ROOT

    return subprocess.run(
        [*SlurmLab.slurmfm_argv(), *args],
        env={**env, "PYTHONPATH": str(REPO_ROOT)},
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
