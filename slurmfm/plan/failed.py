"""Nodes that failed slurmfm's health gate recently, so the planner can leave them out.

Why: a node that failed the gate is drained and, once an admin resumes it, looks idle again to
Slurm and to the topology's node states; if the fault comes back, the next job loses a
restart on it. Two sources, both under the user's control (``plan --avoid-failed-since``):

* **The jobs' own records**: the state file every slurmfm job appends to
  (``<log_dir>/<job>_<id>.state``, :mod:`slurmfm.backends.state`); the job script writes
  ``<UTC time> restart=N event=requeue health gate failed on NODE NODE ...`` when the gate
  fails (``slurmfm/render/templates/runtime.sh.j2``).
* **Slurm's node reasons**: ``sinfo -R`` lists down/drained nodes with the reason and its time
  (``%H``, ``%N``, ``%E``: https://slurm.schedmd.com/sinfo.html); slurmfm drains with a reason
  that starts ``slurmfm:`` (same template), and only those count.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path

from slurmfm.errors import SlurmfmError
from slurmfm.job import fsafe
from slurmfm.job.state import SUFFIX

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 3600.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_GATE = re.compile(r"health gate failed on (?P<nodes>.*)$")
_HOST = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class FailedNodesError(SlurmfmError):
    """A duration or a record that cannot be read."""


def parse_duration(text: str) -> float:
    """``24h``, ``90m``, ``2d``, ``1w``, ``3600s`` (a bare number is hours) -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise FailedNodesError(
            f"--avoid-failed-since {text!r}: expected a duration like 24h, 90m, 2d"
        )
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def _epoch(ts: str) -> float | None:
    """Epoch seconds of an ISO time: ``...Z`` (the state file) is UTC; a time without a zone
    (sinfo's ``%H``) is the local time of the host, as Slurm prints it."""
    try:
        dt = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    return dt.timestamp()


def from_state_text(text: str, since: float, source: str = "") -> dict[str, str]:
    """Nodes a job's state file says failed the health gate at or after ``since`` (epoch)."""
    from slurmfm.job.state import events

    out: dict[str, str] = {}
    for e in events(text):
        g = _GATE.search(e.detail)
        ts = _epoch(e.time)
        if g is None or ts is None or ts < since:
            continue
        for node in g.group("nodes").replace(",", " ").split():
            if _HOST.match(node) and node not in {"some", "node"}:
                out[node] = f"health gate failed {e.time}" + (f" ({source})" if source else "")
    return out


def from_state_dirs(dirs: Iterable[str | Path], since: float) -> dict[str, str]:
    """Every ``*.state`` file under ``dirs`` (recursively)."""
    out: dict[str, str] = {}
    for d in dirs:
        base = Path(d)
        if not base.is_dir():
            raise FailedNodesError(f"--failed-records {d}: not a directory")
        for f in sorted(base.rglob("*" + SUFFIX)):
            try:  # this user's own records only: a planted one could name any node
                text = fsafe.read(str(f), limit=16 << 20).decode("utf-8", "replace")
            except fsafe.Refused:
                continue
            except OSError as exc:
                raise FailedNodesError(f"{f}: cannot read: {exc.strerror}") from exc
            out.update(from_state_text(text, since, f.name))
    return out


def from_sinfo_reasons(text: str, since: float) -> dict[str, str]:
    """``sinfo -R -h -o '%H|%N|%E'`` output: slurmfm's drain reasons at or after ``since``."""
    from slurmfm.topology.hostlist import BadHostlist, expand_hostlist

    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.split("|", 2)
        if len(parts) != 3 or not parts[2].startswith("slurmfm:"):
            continue
        ts = _epoch(parts[0].strip())
        if ts is None or ts < since:
            continue
        try:
            nodes = expand_hostlist(parts[1].strip())
        except BadHostlist:
            continue
        for node in nodes:
            out[node] = f"Slurm reason {parts[2].strip()!r} since {parts[0].strip()}"
    return out


def sinfo_reasons(since: float) -> dict[str, str]:
    """Ask Slurm (``sinfo -R``); empty when sinfo is not there."""
    import subprocess

    try:
        proc = subprocess.run(
            ["sinfo", "-R", "-h", "-o", "%H|%N|%E"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if proc.returncode != 0:
        return {}
    return from_sinfo_reasons(proc.stdout, since)


def recent_failures(
    window_s: float,
    record_dirs: Iterable[str | Path] = (),
    *,
    ask_slurm: bool = True,
    now: float | None = None,
) -> Mapping[str, str]:
    """Node -> why, for nodes that failed the health gate in the last ``window_s`` seconds."""
    since = (time.time() if now is None else now) - window_s
    out = from_state_dirs(record_dirs, since)
    if ask_slurm:
        for node, why in sinfo_reasons(since).items():
            out.setdefault(node, why)
    return out
