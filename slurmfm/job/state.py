"""The job's state file: one line per event, read by ``slurmfm status``.

Format (unchanged from the bash runtime, so old records still read):
``<UTC time> restart=<n> event=<word> <detail>`` (:func:`format_line`, read back by
:func:`parse_line` and :func:`events`, the one reader: ``slurmfm status``, ``report``,
``logs`` and ``plan --avoid-failed-since`` use it too). A line is written after the event
happened (a requeue is recorded once ``scontrol requeue`` succeeded), and a record that cannot
be written never stops the job. The file is ``<log dir>/<job name>_<job id>.state``
(:func:`state_name`).

The events: ``start``, ``checkpoint-dir``, ``hosts``, ``signal``, ``requeue`` (one the
runtime asked for), ``restart`` (one it did not: Slurm's or an operator's, recorded by the
attempt that followed), ``stop`` (what Slurm said when a TERM reached the batch step),
``give-up``, ``fail``, ``finished`` and a few more (``save-failed``...).

The log directory is shared (docs/security.md), and the name ``<job>_<id>.state`` is easy to
guess before the job exists. So the record is the first of ``<job>_<id>.state`` and
``<job>_<id>.<random>.state`` that is a regular file of the job's own user; a link, a FIFO or
another user's file under that name is ignored (and said so), and the job then keeps its
record under a fresh random name, created exclusively. ``slurmfm status`` applies the same rule
(:func:`find`), so it reads what the job wrote and nothing planted beside it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from typing import NamedTuple

from . import fsafe

SUFFIX = ".state"
_LINE = re.compile(r"^(?P<ts>\S+) restart=(?P<restart>\d+) event=(?P<event>\S+) ?(?P<rest>.*)$")


class Event(NamedTuple):
    """One line of a state file."""

    time: str  # ISO 8601 UTC, ``...Z``
    restart: int  # the attempt that wrote it (SLURM_RESTART_COUNT)
    event: str
    detail: str
    line: str  # as written


def format_line(clock_s: float, restart: int, event: str, detail: str) -> str:
    """The line that records ``event``; a newline in a detail cannot forge a second record."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(clock_s))
    return "%s restart=%d event=%s %s\n" % (stamp, restart, event, " ".join(detail.split()))


def parse_line(line: str) -> Event | None:
    """The event of one line, None for anything else."""
    m = _LINE.match(line)
    if not m:
        return None
    return Event(m.group("ts"), int(m.group("restart")), m.group("event"), m.group("rest"), line)


def events(text: str) -> list[Event]:
    """Every event of a state file's text, oldest first."""
    return [e for e in map(parse_line, text.splitlines()) if e is not None]


def state_name(job_name: str, job_id: str) -> str:
    """The state file's name for a job: ``<job name>_<job id>.state``."""
    return "%s_%s%s" % (job_name, job_id, SUFFIX)


def candidates(path: str) -> list[str]:
    """The state file's usual name, then its random-named fallbacks."""
    stem = path[: -len(SUFFIX)] if path.endswith(SUFFIX) else path
    return [path] + sorted(glob.glob(glob.escape(stem) + ".*" + SUFFIX))


def find(path: str, uid: int | None = None) -> tuple[str | None, list[str]]:
    """The job's state file owned by ``uid`` (default: this user), and the ones ignored (why)."""
    ignored: list[str] = []
    for cand in candidates(path):
        try:
            st = os.lstat(cand)
        except OSError:
            continue
        why = fsafe.problem(st, uid)
        if why is None:
            return cand, ignored
        ignored.append("%s %s" % (cand, why))
    return None, ignored


def claim(path: str) -> str:
    """The path this job records in: its own existing file, the usual name, or a fresh one."""
    found, ignored = find(path)
    if found is not None or not ignored:
        return found or path
    directory, base = os.path.split(path)
    stem = base[: -len(SUFFIX)] if base.endswith(SUFFIX) else base
    try:
        fd, fresh = tempfile.mkstemp(prefix=stem + ".", suffix=SUFFIX, dir=directory or ".")
        os.fchmod(fd, fsafe.FILE_MODE)
        os.close(fd)
    except OSError:
        return path
    for why in ignored:
        print(
            "slurmfm: ignoring %s (not this job's record); recording in %s" % (why, fresh),
            file=sys.stderr,
        )
    return fresh


class StateFile:
    """Appends event lines; ``clock`` returns seconds since the epoch (injected in tests)."""

    def __init__(self, path: str, restart: int, clock: Callable[[], float] = time.time) -> None:
        self.path = claim(path)
        self.restart = restart
        self.clock = clock

    def record(self, event: str, detail: str = "") -> None:
        line = format_line(self.clock(), self.restart, event, detail)
        with contextlib.suppress(OSError):
            fsafe.append(self.path, line)

    def last(self, event: str) -> str | None:
        """The detail of the newest ``event`` line, if any."""
        entry = self.last_entry(event)
        return entry[1] if entry else None

    def last_entry(self, event: str) -> tuple[int, str] | None:
        """``(restart, detail)`` of the newest ``event`` line, if any.

        The restart number says which attempt wrote it: a requeue the runtime asked for is
        written by the attempt it ends, so the next attempt can tell it from one it did not
        ask for (:meth:`slurmfm.job.batch.Batch.note_unasked_restart`).
        """
        found = None
        for e in events(fsafe.read_text(self.path, limit=16 << 20) or ""):
            if e.event == event:
                found = (e.restart, e.detail)
        return found


def state_path(log_dir: str, env: dict[str, str]) -> str:
    """``$LOG_DIR/<job name>_<job id>.state``, the path ``slurmfm status`` reads."""
    return os.path.join(
        log_dir, state_name(env.get("SLURM_JOB_NAME", "job"), env.get("SLURM_JOB_ID", "0"))
    )
