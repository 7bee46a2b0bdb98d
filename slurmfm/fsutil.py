"""Whole-file-or-nothing writes of a user's output paths, shared by the CLI and the topology store.

Why one function: "nothing half-written is left behind" is a promise of every command that
writes (rendered scripts, saved topologies, SVGs). The write is the job runtime's atomic
write (:func:`slurmfm.job.fsafe.replace`, the only one): a temporary file in the target's
directory is written, flushed to disk and renamed over the target; on any error it is removed.

Why the target is checked first: a rename replaces whatever directory entry has the name. Run
as root, ``render -o /dev/null`` would replace the host's ``/dev/null`` with a script, and
``-o link`` would replace a symlink instead of writing where it points. Only a regular file
(or nothing) is replaced, and an existing file keeps its permission bits (a 0600 file stays
private).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from slurmfm.errors import SlurmfmError
from slurmfm.job import fsafe
from slurmfm.job.fsafe import kind


class OutputError(SlurmfmError, OSError):
    """An output path slurmfm will not write (exit status 2, one line).

    Also an ``OSError``: callers that treat a failed write as best effort (the pipeline
    record, caches) keep doing so.
    """


_kind = kind  # one wording of what a non-regular file is (slurmfm.job.fsafe)


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


def write_atomic(path: str | Path, text: str | bytes, *, mode: int | None = None) -> None:
    """Write ``text`` (UTF-8) or bytes to ``path`` atomically, flushed to disk.

    The write itself is the job runtime's (:func:`slurmfm.job.fsafe.replace`: an exclusive,
    randomly named temporary file beside the target, renamed over it, removed on any error),
    so slurmfm has one atomic write. Here, for a user's output path: an existing regular file
    keeps its mode; a new file gets ``mode`` (default 0666 less the umask). Anything else at
    ``path`` is refused with :class:`OutputError`, as is a path whose directory cannot be
    created or written.
    """
    target = Path(path)
    existing = check_target(target)
    if existing is not None:
        mode = existing
    elif mode is None:
        umask = os.umask(0)
        os.umask(umask)
        mode = 0o666 & ~umask
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fsafe.replace(str(target), text, mode=mode, fsync=True)
    except OSError as exc:
        raise OutputError(f"{path}: (output): cannot write here: {exc.strerror or exc}") from None


# Recipes and pipeline files are a few KiB; the largest shipped recipe is under 4 KiB.
MAX_INPUT_BYTES = 1 << 20


class InputFileError(SlurmfmError):
    """A file slurmfm will not read as a recipe: not a regular file, or too large."""


def read_bounded(path: str | Path, limit: int = MAX_INPUT_BYTES) -> bytes:
    """The bytes of the regular file ``path``, refusing anything else or more than ``limit``.

    Why open non-blocking and check after opening: a FIFO with no writer would block ``open``
    forever, and ``/dev/zero`` would be read until the kernel's OOM killer ends the process
    (on a shared login node). ``fstat`` of the opened descriptor sees what was really opened.
    Other ``OSError`` (missing, no permission) propagate for the caller to word.
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0)
    fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InputFileError(f"is {_kind(st.st_mode)}, not a regular file")
        if st.st_size > limit:
            raise InputFileError(f"is {st.st_size} bytes, over the limit of {limit}")
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:  # grew while being read
            raise InputFileError(f"is more than {limit} bytes, over the limit")
        return b"".join(chunks)
    finally:
        os.close(fd)


def make_dirs(path: str | Path, *, what: str) -> None:
    """``mkdir -p`` that fails as one line naming the recipe field, not a traceback."""
    try:
        Path(path).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputError(f"{what}: cannot create {path}: {exc.strerror or exc}") from None
