"""scripts/bench_goodput.py's own measurement, the independent one the goodput ledger is held
to: on timelines written the way train_faults.py writes them (every report: time, pid, step,
checkpoint step; every worker's start: time, pid, rank)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_goodput as bg

T0 = 1_000_000.0


def write(tmp: Path, launches: list[tuple[int, float, range]], starts: list[float]) -> None:
    """Each launch: its worker pid, its first step's time, its steps (1 s apart, a save of
    every fifth step reported beside it)."""
    lines = []
    for pid, first, steps in launches:
        for i, step in enumerate(steps):
            t = first + i
            lines.append(f"{t:.3f} {pid} {step} None")
            if step % 5 == 0:
                lines.append(f"{t + 0.01:.3f} {pid} {step} {step}")
    (tmp / "timeline").write_text("\n".join(lines) + "\n")
    (tmp / "timeline.starts").write_text("".join(f"{t:.3f} 1 0\n" for t in starts))


def test_a_killed_worker_loses_the_steps_since_the_kept_save_and_the_restart(
    tmp_path: Path,
) -> None:
    # launch 1: steps 1-12 at T0+50..61 (killed after 12); launch 2 resumes at 11 from the
    # save of step 10, its worker started at T0+80, its first step at T0+100
    write(
        tmp_path, [(11, T0 + 50, range(1, 13)), (22, T0 + 100, range(11, 31))], [T0 + 20, T0 + 80]
    )
    m = bg.measure(tmp_path, T0, T0 + 130, 30)
    assert m["finished"]
    assert m["launches"] == 2
    assert m["startup_s"] == 50
    (f,) = m["failures"]
    assert f["recomputed_steps"] == 2
    assert f["to_new_process_s"] == 80 - 61
    assert f["to_training_s"] == 100 - 61
    # from the save of step 10 (T0+59.01) to training again
    assert abs(f["lost_s"] - (100 - 59.01)) < 1e-6
    # kept: launch 1 up to that save, launch 2 to its end (step 30 at T0+119, its save +0.01)
    productive = (59.01 - 50) + (119.01 - 100)
    assert abs(m["productive_s"] - productive) < 1e-6
    assert abs(m["ettr"] - productive / 130) < 1e-9


def test_a_failure_free_run_is_start_up_and_training(tmp_path: Path) -> None:
    write(tmp_path, [(11, T0 + 40, range(1, 31))], [T0 + 10])
    m = bg.measure(tmp_path, T0, T0 + 75, 30)
    assert m["finished"]
    assert m["failures"] == []
    assert abs(m["productive_s"] - 29.01) < 1e-6
    assert abs(bg.parts(m)["other (end, saves, teardown)"] - (75 - 40 - 29.01)) < 1e-6


def test_an_arm_that_never_recovers_is_unbounded_not_guessed(tmp_path: Path) -> None:
    write(tmp_path, [(11, T0 + 50, range(1, 13))], [T0 + 20])
    dead = bg.measure(tmp_path, T0, T0 + 70, 30)
    assert not dead["finished"]
    rows: list[dict[str, Any]] = [
        dict(dead, arm="aws", fault="kill", state="FAILED"),
        dict(dead, arm="aws-careful", fault="hang", state="CANCELLED", cancelled_hung=True),
    ]
    text = bg.table(rows)
    assert "| kill | aws | 1 | 0/1: FAILED | no recovery | - | unbounded" in text
    assert "| hang | aws-careful | 1 | 0/1: stuck, cancelled | no recovery | - | unbounded" in text


def test_two_failures_each_count_from_their_own_injection(tmp_path: Path) -> None:
    # killed after step 12 (the wrapper's, at its last step), then a hang this script
    # injected at T0+131.5, in the second launch, after its step 22 at T0+111
    write(
        tmp_path,
        [(11, T0 + 50, range(1, 13)), (22, T0 + 100, range(11, 23)), (33, T0 + 170, range(21, 31))],
        [T0 + 20, T0 + 80, T0 + 150],
    )
    m = bg.measure(tmp_path, T0, T0 + 200, 30)
    bg.attribute(m["failures"], [T0 + 131.5])
    kill, hang = m["failures"]
    assert kill["to_training_s"] == 100 - 61  # from the last step before the kill
    assert hang["to_training_s"] == 170 - 131.5  # from the injection, not step 22
    assert hang["to_new_process_s"] == 150 - 131.5
    assert hang["recomputed_steps"] == 2


def test_steps_after_this_script_cancelled_a_hung_run_do_not_count(tmp_path: Path) -> None:
    # stopped after step 12 (T0+61); cancelled at T0+241, when scancel's SIGCONT let one more
    # step through at T0+242
    write(tmp_path, [(11, T0 + 50, range(1, 13))], [T0 + 20])
    with (tmp_path / "timeline").open("a") as fh:
        fh.write(f"{T0 + 242:.3f} 11 13 None\n")
    m = bg.measure(tmp_path, T0, T0 + 245, 30, cut=T0 + 241)
    assert abs(m["productive_s"] - 11) < 1e-6
    assert bg.measure(tmp_path, T0, T0 + 245, 30)["productive_s"] > 190


def _stamp(t: float, fmt: str = "%Y-%m-%dT%H:%M:%S") -> str:
    """``t`` as the lab's logs write it (local time, as ``bench_goodput.epoch`` reads it)."""
    return time.strftime(fmt, time.localtime(t))


