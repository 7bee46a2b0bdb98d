"""Optional backend over pyslurm, used only when it imports and matches the cluster's Slurm.

Why so guarded: ``import pyslurm`` with no reachable slurm.conf makes libslurm call ``fatal()``,
which ends the interpreter (no exception to catch; seen on the lab of scripts/slurm-lab). So
availability is probed in a child process first. PyPI carries pyslurm only for Slurm 25.11, and a
pyslurm built for another Slurm release refuses to build or is ABI-incompatible, so the probe
also compares pyslurm's major.minor with the cluster's (docs/backends.md).

The calls used follow pyslurm's documented object API (``JobSubmitDescription``,
``load_sbatch_options``, ``submit``, ``Job.load``, ``Job.cancel``); known pitfalls are handled:
the job environment is passed explicitly (the default ``None`` made 24.11 fail with "batch job
cannot run without an environment"), and ``--switches`` is not set through pyslurm (broken in
22.5/24.11, reference sections 7.4 and 5) but left on the script's ``#SBATCH`` lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from slurmfm.backends.base import JobStatus, SubmitResult
from slurmfm.errors import BackendError

if TYPE_CHECKING:
    from slurmfm.request import SubmitRequest

_PROBE = (
    "import json, pyslurm\n"
    "v = getattr(pyslurm, 'version', None)\n"
    "v = v() if callable(v) else pyslurm.__version__\n"
    "print(json.dumps({'version': str(v)}))\n"
)


@dataclass(frozen=True)
class ProbeResult:
    """Whether pyslurm can be used here, and why not when it cannot."""

    usable: bool
    version: str | None
    reason: str


def _major_minor(version: str) -> tuple[int, int] | None:
    parts = version.replace("-", ".").split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (ValueError, IndexError):
        return None


def probe(
    cluster_version: str, *, python: str | None = None, env: dict[str, str] | None = None
) -> ProbeResult:
    """Import pyslurm in a child process and compare its version with the cluster's."""
    try:
        proc = subprocess.run(
            [python or sys.executable, "-c", _PROBE],
            capture_output=True,
            text=True,
            timeout=30,
            env=env if env is not None else dict(os.environ),
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return ProbeResult(False, None, f"probe failed: {exc}")
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return ProbeResult(False, None, f"import pyslurm failed: {tail}")
    try:
        version = str(json.loads(proc.stdout.strip().splitlines()[-1])["version"])
    except (ValueError, KeyError, IndexError):
        return ProbeResult(False, None, f"unexpected probe output {proc.stdout!r}")
    mine, theirs = _major_minor(version), _major_minor(cluster_version)
    if mine is None or theirs is None or mine != theirs:
        return ProbeResult(
            False,
            version,
            f"pyslurm {version} is built for Slurm {version.rsplit('.', 1)[0]}, "
            f"the cluster runs {cluster_version}",
        )
    return ProbeResult(True, version, "ok")


class PySlurmBackend:
    """Submit and query through pyslurm (import happens only after a successful probe)."""

    name = "pyslurm"

    def __init__(self, module: Any | None = None) -> None:
        if module is None:
            import pyslurm

            module = pyslurm
        self.mod = module

    def version(self) -> str:
        v = self.mod.version() if callable(getattr(self.mod, "version", None)) else None
        return str(v or self.mod.__version__)

    def submit(self, request: SubmitRequest, *, env: dict[str, str] | None = None) -> SubmitResult:
        """Submit ``request`` through ``JobSubmitDescription``: the script's ``#SBATCH`` lines
        are loaded as sbatch would, then the request's structured options set the attributes
        that sbatch's command line would (``dependencies``, ``array``,
        ``kill_on_invalid_dependency``; pyslurm's documented JobSubmitDescription)."""
        request.check_submittable()
        if request.sbatch_args:
            raise BackendError(
                f"pyslurm: cannot pass sbatch options {' '.join(request.sbatch_args)}; "
                "use --backend cli"
            )
        desc = self.mod.JobSubmitDescription(
            script=request.text, environment=dict(env if env is not None else os.environ)
        )
        try:
            desc.load_sbatch_options()
            if request.array is not None:
                desc.array = request.array.indices
            if request.dependency is not None and request.dependency.has_jobs:
                desc.dependencies = request.dependency.expression()
            if request.kill_on_invalid_dep:
                desc.kill_on_invalid_dependency = True
            job_id = desc.submit()
        except Exception as exc:  # pyslurm raises RPCError and plain ValueErrors
            raise BackendError(f"pyslurm: {exc}") from None
        return SubmitResult(job_id=str(job_id))

    def status(self, job_id: str) -> JobStatus:
        try:
            job = self.mod.Job.load(int(job_id))
        except Exception as exc:
            raise BackendError(f"pyslurm: job {job_id}: {exc}") from None
        nodes = getattr(job, "nodelist", None) or getattr(job, "allocated_nodes", None) or ""
        return JobStatus(
            job_id=str(job_id),
            state=str(getattr(job, "state", "") or ""),
            reason=str(getattr(job, "state_reason", "") or ""),
            nodes=str(nodes),
            exit_code=str(getattr(job, "exit_code", "") or ""),
            restarts=int(getattr(job, "requeue_count", 0) or 0),
            name=str(getattr(job, "name", "") or ""),
            source="pyslurm",
        )

    def cancel(self, job_id: str) -> None:
        try:
            self.mod.Job.load(int(job_id)).cancel()
        except Exception as exc:
            raise BackendError(f"pyslurm: cancel {job_id}: {exc}") from None
