"""Whole-file-or-nothing writes, shared by the CLI and the topology store.

Why one function: "nothing half-written is left behind" is a promise of every command that
writes (rendered scripts, saved topologies, SVGs). A temporary file in the target's directory
is written, flushed to disk and renamed over the target; on any error it is removed.

Why the target is checked first: a rename replaces whatever directory entry has the name. Run
as root, ``render -o /dev/null`` would replace the host's ``/dev/null`` with a script, and
``-o link`` would replace a symlink instead of writing where it points. Only a regular file
(or nothing) is replaced, and an existing file keeps its permission bits (a 0600 file stays
private).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path

from slurmfm.errors import SlurmfmError


class OutputError(SlurmfmError):
    """An output path slurmfm will not write (exit status 2, one line)."""


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def check_target(path: str | Path) -> int | None:
    """The permission bits of an existing regular file at ``path``, None when nothing is there.

    Raises :class:`OutputError` when something else is there (a symlink is not followed).
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise OutputError(f"{path}: (output): cannot write here: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise OutputError(
            f"{path}: (output): exists and is {_kind(st.st_mode)}; slurmfm only replaces regular"
            " files (remove it or choose another path)"
        )
    return stat.S_IMODE(st.st_mode)


def write_atomic(path: str | Path, text: str, *, mode: int | None = None) -> None:
    """Write ``text`` to ``path`` atomically.

    An existing regular file keeps its mode; a new file gets ``mode`` (default 0666 less the
    umask). Anything else at ``path`` is refused with :class:`OutputError`, as is a path
    whose directory cannot be created or written.
    """
    target = Path(path)
    existing = check_target(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise OutputError(f"{path}: (output): cannot write here: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        if existing is not None:
            mode = existing
        elif mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
