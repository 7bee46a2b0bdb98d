"""The run directory's rules both sides read: which checkpoint a job resumes from, and the
completion (``DONE``) marker.

Why one module: the runtime (``prepare`` exports ``SLURMFM_RESUME_FROM``; the batch step
judges the marker) and the submitting side (:mod:`slurmfm.checkpoint`, which writes
checkpoints, the pointer and the marker, and ``slurmfm status``) had a rule each and they
disagreed: after a kill during a re-save of step 5 the runtime resumed from ``step_4`` while
the library resumed from the step-5 copy set aside. Standard library only, Python 3.8 (this
module travels in the job runtime), paths as ``str`` (no ``pathlib`` at the runtime's start).

The layout (written by :func:`slurmfm.checkpoint.save`): ``step_N`` directories, each of
which appears only by a rename of a fully written and flushed temporary directory; the
pointer ``latest`` naming the newest one, replaced atomically; ``.step_N.PID.old``, the
complete previous copy of step N moved aside while step N is saved again, until the new
``step_N`` is renamed in.

**The resume rule** (:func:`resume_point`): the checkpoint ``latest`` names when it is
complete, else the newest complete one. Complete are every ``step_N`` directory and an aside
copy of a step whose ``step_N`` is missing. Why the aside copy counts: it was a published,
complete ``step_N`` that only a rename moved; a kill between the two renames of a re-save
leaves it as the only copy of that step, with ``latest`` still naming the step. Falling back
past it to ``step_N-1`` would throw away a checkpoint interval of training (hours on a large
job) while a complete copy of step N is there, and the job would resume from another
checkpoint than the one ``slurmfm status`` reports (tests/job/test_resume_pointer.py). The
next save puts the copy back as ``step_N`` (:func:`slurmfm.checkpoint.clean`). The pointer is
read through
:mod:`.fsafe` (never followed as a link, another user's file ignored): a forged pointer must
not choose what the job loads.

**The chain** (:func:`open_run_dir`, docs/security.md): the run directory is
``<checkpoint_root>/<name>/<run_id>`` (:attr:`slurmfm.recipe.schema.Recipe.checkpoint_dir`),
and a checkpoint root is often a team's directory. Whoever may rename entries anywhere on
that chain may put a link, or another of our own runs, where the run directory is expected.
So the run directory is opened once, each of ``<name>`` and ``<run_id>`` with
``O_NOFOLLOW`` relative to the one above, and each, the root included, checked on its
descriptor (ours or root's, writable by nobody else unless sticky); ``step_N``, ``latest``
and ``DONE`` are then resolved relative to that descriptor, and only our own ``step_N``
directories count.
"""

from __future__ import annotations

import os
import re
import stat
from typing import NamedTuple

from . import fsafe

POINTER = "latest"
DONE = "DONE"
STEP = re.compile(r"^step_(\d+)$")
# A complete copy of step N moved aside while step N is saved again (slurmfm.checkpoint.save).
ASIDE = re.compile(r"^\.step_(\d+)\.\d+\.old$")


# The run directory's components below the checkpoint root: <name>/<run_id>.
RUN_DEPTH = 2


def open_run_dir(directory: str, create: bool = False, uid: int | None = None) -> int:
    """The run directory of ``uid`` (default: this user), opened through its whole chain (the
    module's docstring; :func:`.fsafe.open_chain`). Raises :class:`.fsafe.Refused` (one
    line) or OSError."""
    return fsafe.open_chain(directory, RUN_DEPTH, uid=uid, create=create)


def ensure_run_dir(directory: str) -> None:
    """Make the run directory (0755) and any missing part of its chain below the root,
    creating the root too when it is missing; raise :class:`.fsafe.Refused` when any part of
    the chain is a link, another user's or open to others' renames (module docstring)."""
    top, _ = fsafe.split_chain(directory, RUN_DEPTH)
    if not os.path.lexists(top):
        os.makedirs(top, 0o755, exist_ok=True)
    os.close(open_run_dir(directory, create=True))


class ResumePoint(NamedTuple):
    """What a (re)starting job resumes from, and the words to log about it.

    ``path`` is None only when no complete checkpoint exists at all. ``message`` says what is
    really resumed, including why it is not the one ``latest`` names when they differ, so a
    log never says "resuming from X" while training restarts from step 0.
    """

    path: str | None
    step: int | None
    message: str
    # Why the run directory is not trusted (its chain, :func:`open_run_dir`); "" when it is.
    refused: str = ""


