"""Checkpoint directory helpers for training scripts launched by slurmfm.

The contract with a job: ``SLURMFM_CHECKPOINT_DIR`` names the run's directory,
``SLURMFM_RESUME_FROM`` (when set) the checkpoint to resume from, ``SLURMFM_KEEP_LAST`` how
many to keep, and SIGUSR2 (``SLURMFM_SAVE_SIGNAL``) asks the job to save and exit before its
time limit. This module implements the directory side with only the standard library, so a
script can copy it if slurmfm is not installed in its container.

Why the ``latest`` pointer is published with write, fsync, rename: a reader (a restarted job, or
an evaluation job) must never see a half-written checkpoint. A checkpoint is written under a
temporary name, flushed, renamed into place, and only then named by ``latest``, which is itself
replaced atomically. A crash at any point leaves ``latest`` naming a complete checkpoint (or no
pointer at all before the first save). On Lustre, rename within a directory is atomic as on
any POSIX file system.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import re
import shutil
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from slurmfm.job import fsafe
from slurmfm.job.checkpoint import DONE as DONE  # noqa: PLC0414 - re-exported
from slurmfm.job.checkpoint import POINTER as POINTER  # noqa: PLC0414 - re-exported
from slurmfm.job.checkpoint import STEP as _STEP

PROGRESS_ENV = "SLURMFM_PROGRESS_FILE"
# What interrupted saves and prunes leave behind (see clean()).
_LEFTOVER = re.compile(r"^\.step_(?P<step>\d+)\.(?P<pid>\d+)\.(?P<kind>partial|old|deleting)$")


def run_dir(env: dict[str, str] | None = None) -> Path:
    """The run's checkpoint directory, from ``SLURMFM_CHECKPOINT_DIR``."""
    e = os.environ if env is None else env
    return Path(e.get("SLURMFM_CHECKPOINT_DIR", "checkpoints"))


def _ensure(directory: Path) -> None:
    """Make the run directory, refusing an unsafe chain (the runtime's rule,
    :func:`slurmfm.job.checkpoint.ensure_run_dir`): a checkpoint is never written through a
    link or into another user's directory."""
    from slurmfm.job.checkpoint import ensure_run_dir

    ensure_run_dir(str(directory))


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    if path.is_file():
        with open(path, "rb") as fh:
            os.fsync(fh.fileno())
        return
    for p in sorted(path.rglob("*")):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(path)


def publish(directory: Path, name: str) -> None:
    """Point ``latest`` at ``name`` atomically (write a temp file, fsync, rename, fsync dir).

    The temporary file is created exclusively under a random name (:func:`fsafe.replace`), and
    leftovers of earlier kills inside this function are removed first.
    """
    target = str(directory / POINTER)
    fsafe.clean_temporaries(target)
    fsafe.replace(target, name + "\n", fsync=True)
    _fsync_dir(directory)


@dataclass(frozen=True)
class ResumePoint:
    """What a (re)starting job resumes from (:class:`slurmfm.job.checkpoint.ResumePoint`, with
    a ``Path``): ``path`` None only when no complete checkpoint exists at all; ``message``
    says what is really resumed and why it is not the one ``latest`` names when they differ."""

    path: Path | None
    step: int | None
    message: str


def resume_point(directory: Path, uid: int | None = None) -> ResumePoint:
    """The checkpoint a job must resume from: the job runtime's rule, the only one
    (:func:`slurmfm.job.checkpoint.resume_point`; why an aside copy of a step counts is
    said there). Pure (reads only) and standard library only. Raises
    :class:`slurmfm.job.fsafe.Refused` when the run directory's chain is not safe (a link,
    another user's directory, one others may rename entries in): its checkpoints might not be
    this run's. ``uid``: whose run directory it is (default: this user)."""
    from slurmfm.job.checkpoint import resume_point as rule

    rp = rule(str(directory), uid)
    if rp.refused:  # the run directory's chain (docs/security.md): load nothing from it
        raise fsafe.Refused(f"{directory}: not resuming: {rp.refused}")
    return ResumePoint(Path(rp.path) if rp.path else None, rp.step, rp.message)


def latest(directory: Path | None = None, uid: int | None = None) -> Path | None:
    """The checkpoint to resume from, or None. Never a partially written one.

    See :func:`resume_point`: a dangling or empty ``latest`` falls back to the newest
    complete checkpoint.
    """
    return resume_point(directory or run_dir(), uid).path


