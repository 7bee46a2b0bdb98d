"""Hang detection (slurmfm.job.hang): what counts as progress, when a launch is hung, and
what a hang is judged as."""

from __future__ import annotations

import json
from pathlib import Path

from slurmfm.job.classify import Evidence, classify
from slurmfm.job.hang import ITERATION, HangWatch, hang_env


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_no_progress_for_the_timeout_is_a_hang(tmp_path: Path) -> None:
    clock = Clock()
    mark = {"progress": ""}
    log = tmp_path / "job.out"
    log.write_text("")
    w = HangWatch(60, clock, lambda: dict(mark), (str(log), 0))
    clock.t = 30
    assert not w.hung()
    mark["progress"] = json.dumps({"step": 3})  # report_progress wrote
    clock.t = 59
    assert not w.hung()
    clock.t = 100
    assert not w.hung()  # 41 s since the report
    with log.open("a") as fh:  # Megatron's own iteration line
        fh.write(" [2026-12-02 03:00:00] iteration      120/    1000 | consumed samples: 1\n")
    clock.t = 150
    assert not w.hung()
    with log.open("a") as fh:
        fh.write("some other output\n")
    clock.t = 211
    assert w.hung()
    assert w.what == "iteration line in the log"
    assert w.idle_s() == 61


def test_iteration_lines_of_megatron_and_nemo() -> None:
    assert ITERATION.search(" iteration       10/     100 | consumed samples:          640 |")
    assert ITERATION.search("Training epoch 0, iteration 20/99 | lr: 1e-05")
    assert not ITERATION.search("iteration took 3 s")


def test_hang_env_turns_on_stack_dumps_and_the_flight_recorder_unless_set() -> None:
    env = hang_env({"TORCH_FR_BUFFER_SIZE": "50"}, "/x/ev")
    assert env["PYTHONFAULTHANDLER"] == "1"
    assert env["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1"
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == "/x/ev/nccl_trace_rank_"
    assert "TORCH_FR_BUFFER_SIZE" not in env  # the recipe's value stays


def test_a_hang_is_retried_and_a_second_without_progress_is_a_crash_loop() -> None:
    first = classify(Evidence(1, hang="no progress for 61 s", progress=True))
    assert first.retry
    assert first.reason.startswith("hang: no progress for 61 s")
    again = classify(Evidence(1, hang="no progress for 62 s", previous=first.signature))
    assert not again.retry
    assert again.reason.startswith("crash loop: hang again")
    # progress before the second hang: retried again
    assert classify(Evidence(1, hang="x", previous=first.signature, progress=True)).retry


def test_stacks_finds_and_aborts_the_launch_workers(tmp_path: Path) -> None:
    """A fake /proc: the node entry (SLURMFM_STEP=launch), torchrun, two workers."""
    from slurmfm.job import hang

    proc = tmp_path / "proc"

    def make(pid: int, ppid: int, **env: str) -> None:
        d = proc / str(pid)
        (d / "task" / str(pid)).mkdir(parents=True)
        (d / "stat").write_text(f"{pid} (python3) S {ppid} 0 0\n")
        (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in env.items()))
        (d / "task" / str(pid) / "children").write_text("")

    # slurmstepd sets SLURM_TASK_PID to the task's pid; its children inherit it
    base = {"SLURM_JOB_ID": "7", "SLURMFM_STEP": "launch", "SLURMD_NODENAME": "n1"}
    base["SLURM_TASK_PID"] = "100"
    make(100, 1, **base)
    make(101, 100, **base)
    make(102, 101, **base, LOCAL_RANK="0", RANK="0")
    make(103, 101, **base, LOCAL_RANK="1", RANK="1")
    (proc / "100" / "task" / "100" / "children").write_text("101")
    (proc / "101" / "task" / "101" / "children").write_text("102 103")
    assert hang.workers("7", "n1", str(proc)) == [102, 103]
    assert hang.workers("8", "n1", str(proc)) == []
