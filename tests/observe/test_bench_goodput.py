"""scripts/bench_goodput.py's own measurement, the independent one the goodput ledger is held
to: on timelines written the way train_faults.py writes them (every report: time, pid, step,
checkpoint step; every worker's start: time, pid, rank)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

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
