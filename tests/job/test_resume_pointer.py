"""Issue 15.7: a missing, empty or dangling ``latest`` falls back to the newest checkpoint."""

from __future__ import annotations

from pathlib import Path

from slurmfm.job.checkpoint import resume_from


def test_resume_pointer_and_its_fallback(tmp_path: Path) -> None:
    assert resume_from(str(tmp_path)) is None
    for step in (10, 9, 20):
        (tmp_path / f"step_{step:09d}").mkdir()
    (tmp_path / "latest").write_text("step_000000010\n")
    assert resume_from(str(tmp_path)) == str(tmp_path / "step_000000010")
    (tmp_path / "latest").write_text("step_000000099\n")  # dangling
    assert resume_from(str(tmp_path)) == str(tmp_path / "step_000000020")
    (tmp_path / "latest").write_text("")  # empty
    assert resume_from(str(tmp_path)) == str(tmp_path / "step_000000020")
