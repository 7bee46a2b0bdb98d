"""The job runtime on every node: a private copy that nobody but the job's user can change.

Why (README "Security"): the runtime used to be extracted into the shared log directory and run
from there by every step on every node. Another user who could write that directory (created
first, or group-writable under umask 002) could swap the file and run code as the job's user;
zipimport reopens the path for each module, so even a check at start is not enough. Now:

1. The batch script extracts the runtime from its own last line (Slurm's private copy of the
   script) into ``mktemp /tmp/slurmfm-<job>-XXXXXXXXXX`` on the batch host: created exclusively,
   mode 0600, a name nobody can guess, checked against its sha256.
2. Before any step runs it elsewhere, ``prepare`` runs one step with a task on every node
   (every component of a heterogeneous job) that reads the runtime from its standard input
   (srun sends a step's stdin to all its tasks: https://slurm.schedmd.com/srun.html, ``--input``)
   and runs :data:`PROGRAM` (this file, as ``python3 -I -c``; it imports nothing of slurmfm),
   which writes the same path on that node: a private temporary file renamed into place, then
   checked on the opened file: a regular file of this user, mode 0600, one link, the expected
   sha256, in a directory that is sticky or writable by nobody else. In a sticky ``/tmp``
   nobody else can rename or remove it afterwards, so it stays what was checked for the job's
   life. A node where any check fails ends the step, and the job, with the reason.
3. Earlier attempts' copies of the same job on that node are removed.

Nothing on the shared file system is run, and nothing there needs to be writable for the job
to start: users of one log directory with different slurmfm versions no longer meet.
"""

from __future__ import annotations

import hashlib
import os
import stat
import sys
import tempfile


def dir_problem(path: str, uid: int | None = None) -> str | None:
    """Why others could rename or plant entries in directory ``path``, or None.

    A directory is safe when it is ours or root's and nobody else may write it, or when it is
    sticky (like ``/tmp``: others may create entries, but never rename or remove ours).
    """
    try:
        st = os.stat(path)
    except OSError as exc:
        return "cannot be read (%s)" % (exc.strerror or exc)
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    want = os.geteuid() if uid is None else uid
    if st.st_uid not in (0, want):
        return "belongs to uid %d" % st.st_uid
    if st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
        who = "others" if st.st_mode & 0o002 else "its group"
        return "is writable by %s without the sticky bit" % who
    return None


def copy_problem(path: str, sha256: str) -> str | None:
    """Why the file at ``path`` is not this user's private, intact runtime, or None."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        return "cannot be opened (%s)" % (exc.strerror or exc)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            return "is not a regular file"
        if st.st_uid != os.geteuid():
            return "belongs to uid %d" % st.st_uid
        if stat.S_IMODE(st.st_mode) != 0o600 or st.st_nlink != 1:
            return "has mode %o and %d links, not 600 and 1" % (
                stat.S_IMODE(st.st_mode),
                st.st_nlink,
            )
        digest = hashlib.sha256()
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            digest.update(chunk)
        if digest.hexdigest() != sha256:
            return "does not match sha256 %s" % sha256
    finally:
        os.close(fd)
    return None


def put(path: str, sha256: str, data: bytes) -> str | None:
    """Place ``data`` at ``path`` on this node (see the module's docstring); None, or why not."""
    directory, base = os.path.split(path)
    why = dir_problem(directory)
    if why:
        return "%s %s" % (directory, why)
    if hashlib.sha256(data).hexdigest() != sha256:
        return "the copy received does not match sha256 %s" % sha256
    try:
        fd, tmp = tempfile.mkstemp(prefix=base + ".", dir=directory)
    except OSError as exc:
        return "cannot write in %s (%s)" % (directory, exc.strerror or exc)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            os.fchmod(fh.fileno(), 0o600)
        # rename never follows a link; in a sticky directory it cannot replace another
        # user's file (EPERM), only ours (the lab's nodes share one /tmp)
        os.rename(tmp, path)
    except OSError as exc:
        return "cannot place %s (%s)" % (path, exc.strerror or exc)
    finally:
        if os.path.lexists(tmp):
            os.unlink(tmp)
    why = copy_problem(path, sha256)
    if why:
        return "%s %s" % (path, why)
    # earlier attempts of this job on this node: slurmfm-<job>-<10 random characters>
    prefix = base[: len(base) - 10]
    for name in os.listdir(directory):
        if name != base and name.startswith(prefix) and len(name) == len(base):
            old = os.path.join(directory, name)
            try:
                st = os.lstat(old)
                if stat.S_ISREG(st.st_mode) and st.st_uid == os.geteuid():
                    os.unlink(old)
            except OSError:
                pass
    return None


def main(argv: list[str]) -> int:
    path, sha256 = argv[1], argv[2]
    why = put(path, sha256, sys.stdin.buffer.read())
    if why:
        sys.stderr.write("slurmfm: %s: job runtime not installed: %s\n" % (os.uname()[1], why))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))


def program() -> str:
    """This module's source: what every node runs as ``python3 -I -c PROGRAM PATH SHA256``."""
    loader = globals().get("__loader__")
    get_data = getattr(loader, "get_data", None)
    if get_data is not None:
        try:
            return str(get_data(__file__).decode("utf-8"))
        except OSError:
            pass
    with open(__file__, encoding="utf-8") as fh:
        return fh.read()


def steps(env: dict[str, str]) -> list[list[str]]:
    """One ``srun`` per component: a task on every node, reading the runtime on stdin."""
    size = int(env.get("SLURM_HET_SIZE", "0") or 0)
    groups: list[tuple[int | None, str]]
    if size > 1:
        groups = [
            (g, env.get("SLURM_JOB_NUM_NODES_HET_GROUP_%d" % g, "1") or "1") for g in range(size)
        ]
    else:
        groups = [(None, env.get("SLURM_JOB_NUM_NODES", "1") or "1")]
    out = []
    for group, n in groups:
        het = [] if group is None else ["--het-group=%d" % group]
        out.append(
            ["srun", *het, "--nodes=" + n, "--ntasks=" + n, "--ntasks-per-node=1", "--input=all"]
        )
    return out
