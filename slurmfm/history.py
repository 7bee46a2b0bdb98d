"""What was submitted from where: a small per-user record, so a script can list and reopen
its runs (``fm.history()``, ``fm.Experiment``).

Why: a research script that submitted a dozen jobs last week should not have to have kept
their ids; NeMo-Run has ``Experiment.from_id`` and submitit keeps a folder per job. One JSON
line per submission: the job id, the experiment it belongs to (``""`` when none was named),
the job and run names, the log and checkpoint directories, and where it was submitted from
(host, working directory, the submitting program's command line).

Where: ``$SLURMFM_HISTORY``, else ``$XDG_STATE_HOME/slurmfm/history.jsonl``, else
``~/.local/state/slurmfm/history.jsonl`` (the XDG base directory spec's place for state;
https://specifications.freedesktop.org/basedir-spec/latest/). ``SLURMFM_HISTORY=off`` turns
it off.

How it is written, on a file system other users share: the directory is made owner-only
(0700) and must be a real directory owned by this user that no one else can write; the file
is opened without following a link (``O_NOFOLLOW``), must be a regular file owned by this
user with one link (a hard link to someone else's file would be written through), and is
owner-only (0600) under any umask. Each record is one ``write`` of one line in append mode.
A record that cannot be written never undoes a submission: the caller warns instead.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from slurmfm.errors import SlurmfmError
from slurmfm.job import fsafe

# A history far beyond this is not read whole (a file of a million submissions is a mistake).
MAX_HISTORY_BYTES = 64 * 1024 * 1024


class HistoryError(SlurmfmError):
    """The history file or its directory is not safe to use (or cannot be written)."""


@dataclass(frozen=True)
class Submission:
    """One submitted job, as recorded at submission."""

    job_id: str
    name: str
    run_id: str = ""
    experiment: str = ""
    submitted_at: str = ""
    host: str = ""
    cwd: str = ""
    argv: tuple[str, ...] = ()
    log_dir: str = ""
    checkpoint_dir: str = ""
    label: str = ""  # a pipeline stage's name
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> Submission | None:
        """The submission a history line records, or None when the line is not one (any
        JSON at all, a field of the wrong type): one bad line must not hide the others."""
        try:
            data = json.loads(line)
        except (ValueError, RecursionError):
            return None
        if not isinstance(data, dict) or not isinstance(data.get("job_id"), str):
            return None
        known = set(cls.__dataclass_fields__)
        kw = {k: v for k, v in data.items() if k in known}
        argv = kw.get("argv", ()) or ()
        extra = kw.get("extra", {}) or {}
        if not isinstance(argv, list | tuple) or not isinstance(extra, dict):
            return None
        kw["argv"] = tuple(str(a) for a in argv)
        kw["extra"] = {str(k): str(v) for k, v in extra.items()}
        if any(not isinstance(v, str) for k, v in kw.items() if k not in ("argv", "extra")):
            return None
        try:
            return cls(**kw)
        except TypeError:
            return None


def history_path(env: Mapping[str, str] | None = None) -> Path | None:
    """The history file, or None when ``SLURMFM_HISTORY=off``."""
    env = os.environ if env is None else env
    given = env.get("SLURMFM_HISTORY", "")
    if given == "off":
        return None
    if given:
        return Path(given)
    state = env.get("XDG_STATE_HOME") or os.path.join(
        env.get("HOME") or os.path.expanduser("~"), ".local", "state"
    )
    return Path(state) / "slurmfm" / "history.jsonl"


def _safe_dir(directory: Path) -> None:
    """Make ``directory`` (0700) if missing; refuse one that is a link, not ours, or
    writable by others."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise HistoryError(f"history: cannot make {directory}: {exc.strerror or exc}") from None
    _check_dir(directory)


def record(sub: Submission, path: Path | None = None) -> Path | None:
    """Append ``sub`` to the history; returns the file (None when turned off)."""
    path = history_path() if path is None else path
    if path is None:
        return None
    _safe_dir(path.parent)
    try:  # a link, a FIFO, another user's or a linked file is refused (slurmfm.job.fsafe)
        fsafe.append(str(path), sub.to_json() + "\n", mode=fsafe.PRIVATE_MODE)
    except fsafe.Refused as exc:
        raise HistoryError(f"history: {exc}") from None
    except OSError as exc:
        raise HistoryError(f"history: cannot write {path}: {exc.strerror or exc}") from None
    return path


def _check_dir(directory: Path) -> None:
    """The history's directory must be our own that no one else may write
    (:func:`slurmfm.job.fsafe.own_dir_problem`): a history in a directory that is a link,
    another user's, or writable by others could have been replaced by someone else's."""
    try:
        info = os.lstat(directory)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise HistoryError(f"history: cannot read {directory}: {exc.strerror or exc}") from None
    why = fsafe.own_dir_problem(info)
    if why:
        raise HistoryError(f"history: {directory} {why}")


def read(path: Path | None = None) -> list[Submission]:
    """Every recorded submission, oldest first. A line that is not one (a kill in the middle
    of a write, an edit by hand) is skipped with a warning naming it (``file:line``); the
    directory is checked as when writing."""
    import warnings

    path = history_path() if path is None else path
    if path is None:
        return []
    _check_dir(path.parent)
    try:
        data = fsafe.read(str(path), limit=MAX_HISTORY_BYTES, cut=True)
    except FileNotFoundError:
        return []
    except fsafe.Refused as exc:
        raise HistoryError(f"history: {exc}") from None
    except OSError as exc:
        raise HistoryError(f"history: cannot read {path}: {exc.strerror or exc}") from None
    out: list[Submission] = []
    for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        sub = Submission.from_json(line)
        if sub is None:
            warnings.warn(f"{path}:{n}: history: not a submission record; skipped", stacklevel=2)
            continue
        out.append(sub)
    return out


def now_utc() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def here() -> dict[str, object]:
    """Where a submission is made from: host, working directory, the program's argv."""
    try:
        cwd = os.getcwd()
    except OSError:
        cwd = ""
    return {"host": socket.gethostname(), "cwd": cwd, "argv": tuple(sys.argv)}
