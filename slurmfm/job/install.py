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
2. Every step runs the runtime through :data:`CHECKED` (``python3 -I -S -c "$slurmfm_checked"
   SUBCOMMAND ...``): before any of the file's code runs, the opened file must be a regular
   file of this user, mode 0600, one link, with the script's sha256, in a directory that is
   sticky or writable by nobody else. Such a file can be changed, renamed or removed by nobody
   but its owner and root, so what was checked is what runs, for the step's whole life. A copy
   that fails the check is not run: the step ends with the reason.
3. ``-I`` (isolated mode): no ``PYTHON*`` variable, no user site directory and not the working
   directory (a shared file system, where a planted ``_sha256.py`` would be imported first)
   reaches the interpreter before the check. ``-S``: no ``site`` either. The runtime is
   standard library only, and ``site`` runs every ``.pth`` file of the environment's
   site-packages (a venv's or conda's: editable installs, setuptools' distutils hook) in
   every step on every node; in the test venv that was 14 % of a node entry's CPU.

Nothing on the shared file system is run, and nothing there needs to be writable for the job
to start: users of one log directory with different slurmfm versions no longer meet.
"""

from __future__ import annotations

import contextlib
import os
import stat

# The program every step runs (the batch script shows it once, as ``slurmfm_checked``). No
# single quote in it: the script carries it in single quotes, readable as written here.
# A launch task (``node``) ignores USR2 from its first statement: srun passes the save signal
# to every process of the step (https://slurm.schedmd.com/srun.html#SECTION_SIGNALS-AND-ESCAPE-SEQUENCES),
# and a task that dies of it ends the step mid-save through --kill-on-bad-exit (seen on the
# lab as "task 1: User defined signal 2", there while a task exited: node.run_launcher).
CHECKED = """\
import os, signal, stat, sys, zipimport
if sys.argv[1:2] == ["node"]:  # a launch task: the save signal is for its training processes
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
try: from _sha2 import sha256  # built in (hashlib loads OpenSSL, ms of every step start)
except ImportError:  # Python 3.8 to 3.11; hashlib where sha256 is not built in (FIPS builds)
    try: from _sha256 import sha256
    except ImportError: from hashlib import sha256
p, me = os.environ["SLURMFM_RUNTIME"], os.geteuid()
fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
f, d, data = os.fstat(fd), os.stat(os.path.dirname(p)), os.read(fd, 1 << 26)
ok = stat.S_ISREG(f.st_mode) and (f.st_uid, f.st_nlink, f.st_mode & 0o777) == (me, 1, 0o600)
if not (ok and d.st_uid in (0, me) and (d.st_mode & 0o1000 or not d.st_mode & 0o22)
        and sha256(data).hexdigest() == os.environ["SLURMFM_RUNTIME_SHA"]):
    sys.exit("slurmfm: %s: %s is not the intact job runtime of this user" % (os.uname()[1], p))
sys.argv[0], sys.path[:0] = p, [p]  # what runpy.run_path does for a zip, without runpy
exec(zipimport.zipimporter(p).get_code("__main__"), {"__name__": "__main__"})
"""


# The interpreter every step runs the runtime with (point 3 above); the batch script's steps
# and the ones the runtime starts itself (:func:`argv`) alike.
INTERPRETER = ("python3", "-I", "-S")


def argv() -> list[str]:
    """How a step runs this runtime: ``python3 -I -S -c CHECKED`` (then the subcommand)."""
    return [*INTERPRETER, "-c", CHECKED]


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


# Where ``prepare`` names the copy without bytecode once the job runs the one with it
# (:func:`with_bytecode`): the batch step removes both at the end.
PLAIN_ENV = "SLURMFM_RUNTIME_PLAIN"


def with_bytecode(path: str, job: str) -> tuple[str, str, str] | None:
    """A copy of the runtime at ``path`` that carries each module's bytecode for the running
    interpreter: ``(staging, final, sha256)``, both new private files (``mkstemp``: created
    exclusively, mode 0600) in the directory of ``path``; the bytes are in ``staging``, for
    ``sbcast`` to ``final`` on every node. None (nothing left behind) where it cannot be made.

    Why: zipimport never writes bytecode, so every step on every node compiled each module it
    imported from source: about a third of the per-node entry's CPU, paid once per node per
    step, while compiling them all once costs one such share on the batch host. The copy is
    made by the node's own ``python3`` (the batch host's): a node whose interpreter differs
    finds a bytecode version it cannot use, and zipimport compiles that module from source as
    before. The bytecode is hash-based and unchecked (PEP 552): the file is checked whole
    (:data:`CHECKED`, sha256) before any of it runs, so a module's source cannot differ from
    its bytecode. Each code object is compiled under the module's path in ``final``, the
    path zipimport gives it, so tracebacks name the lines that ran.
    """
    import importlib.util
    import io
    import marshal
    import tempfile
    import zipfile

    where = os.path.dirname(path) or "."
    made: list[str] = []
    try:
        with open(path, "rb") as f:
            data = f.read()
        prefix = "slurmfm-%s-" % job
        fd, final = tempfile.mkstemp(prefix=prefix, dir=where)
        os.close(fd)
        made.append(final)
        buf = io.BytesIO()
        # Deflated, fast: sbcast time grows with the size (0.11 s for the plain copy to 64
        # nodes of the lab, 0.23 s stored with bytecode), and inflating is cheap.
        deflate = {"compress_type": zipfile.ZIP_DEFLATED, "compresslevel": 1}
        with zipfile.ZipFile(io.BytesIO(data)) as zin, zipfile.ZipFile(buf, "w") as zout:
            for info in zin.infolist():
                source = zin.read(info)
                zout.writestr(info.filename, source, **deflate)
                if info.filename.endswith(".py"):
                    name = final + "/" + info.filename
                    code = compile(source, name, "exec", dont_inherit=True)
                    flags = (1).to_bytes(4, "little")  # hash-based, not checked against source
                    head = importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source)
                    zout.writestr(info.filename + "c", head + marshal.dumps(code), **deflate)
        blob = buf.getvalue()
        fd, staging = tempfile.mkstemp(prefix=prefix, dir=where)
        made.append(staging)
        with os.fdopen(fd, "wb") as out:
            out.write(blob)
    except (OSError, ValueError, SyntaxError, zipfile.BadZipFile):
        for p in made:
            with contextlib.suppress(OSError):
                os.unlink(p)
        return None
    import hashlib

    return staging, final, hashlib.sha256(blob).hexdigest()


def cleanup_steps(env: dict[str, str], runtime: str) -> list[list[str]]:
    """At the end of the batch step: ``rm`` of this attempt's copies on every node (the one
    run, and the one without bytecode it was made from), one step per component (best effort;
    the copies are 0600 files in /tmp)."""
    size = int(env.get("SLURM_HET_SIZE", "0") or 0)
    groups: list[tuple[int | None, str]]
    if size > 1:
        groups = [
            (g, env.get("SLURM_JOB_NUM_NODES_HET_GROUP_%d" % g, "1") or "1") for g in range(size)
        ]
    else:
        groups = [(None, env.get("SLURM_JOB_NUM_NODES", "1") or "1")]
    from .slurm import OVERLAP, srun_per_node  # here: fsafe (and so the CLI) imports this module

    paths = [runtime] + [p for p in [env.get(PLAIN_ENV, "")] if p and p != runtime]
    out = []
    for group, n in groups:
        out.append([*srun_per_node(n, group), *OVERLAP, "rm", "-f", *paths])
    return out
