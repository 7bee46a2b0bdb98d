"""One pyslurm-backend operation with real pyslurm, its result printed as JSON.

Run by tests/backends/test_pyslurm_backend.py in a child process per call, with the lab's
environment: ``import pyslurm`` binds the process to one cluster's slurm.conf for good (and ends
it when there is none), and a chroot lab's pyslurm runs inside that chroot.

    pyslurm_driver.py probe CLUSTER_VERSION | version | submit SCRIPT [OPTIONS_JSON] |
                      status JOB_ID | cancel JOB_ID

A BackendError prints ``{"error": message}`` and exits 3.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import types
from typing import Any

from slurmfm.backends.pyslurm_backend import PySlurmBackend, probe
from slurmfm.errors import BackendError
from slurmfm.request import ArraySpec, Dependency, SubmitRequest


def recording_pyslurm(seen: dict[str, Any]) -> types.SimpleNamespace:
    """Real pyslurm whose ``JobSubmitDescription.submit`` first records what the backend
    handed it: the script's path and that file's and its directory's modes, as they are when
    pyslurm reads it (a subclass of the real class: the submission itself is pyslurm's)."""
    import pyslurm

    class Recording(pyslurm.JobSubmitDescription):  # type: ignore[misc,name-defined]
        def submit(self) -> int:
            path = str(self.script)
            seen["path"] = path
            seen["is_file"] = os.path.isfile(path)
            if seen["is_file"]:
                seen["mode"] = os.stat(path).st_mode & 0o777
                seen["dir_mode"] = os.stat(os.path.dirname(path)).st_mode & 0o777
            seen["time_limit"] = repr(getattr(self, "time_limit", None))
            return int(super().submit())

    return types.SimpleNamespace(
        JobSubmitDescription=Recording,
        Job=pyslurm.Job,
        version=getattr(pyslurm, "version", None),
        __version__=getattr(pyslurm, "__version__", None),
    )


def run(argv: list[str]) -> Any:
    op, args = argv[0], argv[1:]
    if op == "probe":
        return dataclasses.asdict(probe(args[0]))
    if op == "version":
        return PySlurmBackend().version()
    if op == "submit":
        with open(args[0], encoding="utf-8") as f:
            request = SubmitRequest.of_script(f.read())
        opts = json.loads(args[1]) if len(args) > 1 else {}
        if "array" in opts:
            request = dataclasses.replace(request, array=ArraySpec(opts["array"], 0))
        if "dependency" in opts:
            cond, job = opts["dependency"].split(":")
            request = dataclasses.replace(request, dependency=Dependency.of([(cond, job)]))
        if opts.get("kill_on_invalid_dep"):
            request = dataclasses.replace(request, kill_on_invalid_dep=True)
        seen: dict[str, Any] = {}
        job_id = PySlurmBackend(recording_pyslurm(seen)).submit(request).job_id
        seen["left_behind"] = os.path.exists(seen.get("path", ""))
        return {"job_id": job_id, "seen": seen}
    if op == "status":
        st = PySlurmBackend().status(args[0])
        return {k: v for k, v in dataclasses.asdict(st).items() if k != "raw"}
    if op == "cancel":
        PySlurmBackend().cancel(args[0])
        return "cancelled"
    raise SystemExit(f"unknown operation {op!r}")


def main() -> int:
    try:
        out = run(sys.argv[1:])
    except BackendError as exc:
        print(json.dumps({"error": str(exc)}))
        return 3
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
