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
        marker = f" event={event} "
        found = None
        try:
            with open(self.path, encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    if marker in line:
                        found = line.split(marker, 1)[1].rstrip("\n")
        except OSError:
            return None
        return found


def state_path(log_dir: str, env: dict[str, str]) -> str:
    """``$LOG_DIR/<job name>_<job id>.state``, the path ``slurmfm status`` reads."""
    return os.path.join(
        log_dir,
        "{}_{}.state".format(env.get("SLURM_JOB_NAME", "job"), env.get("SLURM_JOB_ID", "0")),
    )
