"""Optional backend over pyslurm, used only when it imports and matches the cluster's Slurm.

Why so guarded: ``import pyslurm`` with no reachable slurm.conf makes libslurm call ``fatal()``,
which ends the interpreter (no exception to catch; seen on the lab of scripts/slurm-lab). So
availability is probed in a child process first. PyPI carries pyslurm only for Slurm 25.11, and a
pyslurm built for another Slurm release refuses to build or is ABI-incompatible, so the probe
also compares pyslurm's major.minor with the cluster's (docs/backends.md).

The calls used follow pyslurm's object API (``JobSubmitDescription``, ``load_sbatch_options``,
``submit``, ``Job.load``, ``Job.cancel``), as real pyslurm 22.5.3 and 24.11.0 behave against real
clusters of the same release (tests/backends/test_pyslurm_backend.py):

* ``JobSubmitDescription(script=...)`` takes a *path*: ``load_sbatch_options`` raises "The script
  path you provided is not valid." for script text, and ``submit`` reads the file
  (PySlurm/pyslurm:pyslurm/core/job/sbatch_opts.pyx, ``_parse_opts_from_batch_script``). The
  script is written to a private file (0600, in a 0700 directory of its own) and removed once
  submitted.
* A bare-minutes time (``#SBATCH --time=30``) stays a string after ``load_sbatch_options`` and
  ``submit`` raises ``TypeError: an integer is required`` (``pyslurm/utils/ctime.pyx``,
  ``timestr_to_mins`` returns a digit string as it is); it is handed over as an integer.
* ``pyslurm.version`` is a function in 22.5.x and a submodule in 24.11 and 25.11:
  ``pyslurm.__version__`` is read then.
* ``Job.exit_code`` is an int (0 on success) with the signal apart (``exit_code_signal``): the
  status says ``0:0`` as ``scontrol`` does, never "" for a success. ``state_reason`` is
  Slurm's word, ``'None'`` when there is none, as ``scontrol``'s ``Reason=None``; the nodes are
  ``allocated_nodes``.
* ``load_sbatch_options`` raised AttributeError on ``#SBATCH --partition`` (its table names an
  attribute ``partition``, the class has ``partitions``): the one is made the other. It skips,
  without a word, an option its table does not map (``--segment``) and fails on one whose
  attribute the class lacks (``--gpus-per-node``): such a script is refused, naming them.

Also: the job environment is passed explicitly (the default ``None`` made 24.11 fail with "batch
job cannot run without an environment"), and ``--switches`` is not set through pyslurm (broken in
22.5/24.11) but left on the script's ``#SBATCH`` lines.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import tempfile
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


def sbatch_header_options(text: str) -> list[str]:
    """The options of a script's ``#SBATCH`` lines as sbatch reads them: those before the first
    command, each as ``--long`` or ``-s`` without its value."""
    found = []
    for line in text.splitlines()[1:]:
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break
        if stripped.startswith("#SBATCH"):
            words = stripped[len("#SBATCH") :].split()
            if words and words[0].startswith("-"):
                found.append(words[0].split("=", 1)[0])
    return found


def description_class(mod: Any) -> Any:
    """pyslurm's ``JobSubmitDescription``, with ``partition`` made the ``partitions`` it means.

    Why: pyslurm's option table maps ``-p/--partition`` to an attribute ``partition``
    (PySlurm/pyslurm:pyslurm/core/job/sbatch_opts.pyx, ``SbatchOpt("p", "partition",
    "partition")`` in 22.5.x and 24.11.x) that its ``JobSubmitDescription`` names
    ``partitions``, so ``load_sbatch_options`` raised AttributeError on every script with
    ``#SBATCH --partition``, which slurmfm renders into every job."""
    base = mod.JobSubmitDescription
    if hasattr(base, "partition") or not hasattr(base, "partitions"):
        return base

    class Description(base):  # type: ignore[misc,valid-type]
        @property
        def partition(self) -> Any:
            return self.partitions

        @partition.setter
        def partition(self, value: Any) -> None:
            self.partitions = value

    return Description


