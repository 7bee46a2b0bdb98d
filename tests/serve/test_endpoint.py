"""`api.endpoint`: the endpoint file is found by recipe, and a stale one is not trusted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurmfm import api
from slurmfm.backends.base import JobStatus


class States:
    """A backend stand-in that knows only job states (all `endpoint` asks)."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.asked: list[str] = []

    def status(self, job_id: str) -> JobStatus:
        self.asked.append(job_id)
        return JobStatus(job_id=job_id, state=self.state)


def recipe(tmp: Path) -> Any:
    return api.load(
        {
            "name": "srv",
            "cluster": {"instance_type": "p5.48xlarge"},
            "resources": {"nodes": 1},
            "parallelism": {"tp": 8},
            "launcher": {"kind": "vllm", "model": "m"},
            "storage": {"log_dir": str(tmp / "logs"), "run_id": "r1"},
        }
    )


def publish(tmp: Path, job_id: str) -> dict[str, Any]:
    info = {"url": "http://10.0.0.5:8000", "job_id": job_id, "run_id": "r1"}
    (tmp / "logs" / "endpoints").mkdir(parents=True)
    (tmp / "logs" / "endpoints" / "r1.json").write_text(json.dumps(info))
    return info


def test_path_is_by_run_id(tmp_path: Path) -> None:
    assert api.endpoint_path(recipe(tmp_path)) == tmp_path / "logs/endpoints/r1.json"


def test_running_job_endpoint(tmp_path: Path) -> None:
    info = publish(tmp_path, "42")
    be = States("RUNNING")
    assert api.endpoint(recipe(tmp_path), backend=be) == info  # type: ignore[arg-type]
    assert be.asked == ["42"]


def test_stale_endpoint_of_an_ended_job_is_ignored(tmp_path: Path) -> None:
    publish(tmp_path, "42")
    assert api.endpoint(recipe(tmp_path), backend=States("NODE_FAIL")) is None  # type: ignore[arg-type]


def test_without_slurm_the_file_is_taken_as_is(tmp_path: Path) -> None:
    info = publish(tmp_path, "42")
    assert api.endpoint(recipe(tmp_path), backend=None) == info


def test_missing(tmp_path: Path) -> None:
    assert api.endpoint(recipe(tmp_path), backend=None) is None
