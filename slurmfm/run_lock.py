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
"Security"): the record is opened without following links or blocking; a link, a FIFO or
anything but a regular file there is refused with one line (before, it turned the check off
silently), and only this user's own record counts: another user's is said
(``ignored FILE (uid N)``) and replaced, so a record planted by someone else can neither
block a submission nor be written through.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import stat
import sys
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


def _open_record(path: Path) -> int | None:
    """Our own record, opened read-write (made when missing); None when it cannot be made
    (the checkpoint file system is not mounted here: nothing is checked, as before).

    A record that is a link, a FIFO or anything but a regular file is refused with one line:
    never followed, never blocked on, and the check is never turned off silently. Another
    user's record is not ours to trust: its jobs are not asked about (they cannot train in
    our own run directory, which the chain check keeps ours, :func:`slurmfm.submit._own_run_dir`),
    and it is said and replaced by our own where the directory lets us
    (``ignored FILE (uid N)``)."""
    from slurmfm.job import fsafe

    for _ in range(2):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | _FLAGS, 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise _refused(path, "is a symbolic link") from None
            if exc.errno in (errno.ENXIO, errno.EISDIR):
                raise _refused(path, "is " + fsafe.kind(_lmode(path))) from None
            if exc.errno != errno.EACCES:
                return None
            st = _lstat(path)
            if st is None:
                return None  # the directory does not let us add the record
            fd = -1
        else:
            st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            if fd >= 0:
                os.close(fd)
            raise _refused(path, "is " + fsafe.kind(st.st_mode))
        if st.st_uid == os.geteuid() and st.st_nlink == 1:
            return fd
        if fd >= 0:
            os.close(fd)
        why = f"uid {st.st_uid}" if st.st_uid != os.geteuid() else f"{st.st_nlink} hard links"
        sys.stderr.write(f"slurmfm: ignored {path} ({why})\n")
        try:
            os.unlink(path)
        except OSError:
            return None  # not ours to replace: nothing is checked, nothing of hers trusted
    return None


def _lstat(path: Path) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except OSError:
        return None


def _lmode(path: Path) -> int:
    st = _lstat(path)
    return st.st_mode if st is not None else 0


def _refused(path: Path, why: str) -> SlurmfmError:
    return SlurmfmError(
        f"storage.run_id: the run record {path} {why}, not a file of slurmfm's: it is never "
        "followed or trusted; remove it (docs/security.md)"
    )


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
    fd = _open_record(path)
    if fd is None:
        yield lambda job_id: None
        return
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
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
                os.pwrite(fd, ("\n".join(kept[-_KEEP:]) + "\n").encode(), 0)
                os.fsync(fd)

        yield record
    finally:
        os.close(fd)  # releases the flock
