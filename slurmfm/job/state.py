"""The job's state file: one line per event, read by ``slurmfm status``.

Format (unchanged from the bash runtime, so old records still read):
``<UTC time> restart=<n> event=<word> <detail>``. A line is written after the event happened
(a requeue is recorded once ``scontrol requeue`` succeeded), and a record that cannot be
written never stops the job.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable


class StateFile:
    """Appends event lines; ``clock`` returns seconds since the epoch (injected in tests)."""

    def __init__(self, path: str, restart: int, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.restart = restart
        self.clock = clock

    def record(self, event: str, detail: str = "") -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
        # one line per event: a newline in a detail must not forge a second record
        detail = " ".join(detail.split())
        line = "%s restart=%d event=%s %s\n" % (stamp, self.restart, event, detail)
        try:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write(line)
        except OSError:
            pass

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
        marker = f" event={event} "
        found = None
        try:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if marker in line:
                        head, _, detail = line.partition(marker)
                        restart = head.rpartition(" restart=")[2]
                        if restart.isdigit():
                            found = (int(restart), detail.rstrip("\n"))
        except OSError:
            return None
        return found


def state_path(log_dir: str, env: dict[str, str]) -> str:
    """``$LOG_DIR/<job name>_<job id>.state``, the path ``slurmfm status`` reads."""
    return os.path.join(
        log_dir,
        "{}_{}.state".format(env.get("SLURM_JOB_NAME", "job"), env.get("SLURM_JOB_ID", "0")),
    )