def step_of(path: Path) -> int:
    """The step of a checkpoint directory (``step_N`` or its aside copy)."""
    from slurmfm.job.checkpoint import step_of as step

    n = step(path.name)
    if n is None:
        raise ValueError(f"{path} is not a step_N checkpoint")
    return n


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def clean(directory: Path) -> list[Path]:
    """Remove what interrupted saves and prunes left, and put back an aside copy of a step.

    Called at the start of every :func:`save` and by :func:`prune`; a job may call it at
    start. Leftovers of a process that still runs on this host are left alone (a save in
    progress); a save running on another host is not seen, so call this only where no other
    host saves into the directory (one job per run directory: slurmfm.run_lock). A
    ``.partial`` directory (a save killed while writing) is removed; a ``.old`` aside copy
    is renamed back to ``step_N`` when the new ``step_N`` never landed, else removed; a
    ``.deleting`` directory (a prune killed while deleting) is removed. Why prunes rename
    first: a half-deleted ``step_N`` would look complete. Returns what was removed.
    """
    removed: list[Path] = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for e in entries:
        m = _LEFTOVER.match(e.name)
        if not m or not e.is_dir(follow_symlinks=False):
            continue
        pid, kind = int(m.group("pid")), m.group("kind")
        path = Path(e.path)
        if pid != os.getpid() and _pid_alive(pid):
            continue  # a save or prune in progress (only a writer on this host has this pid)
        if kind == "old":
            final = directory / f"step_{m.group('step')}"
            if not final.exists():
                with contextlib.suppress(OSError):
                    os.rename(path, final)
                    _fsync_dir(directory)
                    continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _no_space(exc: BaseException) -> bool:
    """Whether a failed write ran out of space (also when a framework wrapped the OSError)."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(cur) or "Disk quota exceeded" in str(cur):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


def save(
    directory: Path,
    step: int,
    write: Callable[[Path], None],
    *,
    keep_last: int | None = None,
) -> Path:
    """Write checkpoint ``step`` with ``write(tmp_path)``, publish it, then prune old ones.

    ``write`` receives a temporary directory to fill (any number of files). Only after it
    returns, and its files are flushed to disk, is the directory renamed to ``step_N`` and
    ``latest`` switched to it. One process writes a run's checkpoints (rank 0).

    Saving a step that exists (a job that resumed before its last save) moves the existing
    ``step_N`` aside first, renames the new one in, and only then deletes the old copy: a
    kill at any point leaves a complete ``step_N`` or its complete aside copy, which
    :func:`resume_point` and :func:`clean` use. When the write runs out of space, leftovers
    are removed and, with ``keep_last``, older checkpoints pruned, and the write is retried
    once.
    """
    began = time.monotonic()  # the save's duration goes to the progress history (goodput)
    _ensure(directory)
    if keep_last is None and os.environ.get("SLURMFM_KEEP_LAST"):
        keep_last = int(os.environ["SLURMFM_KEEP_LAST"])
    clean(directory)
    if keep_last:
        prune(directory, keep_last)
    name = f"step_{step:09d}"
    tmp = directory / f".{name}.{os.getpid()}.partial"
    try:
        _write_tmp(tmp, write)
    except BaseException as exc:
        if not _no_space(exc):
            raise
        clean(directory)
        if keep_last:
            prune(directory, max(1, keep_last - 1))
        _write_tmp(tmp, write)
    final = directory / name
    aside = directory / f".{name}.{os.getpid()}.old"
    try:
        if final.exists():  # a save of the same step by an earlier, interrupted run
            os.rename(final, aside)
        os.rename(tmp, final)
        _fsync_dir(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish(directory, name)
    shutil.rmtree(aside, ignore_errors=True)
    report_progress(step, checkpoint_step=step, force=True, save_s=time.monotonic() - began)
    if keep_last:
        prune(directory, keep_last)
    return final


def _write_tmp(tmp: Path, write: Callable[[Path], None]) -> None:
    """Fill a fresh temporary directory and flush it; remove it on any failure."""
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        write(tmp)
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def prune(directory: Path, keep_last: int) -> list[Path]:
    """Remove all but the newest ``keep_last`` checkpoints; never the one ``latest`` names.

    Leftovers of interrupted saves go first (:func:`clean`). A checkpoint is renamed to a
    ``.deleting`` name before it is deleted, so a kill during the deletion never leaves a
    half-deleted ``step_N`` that looks complete.
    """
    clean(directory)
    current = latest(directory)
    me = os.geteuid()
    steps = sorted(
        (
            p
            for p in directory.iterdir()
            if _STEP.match(p.name) and p.is_dir() and not p.is_symlink() and _owner(p) == me
        ),
        key=step_of,
    )
    removed = []
    for p in steps[: max(0, len(steps) - keep_last)]:
        if current is not None and p.name == current.name:
            continue
        doomed = directory / f".{p.name}.{os.getpid()}.deleting"
        try:
            os.rename(p, doomed)
        except OSError:
            continue
        shutil.rmtree(doomed, ignore_errors=True)
        removed.append(p)
    return removed


def _owner(p: Path) -> int:
    try:
        return p.lstat().st_uid
    except OSError:
        return -1


def mark_done(
    directory: Path | None = None,
    *,
    steps: int | None = None,
    samples: int | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """Record that the run finished all its work (the job then does not requeue itself).

    A save signal can arrive while the last steps finish; the job script requeues after a
    signal unless this marker says there is nothing left to do. The run directory outlives a
    run, so the marker says what was asked and who wrote it
    (:func:`slurmfm.job.checkpoint.done_record`); the job accepts it only when it is this
    run's (:func:`slurmfm.job.checkpoint.marker_verdict`): a finished 20-step run resubmitted
    with 240 steps trains on.
    """
    import json
    import time

    from slurmfm.job.checkpoint import done_record

    e = dict(os.environ if env is None else env)
    record = done_record(e, time.time(), steps, samples)
    d = directory or run_dir(env)
    _ensure(d)
    fsafe.clean_temporaries(str(d / DONE))
    fsafe.replace(str(d / DONE), json.dumps(record, sort_keys=True) + "\n")


def is_done(directory: Path | None = None) -> bool:
    """Whether this user's marker is there: the runtime's rule
    (:func:`slurmfm.job.checkpoint.done_here`): a link, a FIFO, another user's file, or a run
    directory reached through a link or another user's directory, is no marker."""
    from slurmfm.job.checkpoint import done_here

    return done_here(str(directory or run_dir()))


