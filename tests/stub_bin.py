"""A directory of stub commands for running a rendered script under bash without Slurm.

Why one builder: tests that run a generated script put stand-ins for the Slurm client
commands first (and only) on ``PATH``, plus the interpreter as ``python3`` and the few system
tools the script itself uses; anything else the script calls then fails loudly instead of
reaching the real host.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

# sbcast(1) on one host, where every "node" shares this file system: copy SOURCE to DEST (its
# last two arguments), as Slurm would write DEST on each node.
SBCAST = """#!/bin/sh
for a; do src=$dst; dst=$a; done
exec /bin/cp "$src" "$dst"
"""


def stub_bin(bindir: Path, stubs: Mapping[str, str], tools: Iterable[str]) -> Path:
    """Write ``stubs`` (name -> program text) into ``bindir`` as executables and link
    ``tools`` from /usr/bin or /bin; ``python3`` is this test run's interpreter.

    A stub whose text starts with ``#!PYTHON`` runs with that interpreter.
    """
    bindir.mkdir(parents=True, exist_ok=True)
    stubs = {"sbcast": SBCAST, **stubs}
    for name, body in stubs.items():
        (bindir / name).write_text(body.replace("#!PYTHON", "#!" + sys.executable, 1))
        (bindir / name).chmod(0o755)
    (bindir / "python3").symlink_to(sys.executable)
    for tool in tools:
        for d in ("/usr/bin", "/bin"):
            if os.path.exists(f"{d}/{tool}"):
                (bindir / tool).symlink_to(f"{d}/{tool}")
                break
    return bindir
