"""The pre-flight fabric test on the real local Slurm: the batch step runs the test step across
the allocation before the first launch, with nccl-tests' ``all_reduce_perf`` replaced by its
stand-in (tests/standins/all_reduce_perf: nccl-tests' documented output; no GPU or NCCL here).

Below the floor the attempt fails with the figures and the training never starts; above it
the training runs and the figures are recorded. ``slurmfm report`` shows them either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lab import SlurmLab, own_lab_fixture, read_text
from test_real_slurm_resilience import FAST, RESIL2, STANDINS, _resil, submit, wait_done

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

FABRIC = (
    "resilience.fabric_test=fail",
    f"resilience.fabric_test_command={STANDINS / 'all_reduce_perf'}",
    "env.SLURMFM_STANDIN_BUSBW=120",  # the stand-in's peak bus bandwidth, GB/s
    "launcher.args=[--steps, '3']",
)


@pytest.fixture(scope="module")
@own_lab_fixture(RESIL2)
def fabric_lab() -> Iterator[SlurmLab]:
    yield from _resil(RESIL2)


def test_below_the_floor_the_training_never_starts_and_the_figures_say_why(
    fabric_lab: SlurmLab, tmp_path: Path
) -> None:
    job_id = submit(fabric_lab, tmp_path, *FAST, *FABRIC, "resilience.fabric_min_busbw_gbs=500")
    rec = wait_done(fabric_lab, job_id, timeout=300)
    log = read_text(tmp_path / "logs" / f"quickstart_{job_id}.out")
    state = read_text(tmp_path / "logs" / f"quickstart_{job_id}.state")
    assert rec["JobState"] == "FAILED", log[-3000:]
    assert "#       size         count      type   redop" in log  # the test's own table
    assert "event=fabric failed: peak busbw 120.00 GB/s at 17179869184 B" in state
    assert "2 node(s); floor 500.00 GB/s; below the floor" in state
    assert "event=fail fabric test: peak busbw 120.00 GB/s" in state
    assert '"event": "step"' not in log  # the training never started
    report = fabric_lab.slurmfm("report", job_id, "--log-dir", str(tmp_path / "logs"))
    assert "fabric test (nccl-tests all_reduce_perf):" in report.stdout, report.stderr
    assert "run 0: failed: peak busbw 120.00 GB/s" in report.stdout


def test_above_the_floor_the_training_runs_and_the_figures_are_recorded(
    fabric_lab: SlurmLab, tmp_path: Path
) -> None:
    job_id = submit(fabric_lab, tmp_path, *FAST, *FABRIC, "resilience.fabric_min_busbw_gbs=100")
    rec = wait_done(fabric_lab, job_id, timeout=300)
    log = read_text(tmp_path / "logs" / f"quickstart_{job_id}.out")
    state = read_text(tmp_path / "logs" / f"quickstart_{job_id}.state")
    assert rec["JobState"] == "COMPLETED", log[-3000:]
    assert "event=fabric ok: peak busbw 120.00 GB/s" in state
    assert "slurmfm: fabric test passed: peak busbw 120.00 GB/s" in log
    assert log.index("fabric test passed") < log.index("slurmfm: launch:")
