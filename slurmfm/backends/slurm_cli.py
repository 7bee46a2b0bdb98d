"""Backend over Slurm's own commands: ``sbatch --parsable``, ``scontrol``, ``squeue``, ``sacct``.

Why the CLI and not a library: the commands are on every Slurm login node, match the
controller's version by construction, and print messages users already know. Commands run
without a shell (argument lists), the script goes through stdin so no temporary file is left,
and Slurm's own error text is passed to the user unchanged.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from slurmfm.backends.base import JobStatus, SubmitResult
from slurmfm.errors import BackendError
from slurmfm.job.slurm import parse_record as parse_scontrol_record

if TYPE_CHECKING:
    from slurmfm.request import SubmitRequest

_JOB_ID = re.compile(r"^\d+(?:_\d+|\+\d+)?$")


def is_job_id(text: str) -> bool:
    """A job id as Slurm prints it: ``123``, an array task ``123_4`` or a component ``123+1``."""
    return _JOB_ID.fullmatch(text) is not None


def _check_job_id(job_id: str) -> str:
    if not is_job_id(job_id):
        raise BackendError(f"{job_id!r} is not a Slurm job id")
    return job_id


def array_representative(records: list[dict[str, str]]) -> dict[str, str]:
    """One record for a job array's id (``scontrol show job`` prints one line per task).

    The array is done only when every task is: a task still pending or running is returned
    first (so waiting goes on), then a task that did not complete (so a failure shows), else
    the first. ``ArrayTasks`` summarizes every task as ``index:STATE``.
    """
    if len(records) == 1 or not all("ArrayJobId" in r for r in records):
        # One job, or a heterogeneous job (one line per component): the first record is the
        # job itself (component 0, where the batch script and its state file live).
        return records[0]
    from slurmfm.backends.base import TERMINAL_STATES, base_state

    def ended(r: dict[str, str]) -> bool:
        return base_state(r.get("JobState", "")) in TERMINAL_STATES

    pick = next((r for r in records if not ended(r)), None)
    pick = pick or next((r for r in records if r.get("JobState") != "COMPLETED"), records[0])
    summary = " ".join(
        f"{r.get('ArrayTaskId', '?')}:{r.get('JobState', '?')}"
        for r in sorted(records, key=lambda r: _leading_int(r.get("ArrayTaskId", "")))
    )
    return {**pick, "ArrayTasks": summary}


def _leading_int(text: str) -> int:
    m = re.match(r"\d+", text)
    return int(m.group(0)) if m else -1


def _closed_umask() -> int:
    """This process's umask with group and other write added."""
    current = os.umask(0o022)
    os.umask(current)
    return current | 0o022


def check_slurm_conf(env: Mapping[str, str]) -> None:
    """Refuse at once when ``$SLURM_CONF`` names a file that is not there.

    Why: every Slurm client then retries its configuration for a minute or more (67 s for
    ``slurmfm submit`` and 122 s for ``slurmfm status``, as issue 24 of this repository
    reports) before an error whose line breaks are lost. Unset, Slurm finds its own (the
    compiled-in path or configless ``sackd``), and nothing is checked.
    """
    conf = env.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        raise BackendError(
            f"SLURM_CONF={conf}: no such file; point SLURM_CONF at the cluster's slurm.conf "
            "or unset it (Slurm then finds its own)"
        )


