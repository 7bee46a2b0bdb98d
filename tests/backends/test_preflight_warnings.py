"""Preflight reports risks that do not stop the job, such as a save window too short."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from slurmfm.backends.preflight import preflight
from slurmfm.recipe.loader import validate


class FakeCLI:
    """Answers preflight's questions like a cluster with room for the job."""

    def partition(self, name: str) -> dict[str, str] | None:
        return {"State": "UP", "TotalNodes": "16", "MaxTime": "UNLIMITED"}

    def node_features(self, partition: str | None) -> set[str]:
        return set()

    def test_only(self, script: str, *, extra_args: Sequence[str] = ()) -> str:
        return "Job 1 to start now on node001"


def _recipe(**res: Any) -> Any:
    return validate(
        {
            "name": "w",
            "cluster": {"instance_type": "p5.48xlarge"},
            "resources": {"nodes": 2},
            "parallelism": {"tp": 8},
            "launcher": {"kind": "torchrun", "script": __file__},  # a file that exists
            "resilience": res,
        }
    )


def test_short_save_window_is_a_warning_not_a_failure() -> None:
    report = preflight(_recipe(model_params_b=405), "#!/bin/bash\n", FakeCLI())  # type: ignore[arg-type]
    assert report.ok
    (line,) = [x for x in report.lines() if x.startswith("warn ")]
    assert "cannot hold one save" in line


def test_no_warning_without_a_model_size() -> None:
    report = preflight(_recipe(), "#!/bin/bash\n", FakeCLI())  # type: ignore[arg-type]
    assert report.warnings == []
    assert report.ok


def test_spare_nodes_count_against_the_partition() -> None:
    r = validate(
        {
            "name": "w",
            "cluster": {"instance_type": "p5.48xlarge", "partition": "gpu"},
            "resources": {"nodes": 16, "spare_nodes": 1},
            "parallelism": {"tp": 8},
            "launcher": {"kind": "torchrun", "script": __file__},
        }
    )
    report = preflight(r, "#!/bin/bash\n", FakeCLI())  # type: ignore[arg-type]
    (nodes,) = [c for c in report.checks if c.name == "nodes"]
    assert not nodes.ok
    assert nodes.message == "17 requested (16 + 1 spare), partition gpu has 16"
