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
import os
import re
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType

POINTER = "latest"
DONE = "DONE"
PROGRESS_ENV = "SLURMFM_PROGRESS_FILE"
_STEP = re.compile(r"^step_(\d+)$")


def run_dir(env: dict[str, str] | None = None) -> Path:
    """The run's checkpoint directory, from ``SLURMFM_CHECKPOINT_DIR``."""
    e = os.environ if env is None else env
    return Path(e.get("SLURMFM_CHECKPOINT_DIR", "checkpoints"))


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
    """Point ``latest`` at ``name`` atomically (write a temp file, fsync, rename, fsync dir)."""
    tmp = directory / f".{POINTER}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(name + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, directory / POINTER)
    _fsync_dir(directory)


def latest(directory: Path | None = None) -> Path | None:
    """The newest complete checkpoint, or None. Never a partially written one."""
    d = directory or run_dir()
    try:
        name = (d / POINTER).read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    if not _STEP.match(name):
        return None
    path = d / name
    return path if path.exists() else None


def step_of(path: Path) -> int:
    m = _STEP.match(path.name)
    if not m:
        raise ValueError(f"{path} is not a step_N checkpoint")
    return int(m.group(1))


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
    ``latest`` switched to it.
    """
    directory.mkdir(parents=True, exist_ok=True)
    name = f"step_{step:09d}"
    tmp = directory / f".{name}.{os.getpid()}.partial"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        write(tmp)
        _fsync_tree(tmp)
        final = directory / name
        if final.exists():  # a save of the same step by an earlier, interrupted run
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(directory)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    publish(directory, name)
    report_progress(step, checkpoint_step=step, force=True)
    if keep_last is None and os.environ.get("SLURMFM_KEEP_LAST"):
        keep_last = int(os.environ["SLURMFM_KEEP_LAST"])
    if keep_last:
        prune(directory, keep_last)
    return final


def prune(directory: Path, keep_last: int) -> list[Path]:
    """Remove all but the newest ``keep_last`` checkpoints; never the one ``latest`` names."""
    current = latest(directory)
    steps = sorted(
        (p for p in directory.iterdir() if _STEP.match(p.name) and p.is_dir()), key=step_of
    )
    removed = []
    for p in steps[: max(0, len(steps) - keep_last)]:
        if current is not None and p.name == current.name:
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def mark_done(directory: Path | None = None) -> None:
    """Record that the run finished all its work (the job then does not requeue itself).

    A save signal can arrive while the last steps finish; the job script requeues after a
    signal unless this marker says there is nothing left to do.
    """
    d = directory or run_dir()
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / f".{DONE}.{os.getpid()}.tmp"
    tmp.write_text("done\n", encoding="utf-8")
    os.replace(tmp, d / DONE)


def is_done(directory: Path | None = None) -> bool:
    return ((directory or run_dir()) / DONE).exists()


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
) -> bool:
    """Record the training step (and the last checkpoint) for the job's metrics.

    The job's observability agent turns this file into the ``slurmfm_train_step`` and
    ``slurmfm_checkpoint_step`` gauges of node_exporter's textfile collector. The file is
    ``$SLURMFM_PROGRESS_FILE`` (set by the job script; nothing happens without it), replaced
    atomically. Writes are throttled to one per ``min_interval_s`` so a fast loop can call
    this every step; ``force`` writes at once (:func:`save` does, for each checkpoint).
    Reporting never raises: metrics must not stop a training run. Returns whether it wrote.
    """
    import json
    import time

    target = path or os.environ.get(PROGRESS_ENV, "")
    now = time.time()
    _progress["step"] = step
    _progress["time"] = now
    if checkpoint_step is not None:
        _progress["checkpoint_step"] = checkpoint_step
        _progress["checkpoint_time"] = now
    if not target or (not force and now - _last_write[0] < min_interval_s):
        return False
    tmp = f"{target}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(_progress, fh, sort_keys=True)
        os.replace(tmp, target)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        return False
    _last_write[0] = now
    return True
