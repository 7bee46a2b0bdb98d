"""The job runtime on every node: a private copy that nobody but the job's user can change.

Why (docs/security.md): the runtime used to be extracted into the shared log directory and run
from there by every step on every node. Another user who could write that directory (created
first, or group-writable under umask 002) could swap the file and run code as the job's user;
zipimport reopens the path for each module, so even a check at start is not enough. Now:

1. The batch script extracts the runtime from its own last line (Slurm's private copy of the
   script) into a private file, ``mktemp /tmp/slurmfm-<job>-XXXXXXXXXX`` (created exclusively,
   mode 0600, a name nobody can guess), checks its sha256, and has Slurm copy it to the same
   path on every node of the job (``sbcast``, https://slurm.schedmd.com/sbcast.html: one
   transfer over Slurm's own tree, tens of milliseconds, no job step; a heterogeneous job's
   components are all covered).
2. Every step runs the runtime through :data:`CHECKED` (``python3 -I -c "$slurmfm_checked"
   SUBCOMMAND ...``): before any of the file's code runs, the opened file must be a regular
   file of this user, mode 0600, one link, with the script's sha256, in a directory that is
   sticky or writable by nobody else. Such a file can be changed, renamed or removed by nobody
   but its owner and root, so what was checked is what runs, for the step's whole life. A copy
   that fails the check is not run: the step ends with the reason.
3. ``-I`` (isolated mode): no ``PYTHON*`` variable, no user site directory and not the working
   directory (a shared file system, where a planted ``hashlib.py`` would be imported first)
   reaches the interpreter before the check.

Nothing on the shared file system is run, and nothing there needs to be writable for the job
to start: users of one log directory with different slurmfm versions no longer meet.
"""

from __future__ import annotations

import os
import stat

# The program every step runs (the batch script shows it once, as ``slurmfm_checked``). No
# single quote in it: the script carries it in single quotes, readable as written here.
# A launch task (``node``) ignores USR2 from its first statement: srun passes the save signal
# to every process of the step (https://slurm.schedmd.com/srun.html#SECTION_SIGNALS-AND-ESCAPE-SEQUENCES),
# and a task that dies of it ends the step mid-save through --kill-on-bad-exit (seen on the
# lab as "task 1: User defined signal 2", there while a task exited: node.run_launcher).
CHECKED = """\
import hashlib, os, runpy, signal, stat, sys
if sys.argv[1:2] == ["node"]:  # a launch task: the save signal is for its training processes
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
p, me = os.environ["SLURMFM_RUNTIME"], os.geteuid()
fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
f, d, data = os.fstat(fd), os.stat(os.path.dirname(p)), os.read(fd, 1 << 26)
ok = stat.S_ISREG(f.st_mode) and (f.st_uid, f.st_nlink, f.st_mode & 0o777) == (me, 1, 0o600)
if not (ok and d.st_uid in (0, me) and (d.st_mode & 0o1000 or not d.st_mode & 0o22)
        and hashlib.sha256(data).hexdigest() == os.environ["SLURMFM_RUNTIME_SHA"]):
    sys.exit("slurmfm: %s: %s is not the intact job runtime of this user" % (os.uname()[1], p))
sys.argv[0] = p
runpy.run_path(p, run_name="__main__")
"""


def argv() -> list[str]:
    """How a step runs this runtime: ``python3 -I -c CHECKED`` (then the subcommand)."""
    return ["python3", "-I", "-c", CHECKED]


def dir_problem(path: str, uid: int | None = None) -> str | None:
    """Why others could rename or plant entries in directory ``path``, or None (the rule
    :data:`CHECKED` applies to the runtime's directory, in words).

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


def cleanup_steps(env: dict[str, str], runtime: str) -> list[list[str]]:
    """At the end of the batch step: ``rm`` of this attempt's copy on every node, one step per
    component (best effort; the copies are 0600 files in /tmp)."""
    size = int(env.get("SLURM_HET_SIZE", "0") or 0)
    groups: list[tuple[int | None, str]]
    if size > 1:
        groups = [
            (g, env.get("SLURM_JOB_NUM_NODES_HET_GROUP_%d" % g, "1") or "1") for g in range(size)
        ]
    else:
        groups = [(None, env.get("SLURM_JOB_NUM_NODES", "1") or "1")]
    from .slurm import OVERLAP, srun_per_node  # here: fsafe (and so the CLI) imports this module

    out = []
    for group, n in groups:
        out.append([*srun_per_node(n, group), *OVERLAP, "rm", "-f", runtime])
    return out
