"""The ``latest`` pointer is published atomically: an interrupted save never shows."""

from __future__ import annotations

import errno
import hashlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurmfm import checkpoint as ck


class Crash(Exception):
    pass


def payload(step: int) -> bytes:
    return hashlib.sha256(str(step).encode()).digest() * 1000


def writer(step: int):  # type: ignore[no-untyped-def]
    def write(tmp: Path) -> None:
        (tmp / "model.bin").write_bytes(payload(step))
        (tmp / "meta.txt").write_text(str(step))

    return write


def assert_complete(d: Path) -> int | None:
    cur = ck.latest(d)
    if cur is None:
        return None
    step = int((cur / "meta.txt").read_text())
    assert (cur / "model.bin").read_bytes() == payload(step)
    assert ck.step_of(cur) == step
    return step


@settings(max_examples=150, deadline=None)
@given(
    saves=st.integers(1, 5),
    crash_at=st.integers(0, 60),
    keep=st.one_of(st.none(), st.integers(1, 3)),
)
def test_interrupted_saves_never_expose_partial_checkpoints(
    tmp_path_factory: pytest.TempPathFactory, saves: int, crash_at: int, keep: int | None
) -> None:
    d = tmp_path_factory.mktemp("ck")
    calls = {"n": 0}
    real_replace, real_fsync, real_write = os.replace, os.fsync, Path.write_bytes

    def tick() -> None:
        calls["n"] += 1
        if calls["n"] == crash_at:
            raise Crash

    def replace(a, b):  # type: ignore[no-untyped-def]
        tick()
        return real_replace(a, b)

    def fsync(fd):  # type: ignore[no-untyped-def]
        tick()
        return real_fsync(fd)

    def write_bytes(self, data):  # type: ignore[no-untyped-def]
        tick()
        half = real_write(self, data[: len(data) // 2])
        tick()
        return half + real_write(self, data) - half

    mp = pytest.MonkeyPatch()
    mp.setattr(os, "replace", replace)
    mp.setattr(os, "fsync", fsync)
    mp.setattr(Path, "write_bytes", write_bytes)
    completed = 0
    try:
        for step in range(1, saves + 1):
            ck.save(d, step, writer(step), keep_last=keep)
            completed = step
    except Crash:
        pass
    finally:
        mp.undo()
    got = assert_complete(d)
    # The reader sees the last completed save, or the one in flight if its pointer landed.
    assert got in ({completed, completed + 1} if completed else {None, 1})
    if keep:
        steps = [p for p in d.iterdir() if p.name.startswith("step_")]
        assert len(steps) <= keep + 1


KILLER = """
import sys, time
from collections.abc import Iterator
from pathlib import Path
from slurmfm import checkpoint as ck
d = Path(sys.argv[1])
step = 0
while True:
    step += 1
    def w(tmp, step=step):
        import hashlib
        (tmp / "model.bin").write_bytes(hashlib.sha256(str(step).encode()).digest() * 1000)
        (tmp / "meta.txt").write_text(str(step))
    ck.save(d, step, w, keep_last=2)
"""


@pytest.mark.parametrize("delay", [0.05, 0.13, 0.31, 0.5])
def test_sigkill_during_saves(tmp_path: Path, delay: float) -> None:
    proc = subprocess.Popen([sys.executable, "-c", KILLER, str(tmp_path)])
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert_complete(tmp_path)


def test_prune_keeps_latest_and_newest(tmp_path: Path) -> None:
    for s in range(1, 6):
        ck.save(tmp_path, s, writer(s))
    removed = ck.prune(tmp_path, 2)
    assert [p.name for p in removed] == [f"step_{s:09d}" for s in (1, 2, 3)]
    assert assert_complete(tmp_path) == 5


def test_latest_ignores_garbage_pointer(tmp_path: Path) -> None:
    (tmp_path / "latest").write_text("../../etc\n")
    assert ck.latest(tmp_path) is None
    (tmp_path / "latest").write_text("step_000000007\n")
    assert ck.latest(tmp_path) is None  # names a checkpoint that does not exist


def test_save_request_flag() -> None:
    req = ck.SaveRequest()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert req.requested
    finally:
        req.restore()


# A training job that resumes and saves again, killed with SIGKILL by itself at the
# KILL_AT-th file-system call (rename, unlink, rmdir, fsync, mkdir): a real kill (no finally,
# no atexit) at a point chosen by the test, so every point of a save is reached without
# timing luck. It first re-saves the step it resumed from (a pre-timeout save right after a
# restart), then the next steps, printing each completed save.
SELF_KILL = """
import hashlib, os, signal, sys
from collections.abc import Iterator
from pathlib import Path
from slurmfm import checkpoint as ck
d, kill_at = Path(sys.argv[1]), int(sys.argv[2])
calls = [0]
def hooked(fn):
    def call(*a, **k):
        calls[0] += 1
        if calls[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return fn(*a, **k)
    return call
for name in ("rename", "replace", "unlink", "rmdir", "fsync", "mkdir"):
    setattr(os, name, hooked(getattr(os, name)))
cur = ck.latest(d)
start = ck.step_of(cur) if cur else 1
for step in range(start, start + 4):
    def w(tmp, step=step):
        for i in range(3):
            (tmp / f"shard{i}.bin").write_bytes(hashlib.sha256(str(step).encode()).digest() * 64)
        (tmp / "meta.txt").write_text(str(step))
    ck.save(d, step, w, keep_last=2)
    print(step, flush=True)
"""

# Every kill point once. A run of four saves makes 64-76 of the hooked file-system calls, so
# the last points kill nothing: those runs finish their saves.
KILL_POINTS = range(1, 91)


def _complete_payload(path: Path) -> int:
    step = int((path / "meta.txt").read_text())
    for i in range(3):
        assert (path / f"shard{i}.bin").read_bytes() == hashlib.sha256(
            str(step).encode()
        ).digest() * 64, f"{path} is not complete"
    return step


def test_resave_killed_anywhere_always_resumes_a_complete_checkpoint(tmp_path: Path) -> None:
    """Issue 15 items 5 and 6: kills at every point of saves that re-save a step.

    ``latest`` (resolved by resume_point) always names a complete checkpoint, no work beyond
    the save in flight is lost, and leftovers of killed saves do not pile up. Each kill point
    comes once, in a seeded random order, so each meets a different state of the directory
    (150 random draws of the 90 points, as before, had left 14 of them out).
    """
    import random

    points = list(KILL_POINTS)
    random.Random(15).shuffle(points)
    lost = kills = 0
    for i, kill_at in enumerate(points):
        cur = ck.latest(tmp_path)
        before = ck.step_of(cur) if cur else None
        proc = subprocess.run(
            [sys.executable, "-c", SELF_KILL, str(tmp_path), str(kill_at)],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr
        done = [int(x) for x in proc.stdout.split()]
        resumed = ck.latest(tmp_path)
        assert resumed is not None, f"kill {i}: latest names no complete checkpoint"
        step = _complete_payload(resumed)
        assert step == ck.step_of(resumed)
        kills += proc.returncode != 0
        floor = done[-1] if done else (before or 0)
        assert step in (floor, floor + 1), f"kill {i}: resumed {step}, last saved {floor}"
        lost += 0 if step >= floor else 1
        leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(".step_")]
        assert len(leftovers) <= 2, leftovers  # at most the killed save's own
        steps = [p for p in tmp_path.iterdir() if p.name.startswith("step_")]
        assert len(steps) <= 4
    assert lost == 0
    assert kills > len(points) // 2  # most runs were really killed mid-way


def test_resume_point_falls_back_from_a_dangling_or_empty_latest(tmp_path: Path) -> None:
    """Issue 15 item 7: never restart from step 0 over older complete checkpoints."""
    for s in (3, 5):
        ck.save(tmp_path, s, writer(s))
    (tmp_path / "latest").write_text("step_000000009\n")
    rp = ck.resume_point(tmp_path)
    assert rp.step == 5
    assert rp.path == tmp_path / "step_000000005"
    assert "step_000000009, which does not exist" in rp.message
    assert "newest complete checkpoint" in rp.message
    assert str(rp.path) in rp.message
    assert ck.latest(tmp_path) == rp.path
    (tmp_path / "latest").write_text("")
    rp = ck.resume_point(tmp_path)
    assert rp.step == 5
    assert "latest is empty" in rp.message
    (tmp_path / "latest").unlink()
    assert ck.resume_point(tmp_path).step == 5
    (tmp_path / "latest").write_text("step_000000003\n")
    rp = ck.resume_point(tmp_path)
    assert rp.step == 3
    assert rp.message == f"resuming from {tmp_path / 'step_000000003'} (named by latest)"


def test_resume_point_of_an_empty_directory_says_step_0(tmp_path: Path) -> None:
    rp = ck.resume_point(tmp_path / "missing")
    assert rp.path is None
    assert rp.step is None
    assert "starting from step 0" in rp.message


def _dead_pid() -> int:
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    return int(proc.stdout)


def test_clean_removes_dead_leftovers_and_restores_an_aside_copy(tmp_path: Path) -> None:
    """Issue 15 items 5-6: a kill between the two renames of a re-save loses nothing."""
    pid = _dead_pid()
    ck.save(tmp_path, 1, writer(1))
    ck.save(tmp_path, 2, writer(2))
    # A re-save of step 2 killed after moving the old copy aside, before the new one landed.
    os.rename(tmp_path / "step_000000002", tmp_path / f".step_000000002.{pid}.old")
    (tmp_path / f".step_000000002.{pid}.partial").mkdir()
    (tmp_path / f".step_000000001.{pid}.deleting").mkdir()
    assert _complete_payload_v1(ck.resume_point(tmp_path).path) == 2
    removed = ck.clean(tmp_path)
    assert sorted(p.name for p in removed) == sorted(
        [f".step_000000002.{pid}.partial", f".step_000000001.{pid}.deleting"]
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "latest",
        "step_000000001",
        "step_000000002",
    ]
    assert assert_complete(tmp_path) == 2


def _complete_payload_v1(path: Path | None) -> int:
    assert path is not None
    step = int((path / "meta.txt").read_text())
    assert (path / "model.bin").read_bytes() == payload(step)
    return step


def test_clean_leaves_a_live_writer_alone(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        live = tmp_path / f".step_000000004.{proc.pid}.partial"
        live.mkdir()
        assert ck.clean(tmp_path) == []
        assert live.exists()
    finally:
        proc.communicate(b"")


def _quota_writer(step: int, directory: Path, capacity: int):  # type: ignore[no-untyped-def]
    """A writer on a disk that holds ``capacity`` checkpoint-sized directories."""

    def write(tmp: Path) -> None:
        used = [p for p in directory.iterdir() if p.is_dir()]
        if len(used) > capacity:
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "model.bin"))
        writer(step)(tmp)

    return write


def test_partials_of_killed_saves_do_not_fill_the_disk(tmp_path: Path) -> None:
    """Issue 15 item 6: 97 % of the disk was leftovers of killed saves."""
    pid = _dead_pid()
    ck.save(tmp_path, 1, writer(1), keep_last=2)
    ck.save(tmp_path, 2, writer(2), keep_last=2)
    for s in (3, 4):
        (tmp_path / f".step_{s:09d}.{pid}.partial").mkdir()
    ck.save(tmp_path, 3, _quota_writer(3, tmp_path, capacity=3), keep_last=2)
    assert assert_complete(tmp_path) == 3
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".partial")]


