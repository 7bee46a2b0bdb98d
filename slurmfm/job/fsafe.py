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
    "create",
    "dir_problem",
    "dir_stat_problem",
    "find_dir",
    "kind",
    "open_chain",
    "open_dir",
    "own_dir_problem",
    "owned",
    "private_dir",
    "problem",
    "read",
    "read_tail",
    "read_text",
    "replace",
    "touch",
]

# Files slurmfm writes itself: the owner writes, the team reads.
FILE_MODE = 0o644
# Files only their owner may read: a pickled call (code), a script with the job's environment,
# the submission history. A file opened ``private`` must have none of the group/other bits.
PRIVATE_MODE = 0o600
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


def _open(
    path: str,
    flags: int,
    uid: int | None = None,
    mode: int = FILE_MODE,
    dir_fd: int | None = None,
    private: bool = False,
) -> int:
    try:
        fd = os.open(path, flags | _BASE_FLAGS, mode & ~0o022, dir_fd=dir_fd)  # never g/o-w
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a link
            raise Refused("%s: is a symbolic link" % path) from None
        if exc.errno == errno.ENXIO:  # O_WRONLY|O_NONBLOCK on a FIFO with no reader
            raise Refused("%s: is a FIFO" % path) from None
        raise
    try:
        st = os.fstat(fd)
        why = problem(st, uid)
        if not why and private and st.st_mode & 0o077:
            why = "is not owner-only (mode %04o)" % stat.S_IMODE(st.st_mode)
        if why:
            raise Refused("%s: %s" % (path, why))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _private(fd: int, mode: int = FILE_MODE) -> None:
    """Our own file: drop group/other write (a umask of 002 would have left them), and every
    group/other bit when ``mode`` is owner-only (an older file made before it was)."""
    perms = stat.S_IMODE(os.fstat(fd).st_mode)
    drop = 0o077 if not mode & 0o077 else 0o022
    if perms & drop:
        os.fchmod(fd, perms & ~drop)


def append(path: str, text: str, mode: int = FILE_MODE) -> None:
    """Append ``text`` to ``path`` (created with ``mode`` when missing; an owner-only
    ``mode`` closes an existing file too). Raises OSError."""
    fd = _open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, mode=mode)
    try:
        _private(fd, mode)
        os.write(fd, text.encode("utf-8"))
    finally:
        os.close(fd)


def create(path: str, data: bytes, mode: int = PRIVATE_MODE) -> None:
    """A new file at ``path`` holding exactly ``data``, with ``mode`` whatever the umask.

    Created exclusively (``O_EXCL``: an existing name, a planted link included, is
    ``FileExistsError``, never written through), for what is read back as trusted: a pickled
    call, a script pyslurm reads by its path. Raises OSError.
    """
    fd = _open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode=mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
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


def read(
    path: str,
    uid: int | None = None,
    limit: int = MAX_READ,
    dir_fd: int | None = None,
    private: bool = False,
    cut: bool = False,
) -> bytes:
    """The bytes of ``path`` when it is a regular file of ``uid`` (default: this user);
    ``dir_fd``: ``path`` is relative to that opened directory (:func:`open_chain`);
    ``private``: only when no one else may read it either (a pickle is code); ``cut``: the
    first ``limit`` bytes of a longer file instead of refusing it.

    Raises :class:`Refused` (with the reason) for anything else, OSError when it is missing.
    """
    fd = _open(path, os.O_RDONLY, uid, dir_fd=dir_fd, private=private)
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
            if cut:
                return b"".join(chunks)[:limit]
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


_DIR_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


def own_dir_problem(st: os.stat_result, owner_only: bool = False) -> str | None:
    """Why a directory with status ``st`` (``lstat``: a link is not one) is not this user's
    own that no one else may write, or, ``owner_only``, enter; None when it is. For the
    private directories of one user (the history, a call's pickles, the ssh control socket),
    which unlike :func:`dir_stat_problem` admit neither root's nor a sticky directory."""
    if not stat.S_ISDIR(st.st_mode):
        what = "a file" if stat.S_ISREG(st.st_mode) else kind(st.st_mode)
        return "is %s, not a directory" % what
    if st.st_uid != os.geteuid():
        return "belongs to another user (uid %d)" % st.st_uid
    if owner_only and st.st_mode & 0o077:
        return "is not owner-only (mode %04o)" % stat.S_IMODE(st.st_mode)
    if st.st_mode & 0o022:
        return "is writable by others"
    return None


