"""Checkpoint helpers the job needs: which checkpoint to resume from.

``latest`` names the newest complete checkpoint (slurmfm.checkpoint publishes it with write,
fsync, rename). When it is missing, empty or dangling, the newest complete ``step_*``
directory is used instead, so a damaged pointer never restarts training from step 0 over
older complete checkpoints.
"""

from __future__ import annotations

import os
import re

_STEP = re.compile(r"^step_(\d+)$")


def resume_from(directory: str) -> str | None:
    """The checkpoint path to resume from, or None for a fresh start."""
    try:
        with open(os.path.join(directory, "latest"), encoding="utf-8") as fh:
            name = fh.readline().strip()
    except OSError:
        name = ""
    if name and "/" not in name and os.path.isdir(os.path.join(directory, name)):
        return os.path.join(directory, name)
    try:
        steps = [
            (int(m.group(1)), e)
            for e in os.listdir(directory)
            for m in [_STEP.match(e)]
            if m and os.path.isdir(os.path.join(directory, e))
        ]
    except OSError:
        return None
    if not steps:
        return None
    return os.path.join(directory, max(steps)[1])
