"""What every backend offers, as typed values so the CLI and API never parse Slurm text."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from slurmfm.request import SubmitRequest

TERMINAL_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
        "SPECIAL_EXIT",
        "REVOKED",
    }
)


def base_state(state: str) -> str:
    """The state word alone: sacct's ``CANCELLED by 0`` and a ``+`` suffix dropped."""
    return state.split(maxsplit=1)[0].rstrip("+") if state.strip() else ""


@dataclass(frozen=True)
class SubmitResult:
    """A submitted job: its id and the cluster it went to."""

    job_id: str
    cluster: str | None = None
    message: str = ""


@dataclass(frozen=True)
class JobStatus:
    """A job's state as Slurm reports it (``scontrol show job`` or ``sacct``)."""

    job_id: str
    state: str
    reason: str = ""
    nodes: str = ""
    exit_code: str = ""
    restarts: int = 0
    stdout: str = ""
    run_time: str = ""
    name: str = ""
    source: str = ""
    raw: dict[str, str] = field(default_factory=dict)
    # From the job's slurmfm state file (next to its log), when there is one:
    last_requeue_reason: str = ""
    last_stop_reason: str = ""
    last_checkpoint: str = ""
    events: tuple[str, ...] = ()
    # State files under the job's name that the job's user does not own: ignored (and why).
    ignored: tuple[str, ...] = ()

    @property
    def done(self) -> bool:
        return base_state(self.state) in TERMINAL_STATES

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"


class Backend(Protocol):
    """The operations slurmfm needs from a Slurm cluster.

    ``submit`` receives the whole :class:`~slurmfm.request.SubmitRequest` (script bytes, runtime
    files, sbatch options, dependency, array): the very object a dry run showed.
    """

    name: str

    def version(self) -> str: ...

    def submit(
        self, request: SubmitRequest, *, env: dict[str, str] | None = None
    ) -> SubmitResult: ...

    def status(self, job_id: str) -> JobStatus: ...

    def cancel(self, job_id: str) -> None: ...


SUBMIT_TOKEN_PREFIX = "slurmfm-submit-"  # noqa: S105 - a marker, not a secret


def new_submit_token() -> str:
    """A fresh token for a job's comment (``sbatch --comment``), by which a remote backend
    finds its submission again when the answer to it was lost (slurmfm.backends.ssh, .rest):
    random, so no two submissions share one, and free of anything a shell or Slurm parses."""
    import secrets

    return SUBMIT_TOKEN_PREFIX + secrets.token_hex(8)
