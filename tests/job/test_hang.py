"""Hang detection (slurmfm.job.hang): what counts as progress, when a launch is hung, and
what a hang is judged as."""

from __future__ import annotations

import json
from pathlib import Path

from slurmfm.job.classify import Evidence, classify
from slurmfm.job.hang import HangWatch, hang_env
from slurmfm.job.node import stat_fields
from slurmfm.job.progress import step_line


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
    assert w.what == "Megatron-LM iteration 120/1000"
    assert w.idle_s() == 61


def test_iteration_lines_of_megatron_and_nemo() -> None:
    assert step_line(" iteration       10/     100 | consumed samples:          640 |")
    assert step_line("Training epoch 0, iteration 20/99 | lr: 1e-05")
    assert not step_line("iteration took 3 s")


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


WORKER = """
import socket, sys, time
peer = socket.socket(fileno=int(sys.argv[1]))
open(sys.argv[2], "w").close()  # about to wait


def wait_for_peer():  # a collective: waits until the other rank sends or goes away
    return peer.recv(1)


wait_for_peer()


def peer_went_away():  # what a rank does once its peer died: handle the error
    print("peer went away", flush=True)
    time.sleep(60)


peer_went_away()
"""

LAUNCHER = """
import os, socket, subprocess, sys
a, b = socket.socketpair()
procs = []
for rank, sock in enumerate((a, b)):
    env = dict(os.environ, LOCAL_RANK=str(rank), RANK=str(rank), PYTHONFAULTHANDLER="1")
    err = open(os.path.join(sys.argv[1], "rank%d.err" % rank), "w")
    procs.append(subprocess.Popen(
        [sys.executable, "-c", sys.argv[2], str(sock.fileno()),
         os.path.join(sys.argv[1], "ready%d" % rank)],
        env=env, pass_fds=[sock.fileno()], stderr=err,
    ))
a.close()  # each end now only in its worker: one's end is the other's EOF
b.close()
print(" ".join(str(p.wait()) for p in procs), flush=True)
"""


def state(pid: int) -> str:
    """A process's state letter (/proc/PID/stat: S sleeping, T stopped, ...)."""
    return stat_fields(pid)[0]


def test_a_hangs_stacks_are_taken_with_every_worker_stopped_first(tmp_path: Path) -> None:
    """Two real workers wait on each other, as ranks in a collective. The first phase stops
    both (and lists them); the second aborts them: each faulthandler dump shows the wait, not
    the handling of a peer that died first (a rank aborted while its peer ran ended the
    peer's collective with an error, and the peer's dump showed that)."""
    import os
    import subprocess
    import sys
    import time

    from slurmfm.job import hang

    job, node = f"hang-test-{os.getpid()}", "n-test"
    env = dict(os.environ, SLURM_JOB_ID=job, SLURMFM_STEP="launch", SLURMD_NODENAME=node)
    launcher = subprocess.Popen(
        ["sh", "-c", 'SLURM_TASK_PID=$$ exec "$0" -c "$1" "$2" "$3"']
        + [sys.executable, LAUNCHER, str(tmp_path), WORKER],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while len(hang.workers(job, node)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        pids = hang.workers(job, node)
        assert len(pids) == 2

        def waiting() -> bool:  # both past their ready mark, asleep in the wait
            ready = all((tmp_path / f"ready{r}").exists() for r in (0, 1))
            return ready and all(state(pid) == "S" for pid in pids)

        while not waiting() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert waiting()
        lines = hang.stop_workers(job, node, pyspy="")
        assert [x.split(" rank ")[1] for x in lines] == ["0", "1"], lines
        assert all(x.startswith(f"slurmfm-stacks {node} pid ") for x in lines), lines
        assert [state(pid) for pid in pids] == ["T", "T"]  # stopped
        assert hang.abort_workers(job, node) == pids
        out, _ = launcher.communicate(timeout=60)
    finally:
        if launcher.poll() is None:
            for pid in hang.workers(job, node):
                os.kill(pid, 9)
            launcher.kill()
    assert out.split() == ["-6", "-6"]  # both ended by SIGABRT
    for rank in (0, 1):
        err = (tmp_path / f"rank{rank}.err").read_text()
        assert "Fatal Python error: Aborted" in err, err
        assert "in wait_for_peer" in err, err
        assert "peer_went_away" not in err, err


def test_stat_fields_begin_after_the_names_last_parenthesis(tmp_path: Path) -> None:
    """A process may name itself with spaces and ")" (prctl): the state, parent and start
    time are read after the name's last ")"; an unreadable or torn file gives no fields."""
    from slurmfm.job import hang, node

    fields = ["T", "41"] + [str(i) for i in range(2, 19)] + ["12345", "0"]
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "stat").write_text("7 (a) b (c)) " + " ".join(fields) + "\n")
    assert node.stat_fields(7, str(tmp_path))[:2] == ["T", "41"]
    assert node.parent(7, str(tmp_path)) == 41
    assert node.start_time(7, str(tmp_path)) == "12345"
    assert hang.stopped(7, str(tmp_path))
    (tmp_path / "8").mkdir()
    (tmp_path / "8" / "stat").write_text("8 (python3")  # torn: no closing parenthesis
    assert node.stat_fields(8, str(tmp_path)) == []
    assert node.parent(8, str(tmp_path)) == 0
    assert node.start_time(8, str(tmp_path)) == ""
    assert node.stat_fields(9, str(tmp_path)) == []  # gone
    assert hang.stopped(9, str(tmp_path))
    (tmp_path / "7" / "stat").write_text("7 (a) S 41 " + " ".join(fields[2:]) + "\n")
    assert not hang.stopped(7, str(tmp_path))
