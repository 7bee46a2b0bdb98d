"""The ``latest`` pointer is published atomically: an interrupted save never shows."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
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