def _own_dir_entry(e: os.DirEntry[str], uid: int | None = None) -> bool:
    try:
        st = e.stat(follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(st.st_mode) and st.st_uid == (os.geteuid() if uid is None else uid)


def complete(directory: str, dir_fd: int | None = None, uid: int | None = None) -> dict[int, str]:
    """Complete checkpoints by step: every ``step_N`` directory, and an aside copy of a step
    while ``step_N`` itself is missing (see the module's docstring); only our own, never
    through a link. ``dir_fd``: the run directory, opened (:func:`open_run_dir`)."""
    found: dict[int, str] = {}
    asides: dict[int, str] = {}
    try:
        entries = list(os.scandir(dir_fd if dir_fd is not None else directory))
    except OSError:
        return found
    for e in entries:
        m = STEP.match(e.name) or ASIDE.match(e.name)
        if not m or not _own_dir_entry(e, uid):
            continue
        path = os.path.join(directory, e.name)
        if m.re is STEP:
            found[int(m.group(1))] = path
        else:
            asides[int(m.group(1))] = path
    for step, path in asides.items():
        found.setdefault(step, path)
    return found


def resume_point(directory: str, uid: int | None = None) -> ResumePoint:
    """The checkpoint a job must resume from; reads only.

    Normally the one ``latest`` names. When ``latest`` is missing, empty, garbage or names a
    checkpoint that is gone (a kill during a save or a prune, a file system restored from a
    snapshot), the newest complete checkpoint instead: restarting from step 0 would retrain
    everything and then overwrite the older complete checkpoints. ``uid``: whose run
    directory it is (default: this user; ``slurmfm status`` gives the job's user).
    """
    try:
        fd = open_run_dir(directory, uid=uid)
    except FileNotFoundError:
        return ResumePoint(None, None, "no checkpoint in %s: starting from step 0" % directory)
    except OSError as exc:  # fsafe.Refused: a link, another user's, open to others
        why = str(exc) if isinstance(exc, fsafe.Refused) else (exc.strerror or str(exc))
        return ResumePoint(None, None, "not resuming from %s: %s" % (directory, why), refused=why)
    try:
        return _resume_point(directory, fd, uid)
    finally:
        os.close(fd)


def _resume_point(directory: str, fd: int, uid: int | None) -> ResumePoint:
    found = complete(directory, fd, uid)
    try:
        raw = fsafe.read(POINTER, uid, dir_fd=fd).decode("utf-8", "replace")
        pointer: str | None = raw.splitlines()[0].strip() if raw.strip() else ""
    except FileNotFoundError:
        pointer = None
    except fsafe.Refused as exc:  # a link, a FIFO, another user's file: never followed
        pointer = "<ignored: %s>" % exc
    except OSError as exc:
        pointer = "<unreadable: %s>" % exc.strerror
    m = STEP.match(pointer or "")
    if m and int(m.group(1)) in found:
        step = int(m.group(1))
        path = found[step]
        return ResumePoint(path, step, "resuming from %s (named by %s)" % (path, POINTER))
    if pointer is None:
        why = "no %s pointer" % POINTER
    elif not pointer:
        why = "%s is empty" % POINTER
    elif m:
        why = "%s names %s, which does not exist" % (POINTER, pointer)
    else:
        why = "%s holds %r, not a step_N name" % (POINTER, pointer[:80])
    if not found:
        if pointer is None:
            return ResumePoint(None, None, "no checkpoint in %s: starting from step 0" % directory)
        return ResumePoint(
            None,
            None,
            "%s and no complete checkpoint is in %s: starting from step 0" % (why, directory),
        )
    step = max(found)
    path = found[step]
    return ResumePoint(
        path,
        step,
        "%s; resuming from the newest complete checkpoint %s (step %d)" % (why, path, step),
    )


def resume_from(directory: str) -> str | None:
    """The checkpoint path to resume from (:func:`resume_point`), or None for a fresh start."""
    return resume_point(directory).path


def step_of(name: str) -> int | None:
    """The step of a checkpoint's directory name (``step_N`` or its aside copy), else None."""
    m = STEP.match(name) or ASIDE.match(name)
    return int(m.group(1)) if m else None


def done_record(
    env: dict[str, str], now: float, steps: int | None = None, samples: int | None = None
) -> dict[str, object]:
    """What the ``DONE`` marker says (JSON; :func:`marker_verdict` reads it back).

    The run directory outlives a run, so the marker says what was asked and who wrote it:
    ``ask``, the digest of the launch command the job exports as ``SLURMFM_ASK``, the job id
    and restart, and the target ``steps``/``samples`` the training was given.
    """
    record: dict[str, object] = {
        "ask": env.get("SLURMFM_ASK", ""),
        "job_id": env.get("SLURM_JOB_ID", ""),
        "restart": int(env.get("SLURM_RESTART_COUNT", "0") or 0),
        "time": now,
    }
    if steps is not None:
        record["steps"] = steps
    if samples is not None:
        record["samples"] = samples
    return record


def marker_stamp(checkpoint_dir: str) -> tuple[int, int, int] | None:
    """Identity of the ``DONE`` marker now (inode, mtime, size), or None when there is none.

    Taken when the step starts, so a marker the step writes (``mark_done`` replaces the file,
    a new inode) can be told from one left by an earlier run without comparing clocks of
    nodes and file servers.
    """
    st = _done_lstat(checkpoint_dir)
    return None if st is None else (st.st_ino, st.st_mtime_ns, st.st_size)


def _done_lstat(checkpoint_dir: str) -> os.stat_result | None:
    """The ``lstat`` of ``DONE`` in the run directory opened through its chain
    (:func:`open_run_dir`); None where either is missing or refused."""
    try:
        fd = open_run_dir(checkpoint_dir)
    except OSError:
        return None
    try:
        return os.stat(DONE, dir_fd=fd, follow_symlinks=False)
    except OSError:
        return None
    finally:
        os.close(fd)


def done_here(checkpoint_dir: str) -> bool:
    """Whether a ``DONE`` marker of this user's is in the run directory (opened through its
    chain, :func:`open_run_dir`): a link, a FIFO or another user's file is no marker."""
    st = _done_lstat(checkpoint_dir)
    return st is not None and fsafe.problem(st) is None


def marker_verdict(
    checkpoint_dir: str, ask: str, job_id: str, before: tuple[int, int, int] | None
) -> tuple[str, str]:
    """Whether the ``DONE`` marker ends *this* run: ("done" | "stale" | "absent", why).

    A marker says a run finished, but the run directory outlives runs: a finished 20-step run
    resubmitted with 240 steps finds its old marker. So a marker counts only for the ask and
    the job that wrote it (:func:`done_record`): it counts when both are this run's. The job
    id matters too because what was asked is not all in the command line (an environment
    variable, a data file); a requeue keeps the job id, and a training that finds nothing
    left to do writes its marker again. A marker without an ask (a plain ``DONE``, or a
    script that writes its own) counts only when this attempt wrote it: it was absent or
    different when the step started (``before``, from :func:`marker_stamp`).
    """
    import json

    try:
        fd = open_run_dir(checkpoint_dir)
    except FileNotFoundError:
        return "absent", ""
    except fsafe.Refused as exc:  # the run directory's chain: nothing in it is this run's word
        return "stale", "DONE marker ignored (%s)" % exc
    except OSError:
        return "absent", ""
    try:
        text = fsafe.read(DONE, limit=65536, dir_fd=fd).decode("utf-8", "replace")
    except FileNotFoundError:
        return "absent", ""
    except fsafe.Refused as exc:  # a link, a FIFO, another user's file: not this run's word
        return "stale", "DONE marker ignored (%s)" % exc
    except OSError:
        return "absent", ""
    finally:
        os.close(fd)
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("ask"):
        wrote = str(data.get("job_id") or "")
        who = "job %s" % wrote if wrote else "another run"
        if str(data["ask"]) != ask:
            asked = ", steps %s" % data["steps"] if data.get("steps") is not None else ""
            return "stale", "stale DONE marker (written by %s for another launch%s)" % (
                who,
                asked,
            )
        if wrote != job_id:
            return "stale", "stale DONE marker (written by %s, not this job)" % who
        return "done", "DONE marker written by this job for this launch"
    if before is None or marker_stamp(checkpoint_dir) != before:
        return "done", "plain DONE marker written during this attempt"
    return "stale", "stale DONE marker (plain, older than this attempt)"
