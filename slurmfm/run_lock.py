"""One live job per run directory: refuse a second submission that would train into it.

Why: the default run id is the recipe's name, so submitting one recipe twice put two jobs in
one checkpoint directory. They raced on every save and each resumed from the other's weights.
Slurm keeps no notion of "run directory", so slurmfm records, next to the
run's checkpoints, the ids of the jobs it submitted there and asks Slurm whether any of them
is still alive (pending, running, requeued, suspended) before submitting another.

The record is ``<checkpoint_root>/<name>/.<run_id>.slurmfm-jobs``: beside the run directory
rather than in it, so that it also covers a sweep's ``<run_id>-t<i>`` directories and never
shows up among a framework's checkpoints. It is held with ``flock`` while Slurm is asked and
the job submitted, so two submissions at once are serialised: the second sees the first's job.
``flock`` is honoured across nodes by Lustre mounted with ``-o flock`` (FSx for Lustre's
default) and by NFSv4; elsewhere it still serialises submissions from one login node.

Jobs that must share a run directory on purpose, one after another, stay allowed: a
``resources.singleton`` recipe (Slurm runs one at a time) and ``--allow-shared-run-dir``.

One record per run directory, named from the *resolved* directory (its parent through
``realpath``): a sweep takes the record of each of its tasks' ``<run_id>-t<i>`` directories,
so a plain job with ``run_id: sw-t0`` meets sweep ``sw``'s task 0, and ``ck/x`` meets
``./ck/../ck/x`` or a symlinked root. The checkpoint root may be shared by a team (README
"Security"): the record is opened without following links or blocking, and written only when
it is this user's own; another user's record is still read, to see their live job.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from slurmfm.errors import SlurmfmError

if TYPE_CHECKING:
    from slurmfm.recipe.schema import Recipe

# Live job ids kept in the record (a pipeline's stages, or jobs allowed to share).
_KEEP = 20


class RunDirInUse(SlurmfmError):
    """Another live job trains in the run directory this submission would use."""


def run_dir(recipe: Recipe) -> Path:
    """The run's checkpoint directory as the job sees it (relative: to the submit directory,
    which sbatch makes the job's working directory)."""
    return Path(recipe.checkpoint_dir)


def run_dirs(recipe: Recipe) -> list[Path]:
    """Every checkpoint directory the submission trains in: a sweep's are its tasks'."""
    d = run_dir(recipe)
    if recipe.sweep is None:
        return [d]
    from slurmfm.recipe.sweep import task_run_id

    return [d.parent / task_run_id(recipe.run_id, i) for i in range(recipe.sweep.size)]


def record_path_of(directory: Path) -> Path:
    """``<realpath of the parent>/.<name>.slurmfm-jobs``: one name per resolved directory."""
    return Path(os.path.realpath(directory.parent)) / f".{directory.name}.slurmfm-jobs"


def _dir_of(record: Path) -> Path:
    """The run directory a record stands for."""
    return record.parent / record.name[1 : -len(".slurmfm-jobs")]


def record_paths(recipe: Recipe) -> list[Path]:
    return [record_path_of(d) for d in run_dirs(recipe)]


def record_path(recipe: Recipe) -> Path:
    """The record of the run's (first) directory."""
    return record_paths(recipe)[0]


_FLAGS = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _open_record(path: Path) -> tuple[int, bool] | None:
    """``(fd, writable)``: our own regular file read-write; another user's read-only; None for
    a link, a FIFO or anything else (then nothing is checked, as when it cannot be created)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _FLAGS, 0o644)
    except OSError as exc:
        if exc.errno != errno.EACCES:
            return None
        try:
            fd = os.open(path, os.O_RDONLY | _FLAGS)
        except OSError:
            return None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        return None
    return fd, st.st_uid == os.geteuid() and st.st_nlink == 1


def _read(fd: int) -> list[str]:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 65536):
        chunks.append(chunk)
    text = b"".join(chunks).decode("utf-8", "replace")
    return [line.strip() for line in text.splitlines() if line.strip().isdigit()]


@contextlib.contextmanager
def exclusive(
    recipe: Recipe,
    live_state: Callable[[str], str | None],
    *,
    path: Path | None = None,
    allow_shared: bool = False,
    override: str = "pass --allow-shared-run-dir",
) -> Iterator[Callable[[str], None]]:
    """Hold the run's record while submitting; yields ``record(job_id)`` for the new job.

    ``live_state(job_id)`` returns the job's state while it is alive, else None. Raises
    :class:`RunDirInUse` when a recorded job is alive, unless ``allow_shared`` or the recipe
    is a singleton; ``override`` ends the message (how to submit anyway). When the record
    cannot be created (the checkpoint file system is not mounted where slurmfm runs),
    nothing is checked: submission must not depend on it.
    """
    path = path or record_path(recipe)
    opened = _open_record(path)
    if opened is None:
        yield lambda job_id: None
        return
    fd, writable = opened
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        # Only jobs still alive are kept: the record stays short, and each submission asks
        # Slurm about a few jobs at most.
        alive = [(job, state) for job in _read(fd)[-_KEEP:] if (state := live_state(job))]
        if alive and not (allow_shared or recipe.resources.singleton):
            job, state = alive[-1]
            raise RunDirInUse(
                f"storage.run_id: job {job} ({state}) already uses the run directory "
                f"{_dir_of(path)}; a second job would overwrite its checkpoints and "
                "resume from them. Wait for it or cancel it, give this run its own id "
                f"(--set storage.run_id=NEW), or {override}"
            )
        kept = [job for job, _ in alive]

        def record(job_id: str) -> None:
            kept.append(job_id.split(";", maxsplit=1)[0])  # sbatch --parsable: "JOBID[;CLUSTER]"
            if not writable:  # another user's record: read, never written
                return
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, ("\n".join(kept[-_KEEP:]) + "\n").encode(), 0)
                os.fsync(fd)

        yield record
    finally:
        os.close(fd)  # releases the flock