def unsupported_options(text: str, description: Any) -> list[str]:
    """The script's ``#SBATCH`` options that this pyslurm cannot take.

    Why: ``load_sbatch_options`` looks each option up in pyslurm's own table
    (PySlurm/pyslurm:pyslurm/core/job/sbatch_opts.pyx, ``SBATCH_OPTIONS``): one it does not map
    is skipped without a word, where sbatch would apply it or refuse the script (22.5.x and
    24.11.x have no ``--segment``, so a block-topology job would lose its placement), and one
    it maps to an attribute that ``JobSubmitDescription`` lacks raises AttributeError
    (``--gpus-per-node``)."""
    try:
        table = importlib.import_module("pyslurm.core.job.sbatch_opts").SBATCH_OPTIONS
    except Exception:  # another layout: nothing to compare with
        return []
    known: set[str] = set()
    for opt in table:
        attr = getattr(opt, "our_attr_name", None)
        if attr and hasattr(description, attr):
            known.update(
                f"{dashes}{name}"
                for dashes, name in (("--", opt.long_opt), ("-", opt.short_opt))
                if name
            )
    return [o for o in sbatch_header_options(text) if o not in known]


def _write_private(path: str, data: bytes) -> None:
    """Write ``data`` to a new file at ``path`` that only this user can read (0600, created
    exclusively, never through a symlink): the script may hold the job's environment names and
    paths, and pyslurm reads it back from the path."""
    from slurmfm.job import fsafe

    fsafe.create(path, data, fsafe.PRIVATE_MODE)


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
        description = description_class(self.mod)
        unsupported = unsupported_options(request.text, description)
        if unsupported:
            raise BackendError(
                f"pyslurm {self.version()} cannot take #SBATCH {', '.join(unsupported)} "
                "(it has no field for them); use --backend cli"
            )
        with tempfile.TemporaryDirectory(prefix="slurmfm-pyslurm-") as private:
            path = os.path.join(private, "job.sh")
            _write_private(path, request.script)
            desc = description(
                script=path, environment=dict(env if env is not None else os.environ)
            )
            try:
                desc.load_sbatch_options()
                for attr in ("time_limit", "time_limit_min"):
                    value = getattr(desc, attr, None)
                    if isinstance(value, str) and value.isdigit():
                        setattr(desc, attr, int(value))  # minutes; pyslurm wants an int here
                if request.array is not None:
                    desc.array = request.array.indices
                if request.dependency is not None and request.dependency.has_jobs:
                    desc.dependencies = request.dependency.expression()
                if request.kill_on_invalid_dep:
                    desc.kill_on_invalid_dependency = True
                job_id = desc.submit()
            except Exception as exc:  # pyslurm raises RPCError, ValueError, TypeError
                raise BackendError(f"pyslurm: {exc}") from None
        return SubmitResult(job_id=str(job_id))

    def status(self, job_id: str) -> JobStatus:
        try:
            job = self.mod.Job.load(int(job_id))
        except Exception as exc:
            raise BackendError(f"pyslurm: job {job_id}: {exc}") from None
        return JobStatus(
            job_id=str(job_id),
            state=str(job.state or ""),
            reason=str(job.state_reason or ""),
            nodes=str(job.allocated_nodes or ""),
            # scontrol's ExitCode=status:signal; pyslurm gives each as an int, 0 on success
            exit_code=f"{job.exit_code or 0}:{getattr(job, 'exit_code_signal', 0) or 0}",
            restarts=int(job.requeue_count or 0),
            stdout=str(getattr(job, "standard_output", "") or ""),
            name=str(job.name or ""),
            source="pyslurm",
        )

    def cancel(self, job_id: str) -> None:
        try:
            self.mod.Job.load(int(job_id)).cancel()
        except Exception as exc:
            raise BackendError(f"pyslurm: cancel {job_id}: {exc}") from None
