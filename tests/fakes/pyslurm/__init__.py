"""A small stand-in for pyslurm 25.11, following its documented object API.

PyPI carries pyslurm only for Slurm 25.11 and no Slurm 25.11 package is reachable here, so the
backend's pyslurm path is tested against this fake (see docs/backends.md). It implements only
what slurmfm calls: ``version()``, ``JobSubmitDescription(script=..., environment=...)`` with
``load_sbatch_options()`` and ``submit()``, ``Job.load(id)`` with ``state``, ``state_reason``,
``nodelist``, ``exit_code``, ``name`` and ``cancel()``. Jobs are kept in a JSON file named by
``FAKE_PYSLURM_DB`` so a probe in a child process and the test see the same state.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

__version__ = os.environ.get("FAKE_PYSLURM_VERSION", "25.11.2")


class RPCError(Exception):
    pass


def version() -> str:
    return __version__


def _db() -> Path:
    return Path(os.environ.get("FAKE_PYSLURM_DB", "/tmp/fake-pyslurm.json"))


def _load() -> dict[str, Any]:
    p = _db()
    return json.loads(p.read_text()) if p.exists() else {"next": 100, "jobs": {}}


def _save(db: dict[str, Any]) -> None:
    _db().write_text(json.dumps(db))


class JobSubmitDescription:
    def __init__(
        self, script: str | None = None, environment: dict[str, str] | None = None, **kwargs: Any
    ) -> None:
        self.script = script
        self.environment = environment
        self.name: str | None = kwargs.get("name")
        self.nodes: str | None = kwargs.get("nodes")
        self.partition: str | None = kwargs.get("partition")

    def load_sbatch_options(self, overwrite: bool = False) -> None:
        for m in re.finditer(r"^#SBATCH --([a-z-]+)(?:=(\S+))?", self.script or "", re.M):
            key = m.group(1).replace("-", "_")
            if key == "job_name":
                key = "name"
            if hasattr(self, key) and (overwrite or getattr(self, key) is None):
                setattr(self, key, m.group(2))

    def submit(self) -> int:
        if not self.environment:
            raise RPCError("batch job cannot run without an environment")
        if self.partition == "nosuch":
            raise RPCError("Invalid partition name specified")
        db = _load()
        job_id = db["next"]
        db["next"] += 1
        db["jobs"][str(job_id)] = {
            "name": self.name,
            "state": "PENDING",
            "nodes": self.nodes,
            # Set by the caller like sbatch's command-line options (recorded for tests):
            "array": getattr(self, "array", None),
            "dependencies": getattr(self, "dependencies", None),
            "kill_on_invalid_dependency": getattr(self, "kill_on_invalid_dependency", None),
        }
        _save(db)
        return int(job_id)


class Job:
    def __init__(self, job_id: int, rec: dict[str, Any]) -> None:
        self.id = job_id
        self.name = rec.get("name")
        self.state = rec["state"]
        self.state_reason = "None" if self.state != "PENDING" else "Priority"
        self.nodelist = "" if self.state == "PENDING" else "node001"
        self.exit_code = 0

    @classmethod
    def load(cls, job_id: int) -> Job:
        rec = _load()["jobs"].get(str(job_id))
        if rec is None:
            raise RPCError(f"Job {job_id} does not exist")
        return cls(job_id, rec)

    def cancel(self) -> None:
        db = _load()
        db["jobs"][str(self.id)]["state"] = "CANCELLED"
        _save(db)
