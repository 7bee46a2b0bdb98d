"""The batch step's supervisor (slurmfm.job.supervise): a kill of the runtime is recorded and
requeued; the runtime's own exit code passes through. Real fork, real signals."""

from __future__ import annotations

import os
import signal
from collections.abc import Sequence
from pathlib import Path

from slurmfm.job import slurm as sl
from slurmfm.job.state import StateFile
from slurmfm.job.supervise import supervise


class Run:
    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def __call__(self, argv: Sequence[str], timeout: float) -> tuple[int, str]:
        self.calls.append(list(argv))
        return 0, ""


def killed() -> int:
    os.kill(os.getpid(), signal.SIGKILL)
    return 0  # pragma: no cover - never reached


def lines(path: Path) -> list[str]:
    return [x.split(" ", 2)[2] for x in path.read_text().splitlines()] if path.exists() else []


def test_the_runtimes_exit_code_passes_through(tmp_path: Path) -> None:
    state = StateFile(str(tmp_path / "s"), 0)
    run = Run()
    assert supervise(lambda: 3, state, {"SLURM_JOB_ID": "5"}, 3, True, run) == 3
    assert supervise(lambda: 0, state, {"SLURM_JOB_ID": "5"}, 3, True, run) == 0
    assert run.calls == []
    assert lines(tmp_path / "s") == []


def test_a_killed_runtime_is_recorded_and_requeued(tmp_path: Path) -> None:
    state = StateFile(str(tmp_path / "s"), 1)
    run = Run()
    env = {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "1"}
    assert supervise(killed, state, env, 3, True, run) == 0
    assert run.calls == [["scontrol", "requeue", "5"]]
    assert lines(tmp_path / "s") == [
        "event=requeue the job runtime was killed (signal 9); its launch step may still have run"
    ]


def test_a_killed_runtime_past_the_cap_gives_up(tmp_path: Path) -> None:
    state = StateFile(str(tmp_path / "s"), 3)
    run = Run()
    env = {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "3"}
    assert supervise(killed, state, env, 3, True, run, sl.Retry(sleep=lambda s: None)) == 137
    assert run.calls == []
    assert lines(tmp_path / "s")[0].startswith("event=give-up restart cap 3 reached: the job")
