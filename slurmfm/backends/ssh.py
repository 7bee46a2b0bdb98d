"""Backend over OpenSSH: Slurm's own commands, run on a login node from anywhere.

Why SSH and not an agent of our own: every Slurm cluster has a login node that users already
reach with ``ssh``, with their keys, ``~/.ssh/config`` and host keys; SkyPilot and dstack reach
Slurm the same way. The script is rendered here; the very ``sbatch`` argv of
:class:`~slurmfm.backends.slurm_cli.SlurmCLI` runs there, each word through the project's one
quoting function (:func:`slurmfm.quote.sh_join`: ``ssh`` hands the remote side one
command line, which the login shell parses), and the script's bytes go on stdin, so nothing is
copied or left behind. Everything ``SlurmCLI`` asks (status, cancel, the preflight's
questions) goes the same way, by overriding how a command is run.

Safety against the network:

- Host keys are checked: ``StrictHostKeyChecking=yes`` always (``accept-new`` only when the
  user asks, ``SLURMFM_SSH_ACCEPT_NEW=1``), given on the command line so that a ``no`` in a
  user's config cannot weaken it (ssh takes the first value it is given, ssh_config(5)).
- ``BatchMode=yes``: no password or passphrase prompt can hang a submission.
- One connection: ``ControlMaster=auto`` with the control socket in a private 0700 directory
  of this user, kept ``ControlPersist`` seconds, so a status poll reuses it.
- A submission carries a token in its ``--comment``; when ``ssh`` fails after the command
  may have run (the answer was lost), the job is looked for by its token on the login node
  (``squeue --me``) before anything is sent again.
- ssh's own failures (no route, refused connection, a refused key, a changed host key) are
  one line: ssh's last line of error text.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from slurmfm.backends.base import JobStatus, SubmitResult, new_submit_token
from slurmfm.backends.slurm_cli import SlurmCLI
from slurmfm.errors import BackendError
from slurmfm.job import fsafe

if TYPE_CHECKING:
    from slurmfm.request import SubmitRequest

# ssh(1): "ssh exits with the exit status of the remote command or with 255 if an error
# occurred" (https://man.openbsd.org/ssh#EXIT_STATUS).
SSH_FAILED = 255
# ssh's messages for failures before any remote command ran: nothing was sent.
_NOT_CONNECTED = (
    "Permission denied",
    "Host key verification failed",
    "Connection refused",
    "Could not resolve hostname",
    "Connection timed out",
    "No route to host",
    "Network is unreachable",
    "REMOTE HOST IDENTIFICATION HAS CHANGED",
    "No ED25519 host key is known",
    "No RSA host key is known",
    "No ECDSA host key is known",
    "Bad configuration option",
    "Can't open user config file",
)


class SshTransportError(BackendError):
    """ssh itself failed (exit 255): ``connected`` says whether a remote command may have run."""

    def __init__(self, message: str, *, connected: bool, command: list[str] | None = None):
        self.connected = connected
        super().__init__(message, command=command)


def control_dir(env: Mapping[str, str]) -> Path:
    """This user's private directory for ssh control sockets (made 0700; refused when it is a
    link, another user's, or open to others: a socket there is a live login to the cluster).

    Short on purpose: a Unix socket path has at most 107 bytes (unix(7)), and ssh's ``%C`` adds
    40 characters.
    """
    base = env.get("SLURMFM_SSH_CONTROL_DIR") or os.path.join(
        tempfile.gettempdir(), f"slurmfm-ssh-{os.geteuid()}"
    )
    path = Path(base)
    try:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(path)
    except OSError as exc:
        raise BackendError(f"ssh: cannot make {path}: {exc.strerror or exc}") from None
    if fsafe.own_dir_problem(info, owner_only=True):
        raise BackendError(
            f"ssh: {path} must be a directory of yours with mode 0700 (it holds the control "
            "socket of your connection); remove it or set SLURMFM_SSH_CONTROL_DIR"
        )
    return path


class SshBackend(SlurmCLI):
    """Slurm's commands on a login node, over one reused OpenSSH connection.

    ``host``: what ``ssh`` accepts (``user@login``, a ``Host`` of your ssh config, or
    ``ssh://user@login:port``); default ``$SLURMFM_SSH_HOST``. ``SLURMFM_SSH_CONFIG`` names an
    ssh config file (``ssh -F``). Paths in the recipe are the cluster's.
    """

    name = "ssh"
    remote = True

    def __init__(
        self,
        host: str | None = None,
        env: dict[str, str] | None = None,
        timeout: float = 60.0,
        persist: int = 300,
    ) -> None:
        super().__init__(env, timeout)
        host = host or self.env.get("SLURMFM_SSH_HOST", "")
        if not host:
            raise BackendError("ssh: no host: give --host user@login (or set SLURMFM_SSH_HOST)")
        if host.startswith("-") or any(c.isspace() for c in host):
            raise BackendError(f"ssh: {host!r} is not a host")
        self.host = host
        self.persist = persist
        self._control: Path | None = None

    # -- how a command runs ---------------------------------------------------------------
    def ssh_argv(self) -> list[str]:
        """``ssh`` and its options, up to and including the host (no remote command)."""
        if self._control is None:
            self._control = control_dir(self.env)
        strict = "accept-new" if self.env.get("SLURMFM_SSH_ACCEPT_NEW") == "1" else "yes"
        argv = ["ssh"]
        if self.env.get("SLURMFM_SSH_CONFIG"):
            argv += ["-F", self.env["SLURMFM_SSH_CONFIG"]]
        argv += [
            "-o", "BatchMode=yes",
            "-o", f"StrictHostKeyChecking={strict}",
            "-o", "ControlMaster=auto",
            "-o", f"ControlPath={self._control}/%C",
            "-o", f"ControlPersist={self.persist}",
            "-o", "ConnectTimeout=15",
            "-o", "ServerAliveInterval=15",
            "-o", "LogLevel=ERROR",
            "-T",
            "--",
            self.host,
        ]  # fmt: skip
        return argv

    def _command(self, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
        from slurmfm.quote import sh_join

        remote = sh_join(list(argv), what="remote command word")
        import shutil

        ssh = shutil.which("ssh", path=env.get("PATH"))
        if ssh is None:
            raise BackendError("ssh: command not found; install OpenSSH's client")
        return [ssh, *self.ssh_argv()[1:], remote]

    def _where(self, command: str) -> str:
        return f"{command} on {self.host}"

    def _checked(
        self, proc: subprocess.CompletedProcess[str], argv: Sequence[str]
    ) -> subprocess.CompletedProcess[str]:
        if proc.returncode != SSH_FAILED:
            return proc
        lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
        text = " ".join(lines)
        connected = not any(m in text for m in _NOT_CONNECTED)
        last = lines[-1] if lines else "connection lost"
        raise SshTransportError(f"ssh: {self.host}: {last}", connected=connected, command=None)

    # -- what is asked ----------------------------------------------------------------------
    def submit(self, request: SubmitRequest, *, env: dict[str, str] | None = None) -> SubmitResult:
        """:meth:`SlurmCLI.submit` on the login node with ``--comment=<token>`` added. When
        ssh fails after the command may have run (its answer lost), the job is looked up by
        its token before the request is sent a second (and last) time."""
        import dataclasses

        token = new_submit_token()
        marked = dataclasses.replace(
            request, sbatch_args=(*request.sbatch_args, f"--comment={token}")
        )
        for attempt in (1, 2):
            try:
                return self._submit_once(marked, env)
            except SshTransportError as exc:
                if not exc.connected:
                    raise
                found = self.find_submitted(token)
                if found is not None:
                    return SubmitResult(job_id=found, message="found again after a lost answer")
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")  # pragma: no cover

    def _submit_once(self, request: SubmitRequest, env: dict[str, str] | None) -> SubmitResult:
        """One ``sbatch`` on the login node (a test may lose its answer here)."""
        return super().submit(request, env=env)

    def find_submitted(self, token: str) -> str | None:
        """The id of this user's job whose comment is ``token`` (any state), or None."""
        out = self._query(["squeue", "--me", "--states=all", "-h", "-o", "%i|%k"])
        for line in out.splitlines():
            job_id, _, comment = line.strip().partition("|")
            if comment == token:
                return job_id.split("_")[0]
        return None

    def make_dirs(self, dirs: Sequence[str]) -> None:
        """``mkdir -p`` on the login node: sbatch does not create the ``--output`` directory."""
        if dirs:
            self._query(["mkdir", "-p", "--", *dirs])

    def fetch_logs(self, status: JobStatus, directory: Path, job_name: str) -> Path:
        """Copy the job's log files (``NAME_ID*`` in its log directory, only those its own user
        owns: docs/security.md) into a fresh private local directory, and return it; the
        readers of :mod:`slurmfm.observe` then read the copy. Used by ``logs`` (again at each
        poll of ``--follow``) and ``report``."""
        import glob
        import io
        import tarfile

        from slurmfm.backends.state import job_uid

        uid = job_uid(status)
        pattern = glob.escape(f"{job_name}_{status.job_id}") + "*"
        words = [
            "sh",
            "-c",
            'cd -- "$1" && shift && find . -mindepth 1 -maxdepth 1 "$@" -print0 '
            "| tar --null -T - -cf -",
            "slurmfm",
            str(directory),
            "-name",
            pattern,
            *(["-user", str(uid)] if uid is not None else []),
        ]
        proc = subprocess.run(
            self._command(words, self.env),
            capture_output=True,
            env=self.env,
            timeout=self.timeout,
            check=False,
        )
        if proc.returncode == SSH_FAILED:
            self._checked(
                subprocess.CompletedProcess(
                    proc.args, proc.returncode, "", proc.stderr.decode("utf-8", "replace")
                ),
                words,
            )
        if proc.returncode:
            detail = " ".join(proc.stderr.decode("utf-8", "replace").split())
            raise BackendError(
                f"job {status.job_id}: cannot read {directory} on {self.host}: {detail}"
            )
        local = Path(tempfile.mkdtemp(prefix="slurmfm-logs-"))  # 0700, this user's
        if proc.stdout:
            with tarfile.open(fileobj=io.BytesIO(proc.stdout), mode="r:") as tar:
                # "data": no links out, no devices, no owners kept (the files become ours)
                tar.extractall(local, filter="data")
        return local

    def close(self) -> None:
        """End the shared connection now (``ssh -O exit``) instead of after ``ControlPersist``."""
        if self._control is None:
            return
        subprocess.run(
            [*self.ssh_argv()[:-2], "-O", "exit", "--", self.host],
            capture_output=True,
            env=self.env,
            timeout=self.timeout,
            check=False,
        )