def test_no_space_prunes_then_retries_once(tmp_path: Path) -> None:
    for s in (1, 2):
        ck.save(tmp_path, s, writer(s), keep_last=2)
    ck.save(tmp_path, 3, _quota_writer(3, tmp_path, capacity=2), keep_last=2)
    assert assert_complete(tmp_path) == 3
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step_")) == [
        "step_000000002",
        "step_000000003",
    ]
    # Without keep_last nothing of the user's is deleted: the error stands.
    with pytest.raises(OSError, match="No space"):
        ck.save(tmp_path, 4, _quota_writer(4, tmp_path, capacity=1))
    assert assert_complete(tmp_path) == 3


def test_no_space_wrapped_by_a_framework_is_recognised() -> None:
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("PytorchStreamWriter failed writing file") from inner
    except RuntimeError as exc:
        assert ck._no_space(exc)
    assert not ck._no_space(RuntimeError("CUDA error"))


def test_status_resolves_a_relative_checkpoint_dir_in_the_jobs_workdir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 15 item 16b: `slurmfm status` looked for runs/ck under the caller's directory."""
    from slurmfm.backends.base import JobStatus
    from slurmfm.backends.state import read_state

    work, logs, elsewhere = tmp_path / "work", tmp_path / "logs", tmp_path / "elsewhere"
    for d in (work, logs, elsewhere):
        d.mkdir()
    ck.save(work / "runs" / "ck", 7, writer(7))
    (logs / "demo_42.state").write_text(
        "2026-12-01T00:00:00 restart=0 event=start\n"
        "2026-12-01T00:00:01 restart=0 event=checkpoint-dir runs/ck\n"
    )
    status = JobStatus(
        job_id="42",
        state="RUNNING",
        name="demo",
        stdout=str(logs / "demo_42.out"),
        raw={"WorkDir": str(work)},
    )
    monkeypatch.chdir(elsewhere)
    st = read_state(status)
    assert st is not None
    assert st.last_checkpoint == str(work / "runs" / "ck" / "step_000000007")


