"""The job runtime as one line of the batch script: a deterministic zipapp in base64.

Why embedded: a script submitted with plain ``sbatch`` must work where compute nodes do not
have slurmfm installed, and a requeued job must run the runtime it started with. Slurm stores
the batch script and a requeue runs those same bytes, so a runtime carried in the script cannot
change under a requeued job. The zip is deterministic (sorted entries, fixed timestamps and
modes), so the same slurmfm renders the same bytes and the sha256 in the line names them.

The batch script extracts the last line into a private file on the batch host, checks the
sha256, copies it to every node with ``sbcast``, and each step runs it only after checking the
opened file (:mod:`slurmfm.job.install`): the program is a file nobody else can change, never
argv, and never a file on the shared file system.
"""

from __future__ import annotations

import base64
import hashlib
import io
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

MARK = "# slurmfm-runtime"
PACKAGE = "slurmfm_job"  # the package's name inside the zip (relative imports only)
# The per-node entry ignores the save signal from its first instant: the checked program every
# step runs does that before it reads this file (slurmfm.job.install.CHECKED).
# The agents' step (``observe``, one per node, no options) goes straight to the agent: the
# command line's parser and option types (argparse, typing, a quarter of an agent's start-up
# CPU) are for the steps that have options.
_MAIN = (
    "import sys\n"
    "if sys.version_info < (3, 8):\n"
    "    sys.exit('slurmfm: the job runtime needs python3 >= 3.8, found ' + sys.version)\n"
    "if sys.argv[1:] == ['observe']:\n"
    f"    from {PACKAGE}.agent import main\n"
    "else:\n"
    f"    from {PACKAGE}.cli import main\n"
    "sys.exit(main())\n"
)


@dataclass(frozen=True)
class RuntimeFile:
    """A file the job needs beside its script (here: the runtime zipapp)."""

    name: str
    data: bytes
    sha256: str


def _zip_bytes() -> bytes:
    src = Path(__file__).resolve().parent.parent / "job"
    entries = {"__main__.py": _MAIN.encode()}
    for path in sorted(src.glob("*.py")):
        if path.name == "__main__.py":
            continue
        entries[f"{PACKAGE}/{path.name}"] = path.read_bytes()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(info, entries[name], compresslevel=9)
    return buf.getvalue()


@lru_cache(maxsize=1)
def runtime_file() -> RuntimeFile:
    data = _zip_bytes()
    sha = hashlib.sha256(data).hexdigest()
    return RuntimeFile(f"{sha}.pyz", data, sha)


def payload_line(rf: RuntimeFile | None = None) -> str:
    """``# slurmfm-runtime sha256=<hex> <base64>``: the script's last line."""
    rf = rf or runtime_file()
    return f"{MARK} sha256={rf.sha256} {base64.b64encode(rf.data).decode('ascii')}"


def extract(script_text: str) -> bytes:
    """The runtime bytes from a rendered script (checks the sha256), for tests and tools."""
    last = script_text.rstrip("\n").rsplit("\n", 1)[-1]
    mark, sha, data = last.split(" ", 3)[1:] if last.startswith(MARK) else ("", "", "")
    if mark != "slurmfm-runtime" or not sha.startswith("sha256="):
        raise ValueError("no slurmfm runtime line at the end of the script")
    raw = base64.b64decode(data)
    if hashlib.sha256(raw).hexdigest() != sha.removeprefix("sha256="):
        raise ValueError("the runtime line's sha256 does not match its data")
    return raw
