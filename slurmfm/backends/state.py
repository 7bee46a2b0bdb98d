"""Read the state file that slurmfm's job script writes next to the job's log.

The format, its events and its reader are the job runtime's (:mod:`slurmfm.job.state`); this
module turns them into what ``slurmfm status`` shows. Slurm itself keeps only a restart
count; this file carries the reasons, so ``slurmfm status`` can say why a job restarted and
which checkpoint it would resume from.

The log directory may be shared (docs/security.md): the file read is the one the job's own
user owns, by the job runtime's rule (:func:`slurmfm.job.state.find`); a file planted under
the job's name by anyone else is ignored, and the status says so (``ignored``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from slurmfm.job.state import events, state_name

if TYPE_CHECKING:
    from slurmfm.backends.base import JobStatus


@dataclass
class JobState:
    events: list[str] = field(default_factory=list)
    restarts: int = 0
    last_requeue_reason: str = ""
    last_stop_reason: str = ""
    checkpoint_dir: str = ""
    last_checkpoint: str = ""
    ignored: list[str] = field(default_factory=list)


def parse_state(text: str) -> JobState:
    st = JobState()
    for e in events(text):
        st.events.append(e.line)
        st.restarts = max(st.restarts, e.restart)
        if e.event in ("requeue", "restart"):
            st.last_requeue_reason = e.detail
        elif e.event == "stop":
            st.last_stop_reason = e.detail
        elif e.event == "checkpoint-dir":
            st.checkpoint_dir = e.detail
    return st


def state_path(status: JobStatus) -> Path | None:
    """``<dir of StdOut>/<JobName>_<JobId>.state``, from ``scontrol show job``."""
    if not status.stdout or not status.name:
        return None
    return Path(status.stdout).parent / state_name(status.name, status.job_id)


def job_uid(status: JobStatus) -> int | None:
    """The job's user id from Slurm's ``UserId=name(uid)`` (None: not reported)."""
    from slurmfm.job.slurm import user_id

    return user_id(status.raw)


def read_state(status: JobStatus) -> JobState | None:
    from slurmfm.job import fsafe
    from slurmfm.job.state import find

    path = state_path(status)
    if path is None:
        return None
    uid = job_uid(status)
    found, ignored = find(str(path), uid)
    text = fsafe.read_text(found, uid, limit=16 << 20) if found else None
    if text is None:
        if not ignored:
            return None
        st = JobState()
    else:
        st = parse_state(text)
    st.ignored = [f"state file {why} (not the job's user's)" for why in ignored]
    if st.checkpoint_dir:
        from slurmfm.checkpoint import latest

        try:  # the job user's run directory and checkpoints only (docs/security.md)
            cur = latest(checkpoint_dir(st.checkpoint_dir, status), uid)
        except fsafe.Refused as exc:
            st.ignored.append(f"checkpoint directory {exc}")
            cur = None
        st.last_checkpoint = str(cur) if cur else ""
    return st


def checkpoint_dir(recorded: str, status: JobStatus) -> Path:
    """The checkpoint directory the job used, as a path valid for the caller.

    A relative ``checkpoint_root`` is relative to the job's working directory (sbatch runs the
    script there: Slurm's ``WorkDir``), not to wherever ``slurmfm status`` is run.
    """
    path = Path(recorded)
    workdir = status.raw.get("WorkDir", "")
    if not path.is_absolute() and workdir:
        return Path(workdir) / path
    return path