def _lock_recipe(root: Path, **resources: object):  # type: ignore[no-untyped-def]
    from slurmfm.recipe.loader import validate

    return validate(
        {
            "name": "twice",
            "cluster": {"instance_type": "lab-cpu"},
            "resources": {"procs_per_node": 1, **resources},
            "launcher": {"kind": "torchrun", "script": "t.py"},
            "storage": {"checkpoint_root": str(root)},
        }
    )


def test_run_lock_refuses_a_live_job_and_allows_the_explicit_choices(tmp_path: Path) -> None:
    """Issue 15 item 8, without Slurm: the record beside the run directory and its rules."""
    from slurmfm import run_lock
    from slurmfm.run_lock import RunDirInUse

    r = _lock_recipe(tmp_path)
    alive = {"11": "RUNNING"}
    with run_lock.exclusive(r, alive.get) as record:
        record("11")
    assert (tmp_path / "twice" / ".twice.slurmfm-jobs").read_text() == "11\n"
    refused = r"job 11 \(RUNNING\) already uses the run directory"
    with pytest.raises(RunDirInUse, match=refused), run_lock.exclusive(r, alive.get):
        pass
    with run_lock.exclusive(r, alive.get, allow_shared=True) as record:
        record("12")
    with run_lock.exclusive(_lock_recipe(tmp_path, singleton=True), alive.get) as record:
        record("13")
    alive["13"] = "PENDING"
    # Only live jobs stay in the record (12 never was alive here).
    assert (tmp_path / "twice" / ".twice.slurmfm-jobs").read_text().split() == ["11", "13"]
    alive.clear()  # every recorded job has ended
    with run_lock.exclusive(r, alive.get) as record:
        record("14;cluster")
    assert (tmp_path / "twice" / ".twice.slurmfm-jobs").read_text() == "14\n"
    # A checkpoint file system that is not mounted here: nothing to check, submission goes on.
    blocker = tmp_path / "file"
    blocker.write_text("")
    with run_lock.exclusive(_lock_recipe(blocker), alive.get) as record:
        record("15")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 2 MiB file system (tmpfs), so a full disk is the kernel's ENOSPC."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True
    )
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {proc.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def _big(step: int):  # type: ignore[no-untyped-def]
    def write(tmp: Path) -> None:
        (tmp / "model.bin").write_bytes(payload(step)[:32] * (600 * 1024 // 32))
        (tmp / "meta.txt").write_text(str(step))

    return write


def test_a_full_disk_of_leftovers_and_old_checkpoints_does_not_stop_a_save(
    small_disk: Path,
) -> None:
    """Issue 15 item 6 on a real file system: leftovers are cleaned first, and when the disk
    is still full, keep_last pruning runs before the save gives up."""
    d = small_disk / "run"
    for s in (1, 2):
        ck.save(d, s, _big(s), keep_last=2)
    leftover = d / f".step_000000003.{_dead_pid()}.partial"  # a save killed mid-write
    leftover.mkdir()
    (leftover / "model.bin").write_bytes(b"x" * 600 * 1024)
    ck.save(d, 3, _big(3), keep_last=2)
    assert not leftover.exists()
    assert ck.step_of(ck.latest(d) or d) == 3
    # Three checkpoints fill the disk: saving a fourth with keep_last=3 prunes to two first.
    ck.save(d, 4, _big(4), keep_last=3)
    ck.save(d, 5, _big(5), keep_last=3)
    names = sorted(p.name for p in d.iterdir() if p.name.startswith("step_"))
    assert names[-1] == "step_000000005"
    assert int((d / names[-1] / "meta.txt").read_text()) == 5
    assert not [p for p in d.iterdir() if p.name.startswith(".step_")]


def test_done_marker_says_what_was_asked_and_who_wrote_it(tmp_path: Path) -> None:
    """15.2: the job accepts a DONE marker only for the ask that wrote it."""
    import json

    from slurmfm.job.decide import marker_verdict

    env = {"SLURMFM_ASK": "a20", "SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "1"}
    ck.mark_done(tmp_path, steps=20, env=env)
    record = json.loads((tmp_path / ck.DONE).read_text())
    assert {k: record[k] for k in ("ask", "job_id", "restart", "steps")} == {
        "ask": "a20",
        "job_id": "12",
        "restart": 1,
        "steps": 20,
    }
    assert ck.is_done(tmp_path)
    assert not list(tmp_path.glob(".DONE.*"))  # written under a temporary name, then renamed
    assert marker_verdict(str(tmp_path), "a20", "12", None)[0] == "done"
    # resubmitted with 240 steps (another launch command, another job): the marker is stale
    assert marker_verdict(str(tmp_path), "a240", "13", None)[0] == "stale"
    assert marker_verdict(str(tmp_path), "a20", "13", None)[0] == "stale"
