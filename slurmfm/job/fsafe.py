"""Files in shared directories: opened without trusting what is already there.

Why (docs/security.md): the log and checkpoint directories of a team live on a shared file
system (FSx for Lustre ``/fsx/logs``, often group-writable with umask 002). Any other user who
can write such a directory can plant, before the job writes, a symbolic link (the job would
write through it into one of the victim's own files), a FIFO (an ``open`` for writing blocks
until a reader comes: the job hangs), or a file of their own with forged content (read back
into ``slurmfm status`` and the job's decisions). So every file slurmfm writes or reads back
there goes through this module:

* opened with ``O_NOFOLLOW`` (a link is refused, not followed) and ``O_NONBLOCK`` (a FIFO or
  device never blocks), then checked on the *opened descriptor* (``fstat``, so a swap between
  check and use changes nothing): a regular file, owned by the expected user, with one link;
* created with an explicit mode, never group- or other-writable whatever the umask;
* replaced atomically through a temporary name that ``mkstemp`` creates exclusively
  (``O_EXCL``, random suffix), never a predictable ``<name>.<pid>.tmp``;
* read back only when it is the expected user's own, and bounded in size.

Standard library only, Python 3.8 (this module travels in the job runtime); the submitting
side (:mod:`slurmfm.fsutil`, :mod:`slurmfm.checkpoint`, :mod:`slurmfm.run_lock`) imports it too,
so there is one definition of "safe to write here".
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import stat
import tempfile

from .install import dir_problem

__all__ = [
    "ANY_OWNER",
    "FILE_MODE",
    "Refused",
    "append",
    "claim_dir",
    "clean_temporaries",
    "dir_problem",
    "find_dir",
    "kind",
    "problem",
    "read",
    "read_text",
    "replace",
    "touch",
]

# Files slurmfm writes itself: the owner writes, the team reads.
FILE_MODE = 0o644
# ``uid`` for files that are only shown, whoever wrote them (a job's output to its reader):
# still never a link, a FIFO or a device.
ANY_OWNER = -1
MAX_READ = 1 << 20

_BASE_FLAGS = (
    getattr(os, "O_NOFOLLOW", 0)
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_NOCTTY", 0)
)


class Refused(OSError):
    """A path slurmfm will not write or trust; ``str()`` says why, in one line."""


def kind(mode: int) -> str:
    """What a non-regular file is, in words (for the one-line refusals)."""
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


def problem(st: os.stat_result, uid: int | None = None) -> str | None:
    """Why a file with status ``st`` is not one slurmfm trusts, or None when it is."""
    if not stat.S_ISREG(st.st_mode):
        return "is " + kind(st.st_mode)
    want = os.geteuid() if uid is None else uid
    if want not in (ANY_OWNER, st.st_uid):
        return "belongs to uid %d, not uid %d" % (st.st_uid, want)
    if st.st_nlink > 1:
        return "has %d hard links" % st.st_nlink
    return None


def _open(path: str, flags: int, uid: int | None = None, mode: int = FILE_MODE) -> int:
    try:
        fd = os.open(path, flags | _BASE_FLAGS, mode & ~0o022)  # never group-writable
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise Refused("%s: is a symbolic link" % path) from None
        if exc.errno == errno.ENXIO:  # O_WRONLY|O_NONBLOCK on a FIFO with no reader
            raise Refused("%s: is a FIFO" % path) from None
        raise
    try:
        why = problem(os.fstat(fd), uid)
        if why:
            raise Refused("%s: %s" % (path, why))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _private(fd: int) -> None:
    """Our own file: drop group/other write (a umask of 002 would have left them)."""
    perms = stat.S_IMODE(os.fstat(fd).st_mode)
    if perms & 0o022:
        os.fchmod(fd, perms & ~0o022)


def append(path: str, text: str, mode: int = FILE_MODE) -> None:
    """Append ``text`` to ``path`` (created with ``mode`` when missing). Raises OSError."""
    fd = _open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode=mode)
    try:
        _private(fd)
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)


def touch(path: str, mode: int = FILE_MODE) -> None:
    """Create ``path`` if missing (a marker), refusing links, FIFOs and others' files."""
    os.close(_open(path, os.O_WRONLY | os.O_CREAT, mode=mode))


def replace(path: str, data: bytes | str, mode: int = FILE_MODE, fsync: bool = False) -> None:
    """Write ``data`` to a new exclusive temporary file beside ``path``, rename it over ``path``.

    ``rename`` replaces the directory entry: a planted link is replaced, never followed. A
    directory at ``path`` makes it fail. The temporary file is removed on any error.
    """
    directory, base = os.path.split(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % base, suffix=".tmp", dir=directory or ".")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
            os.fchmod(fh.fileno(), mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def clean_temporaries(path: str) -> list[str]:
    """Remove this user's leftover temporary files of :func:`replace` for ``path``.

    A process killed between ``mkstemp`` and ``rename`` leaves one; they are never read.
    """
    directory, base = os.path.split(path)
    removed: list[str] = []
    pattern = os.path.join(glob.escape(directory or "."), ".%s.*.tmp" % glob.escape(base))
    for tmp in glob.glob(pattern):
        with contextlib.suppress(OSError):
            st = os.lstat(tmp)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                os.unlink(tmp)
                removed.append(tmp)
    return removed


def read(path: str, uid: int | None = None, limit: int = MAX_READ) -> bytes:
    """The bytes of ``path`` when it is a regular file of ``uid`` (default: this user).

    Raises :class:`Refused` (with the reason) for anything else, OSError when it is missing.
    """
    fd = _open(path, os.O_RDONLY, uid)
    try:
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 16, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise Refused("%s: is more than %d bytes" % (path, limit))
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_text(path: str, uid: int | None = None, limit: int = MAX_READ) -> str | None:
    """:func:`read` as text, or None when missing or not to be trusted."""
    try:
        return read(path, uid, limit).decode("utf-8", "replace")
    except OSError:
        return None


def _own_dir(path: str, uid: int | None = None) -> bool:
    try:
        st = os.lstat(path)
    except OSError:
        return False
    want = os.geteuid() if uid is None else uid
    return stat.S_ISDIR(st.st_mode) and st.st_uid == want


def find_dir(path: str, uid: int | None = None) -> str | None:
    """The first of ``path`` and ``path.<random>`` that is a directory of ``uid`` (a link is
    not one): where :func:`claim_dir` put a job's directory."""
    for cand in [path] + sorted(glob.glob(glob.escape(path) + ".*")):
        if _own_dir(cand, uid):
            return cand
    return None


def claim_dir(path: str) -> str:
    """A directory of this user's at ``path`` (made 0755 when missing), or, when another user
    (or a link, a FIFO) holds that name, a fresh ``path.<random>`` made exclusively: a name
    planted before the job can neither block nor receive its files. An own directory left
    group-writable by an umask of 002 is closed to others. Raises OSError when none can be
    made (the directory above is not writable)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o755)
    found = find_dir(path)
    if found is not None:
        perms = stat.S_IMODE(os.lstat(found).st_mode)
        if perms & 0o022:
            os.chmod(found, perms & ~0o022)
        return found
    fresh = tempfile.mkdtemp(prefix=os.path.basename(path) + ".", dir=os.path.dirname(path) or ".")
    os.chmod(fresh, 0o755)  # noqa: S103 - the team reads job metrics; only we write
    return str(fresh)
