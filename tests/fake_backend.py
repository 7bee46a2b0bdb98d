"""A backend without a cluster, and the small lab-cpu recipes the request and pipeline tests
submit to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from slurmfm.backends.base import JobStatus, SubmitResult
from slurmfm.errors import BackendError
from slurmfm.request import SubmitRequest

VERSION = "22.05.8"

RECIPE = """\
name: {name}
cluster: {{instance_type: lab-cpu, partition: batch}}
resources: {{nodes: 1, procs_per_node: 1, exclusive: false}}
launcher: {{kind: torchrun, script: t.py}}
storage: {{log_dir: {logs}, checkpoint_root: {logs}}}
"""


def write_recipes(directory: Path, *names: str) -> None:
    """``NAME.yaml`` for each name in ``directory``, logging to ``directory/logs``."""
    for name in names:
        (directory / f"{name}.yaml").write_text(RECIPE.format(name=name, logs=directory / "logs"))


@dataclass
class FakeBackend:
    """Keeps every request exactly as received (the object a real backend would send) and
    answers like a 22.05.8 cluster: job ids 101, 102, ...; ``fail_at`` makes that submission
    (0-based) fail as sbatch does when a QOS limit is hit."""

    name: str = "fake"
    fail_at: int | None = None
    requests: list[SubmitRequest] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)

    def version(self) -> str:
        return VERSION

    def submit(self, request: SubmitRequest, *, env: dict[str, str] | None = None) -> SubmitResult:
        if self.fail_at is not None and len(self.requests) == self.fail_at:
            raise BackendError("sbatch: error: Batch job submission failed: QOSMaxSubmitJobs")
        request.check_submittable()
        self.requests.append(request)
        return SubmitResult(str(100 + len(self.requests)))

    def status(self, job_id: str) -> JobStatus:
        return JobStatus(job_id, "COMPLETED")

    def cancel(self, job_id: str) -> None:
        self.cancelled.append(job_id)
