"""Run a pickled Python call as a job's training program (``fm.Executor(...).submit(fn)``).

The job is an ordinary torchrun recipe whose program is ``python -m slurmfm.call CALL_DIR``:
torchrun starts it on every node and process as it would a training script, so a function
gets the same ranks, rendezvous, restarts and logs as any recipe. Every rank calls the
function; rank 0's return value is the job's result (``result.pkl``), after which rank 0
marks the run done (:func:`slurmfm.checkpoint.mark_done`: a call has nothing to save, so the
pre-timeout signal does not requeue a call that finished), and a rank whose call raised
writes its traceback (``error-r<RANK>.txt``) and exits 1.

Why pickle is safe to load here: ``CALL_DIR`` is made owner-only (0700) by the submitting
user under the recipe's log directory, its files are created owner-only with ``O_EXCL`` and
opened without following links, and both sides refuse a directory or file that is not the
user's own or that others could write (a pickle is code). A function defined in the
submitting script (``__main__``) is found as multiprocessing's spawn start method finds it:
the script is imported under the name ``__mp_main__``, so its ``if __name__ == "__main__":``
block does not run again (https://docs.python.org/3/library/multiprocessing.html, "Safe
importing of main module").
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import traceback
from pathlib import Path
from typing import Any

from slurmfm.job import fsafe

CALL = "call.pkl"
META = "call.json"
RESULT = "result.pkl"


class CallDirError(Exception):
    """A call directory or file that is not this user's own, owner-only one."""


def check_dir(path: Path) -> None:
    """Refuse a call directory that is a link, not ours, or open to others
    (:func:`slurmfm.job.fsafe.own_dir_problem`)."""
    why = fsafe.own_dir_problem(os.lstat(path), owner_only=True)
    if why:
        raise CallDirError(f"{path}: {why}")


# A call's pickle holds its arguments: no bound but the memory of the node that reads it.
_NO_LIMIT = 1 << 62


def read_owned(path: Path) -> bytes:
    """A file's bytes, refused when it is a link, not a regular file, or not ours alone
    (:func:`slurmfm.job.fsafe.read`, ``private``)."""
    return fsafe.read(str(path), limit=_NO_LIMIT, private=True)


def write_new(path: Path, data: bytes) -> None:
    """Create ``path`` owner-only with exactly ``data``; an existing name is an error
    (:func:`slurmfm.job.fsafe.create`)."""
    fsafe.create(str(path), data, fsafe.PRIVATE_MODE)


def _import_main(path: str) -> None:
    """Make ``__main__`` the submitting script, imported as ``__mp_main__`` (see above)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("__mp_main__", path)
    if spec is None or spec.loader is None:
        raise CallDirError(f"{path}: cannot import the submitting script")
    module = importlib.util.module_from_spec(spec)
    sys.modules["__mp_main__"] = module
    sys.modules["__main__"] = module
    spec.loader.exec_module(module)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m slurmfm.call CALL_DIR", file=sys.stderr)
        return 2
    call_dir = Path(args[0])
    rank = int(os.environ.get("RANK", "0"))
    check_dir(call_dir)
    meta: dict[str, Any] = json.loads(read_owned(call_dir / META))
    for entry in reversed(meta.get("sys_path", [])):
        if entry not in sys.path:
            sys.path.insert(0, entry)
    try:
        if meta.get("main"):
            _import_main(str(meta["main"]))
        fn, fargs, fkwargs = pickle.loads(read_owned(call_dir / CALL))  # noqa: S301 - see above
        value = fn(*fargs, **fkwargs)
    except BaseException as exc:  # the job's result is the traceback, for job.result()
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        # a restart's replaces the last (slurmfm's one atomic write)
        fsafe.replace(str(call_dir / f"error-r{rank}.txt"), text.encode("utf-8", "replace"), 0o600)
        sys.stderr.write(text)
        return 1
    if rank == 0:
        fsafe.replace(str(call_dir / RESULT), pickle.dumps(value), 0o600)  # whole or not at all
        if os.environ.get("SLURMFM_CHECKPOINT_DIR"):
            # The result is the call's completion: with the marker, an exit 0 after the
            # pre-timeout signal ends the job finished instead of "requeue, no save seen".
            from slurmfm.checkpoint import mark_done

            mark_done()
    return 0


if __name__ == "__main__":
    sys.exit(main())
