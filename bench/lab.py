"""The environment of one lab for a benchmark that drives it from outside (the scripts under
``scripts/bench_*.py``): what ``scripts/slurm-lab --lab DIR env`` exports, over this
process's environment, with this Python's folder first on ``PATH`` (the lab's jobs run the
checkout's ``slurmfm`` from the same venv)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def lab_env(lab: str | Path) -> dict[str, str]:
    """The lab's exports (``SLURM_CONF``, its ``PATH`` of Slurm's commands, ...) over
    ``os.environ``."""
    out = subprocess.run(
        [str(REPO / "scripts" / "slurm-lab"), "--lab", str(lab), "env"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    env = dict(os.environ)
    for line in out.splitlines():
        m = re.match(r"export (\w+)=(.*)$", line.strip())
        if m:
            env[m.group(1)] = m.group(2).strip("'\"")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env