class SlurmCLI:
    """Talk to Slurm through its command-line tools."""

    name = "slurm-cli"

    def __init__(self, env: dict[str, str] | None = None, timeout: float = 60.0) -> None:
        self.env = dict(os.environ if env is None else env)
        self.timeout = timeout

    def _run(
        self, argv: Sequence[str], *, stdin: bytes | None = None, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run a Slurm command without a shell; ``stdin`` is sent byte for byte.

        With group and other write removed from the umask: Slurm creates the job's output
        file with the submitting umask (sbatch passes it as ``SLURM_UMASK``), before the job
        script's own ``umask`` runs, and the log directory may be shared (docs/security.md).
        """
        child_env = env or self.env
        command = self._command(argv, child_env)
        try:
            proc = subprocess.run(
                command,
                input=stdin,
                capture_output=True,
                env=child_env,
                timeout=self.timeout,
                check=False,
                umask=_closed_umask(),
            )
        except subprocess.TimeoutExpired:
            raise BackendError(
                f"{self._where(argv[0])} did not answer within {self.timeout:.0f} s",
                command=list(argv),
            ) from None
        return self._checked(
            subprocess.CompletedProcess(
                proc.args,
                proc.returncode,
                proc.stdout.decode("utf-8", errors="replace"),
                proc.stderr.decode("utf-8", errors="replace"),
            ),
            argv,
        )

    # How a Slurm command is run: here, on this machine. The SSH backend
    # (slurmfm.backends.ssh) runs the same argv on a login node by overriding these three.
    def _command(self, argv: Sequence[str], env: Mapping[str, str]) -> list[str]:
        """The argv to execute for the Slurm command ``argv``."""
        check_slurm_conf(env)
        exe = shutil.which(argv[0], path=env.get("PATH"))
        if exe is None:
            raise BackendError(
                f"{argv[0]}: command not found; run slurmfm on a Slurm login node "
                "(or set PATH/SLURM_CONF)",
                command=list(argv),
            )
        return [exe, *argv[1:]]

    def _where(self, command: str) -> str:
        return command

    def _checked(
        self, proc: subprocess.CompletedProcess[str], argv: Sequence[str]
    ) -> subprocess.CompletedProcess[str]:
        """The finished command, or an error when it could not run at all."""
        return proc

    @staticmethod
    def _fail(proc: subprocess.CompletedProcess[str], argv: Sequence[str]) -> BackendError:
        msg = (proc.stderr or proc.stdout).strip() or f"exit status {proc.returncode}"
        msg = " ".join(line.strip() for line in msg.splitlines())
        if not msg.startswith(f"{argv[0]}:"):
            msg = f"{argv[0]}: {msg}"
        return BackendError(msg, command=list(argv))

    def version(self) -> str:
        """The cluster's Slurm version, from ``sbatch --version`` (e.g. ``22.05.8``)."""
        argv = ["sbatch", "--version"]
        proc = self._run(argv)
        if proc.returncode:
            raise self._fail(proc, argv)
        m = re.search(r"(\d+\.\d+(?:\.\d+)?)", proc.stdout)
        if not m:
            raise BackendError(f"cannot read a version from {proc.stdout.strip()!r}")
        return m.group(1)

    def submit(self, request: SubmitRequest, *, env: dict[str, str] | None = None) -> SubmitResult:
        """Submit ``request``: ``request.argv()`` with the script's bytes on stdin (the script
        carries its runtime files); return the job id Slurm printed."""
        request.check_submittable()
        argv = list(request.argv())
        proc = self._run(argv, stdin=request.script, env=env)
        if proc.returncode:
            raise self._fail(proc, argv)
        first = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else ""
        job_id, _, cluster = first.partition(";")
        if not job_id.isdigit():
            raise BackendError(f"sbatch printed no job id: {proc.stdout.strip()!r}")
        return SubmitResult(job_id=job_id, cluster=cluster or None, message=proc.stderr.strip())

    def test_only(
        self, script: str, *, env: dict[str, str] | None = None, extra_args: Sequence[str] = ()
    ) -> str:
        """Ask the scheduler whether and where the job would start (``sbatch --test-only``),
        with ``extra_args`` (a request's ``--array``) as the real submission would have them."""
        argv = ["sbatch", "--test-only", *extra_args]
        proc = self._run(argv, stdin=script.encode("utf-8"), env=env)
        if proc.returncode:
            raise self._fail(proc, argv)
        return (proc.stderr or proc.stdout).strip()

    # Read-only questions about the cluster (topology, node states, partitions), here so that
    # nothing outside the backends runs a Slurm command of its own.
    def show_topology(self) -> str:
        """``scontrol show topology``: the switch/block text; an error when none is set."""
        argv = ["scontrol", "show", "topology"]
        proc = self._run(argv)
        if proc.returncode or not proc.stdout.strip():
            raise BackendError(
                "scontrol show topology: "
                + (
                    proc.stderr.strip()
                    or "no topology configured (TopologyPlugin is not tree/block)"
                ),
                command=argv,
            )
        return proc.stdout

    def node_states(self) -> str:
        """``sinfo -N -h -o "%N %T"``: one ``NODE STATE`` line per node and partition."""
        return self._query(["sinfo", "-N", "-h", "-o", "%N %T"])

    def show_nodes(self) -> str:
        """``scontrol show nodes -o``: one record per node (addresses, features, state)."""
        return self._query(["scontrol", "show", "nodes", "-o"])

    def has_pyxis(self) -> bool:
        """Whether ``srun`` has Pyxis' options: the plugin adds ``--container-image`` to
        ``srun --help``, the check Pyxis' own guide gives
        (https://github.com/NVIDIA/pyxis/wiki/Installation#verifying-srun)."""
        proc = self._run(["srun", "--help"])
        return "--container-image" in proc.stdout + proc.stderr

    def partition(self, name: str) -> dict[str, str] | None:
        """``scontrol show partition -o NAME`` as a record; None when there is no such one."""
        proc = self._run(["scontrol", "show", "partition", "-o", name])
        if proc.returncode or not proc.stdout.strip():
            return None
        return parse_scontrol_record(proc.stdout.strip().splitlines()[0])

    def partition_topologies(self) -> dict[str, str | None]:
        """Each partition's ``Topology=`` tag (topology.yaml, Slurm >= 25.05), None if untagged."""
        proc = self._run(["scontrol", "show", "partition", "-o"])
        out: dict[str, str | None] = {}
        for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
            rec = parse_scontrol_record(line)
            if rec.get("PartitionName"):
                out[rec["PartitionName"]] = rec.get("Topology") or None
        return out

    def node_features(self, partition: str | None = None) -> set[str]:
        """Every feature some node has (``sinfo -h -o %f``), in ``partition`` if given."""
        argv = ["sinfo", "-h", "-o", "%f"] + (["-p", partition] if partition else [])
        proc = self._run(argv)
        have: set[str] = set()
        for line in proc.stdout.split():
            have.update(line.split(","))
        return have

    def _query(self, argv: list[str]) -> str:
        proc = self._run(argv)
        if proc.returncode:
            raise self._fail(proc, argv)
        return proc.stdout

    def status(self, job_id: str) -> JobStatus:
        """Current state: ``scontrol show job`` first (live and recently ended), then sacct."""
        _check_job_id(job_id)
        argv = ["scontrol", "show", "job", "-o", job_id]
        proc = self._run(argv)
        if proc.returncode == 0 and proc.stdout.strip():
            rec = array_representative(
                [parse_scontrol_record(line) for line in proc.stdout.strip().splitlines()]
            )
            return JobStatus(
                job_id=rec.get("JobId", job_id),
                state=rec.get("JobState", ""),
                reason=rec.get("Reason", ""),
                nodes=rec.get("NodeList", ""),
                exit_code=rec.get("ExitCode", ""),
                restarts=int(rec.get("Restarts", "0") or 0),
                stdout=rec.get("StdOut", ""),
                run_time=rec.get("RunTime", ""),
                name=rec.get("JobName", ""),
                source="scontrol",
                raw=rec,
            )
        return self._sacct_status(job_id, proc)

    def _sacct_status(self, job_id: str, prior: subprocess.CompletedProcess[str]) -> JobStatus:
        fields = "JobID,JobName,State,ExitCode,NodeList,Elapsed,Reason"
        argv = ["sacct", "-X", "-n", "-P", "-j", job_id, f"--format={fields}"]
        try:
            proc = self._run(argv)
        except BackendError:
            raise self._fail(prior, ["scontrol"]) from None
        if proc.returncode or not proc.stdout.strip():
            detail = (prior.stderr or "").strip() or "job not found"
            raise BackendError(
                f"job {job_id}: {detail} (and sacct has no record: accounting may be off)"
            )
        parts = proc.stdout.strip().splitlines()[0].split("|")
        rec = dict(zip(fields.split(","), parts, strict=False))
        return JobStatus(
            job_id=rec.get("JobID", job_id),
            state=rec.get("State", ""),
            reason=rec.get("Reason", ""),
            nodes=rec.get("NodeList", ""),
            exit_code=rec.get("ExitCode", ""),
            run_time=rec.get("Elapsed", ""),
            name=rec.get("JobName", ""),
            source="sacct",
            raw=rec,
        )

    def cancel(self, job_id: str) -> None:
        argv = ["scancel", _check_job_id(job_id)]
        # Slurm 22.05's scancel exits 0 for a job that never existed (it only prints an
        # error), so a job scontrol does not know is refused first, with scontrol's words.
        known = self._run(["scontrol", "show", "job", "-o", job_id])
        if known.returncode or not known.stdout.strip():
            detail = " ".join((known.stderr or "").split()) or "no such job"
            raise BackendError(f"scancel: job {job_id}: {detail}", command=argv)
        proc = self._run(argv)
        if proc.returncode or "error" in proc.stderr:
            raise self._fail(proc, argv)

    def wait(
        self,
        job_id: str,
        *,
        timeout: float = 3600.0,
        interval: float = 1.0,
        max_interval: float = 60.0,
    ) -> JobStatus:
        """Poll until the job reaches a terminal state (``sbatch --wait`` polls too slowly),
        with backoff (:mod:`slurmfm.polling`)."""
        from slurmfm.polling import wait_for_end

        return wait_for_end(
            lambda: self.status(job_id), job_id, timeout=timeout, first=interval, most=max_interval
        )
