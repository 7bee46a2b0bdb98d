"""Collecting the evidence :mod:`.classify` judges: what each node's launcher did, what srun
printed, and whether the training made progress during the attempt.

* Each node's entry (:mod:`.node`) points torch's ``TORCHELASTIC_ERROR_FILE`` at a file of its
  own in the attempt's evidence directory (so ``@record`` writes the first failed worker's
  exception there), keeps the last lines of its launcher's stderr, and writes one JSON report
  when the launcher ends: its exit, whether srun stopped it first, the exception, the rank.
* The batch step copies the launch srun's stderr through (the job log is unchanged) and keeps
  srun's own lines: which task failed first, which were killed for it, an OOM.
* Progress: the checkpoint directory's newest complete checkpoint (``latest`` or Megatron's
  tracker) and the progress file (:func:`slurmfm.checkpoint.report_progress`) before and after.

The evidence directory is created by the batch step, mode 0700, so no other user can plant or
replace a report or the error file torch writes (torch opens it with a plain ``open(.., "w")``).
"""

from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    # imported where used: a node entry's start (the gate's verdict, the launch's watch)
    # needs none of the judging, only the batch step and a finished launch do
    from . import classify as cl

# ``json``, :mod:`.fsafe` (``tempfile``, ``glob``) and :mod:`.checkpoint` are imported where
# used too: a node entry imports this module before its launcher starts and needs them only
# once the launcher has ended (its report) or not at all (the batch step's progress marks).

TAIL_LINES = 200


def attempt_dir(log_dir: str, env: dict[str, str], restart: int, launch: int) -> str:
    """``$LOG_DIR/<job name>_<job id>.evidence/r<restart>-l<launch>``."""
    return os.path.join(
        log_dir,
        "{}_{}.evidence".format(env.get("SLURM_JOB_NAME", "job"), env.get("SLURM_JOB_ID", "0")),
        "r%d-l%d" % (restart, launch),
    )


def private_dir(path: str) -> bool:
    """Create ``path`` (and its parent) mode 0700 and check it is a directory of ours
    (:func:`.fsafe.private_dir`); False when it is not."""
    from . import fsafe

    try:
        for p in (os.path.dirname(path), path):
            fsafe.private_dir(p)
        return True
    except OSError:
        return False


def write_private(path: str, text: str) -> None:
    """Replace ``path`` with an owner-only file (:func:`.fsafe.replace`: never through a
    link, never into someone else's file); errors are ignored."""
    from . import fsafe

    with contextlib.suppress(OSError):
        fsafe.replace(path, text, mode=0o600)


def read_small(path: str, limit: int = 1 << 20) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return ""
    with os.fdopen(fd, "rb") as fh, contextlib.suppress(OSError):
        import stat

        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            return ""
        return fh.read(limit).decode("utf-8", "replace")
    return ""