class SaveRequest:
    """Turns the pre-timeout signal into a flag the training loop polls between steps.

    slurmfm sends SIGUSR2 (not SIGUSR1, which NCCL uses) some minutes before the time limit;
    the loop should then save a checkpoint and exit 0, and the job requeues itself.
    """

    def __init__(self, signum: int | None = None) -> None:
        self.requested = False
        name = os.environ.get("SLURMFM_SAVE_SIGNAL", "USR2")
        self.signum = signum if signum is not None else getattr(signal, f"SIG{name}")
        self._previous = signal.signal(self.signum, self._handler)
        atexit.register(self.finish)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self.requested = True

    def restore(self) -> None:
        signal.signal(self.signum, self._previous)

    def finish(self) -> None:
        """Ignore further save signals: call before exiting after a save.

        At interpreter shutdown CPython resets its handlers to the default action, and the
        default action of USR2 is to terminate; a late duplicate signal would then turn a clean
        exit after a good save into a crash. Registered with ``atexit`` as well, so a normal
        end of the program is covered too.
        """
        signal.signal(self.signum, signal.SIG_IGN)


_progress: dict[str, float] = {}
_last_write = [0.0]


def report_progress(
    step: int,
    *,
    checkpoint_step: int | None = None,
    force: bool = False,
    min_interval_s: float = 5.0,
    path: str | None = None,
    save_s: float | None = None,
) -> bool:
    """Record the training step (and the last checkpoint) for the job's metrics.

    The job's observability agent turns this file into the ``slurmfm_train_step`` and
    ``slurmfm_checkpoint_step`` gauges of node_exporter's textfile collector. The file is
    ``$SLURMFM_PROGRESS_FILE`` (set by the job script; nothing happens without it), replaced
    atomically. Writes are throttled to one per ``min_interval_s`` so a fast loop can call
    this every step; ``force`` writes at once (:func:`save` does, for each checkpoint, with
    the save's duration ``save_s``). Reporting never raises: metrics must not stop a training
    run. Returns whether it wrote.

    Each write is also appended as one line to the progress history beside the file
    (``progress.jsonl``, :func:`slurmfm.job.goodput.history_path`), with this process's pid:
    the goodput ledger of ``slurmfm report`` and the node agent reads from it when each launch
    first trained, which checkpoint the next one resumed from and how long saves took.
    """
    import json

    from slurmfm.job.goodput import history_line, history_path

    target = path or os.environ.get(PROGRESS_ENV, "")
    now = time.time()
    _progress["step"] = step
    _progress["time"] = now
    if checkpoint_step is not None:
        _progress["checkpoint_step"] = checkpoint_step
        _progress["checkpoint_time"] = now
    if not target or (not force and now - _last_write[0] < min_interval_s):
        return False
    try:
        fsafe.replace(target, json.dumps(_progress, sort_keys=True))
    except OSError:
        return False
    _last_write[0] = now
    line = history_line(now, step, dict(os.environ), os.getpid(), checkpoint_step, save_s)
    with contextlib.suppress(OSError):
        fsafe.append(history_path(target), line)
    return True