def private_dir(path: str) -> bool:
    """Make ``path`` a directory only this user may enter (0700; made when missing): the
    render cache, the job's evidence directory. Our own one left open (an umask, an older
    slurmfm) is closed, and True says it was (its entries may need closing too). Raises
    :class:`Refused` when ``path`` is a link, not a directory or another user's
    (:func:`own_dir_problem`), OSError when it cannot be made."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, 0o700)
    st = os.lstat(path)
    why = own_dir_problem(st, owner_only=True)
    if why is None:
        return False
    if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
        os.chmod(path, 0o700)
        return True
    raise Refused("%s: %s" % (path, why))


def dir_stat_problem(st: os.stat_result, uid: int | None = None) -> str | None:
    """Why a directory with status ``st`` (``lstat`` or ``fstat``, never through a link) is
    not one whose entries slurmfm trusts, or None: it must be a directory of ``uid`` (default:
    this user) or root's, that nobody else may write unless it is sticky (then others may add
    entries but never rename or remove ours; ``/tmp``, a 3775 team root)."""
    if not stat.S_ISDIR(st.st_mode):
        return "is " + kind(st.st_mode)
    want = os.geteuid() if uid is None else uid
    if st.st_uid not in (0, want):
        return "belongs to uid %d, not uid %d or root" % (st.st_uid, want)
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        who = "others" if st.st_mode & 0o002 else "its group"
        return "is writable by %s without the sticky bit (chmod +t)" % who
    return None


def open_dir(
    path: str,
    dir_fd: int | None = None,
    uid: int | None = None,
    follow: bool = False,
    close_own: bool = False,
) -> int:
    """An opened directory ``path`` (relative to ``dir_fd`` when given) that passes
    :func:`dir_stat_problem`, checked on the descriptor: ``O_NOFOLLOW`` unless ``follow``,
    so a link is refused, and a swap after the check changes nothing for what is resolved
    relative to the descriptor. ``close_own``: our own directory left group- or
    other-writable (an umask of 002, an older slurmfm) is closed first. Raises
    :class:`Refused` with the reason, OSError (FileNotFoundError) when it is missing."""
    flags = _DIR_FLAGS | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        fd = os.open(path, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            try:
                mode = os.stat(path, dir_fd=dir_fd, follow_symlinks=False).st_mode
                what = "a file, not a directory" if stat.S_ISREG(mode) else kind(mode)
            except OSError:
                what = "not a directory"
            raise Refused("%s: is %s" % (path, what)) from None
        raise
    try:
        st = os.fstat(fd)
        want = os.geteuid() if uid is None else uid
        if close_own and st.st_uid == want and st.st_mode & 0o022 and not st.st_mode & 0o1000:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & ~0o022)
            st = os.fstat(fd)
        why = dir_stat_problem(st, uid)
        if why:
            raise Refused("%s: %s" % (path, why))
    except BaseException:
        os.close(fd)
        raise
    return fd


def split_chain(path: str, depth: int) -> tuple[str, list[str]]:
    """``(top, [names below it])``: the last ``depth`` components of ``path`` and what is
    above them (``.`` for a relative path that has no more)."""
    head = os.path.normpath(path)
    names: list[str] = []
    for _ in range(depth):
        up, tail = os.path.split(head)
        if tail in ("", ".", ".."):
            break
        names.insert(0, tail)
        head = up
    return head or ".", names


def open_chain(
    path: str,
    depth: int,
    uid: int | None = None,
    create: bool = False,
    mode: int = 0o755,
) -> int:
    """The directory ``path`` opened through its last ``depth`` components, each checked on
    its own descriptor (:func:`open_dir`): the top (``path`` less those components) is
    reached as named (the links of whoever set it up are followed) and must pass
    :func:`dir_stat_problem` itself; each component below is opened with ``O_NOFOLLOW``
    relative to the one above, so no link, no other user's directory and no directory that
    others may rename entries in lies anywhere on the way. ``create``: missing components
    are made (``mode``, never group- or other-writable) and our own open ones are closed.
    Raises :class:`Refused` (one line: which component, why), OSError when one is missing
    and not ``create``. The caller closes the descriptor."""
    top, names = split_chain(path, depth)
    fd = open_dir(top, uid=uid, follow=True)
    where = top
    try:
        for name in names:
            where = os.path.join(where, name)
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(name, mode & ~0o022, dir_fd=fd)
            try:
                nfd = open_dir(name, dir_fd=fd, uid=uid, close_own=create)
            except Refused as exc:
                raise Refused("%s%s" % (where, str(exc)[len(name) :])) from None
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def owned(paths: list[str], uid: int | None = None) -> tuple[list[str], list[str]]:
    """``(kept, ignored)``: the ``paths`` that are regular files of ``uid`` (default: this
    user; :data:`ANY_OWNER`: anyone's, still no link, FIFO or device), by ``lstat``, and one
    ``ignored PATH (uid N)`` / ``ignored PATH (is a FIFO)`` note for each of the rest.

    Why: a name in a shared log directory says nothing about who wrote it; ``slurmfm logs``,
    ``report`` and ``status`` show only what the job's user wrote, and say what they skipped.
    """
    kept: list[str] = []
    ignored: list[str] = []
    want = os.geteuid() if uid is None else uid
    for path in paths:
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            ignored.append("ignored %s (is %s)" % (path, kind(st.st_mode)))
        elif want not in (ANY_OWNER, st.st_uid):
            ignored.append("ignored %s (uid %d)" % (path, st.st_uid))
        else:
            kept.append(path)
    return kept, ignored


def read_tail(path: str, uid: int | None = None, limit: int = MAX_READ) -> tuple[bytes, int]:
    """The last ``limit`` bytes of ``path`` (a regular file of ``uid``, as :func:`read`) and
    how many bytes before them were skipped. Seeks rather than reads past what is skipped: a
    sparse file of hundreds of megabytes costs neither time nor memory."""
    fd = _open(path, os.O_RDONLY, uid)
    try:
        size = os.fstat(fd).st_size
        skipped = max(0, size - limit)
        os.lseek(fd, skipped, os.SEEK_SET)
        chunks: list[bytes] = []
        got = 0
        while got < limit:
            chunk = os.read(fd, min(1 << 16, limit - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks), skipped
    finally:
        os.close(fd)