class Tail:
    """Copies a stream to ``out`` line by line, keeping the last lines and calling ``seen``."""

    def __init__(
        self,
        stream: IO[bytes],
        out: IO[bytes] | None = None,
        seen: Callable[[str], None] | None = None,
        keep: int = TAIL_LINES,
    ) -> None:
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self.stream = stream
        self.out = out if out is not None else sys.stderr.buffer
        self.seen = seen
        self.thread = threading.Thread(target=self._copy, daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        for raw in iter(self.stream.readline, b""):
            with contextlib.suppress(OSError, ValueError):
                self.out.write(raw)
                self.out.flush()
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            self.lines.append(line)
            if self.seen is not None:
                with contextlib.suppress(Exception):
                    self.seen(line)

    def join(self, timeout: float = 10.0) -> list[str]:
        self.thread.join(timeout)
        return list(self.lines)


class LaunchWatch:
    """The node entry's record of its launcher (see :func:`report`)."""

    def __init__(self, directory: str, node: str) -> None:
        self.directory = directory
        self.node = node
        self.stopped = False
        self.tail: Tail | None = None

    @property
    def error_file(self) -> str:
        return os.path.join(self.directory, "%s.torch.json" % self.node)

    def environ(self, env: dict[str, str]) -> dict[str, str]:
        """The launcher's environment: torch's error file is this node's, this attempt's."""
        with contextlib.suppress(OSError):
            os.unlink(self.error_file)  # a file left by an earlier launch is not evidence
        return dict(env, TORCHELASTIC_ERROR_FILE=self.error_file)

    def follow(self, stream: IO[bytes] | None) -> None:
        if stream is not None:
            self.tail = Tail(stream)

    def finish(self, rc: int) -> None:
        import json

        lines = self.tail.join() if self.tail is not None else []
        write_private(
            os.path.join(self.directory, "%s.json" % self.node),
            json.dumps(report(self.node, rc, self.stopped, read_small(self.error_file), lines)),
        )


def report(
    node: str, rc: int, stopped: bool, error_file: str, lines: list[str], now: float | None = None
) -> dict[str, object]:
    """One node's report: the launcher's exit, the exception (error file first, else its
    output), the failing rank and signal."""
    from . import classify as cl

    typ, msg, when = cl.parse_error_file(error_file) if error_file else ("", "", 0.0)
    exc, emsg, rank, sig = cl.parse_launcher_output(lines)
    if sig:  # a worker killed from outside: the others' errors are its consequences
        typ, msg, when = "", "", 0.0
    elif not typ:
        typ, msg = exc, emsg
    return {
        "node": node,
        "exit": rc,
        "stopped": stopped,
        "ended": time.time() if now is None else now,
        "exc_type": typ,
        "message": msg[:500],
        "rank": rank,
        "when": when,
        "signal": sig,
    }


def read_reports(directory: str) -> tuple[cl.NodeReport, ...]:
    """Every node's report of one launch (unreadable or malformed ones are skipped)."""
    import json

    from . import classify as cl

    out = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return ()
    for name in names:
        if not name.endswith(".json") or name.endswith(".torch.json"):
            continue
        try:
            d = json.loads(read_small(os.path.join(directory, name)))
            out.append(
                cl.NodeReport(
                    str(d["node"]),
                    int(d["exit"]),
                    bool(d.get("stopped")),
                    float(d.get("ended") or 0),
                    str(d.get("exc_type") or ""),
                    str(d.get("message") or ""),
                    int(d.get("rank", -1)),
                    float(d.get("when") or 0),
                    int(d.get("signal") or 0),
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return tuple(out)


def log_position(fd: int = 2) -> tuple[str, int] | None:
    """(path, size) of the job log this process writes to (its stderr), when a file."""
    import stat

    try:
        path = os.readlink("/proc/self/fd/%d" % fd)
        st = os.stat(path)
    except OSError:
        return None
    return (path, st.st_size) if stat.S_ISREG(st.st_mode) else None


def log_since(start: tuple[str, int] | None, cap: int = 4 << 20) -> list[str]:
    """The lines written to the job log since ``start`` (at most the last ``cap`` bytes:
    srun reports the tasks' ends last)."""
    if start is None:
        return []
    path, offset = start
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as fh:
        try:
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(offset, size - cap))
            data = fh.read(cap)
        except OSError:
            return []
    return data.decode("utf-8", "replace").splitlines()


class SrunLines:
    """What the batch step keeps of the launch srun's stderr (see :mod:`.classify`)."""

    def __init__(self) -> None:
        self.tasks: list[cl.TaskLine] = []
        self.errors: list[str] = []
        self.oom = False

    def __call__(self, line: str) -> None:
        if not line.startswith(("srun:", "slurmstepd:")):
            return
        from . import classify as cl

        if cl.is_oom_line(line):
            self.oom = True
        t = cl.parse_srun_line(line)
        if t is not None:
            self.tasks.append(t)
        elif cl.is_srun_error(line):
            self.errors.append(line.strip())


# --- progress -----------------------------------------------------------------------------


def progress_mark(checkpoint_dir: str, progress_file: str) -> dict[str, str]:
    """What shows progress, now: the newest complete checkpoint, Megatron's tracker, the
    progress file's content."""
    from .checkpoint import resume_from

    mark = {"checkpoint": "", "tracker": "", "progress": ""}
    if checkpoint_dir:
        mark["checkpoint"] = os.path.basename(resume_from(checkpoint_dir) or "")
        mark["tracker"] = read_small(
            os.path.join(checkpoint_dir, "latest_checkpointed_iteration.txt"), 256
        ).strip()
    if progress_file:
        mark["progress"] = read_small(progress_file, 65536).strip()
    return mark


def progress_since(before: dict[str, str], after: dict[str, str]) -> tuple[bool | None, str]:
    """(progress?, what changed): a new checkpoint, a moved tracker, a new progress report.

    None when nothing could show progress (no checkpoint and no report before or after).
    """
    import json

    notes = []
    if after.get("checkpoint") and after["checkpoint"] != before.get("checkpoint"):
        notes.append("new checkpoint %s" % after["checkpoint"])
    if after.get("tracker") and after["tracker"] != before.get("tracker"):
        notes.append("Megatron tracker at %s" % after["tracker"])
    if after.get("progress") and after["progress"] != before.get("progress"):
        step = ""
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            step = " step %s" % json.loads(after["progress"])["step"]
        notes.append("reported%s" % step)
    if notes:
        return True, ", ".join(notes)
    if not any(after.values()) and not any(before.values()):
        return None, ""
    return False, ""


def saved_since(before: dict[str, str], after: dict[str, str]) -> str | None:
    """The new complete checkpoint that proves a save ("" none appeared; None: the run keeps
    no checkpoint this runtime can read, so nothing tells)."""
    if after.get("checkpoint") and after["checkpoint"] != before.get("checkpoint"):
        return "new checkpoint %s" % after["checkpoint"]
    if after.get("tracker") and after["tracker"] != before.get("tracker"):
        return "Megatron tracker at %s" % after["tracker"]
    return "" if (after.get("checkpoint") or after.get("tracker")) else None
