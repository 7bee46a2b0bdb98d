"""The resume rule, defined once (slurmfm/job/checkpoint.py) for the runtime and the library:
``latest`` when it names a complete checkpoint, else the newest complete one."""

from __future__ import annotations

import os
from pathlib import Path

from slurmfm import checkpoint as ck
from slurmfm.job.checkpoint import resume_from


def test_a_missing_empty_or_dangling_latest_falls_back_to_the_newest(tmp_path: Path) -> None:
    assert resume_from(str(tmp_path)) is None
    for step in (10, 9, 20):
        (tmp_path / f"step_{step:09d}").mkdir()
    (tmp_path / "latest").write_text("step_000000010\n")
    assert resume_from(str(tmp_path)) == str(tmp_path / "step_000000010")
    (tmp_path / "latest").write_text("step_000000099\n")  # dangling
    assert resume_from(str(tmp_path)) == str(tmp_path / "step_000000020")
    (tmp_path / "latest").write_text("")  # empty
    assert resume_from(str(tmp_path)) == str(tmp_path / "step_000000020")


def test_a_step_set_aside_during_a_resave_is_resumed_by_both_sides(tmp_path: Path) -> None:
    """Killed between the two renames of a re-save of step 5: ``step_5`` is gone, its
    complete copy is set aside, ``latest`` still names step 5. The runtime once took
    ``step_4`` here while the library took the copy; both now take the copy (a checkpoint
    interval of training is not thrown away), and the next save puts it back."""
    (tmp_path / "step_000000004").mkdir()
    aside = tmp_path / ".step_000000005.4194303.old"
    aside.mkdir()  # a pid no process has (clean() leaves a live writer's copy alone)
    (tmp_path / "latest").write_text("step_000000005\n")
    assert resume_from(str(tmp_path)) == str(aside)
    rp = ck.resume_point(tmp_path)
    assert (rp.path, rp.step) == (aside, 5)
    assert ck.latest(tmp_path) == aside
    ck.clean(tmp_path)  # what the next save does first
    assert resume_from(str(tmp_path)) == str(tmp_path / "step_000000005")


def test_a_linked_pointer_is_not_followed(tmp_path: Path) -> None:
    """``latest`` is read through fsafe: a link planted as the pointer chooses nothing."""
    for step in (3, 7):
        (tmp_path / f"step_{step:09d}").mkdir()
    (tmp_path / "elsewhere").write_text("step_000000003\n")
    os.symlink(tmp_path / "elsewhere", tmp_path / "latest")
    rp = ck.resume_point(tmp_path)
    assert rp.step == 7
    assert "ignored" in rp.message
