"""Error types that the CLI turns into one clear line and exit status 2.

Why one module: every layer (loading, validation, rendering, backends) raises these, and the
CLI must map all of them to the same ``FILE:LINE: field: message`` shape without importing
the layers that raised them.
"""

from __future__ import annotations

from dataclasses import dataclass


class SlurmfmError(Exception):
    """Base of all errors the user can fix; the CLI prints ``str(err)`` and exits 2."""

    exit_code: int = 2


@dataclass
class Problem:
    """One located problem in a recipe: ``file:line: field: message``."""

    file: str
    line: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line is not None else self.file
        field = self.field or "(recipe)"
        return f"{where}: {field}: {self.message}"


class RecipeError(SlurmfmError):
    """A recipe that cannot be loaded or validated; carries every problem found."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class RenderError(SlurmfmError):
    """A recipe that is valid on its own but cannot be turned into a safe script."""


class UnsafeValueError(RenderError):
    """A user value that cannot be carried into the script exactly (e.g. a NUL byte)."""


class BackendError(SlurmfmError):
    """Slurm (or the pyslurm library) refused a request; message is Slurm's own words."""

    def __init__(self, message: str, *, command: list[str] | None = None) -> None:
        self.command = command
        super().__init__(message)


class UnsupportedError(SlurmfmError):
    """A request the target Slurm version or cluster flavor cannot honour."""


class JobFailed(SlurmfmError):
    """A job ended other than COMPLETED (from ``Job.result()``): its state, Slurm's exit code,
    the reason slurmfm or Slurm recorded, and the last lines of its log, so a research script
    can print why without opening files.

    ``exit_code`` stays the CLI's status for the error (1: the job failed, not the input);
    the job's own is ``job_exit_code``.
    """

    exit_code = 1

    def __init__(
        self,
        job_id: str,
        state: str,
        *,
        reason: str = "",
        job_exit_code: str = "",
        log_tail: str = "",
        log_path: str = "",
    ) -> None:
        self.job_id = job_id
        self.state = state
        self.reason = reason
        self.job_exit_code = job_exit_code
        self.log_tail = log_tail
        self.log_path = log_path
        head = f"job {job_id} ended {state}" + (f" (exit {job_exit_code})" if job_exit_code else "")
        lines = [head + (f": {reason}" if reason else "")]
        if log_tail:
            lines.append(f"last lines of {log_path or 'its log'}:")
            lines.extend(f"  {line}" for line in log_tail.splitlines())
        super().__init__("\n".join(lines))