def test_a_requeue_splits_into_signal_save_end_hold_start_and_first_step(
    tmp_path: Path,
) -> None:
    # launch 1: steps 1-40 at T0+50..89, the save on the signal (step 41) reported at
    # T0+90.5; slurmctld requeued the job at T0+93.25 and started it again at T0+114.5; the
    # new worker began at T0+127, its first step (42, from the save) at T0+150
    lab = tmp_path / "lab"
    run = lab / "bench-goodput-x" / "slurmfm-limit-0"
    (run / "logs").mkdir(parents=True)
    (lab / "log").mkdir()
    write(run, [(11, T0 + 50, range(1, 41)), (22, T0 + 150, range(42, 61))], [T0 + 20, T0 + 127])
    with (run / "timeline").open() as fh:
        lines = fh.read().splitlines()
    lines.insert(
        next(i for i, x in enumerate(lines) if x.split()[2] == "42"), f"{T0 + 90.5:.3f} 11 41 41"
    )
    (run / "timeline").write_text("\n".join(lines) + "\n")
    (lab / "log" / "slurmctld.log").write_text(
        f"[{_stamp(T0)}.100] sched: Allocate JobId=7 NodeList=node[001-004] #CPUs=4\n"
        f"[{_stamp(T0 + 93)}.250] Requeuing JobId=7\n"
        f"[{_stamp(T0 + 93)}.300] Requeuing JobId=77\n"
        f"[{_stamp(T0 + 114)}.500] sched/backfill: _start_job: Started JobId=7 in batch\n"
    )
    utc = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(T0 + 88))
    (run / "logs" / "q_7.state").write_text(f"{utc} restart=0 event=signal USR2 before\n")
    m = bg.measure(run, T0, T0 + 170, 60)
    bg.phases(m["failures"], lab, "7", run)
    (f,) = m["failures"]
    p = f["phases"]
    assert abs(p["signal -> last report"] - 2.5) < 1e-6
    assert abs(p["last report -> job end"] - 2.75) < 1e-6
    assert abs(p["job end -> job start"] - 21.25) < 1e-6
    assert abs(p["job start -> new process"] - 12.5) < 1e-6
    assert abs(p["new process -> first step"] - 23) < 1e-6
    rows = [dict(m, arm="slurmfm", fault="limit", state="COMPLETED")]
    assert "| limit | slurmfm | 1 | 2.5 s | 2.8 s | 21.2 s | 12.5 s | 23.0 s |" in bg.phase_table(
        rows
    )


def test_submitits_signal_comes_from_its_rank_0_log(tmp_path: Path) -> None:
    log = tmp_path / "submitit" / "7"
    log.mkdir(parents=True)
    (log / "7_0_log.err").write_text(
        f"submitit WARNING ({_stamp(T0, '%Y-%m-%d %H:%M:%S')},250) - Caught signal SIGUSR2 on "
        "node001: this job is timed-out.\n"
    )
    (log / "7_1_log.err").write_text(
        f"submitit WARNING ({_stamp(T0 + 5, '%Y-%m-%d %H:%M:%S')},0) - Caught signal SIGUSR2\n"
    )
    assert bg._signal_times(tmp_path) == [T0 + 0.25]


def test_each_requeues_hold_is_released_after_its_own_20_s(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A job that backfill started within 20 s of its first requeue is held again later: that
    hold, too, is released only 20 s after it began (the clock is not carried over)."""
    now = [0.0]
    states = (
        [("RUNNING", "None")] * 20
        + [("PENDING", "BeginTime")] * 20  # 10 s held, then started by Slurm itself
        + [("RUNNING", "None")] * 200
        + [("PENDING", "BeginTime")] * 60  # held again: released after 20 s
        + [("RUNNING", "None")] * 10
        + [("COMPLETED", "None")]
    )
    seen = iter(states)
    released: list[float] = []

    def record(env: dict[str, str], job: str) -> dict[str, str]:
        state, reason = next(seen)
        return {"JobState": state, "Reason": reason}

    def run(argv: list[str], **kw: Any) -> Any:
        if "StartTime=now" in argv:
            released.append(now[0])

    class Clock:
        strptime, mktime = staticmethod(time.strptime), staticmethod(time.mktime)

        @staticmethod
        def monotonic() -> float:
            return now[0]

        @staticmethod
        def time() -> float:
            return T0 + now[0]

        @staticmethod
        def sleep(s: float) -> None:
            now[0] += s

    monkeypatch.setattr(bg, "record", record)
    monkeypatch.setattr(bg.subprocess, "run", run)
    monkeypatch.setattr(bg, "time", Clock)
    inj = bg.Injector({}, str(tmp_path), "limit", tmp_path)
    rec, cancelled = bg.wait_end({}, "7", 1000, inj, tmp_path, 300)
    assert rec["JobState"] == "COMPLETED"
    assert cancelled is None
    # the second hold began at 120 s (240 polls of 0.5 s): released once, 20.5 s later
    assert released == [140.5]
