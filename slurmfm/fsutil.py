"""Whole-file-or-nothing writes, shared by the CLI and the topology store.

Why one function: "nothing half-written is left behind" is a promise of every command that
writes (rendered scripts, saved topologies, SVGs). A temporary file in the target's directory
is written, flushed to disk and renamed over the target; on any error it is removed.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomic(path: str | Path, text: str | bytes, *, mode: int | None = None) -> None:
    """Write ``text`` (UTF-8) or bytes to ``path`` atomically; ``mode`` defaults to 0666 less
    the umask."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(text.encode("utf-8") if isinstance(text, str) else text)
            fh.flush()
            os.fsync(fh.fileno())
        if mode is None:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
